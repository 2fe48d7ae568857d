"""Malformed checkpoints given to the tools (issue 34, items 3 to 5): each is one error line naming the file and the
entry, exit code 1, no traceback -- never a wrong result.  Each case edits the payload of a tiny real checkpoint
(2 updates, with an EMA, so that its train section holds every entry) and saves it with ``torch.save``; every case
goes through what the command runs (its library entry point, in this process), and one case of each item and tool
through the command itself.  Then the body of a checkpoint of ``small`` as checkpoint.load reads it -- each malformed
field one line naming it -- and a diverged model's weights (NaN), which nmt-translate refuses saying so."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError

from conftest import one_line_error as _one_line_error
from conftest import run_tool as _nmt
from conftest import tiny_multi30k_run
from nmtkit.translate.config import DecodeConfig

pytestmark = pytest.mark.usefixtures("restore_threads")


@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    """(prepared data, its run's checkpoint, the payload): the tiny RNNsearch after 2 updates on 60 Multi30K pairs,
    with --ema-decay (the train section holds raw_model and ema)."""
    root = tmp_path_factory.mktemp("ckpt-faults")
    tiny_multi30k_run(data_dir, root, ema_decay=0.5)
    last = root / "run" / "checkpoint_last.pt"
    (root / "src.en").write_text("a man is walking .\n", encoding="utf-8")
    (root / "tgt.fr").write_text("un homme marche .\n", encoding="utf-8")
    return root, last, checkpoint.load(last)


def _command(tool: str, root: Path, bad: Path, workdir: Path) -> subprocess.CompletedProcess:
    if tool == "translate":
        return _nmt("nmt-translate", "-m", bad, stdin="a man is walking .\n")
    if tool == "align":
        return _nmt("nmt-align", "-m", bad, "-s", root / "src.en", "-t", root / "tgt.fr")
    if tool == "score":
        return _nmt("nmt-score", root / "tgt.fr", "-r", root / "tgt.fr", "-s", root / "src.en", "-m", bad,
                    "--metrics", "BLEU")
    if tool == "init-from":
        return _nmt("nmt-train", root / "data", "--arch", "rnnsearch-tiny", "--save-dir", workdir / "new",
                    "--init-from", bad, "--max-updates", "1", "--threads", "1")
    assert tool == "resume"  # (the malformed checkpoint is the run's checkpoint_last.pt)
    return _nmt("nmt-train", root / "data", "--arch", "rnnsearch-tiny", "--save-dir", bad.parent, "--resume",
                "--ema-decay", "0.5", "--max-updates", "3", "--threads", "1")


def _each(weights: dict, make) -> None:
    for name, value in weights.items():
        weights[name] = make(value)


def _first_tensor(p, key):
    """The name of the first state tensor of the optimizer's weight ``key`` that is not a scalar."""
    return next(k for k, v in p["train"]["optimizer"]["state"][key].items() if isinstance(v, torch.Tensor) and v.dim())


def _wrong_optimizer_shape(p):
    entry = p["train"]["optimizer"]["state"][0]
    entry[_first_tensor(p, 0)] = torch.zeros(1)


NAN_COMPLEX = (lambda v: torch.complex(torch.full_like(v, float("nan")), torch.zeros_like(v)))
CASES = [
    # item 3: a wrong result without a word, before
    ("translate", lambda p: p["vocab"].update(src=p["vocab"]["src"][:10]),
     "'vocab.src' has 10 entries; 'config.src_vocab_size' is"),
    ("resume", lambda p: p["train"].update(ema={k: torch.zeros(1) for k in p["model"]}),
     "'train.ema.E_src' has shape [1]; its config's model has"),
    ("align", lambda p: _each(p["model"], lambda v: torch.full_like(v, 3e38)), "holds a weight of 3e+38"),
    ("align", lambda p: _each(p["model"], NAN_COMPLEX), "is complex64, not real floating-point weights"),
    # item 4: a traceback, before
    ("translate", lambda p: p["config"].pop("src_vocab_size"), "'config.src_vocab_size' is missing"),
    ("align", lambda p: p["config"].pop("tgt_vocab_size"), "'config.tgt_vocab_size' is missing"),
    ("translate", lambda p: _each(p["model"], lambda v: torch.full_like(v, -3e38)), "holds a weight of 3e+38"),
    ("score", lambda p: _each(p["model"], NAN_COMPLEX), "is complex64, not real floating-point weights"),
    ("translate", lambda p: p["model"].update(E_src=p["model"]["E_src"].to_sparse()),
     "'model.E_src' is not a dense tensor"),
    ("score", lambda p: p["model"].update(W_o=p["model"]["W_o"].to_sparse_csr()), "'model.W_o' is not a dense"),
    ("translate", lambda p: p["model"].update(b_y=p["model"]["b_y"].long()), "'model.b_y' is int64, not real"),
    ("translate", lambda p: p["vocab"]["tgt"].__setitem__(10, "<unk>"),
     "'vocab.tgt' has the token '<unk>' twice (ids 1 and 10)"),
    ("align", lambda p: p["vocab"]["src"].__setitem__(2, "<bos>"), "'vocab.src' does not start with the specials"),
    ("score", lambda p: p["vocab"].update(tgt=p["vocab"]["tgt"][:-1]), "'vocab.tgt' has "),
    ("translate", lambda p: p["model"].update(W_s=torch.zeros(3, 3)), "'model.W_s' has shape [3, 3]; its config's"),
    ("align", lambda p: p["model"].pop("b_s"), "'model' lacks 'b_s'"),
    ("translate", lambda p: p["model"].update(extra=torch.zeros(2)), "'model.extra' is not a weight of its config"),
    ("init-from", lambda p: p["model"].update(W_s=torch.zeros(3, 3)), "'model.W_s' has shape [3, 3]"),
    ("init-from", lambda p: p["config"].update(emb_dim="wide"), "'config' builds no rnnsearch model"),
    # item 5: --resume with a malformed train section
    ("resume", lambda p: p["train"]["state"].update(extra=1), "'train.state' has 'extra', which is none of"),
    ("resume", lambda p: p["train"]["state"].update(update="2"), "'train.state.update' is '2', not a whole number"),
    ("resume", lambda p: p["train"]["rng"].update(torch=p["train"]["rng"]["torch"].float()),
     "'train.rng.torch' is not a generator's state (torch.float32"),
    ("resume", lambda p: p["train"]["rng"].pop("torch"), "'train.rng.torch' is missing"),
    ("resume", lambda p: p["train"].update(optimizer={}), "'train.optimizer' is not an optimizer's state"),
    ("resume", _wrong_optimizer_shape, "'train.optimizer.state[0]."),
    ("resume", lambda p: p["train"].update(schedule={}), "'train.schedule.factor' is missing"),
    ("resume", lambda p: p.update(train=[1, 2]), "'train' is not a dict"),
    ("resume", lambda p: p["train"].update(data="60 pairs"), "'train.data' is not a dict"),
    ("resume", lambda p: p["train"].update(config=3), "'train.config' is not a dict of settings"),
    ("resume", lambda p: p["train"]["state"].update(history="none"), "'train.state.history' is 'none', not a list"),
    ("resume", lambda p: p["train"].update(log_window=[0.0]), "'train.log_window' is not a dict"),
    ("resume", lambda p: p["train"]["state"].update(best="0.5"), "'train.state.best' is '0.5', not a finite number"),
    ("resume", lambda p: p["train"].update(raw_model={k: torch.full_like(v, 3e38) for k, v in p["model"].items()}),
     "'train.raw_model.E_src' holds a weight of 3e+38"),
]


def _malformed(run, tmp_path, tool, change) -> Path:
    root, last, payload = run
    payload = copy.deepcopy(payload)
    change(payload)
    bad = tmp_path / ("checkpoint_last.pt" if tool == "resume" else "bad.pt")
    torch.save(payload, bad)
    return bad


def _library(tool: str, root: Path, bad: Path, workdir: Path) -> None:
    """What the command does with the checkpoint, in this process: the tools' library entry points."""
    from nmtkit.train.trainer import TrainConfig, Trainer

    if tool == "translate":
        from nmtkit.translate import Translator

        Translator([str(bad)], DecodeConfig(beam=2), workers=1, threads=1)
    elif tool == "align":
        from nmtkit.align import Aligner

        Aligner(str(bad))
    elif tool == "score":
        from nmtkit.score import ScoreConfig, evaluate

        evaluate(ScoreConfig(reference=str(root / "tgt.fr"), hypotheses=[str(root / "tgt.fr")],
                             source=str(root / "src.en"), model=str(bad), metrics=["BLEU"]))
    else:
        where = dict(init_from=str(bad), save_dir=str(workdir / "new")) if tool == "init-from" else \
            dict(resume=True, save_dir=str(bad.parent), ema_decay=0.5)
        Trainer(TrainConfig(data=str(root / "data"), arch="rnnsearch-tiny", max_updates=3, threads=1, **where))


def _refused_in_one_line(run, tmp_path, tool: str, change, fragment: str) -> None:
    """The tool's library call on the checkpoint ``change`` makes: one InputError line naming the file and holding
    ``fragment``."""
    bad = _malformed(run, tmp_path, tool, change)
    with pytest.raises(InputError) as e:
        _library(tool, run[0], bad, tmp_path)
    assert str(e.value).startswith(f"{bad}: ") and fragment in str(e.value), (fragment, str(e.value))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("tool, change, fragment", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_malformed_checkpoint_is_one_error_naming_file_and_entry(run, tmp_path, tool, change, fragment):
    _refused_in_one_line(run, tmp_path, tool, change, fragment)


# (a process each, a few seconds: one case of each item and tool through the installed command)
COMMANDS = [0, 1, 2, 3, 7, 8, 11, 17, 19]


@pytest.mark.parametrize("case", COMMANDS, ids=[f"{CASES[i][0]}-{i}" for i in COMMANDS])
def test_the_command_says_it_in_one_line_without_a_traceback(run, tmp_path, case):
    tool, change, fragment = CASES[case]
    bad = _malformed(run, tmp_path, tool, change)
    res = _command(tool, run[0], bad, tmp_path)
    assert res.returncode == 1, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f": error: {bad}: " in lines[0] and fragment in lines[0], (fragment, lines[0])
    assert res.stdout == ""


def test_a_loaded_model_holds_the_saved_weights_exactly_and_draws_nothing(run):
    """The model of a checkpoint is built without its initialisation (on the meta device, then filled): the
    generator is left as it was, and every weight is the checkpoint's, bit for bit."""
    from nmtkit.models import build_from_checkpoint

    _, _, payload = run
    torch.manual_seed(7)
    before = torch.get_rng_state()
    model = build_from_checkpoint(payload)
    assert torch.equal(torch.get_rng_state(), before)  # (an initialisation would have drawn from it)
    own = model.state_dict()
    assert own.keys() == payload["model"].keys()
    for name, weight in payload["model"].items():
        assert own[name].device.type == "cpu" and own[name].dtype == weight.dtype, name
        assert torch.equal(own[name], weight), name


# -- a checkpoint's body, and a diverged model's weights -------------------------------------------------------------

@pytest.fixture(scope="module")
def model(small_model):
    """A checkpoint of 2 updates of the tiny RNNsearch on ``small`` (``small_model``: tests/conftest.py)."""
    return small_model


def _rewritten(model, tmp_path, change) -> Path:
    payload = checkpoint.load(model)
    change(payload)
    path = tmp_path / "bad.pt"
    torch.save(payload, path)
    return path


def test_decoding_a_diverged_model_says_so(model, tmp_path):
    def poison(p):  # (what a diverged run leaves: NaN weights)
        for name, value in p["model"].items():
            p["model"][name] = torch.full_like(value, float("nan"))

    bad = _rewritten(model, tmp_path, poison)
    res = _nmt("nmt-translate", "-m", bad, stdin="a man .\n")
    _one_line_error(res, "nmt-translate", str(bad), "the weights are not finite", "diverged")
    assert res.stdout == ""


@pytest.mark.parametrize("change, fragment", [
    (lambda p: p.update(config=[1, 2]), "malformed checkpoint: 'config' is not a dict of settings"),
    (lambda p: p["vocab"].pop("tgt"), "malformed checkpoint: 'vocab.tgt' is missing or not a list of tokens"),
    (lambda p: p["vocab"].update(src=42), "malformed checkpoint: 'vocab.src' is missing or not a list"),
    (lambda p: p.update(format_version=1) or p["vocab"].update(src="abc"),  # (version 1 had only lists)
     "malformed checkpoint: 'vocab.src' is missing or not a list"),
    (lambda p: p["vocab"].update(src="\n".join(p["vocab"]["src"][:5] + ["", "x"])),
     "malformed checkpoint: 'vocab.src'[5] is not a token without spaces ('')"),
    (lambda p: p["vocab"].update(tgt="\n".join(p["vocab"]["tgt"][:9] + ["a\tb"])),
     "malformed checkpoint: 'vocab.tgt'[9] is not a token without spaces ('a\\tb')"),
    (lambda p: p["vocab"]["src"].__setitem__(7, "two words"),
     "malformed checkpoint: 'vocab.src'[7] is not a token without spaces ('two words')"),
    (lambda p: p["preprocessing"]["src"].update(casing="odd"),
     "malformed checkpoint: 'preprocessing.src' is not understood: unknown text preprocessing setting(s): casing"),
    (lambda p: p["preprocessing"]["tgt"].update(bpe_codes=12), "'preprocessing.tgt.bpe_codes' is not the text"),
    (lambda p: p["preprocessing"]["src"].update(bpe_codes="#version: 0.2\nt h\nnot codes at all\n"),
     "'preprocessing.src.bpe_codes' are not subword-nmt codes: line 3 is not two subword units"),
    (lambda p: p["model"].update(extra="text"), "malformed checkpoint: 'model' is not a dict of named tensors"),
])
def test_a_malformed_checkpoint_body_is_one_line_naming_the_field(model, tmp_path, change, fragment):
    bad = _rewritten(model, tmp_path, change)
    with pytest.raises(InputError) as e:
        checkpoint.load(bad)
    assert str(e.value).startswith(f"{bad}: ") and fragment in str(e.value) and "\n" not in str(e.value)


def test_a_malformed_checkpoint_is_one_line_from_the_command(model, tmp_path):
    bad = _rewritten(model, tmp_path, lambda p: p["vocab"].pop("tgt"))
    _one_line_error(_nmt("nmt-translate", "-m", bad, stdin="a man .\n"), "nmt-translate", str(bad),
                    "malformed checkpoint: 'vocab.tgt' is missing or not a list of tokens")


# -- issue 57 item 7: scaled weights and vocabulary entries that are not text, for every tool that reads a checkpoint --

def _scaled(p):
    """Every weight multiplied by 9999: under WEIGHT_BOUND for this young model (its largest weight is about 0.5),
    garbage translations and alignments without a word, before."""
    sections = [p["model"]] + [p["train"][k] for k in ("raw_model", "ema") if k in p.get("train", {})]
    for weights in {id(s): s for s in sections}.values():  # (the sections may be one dict: each scaled once)
        _each(weights, lambda v: v * 9999)


def _token(side: str, i: int, text) -> callable:
    return lambda p: p["vocab"][side].__setitem__(i, text(p["vocab"][side][i]))


LOADERS = ("translate", "align", "score", "init-from", "resume")
TEXT_FAULTS = [
    (_token("src", 10, lambda t: t + "\x00"), "'vocab.src'[10] is not text: it holds a control character, U+0000"),
    (_token("tgt", 7, lambda t: "\x1b" + t), "'vocab.tgt'[7] is not text: it holds a control character, U+001B"),
    (_token("src", 12, lambda t: t + "\ud800"), "'vocab.src'[12] is not text: it holds a lone surrogate, U+D800"),
    (lambda p: p["vocab"]["src"].__setitem__(11, p["vocab"]["src"][12]), "'vocab.src' has the token"),
]


@pytest.mark.parametrize("tool", LOADERS)
@pytest.mark.parametrize("change, fragment", [(_scaled, "'model.E_src' has weights of root mean square")] + TEXT_FAULTS,
                         ids=["scaled-x9999", "nul", "escape", "surrogate", "duplicate"])
def test_each_tool_refuses_scaled_weights_and_vocabularies_that_are_not_text(run, tmp_path, tool, change, fragment):
    _refused_in_one_line(run, tmp_path, tool, change, fragment)


def _serve(bad: Path) -> subprocess.CompletedProcess:
    """nmt-serve on a port of the system's choosing: it starts listening, fails to load the model, and exits (a
    server that loads the model serves on: the timeout ends it, and the test fails)."""
    import os
    import sys

    from conftest import REPO

    return subprocess.run([sys.executable, str(REPO / "bin" / "nmt-serve"), "-m", str(bad), "--host", "127.0.0.1",
                           "--port", "0"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))


# (a process each, seconds: the command the issue saw accept it, and nmt-serve, which has no library case above)
@pytest.mark.parametrize("tool", ("align", "serve"))
def test_the_tools_say_a_scaled_checkpoint_is_not_a_model_in_one_line(run, tmp_path, tool):
    bad = _malformed(run, tmp_path, tool, _scaled)
    res = _serve(bad) if tool == "serve" else _command(tool, run[0], bad, tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, (res.returncode, res.stderr)
    last = res.stderr.strip().splitlines()[-1]  # (nmt-serve says where it listens, and uvicorn logs, first)
    assert f": error: {bad}: malformed checkpoint: 'model.E_src' has weights of root mean square" in last, last
    assert res.stdout == ""
    if tool != "serve":
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_vocabulary_entry_that_is_not_text_is_one_line_from_the_command(run, tmp_path):
    change, fragment = TEXT_FAULTS[0]  # (the NUL byte nmt-translate accepted)
    bad = _malformed(run, tmp_path, "translate", change)
    _one_line_error(_command("translate", run[0], bad, tmp_path), "nmt-translate", f"{bad}: malformed checkpoint: ",
                    fragment)


def test_what_a_real_corpus_puts_in_a_vocabulary_and_a_trained_scale_are_read(run, tmp_path):
    """Not stricter than training: DEL and C1 controls reach tokens from real text (news-test-2014's French reference
    holds U+0096), and weights ten times a trained model's are still weights."""
    def change(p):
        p["vocab"]["src"][10] += "\x96"
        p["vocab"]["tgt"][10] += "\x7f"
        _each(p["model"], lambda v: v * 10)

    payload = checkpoint.load(_malformed(run, tmp_path, "translate", change))
    assert payload["vocab"]["src"][10].endswith("\x96") and payload["vocab"]["tgt"][10].endswith("\x7f")
