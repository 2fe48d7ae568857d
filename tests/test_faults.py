"""Faults a careless or hostile user can cause, one test each: interruptions under every training option, two runs in
one save directory, kills between the links of a checkpoint, settings changed on resume, diverged models.

Kills at exact points come from a hook the code under test calls (a monkeypatched function that SIGKILLs its own
process), run in a subprocess.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.train.trainer import TrainConfig, Trainer, train

from conftest import head_lines, train_cfg

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def other_pairs(data_dir, tmp_path_factory, small):
    """Other Multi30K pairs with ``small``'s vocabularies (the prepared files swapped in): other data, same vocab."""
    import shutil

    root = tmp_path_factory.mktemp("other-pairs")
    for lang in ("en", "fr"):
        with open(data_dir / "multi30k" / f"train.{lang}", encoding="utf-8") as f:
            (root / f"train.{lang}").write_text("".join(itertools.islice(f, 200, 380)), encoding="utf-8")
        head_lines(data_dir / "multi30k" / f"val.{lang}", root / f"valid.{lang}", 20)
    built = root / "built"
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(built), valid=str(root / "valid"),
                          src_vocab_size=120, tgt_vocab_size=130, bpe_merges=150))
    dest = root / "data"
    shutil.copytree(small, dest)
    for name in os.listdir(built):
        if name.startswith("train.") and (name.endswith(".bin") or name.endswith(".idx")):
            shutil.copyfile(built / name, dest / name)
    return dest


def _cfg(data, save_dir, **kw) -> TrainConfig:
    return train_cfg(data, save_dir, **{"valid_every": 2, **kw})  # (``small``: tests/conftest.py)


def _records(run) -> list[dict]:
    with open(Path(run) / "train.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _comparable(records: list[dict]) -> list[dict]:
    """A log's records without what depends on the clock (an interruption's validation is no longer in it)."""
    clock = ("elapsed", "tgt_tokens_per_s")
    return [{k: v for k, v in r.items() if k not in clock} for r in records]


def _same_weights(a_path, b_path) -> None:
    a, b = checkpoint.load(a_path), checkpoint.load(b_path)
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


# -- resume equals an uninterrupted run, under every option ------------------------------------------------------

# (options, update of the interruption, --max-updates): the interruption is a --max-updates limit, then --resume
RESUME_CASES = {
    # BLEU on 4 sentences of a tiny model stays 0: every validation after the first is "bad", so patience stops
    # the run at update 8; the interruption's own validation at 3 must not count toward it
    "patience-bleu": (dict(patience=3, best_metric="bleu"), 3, 40),
    "patience-bleu-at-a-validation": (dict(patience=3, best_metric="bleu"), 4, 40),  # (a control: no extra one)
    "patience-loss": (dict(patience=2, best_metric="loss", lr_scheduler="plateau", lr_patience=1), 5, 12),
    "keep-last-1": (dict(keep_last=1, patience=2), 3, 40),
    "log-every-3": (dict(log_every=3), 4, 10),
    "max-epochs": (dict(max_epochs=1, valid_every=5), 7, 40),
    "dropout": (dict(model_options={"dropout": 0.3}, patience=3), 5, 40),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_equals_uninterrupted_under_every_option(small, tmp_path, case):
    options, stop, total = RESUME_CASES[case]
    straight = train(_cfg(small, tmp_path / "A", max_updates=total, **options))
    if options.get("best_metric") == "bleu":
        assert straight["status"] == "early-stopped" and straight["update"] < total, straight["update"]
    assert stop < straight["update"]

    first = train(_cfg(small, tmp_path / "B", max_updates=stop, **options))
    assert first["update"] == stop
    second = train(_cfg(small, tmp_path / "B", max_updates=total, resume=True, **options))
    assert (second["status"], second["update"]) == (straight["status"], straight["update"])
    assert second["best_update"] == straight["best_update"]
    _same_weights(tmp_path / "A" / "checkpoint_last.pt", tmp_path / "B" / "checkpoint_last.pt")
    _same_weights(tmp_path / "A" / "checkpoint_best.pt", tmp_path / "B" / "checkpoint_best.pt")
    a, b = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt"), checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    for key in ("best", "best_update", "bad_validations", "epoch", "batch_in_epoch"):
        assert a["train"]["state"][key] == b["train"]["state"][key], key
    assert a["train"]["schedule"] == b["train"]["schedule"]
    # the logs read alike: no repeated record, the same training figures (the log window survives the resume)
    assert _comparable(_records(tmp_path / "A")) == _comparable(_records(tmp_path / "B"))
    assert _comparable(a["train"]["state"]["history"]) == _comparable(b["train"]["state"]["history"])
    numbered = [sorted(p.name for p in (tmp_path / x).glob("checkpoint[0-9]*.pt")) for x in "AB"]
    assert numbered[0] == numbered[1]  # the same checkpoints kept (the interruption's went)


def test_resume_under_max_time_counts_the_time_already_trained(small, tmp_path):
    """--max-time is a budget of the whole run: the resumed part gets only what the interrupted part left."""
    first = train(_cfg(small, tmp_path / "run", max_updates=6, max_time=3600))
    assert first["update"] == 6
    spent = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["train"]["state"]["elapsed"]
    assert spent > 0
    budget = spent * 1.5  # about three more updates' worth
    second = train(_cfg(small, tmp_path / "run", max_time=budget, resume=True))
    state = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["train"]["state"]
    assert 6 < second["update"] < 40 and state["elapsed"] >= budget
    # and the updates it made are those of an uninterrupted run
    straight = train(_cfg(small, tmp_path / "straight", max_updates=second["update"]))
    _same_weights(tmp_path / "straight" / "checkpoint_last.pt", tmp_path / "run" / "checkpoint_last.pt")
    assert straight["update"] == second["update"]


def test_records_written_after_the_checkpoint_are_dropped_on_resume(small, tmp_path):
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=4))
    with open(run / "train.jsonl", "a", encoding="utf-8") as f:  # what a kill after update 4's checkpoint leaves
        f.write(json.dumps({"type": "train", "update": 5, "loss": 1.0}) + "\n")
        f.write('{"type": "train", "upd')  # torn
    train(_cfg(small, run, max_updates=6, resume=True))
    updates = [r["update"] for r in _records(run) if r["type"] == "train"]
    assert updates == [1, 2, 3, 4, 5, 6]


# -- one run per save directory ----------------------------------------------------------------------------------

def test_a_second_run_in_the_same_save_dir_is_refused(small, tmp_path):
    holder = Trainer(_cfg(small, tmp_path / "run", max_updates=2))
    try:
        with pytest.raises(InputError, match=rf"another nmt-train \(pid {os.getpid()}\) is using this save"):
            Trainer(_cfg(small, tmp_path / "run", max_updates=2, force=True))
        holder.train()  # (it releases the lock when it ends) ...
        summary = Trainer(_cfg(small, tmp_path / "run", max_updates=4, resume=True)).train()  # ... so this one runs
        assert summary["update"] == 4
    finally:
        holder.rundir.unlock()


def test_a_second_nmt_train_process_is_refused_while_the_first_runs(small, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    first = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-train"), str(small), "-a", "rnnsearch-tiny",
                              "--save-dir", str(run), "--max-updates", "100000", "--batch-size", "16",
                              "--valid-every", "1000", "--log-every", "1", "--threads", "1", "-q"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # until it holds the lock and has trained
            if (run / "train.jsonl").exists() and (run / "train.jsonl").stat().st_size:
                break
            assert first.poll() is None, first.communicate()
            import time

            time.sleep(0.1)
        second = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-train"), str(small), "-a",
                                 "rnnsearch-tiny", "--save-dir", str(run), "--resume", "--max-updates", "3", "-q"],
                                env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == [
            f"nmt-train: error: {run}: another nmt-train (pid {first.pid}) is using this save directory; wait for it "
            "to finish or choose another --save-dir"]
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 130  # it was not disturbed: it saved and stopped on SIGTERM


def test_a_second_run_writing_the_same_log_file_is_refused_while_the_first_writes_it(small, tmp_path):
    """Two runs of other save directories naming one --log-file: the second would empty the first's log and write
    its records among the first's (NUL bytes where the first's appends land past the new end).  The first here is
    a run's log as nmt-train opens it (TrainLog), held by this process."""
    from nmtkit.train.trainlog import TrainLog

    log = tmp_path / "shared.jsonl"
    first = TrainLog(str(log), None, None)
    try:
        first.record({"type": "train", "update": 1})
        second = _nmt("nmt-train", small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "second", "--log-file",
                      log, "--max-updates", "2", "--threads", "1", "-q")
        _one_line_error(second, "nmt-train", f"{log}: another nmt-train (pid {os.getpid()}) is writing this training "
                                             "log; give each run its own --log-file (or wait for the other to finish)")
        assert log.read_text(encoding="utf-8") == '{"type": "train", "update": 1}\n'  # (not emptied)
        assert not list((tmp_path / "second").glob("checkpoint*.pt"))
    finally:
        first.close()
    train(_cfg(small, tmp_path / "second", max_updates=1, log_file=str(log)))  # free once closed: a new run's log
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [(r["type"], r["update"]) for r in records] == [("train", 1), ("valid", 1)]


# -- the best checkpoint survives a kill at any instant ----------------------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys
    from nmtkit.data import checkpoint
    from nmtkit.train import rundir
    from nmtkit.train.trainer import TrainConfig, train

    target, update = sys.argv[2], int(sys.argv[3])
    link = checkpoint.link

    def link_then_die(src, dst):
        link(src, dst)
        if os.path.basename(dst) == target and os.path.basename(src) == f"checkpoint{update}.pt":
            os.kill(os.getpid(), signal.SIGKILL)

    rundir.checkpoint.link = link_then_die
    cfg = TrainConfig(**__import__("json").loads(sys.argv[1]))
    train(cfg)
""")


@pytest.mark.parametrize("target", ["checkpoint_best.pt", "checkpoint_last.pt"])
def test_the_best_checkpoint_survives_a_kill_after_either_link(small, tmp_path, target):
    """BLEU on 4 sentences of a tiny model stays 0: the first validation's checkpoint (update 2) stays the best of
    the run.  A kill right after either of its two links, then resuming with keep-last 1 (which deletes
    checkpoint2.pt), must end with checkpoint_best.pt holding the weights of update 2 (as the uninterrupted run's)."""
    options = dict(best_metric="bleu", keep_last=1)

    def run_in_subprocess(run, kill_after: str, resume: bool = False):  # (all runs alike: the tests' speed paths
        cfg = json.dumps({**_cfg(small, run, max_updates=6, resume=resume, **options).__dict__})  # are not theirs)
        return subprocess.run([sys.executable, "-c", KILLER, cfg, kill_after, "2"], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)

    assert run_in_subprocess(tmp_path / "A", "none").returncode == 0
    straight = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")["train"]["state"]
    assert straight["best_update"] == 2 and straight["update"] == 6
    run = tmp_path / "B"
    killed = run_in_subprocess(run, target)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (run / "checkpoint4.pt").exists()
    resumed = run_in_subprocess(run, "none", resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]["best_update"] == 2
    assert not (run / "checkpoint2.pt").exists()  # (keep-last 1: only checkpoint_best.pt holds update 2 now)
    best = checkpoint.load(run / "checkpoint_best.pt")
    assert best["train"]["state"]["update"] == 2
    _same_weights(tmp_path / "A" / "checkpoint_best.pt", run / "checkpoint_best.pt")


def test_resume_relinks_a_best_checkpoint_left_behind(small, tmp_path):
    """What an older nmtkit could leave: checkpoint_last.pt linked to the new best, checkpoint_best.pt still at the
    one before.  The resume relinks it before keep-last could delete the only other name of the best."""
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=4, best_metric="loss", keep_last=5, valid_bleu_sentences=0))
    state = checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]
    assert state["best_saved_update"] == 4
    checkpoint.link(run / "checkpoint2.pt", run / "checkpoint_best.pt")
    train(_cfg(small, run, max_updates=4, best_metric="loss", keep_last=5, valid_bleu_sentences=0, resume=True))
    assert os.path.samefile(run / "checkpoint_best.pt", run / "checkpoint4.pt")


# -- settings that a resume must not ignore ----------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(arch="rnnsearch-small"), r"the model asked for differs from the checkpoint's \(.*emb_dim 32 -> 256"),
    (dict(model_options={"hidden_dim": 64}), r"differs from the checkpoint's \(hidden_dim 48 -> 64\)"),
    (dict(model_options={"dropout": 0.1}), r"differs from the checkpoint's \(dropout 0.0 -> 0.1\)"),
])
def test_resume_refuses_another_model(small, tmp_path, change, message):
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=2))
    with pytest.raises(InputError, match=message):
        Trainer(_cfg(small, run, max_updates=4, resume=True, **change))


def test_resume_refuses_other_data_with_the_same_vocabulary(small, other_pairs, tmp_path):
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=2))
    with pytest.raises(InputError, match=r"the training data differs from the checkpoint's run \(\d+ pairs, [\d,]+/[\d,]+ tokens then; \d+ pairs"):
        Trainer(_cfg(other_pairs, run, max_updates=4, resume=True))


def test_resume_logs_the_settings_that_may_change(small, tmp_path, caplog):
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=2))
    with caplog.at_level("INFO", logger="nmtkit.train"):
        train(_cfg(small, run, max_updates=4, patience=5, log_every=2, resume=True))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("resuming with "))
    assert "--max-updates 2 -> 4" in line and "--patience 0 -> 5" in line and "--log-every 1 -> 2" in line


# -- diverged models ---------------------------------------------------------------------------------------------

def test_training_stops_at_the_first_non_finite_loss_and_saves_nothing(small, tmp_path, monkeypatch):
    from nmtkit.errors import DivergedError
    from nmtkit.models import rnnsearch

    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=4))
    before = {p.name: p.stat().st_mtime_ns for p in run.glob("checkpoint*.pt")}
    trainer = Trainer(_cfg(small, run, max_updates=8, resume=True))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    real = rnnsearch.RNNsearch.training_loss
    calls = []

    def poisoned(self, *args):  # the loss of update 6 becomes NaN, as a diverging run's does
        loss, nll = real(self, *args)
        calls.append(1)
        return (loss * float("nan"), nll * float("nan")) if len(calls) == 2 else (loss, nll)

    monkeypatch.setattr(rnnsearch.RNNsearch, "training_loss", poisoned)
    with pytest.raises(DivergedError, match=r"training diverged at update 6: the loss nan is not finite; the "
                                            r"weights were not updated and no checkpoint was written"):
        trainer.train()
    assert {p.name: p.stat().st_mtime_ns for p in run.glob("checkpoint*.pt")} == before
    assert max(r["update"] for r in _records(run)) == 5
    # update 5 was applied, update 6 was not: the weights are update 5's, all finite
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert any(not torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())


def _nmt(tool: str, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bin" / tool), *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))


def _one_line_error(res: subprocess.CompletedProcess, tool: str, *fragments: str) -> str:
    assert res.returncode == 1, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), res.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def model(small, tmp_path_factory):
    """A checkpoint of 2 updates of the tiny RNNsearch on ``small``."""
    run = tmp_path_factory.mktemp("model")
    train(_cfg(small, run, max_updates=2, valid_bleu_sentences=0))
    return run / "checkpoint_last.pt"


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


# -- options and outputs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["-o", "{t}/x.fr", "--scores", "{t}/x.fr"], "--scores names the same file as the output --output"),
    (["-o", "{t}/x.fr", "--alignments", "{t}/./x.fr"], "--alignments names the same file as the output --output"),
    (["-i", "{t}/in.en", "-o", "{t}/in.en"], "--output names the same file as the input --input"),
    (["--nbest", "2", "--beam", "2", "--nbest-file", "-", "--scores", "-"],
     "standard output: --scores names the same file as the output --nbest-file"),
    (["-o", "{t}/missing/dir/x.fr"], "{t}/missing/dir/x.fr"),
    (["--window", "-3"], "--window must be at least 1 line (got -3"),
])
def test_translate_refuses_bad_options_in_one_line(model, tmp_path, args, fragment):
    (tmp_path / "in.en").write_text("a man .\n", encoding="utf-8")
    args = [a.replace("{t}", str(tmp_path)) for a in args]
    if "-i" not in args:
        args += ["-i", str(tmp_path / "in.en")]
    res = _nmt("nmt-translate", "-m", model, *args)
    _one_line_error(res, "nmt-translate", fragment.replace("{t}", str(tmp_path)))
    assert (tmp_path / "in.en").read_text(encoding="utf-8") == "a man .\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en"]


@pytest.mark.parametrize("options, fragment", [
    (dict(window=-3), "--window must be at least 1 line (got -3"),
    (dict(device="bogus"), "--device 'bogus' is not a device"),
    (dict(device="cuda:7"), "--device cuda:7: "),
    (dict(decode=dict(lenpen=float("nan"))), "--lenpen must be a finite number of at least 0 (got nan)"),
    (dict(decode=dict(max_len_a=-1.0)), "--max-len-a must be a finite number of at least 0 (got -1.0)"),
    (dict(decode=dict(beam=2, nbest=3)), "need beam >= 1 and 1 <= nbest <= beam (got beam 2, nbest 3)"),
])
def test_translator_refuses_bad_settings(model, options, fragment):
    """Bad settings of the translator, and of its decoding (checked as the DecodeConfig is built)."""
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.translator import Translator

    options = dict(options)
    with pytest.raises(InputError, match=re.escape(fragment)):
        decode = DecodeConfig(**options.pop("decode", {}))
        Translator([str(model)], decode, workers=1, **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the error is for machines without it")
def test_cuda_on_a_machine_without_cuda_is_one_line(model, small, tmp_path):
    _one_line_error(_nmt("nmt-translate", "-m", model, "--device", "cuda", stdin="a man .\n"), "nmt-translate",
                    "--device cuda: this machine has no usable CUDA device")
    _one_line_error(_nmt("nmt-train", small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "r", "--device",
                         "cuda"), "nmt-train", "--device cuda: this machine has no usable CUDA device")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("options, fragment", [
    (dict(device="bogus"), "--device 'bogus' is not a device"),
    (dict(lr=float("nan")), "--lr must be finite and at least 0 (got nan)"),
    (dict(lr=-1.0), "--lr must be finite and at least 0 (got -1.0)"),
    (dict(clip_norm=float("inf")), "--clip-norm must be finite and at least 0"),
    (dict(max_time=-5.0), "--max-time must be finite and at least 0"),
    (dict(patience=-1), "--patience must be at least 0"),
    (dict(rho=1.0), "--rho must be in (0, 1)"),
    (dict(eps=0.0), "--eps must be a finite number above 0"),
    (dict(update_freq=0), "--update-freq must be at least 1"),
    (dict(valid_bleu_sentences=-2), "--valid-bleu-sentences must be at least -1"),
])
def test_training_refuses_bad_settings(small, tmp_path, options, fragment):
    with pytest.raises(InputError, match=re.escape(fragment)):
        Trainer(_cfg(small, tmp_path / "run", max_updates=1, **options))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--lr", "nan"], "--lr must be finite and at least 0 (got nan)"),
    (["--log-file", "{t}/missing/dir/log"], "{t}/missing/dir/log: cannot write the training log"),
])
def test_train_refuses_bad_options_in_one_line(small, tmp_path, args, fragment):
    args = [a.replace("{t}", str(tmp_path)) for a in args]
    res = _nmt("nmt-train", small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--max-updates", "1",
               "--threads", "1", *args)
    _one_line_error(res, "nmt-train", fragment.replace("{t}", str(tmp_path)))
    assert not list((tmp_path / "run").glob("checkpoint*.pt"))


def test_a_plain_text_file_named_sgm_is_an_error(tmp_path):
    from nmtkit.files import read_segments

    plain = tmp_path / "news.en.sgm"
    plain.write_text("A plain line .\nAnother one .\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"news.en.sgm: read as WMT SGML \(by its name or header\) but none of its "
                                         r"2 line\(s\) holds a <seg> element"):
        list(read_segments(plain))


# -- damaged prepared data, caught when it is opened -------------------------------------------------------------

def _damage_manifest(d, edit):
    manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    edit(manifest)
    (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _drop_vocab_line(d):
    lines = (d / "vocab.fr").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "vocab.fr").write_text("".join(lines[:10] + lines[11:]), encoding="utf-8")


def _poke_bin(d):  # the 5th id of train.fr becomes 60000 (the vocabulary has 134 entries)
    import numpy as np

    data = np.fromfile(d / "train.fr.bin", dtype="<u2")
    data[4] = 60000
    data.tofile(d / "train.fr.bin")


def _poke_idx(d, which: str):
    import struct

    import numpy as np

    raw = bytearray((d / "train.en.idx").read_bytes())
    n = struct.unpack_from("<Q", raw, 16)[0]
    if which == "offsets":  # offsets 2 and 3 swapped: not monotonic
        offsets = np.frombuffer(bytes(raw[24: 24 + 8 * (n + 1)]), dtype="<i8").copy()
        offsets[[2, 3]] = offsets[[3, 2]]
        raw[24: 24 + 8 * (n + 1)] = offsets.tobytes()
    else:  # the length of sentence 3 negative
        start = 24 + 8 * (n + 1) + 4 * 2
        raw[start: start + 4] = struct.pack("<i", -4)
    (d / "train.en.idx").write_bytes(bytes(raw))


def _valid_corpus(d, sentences):  # the valid split's source side replaced (as a directory prepared earlier may have)
    from nmtkit.data.corpus import CorpusWriter

    with CorpusWriter(d / "valid.en", "uint16") as w:
        for n in sentences:
            w.add([5] * n)


@pytest.mark.parametrize("damage, where, fragment", [
    (lambda d: _damage_manifest(d, lambda m: m["preprocessing"]["en"].update(stemming=True)), "manifest.json",
     "malformed manifest: 'preprocessing.en' is not understood: unknown text preprocessing setting(s): stemming"),
    (lambda d: (d / "bpe.codes").write_text("#version: 0.2\nt h\nth e the\n", encoding="utf-8"), "bpe.codes",
     "damaged BPE codes: line 3 is not two subword units separated by a space ('th e the')"),
    (lambda d: _valid_corpus(d, []), "valid.en.idx", "the validation set has no sentence: it needs at least one pair"),
    (lambda d: _valid_corpus(d, [3, 1001, 2]), "valid.en.idx",
     "sentence 2 of the validation set has 1,001 model tokens, more than the 1,000 a pair scored whole may have"),
    (lambda d: _damage_manifest(d, lambda m: m.pop("vocab")), "manifest.json",
     "malformed manifest: 'vocab' is missing or not a dict"),
    (lambda d: _damage_manifest(d, lambda m: m.update(source_lang="de")), "manifest.json",
     "malformed manifest: 'vocab' has no entry for 'de', a language the manifest names (it has: en, fr)"),
    (_drop_vocab_line, "vocab.fr", "holds 133 entries, the manifest says 134 (a line lost or added"),
    (_poke_bin, "train.fr.bin", "sentence 1 holds token id 60000, but the vocabulary has 134 entries"),
    (lambda d: _poke_idx(d, "offsets"), "train.en.idx",
     "index offsets are not the running sum of the sentence lengths (from sentence 2 on): corrupt"),
    (lambda d: _poke_idx(d, "length"), "train.en.idx", "index gives sentence 3 a negative length (-4): corrupt"),
], ids=["unknown-preprocessing-setting", "bpe-codes", "valid-empty", "valid-too-long", "manifest-no-vocab",
        "manifest-other-language", "vocab-line-missing", "bin-id-too-large",
        "idx-offsets", "idx-negative-length"])
def test_damaged_prepared_data_is_refused_when_opened(small, tmp_path, damage, where, fragment):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    damage(data)
    with pytest.raises(InputError) as e:
        Trainer(_cfg(data, tmp_path / "run", max_updates=1))
    line = str(e.value)
    assert fragment in line and (str(data / where) in line or (where == "manifest.json" and str(data) in line)), line
    assert not list((tmp_path / "run").glob("checkpoint*.pt"))


def test_damaged_prepared_data_is_one_line_from_the_command(small, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    _poke_bin(data)
    res = _nmt("nmt-train", data, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--max-updates", "1",
               "--threads", "1")
    _one_line_error(res, "nmt-train", f"{data / 'train.fr.bin'}: sentence 1 holds token id 60000")


def test_damaged_preprocessing_is_refused_before_training_not_after(small, tmp_path):
    """Found only when a checkpoint is saved, an unknown setting was a traceback at the first save (and damaged BPE
    codes trained to the end, for nmt-translate to refuse every checkpoint)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    _damage_manifest(data, lambda m: m["preprocessing"]["en"].update(stemming=True))
    res = _nmt("nmt-train", data, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--max-updates", "2",
               "--valid-every", "1", "--valid-bleu-sentences", "0", "--threads", "1")
    _one_line_error(res, "nmt-train", f"{data / 'manifest.json'}: malformed manifest: 'preprocessing.en' is not "
                                      "understood: unknown text preprocessing setting(s): stemming")
    assert not (tmp_path / "run").exists()


# -- streaming: a pipeline that waits for each translation gets it --------------------------------------------------

def test_windows_give_what_has_arrived_when_the_input_stalls():
    import time

    from nmtkit.streaming import windows

    def slow():  # 3 lines at once, a pause, 2 lines, a pause, 1 line
        yield from (1, 2, 3)
        time.sleep(0.5)
        yield from (4, 5)
        time.sleep(0.5)
        yield 6

    assert list(windows(slow(), 10)) == [([1, 2, 3], True), ([4, 5], True), ([6], True)]
    assert list(windows(range(7), 3)) == [([0, 1, 2], False), ([3, 4, 5], False), ([6], True)]
    assert list(windows([], 3)) == []


def test_windows_raise_an_input_error_in_order():
    from nmtkit.streaming import windows

    def bad():
        yield from (1, 2)
        raise InputError("bad line", "in.txt", 3)

    got = []
    with pytest.raises(InputError, match="in.txt:3: bad line"):
        for window, _ in windows(bad(), 2):
            got.extend(window)
    assert got == [1, 2]


@pytest.mark.parametrize("options", [[], ["--workers", "2", "--window", "1"], ["--workers", "1"]],
                         ids=["defaults", "two-workers-window-1", "one-worker"])
def test_each_translation_comes_out_before_the_next_line_is_written(model, options):
    """A slow writer: one line, then nothing until its translation has been read.  Today's default reads a whole
    window (or waits for the next line) before translating anything: the first read times out."""
    import select

    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model), "--threads", "2",
                             *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        got = []
        for line in (b"a man is walking .\n", b"two dogs play in the snow .\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)  # (start-up included: workers load torch)
            assert ready, f"no translation of line {len(got) + 1} within 120 s while the writer waits for it"
            got.append(proc.stdout.readline())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert rest == b"" and len(got) == 2 and all(x.endswith(b"\n") for x in got)


# -- a full disk ---------------------------------------------------------------------------------------------------

def _with_file_size_limit(limit: int):
    """A preexec_fn: files of this process may not grow past ``limit`` bytes (the kernel's EFBIG, as a full disk's
    ENOSPC: the write fails; SIGXFSZ ignored so that it is an error, not a kill)."""
    def apply():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _nmt_limited(tool: str, limit: int, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bin" / tool), *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300, preexec_fn=_with_file_size_limit(limit),
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))


def _hidden(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if p.name.startswith("."))


def test_a_full_disk_in_translate_is_one_line_and_leaves_nothing(model, tmp_path):
    text = "".join(f"a man is walking number {i} .\n" for i in range(60))
    res = _nmt_limited("nmt-translate", 200, "-m", model, "-o", tmp_path / "out.fr", stdin=text)
    _one_line_error(res, "nmt-translate", f"{tmp_path / 'out.fr'}: cannot write: file too large; nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_stdout_to_dev_full_is_one_line(model):
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model)],
                             input="a man .\n", stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    _one_line_error(res, "nmt-translate", "standard output: cannot write: no space left on device")


def test_a_full_disk_in_prepare_is_one_line_and_leaves_nothing(data_dir, tmp_path):
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"train.{lang}", 300)
    res = _nmt_limited("nmt-prepare", 4000, "-s", "en", "-t", "fr", "--train", tmp_path / "train",
                       "--dest", tmp_path / "out" / "data", "--src-vocab-size", "100", "--tgt-vocab-size", "100")
    # (the destination the user named, not "standard output": a write error of a file carries no name)
    assert _one_line_error(res, "nmt-prepare") == (f"nmt-prepare: error: {tmp_path / 'out' / 'data'}: cannot write: "
                                                   "file too large; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.en", "train.fr"]


def test_a_full_disk_in_a_checkpoint_save_is_one_line_and_keeps_the_last_good_one(small, tmp_path):
    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=2, valid_bleu_sentences=0))
    before = {p.name: p.stat().st_ino for p in run.iterdir()}
    size = (run / "checkpoint2.pt").stat().st_size
    res = _nmt_limited("nmt-train", size // 2, small, "-a", "rnnsearch-tiny", "--save-dir", run, "--resume",
                       "--max-updates", "4", "--valid-every", "2", "--batch-size", "16", "--pool-batches", "2",
                       "--valid-bleu-sentences",
                       "0", "--threads", "1", "-q")
    _one_line_error(res, "nmt-train", "checkpoint4.pt: cannot write the checkpoint", "the earlier checkpoints "
                    "are intact")
    after = {p.name: p.stat().st_ino for p in run.iterdir() if p.name != "train.jsonl"}
    assert after == {k: v for k, v in before.items() if k != "train.jsonl"}
    assert _hidden(run) == []
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]["update"] == 2


# -- leftovers of kills ------------------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_killed_translation_leaves_a_temporary_that_the_next_run_removes(model, tmp_path):
    import time

    out = tmp_path / "out.fr"
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model), "-o", str(out),
                             "--workers", "1"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    proc.stdin.write(b"a man .\n")
    proc.stdin.flush()
    for _ in range(1200):
        if _hidden(tmp_path):
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    left = _hidden(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.fr.") and left[0].endswith(f".{proc.pid}.tmp"), left
    # a live process's temporary of the same output is never touched
    live = subprocess.Popen(["sleep", "60"])
    (tmp_path / f".out.fr.abcd1234.{live.pid}.tmp").write_text("a live run's", encoding="utf-8")
    try:
        res = _nmt("nmt-translate", "-m", model, "-o", out, stdin="a man .\n")
        assert res.returncode == 0, res.stderr
        assert f"removed {tmp_path / left[0]}, a temporary left by a killed run (pid {proc.pid})" in res.stderr
        assert _hidden(tmp_path) == [f".out.fr.abcd1234.{live.pid}.tmp"]
    finally:
        live.kill()
        live.wait()
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1


def test_a_killed_prepare_leaves_a_directory_that_the_next_run_removes(data_dir, tmp_path):
    import time

    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"train.{lang}", 3000)
    args = [sys.executable, str(REPO / "bin" / "nmt-prepare"), "-s", "en", "-t", "fr", "--train",
            str(tmp_path / "train"), "--dest", str(tmp_path / "data"), "--src-vocab-size", "100",
            "--tgt-vocab-size", "100", "--bpe-merges", "400"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, env=env)
    for _ in range(2400):
        if any(n.startswith(".data.") for n in _hidden(tmp_path)) or proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    left = [n for n in _hidden(tmp_path) if n.startswith(".data.")]
    assert left and left[0].endswith(f".{proc.pid}.tmp"), left
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"removed {tmp_path / left[0]}, a temporary left by a killed run (pid {proc.pid})" in res.stderr
    assert _hidden(tmp_path) == [] and (tmp_path / "data" / "manifest.json").is_file()


def test_force_replaces_in_one_step_and_keeps_a_symlink(small, tmp_path):
    from nmtkit.files import atomic_dir

    target = tmp_path / "real"
    target.mkdir()
    (target / "marker").write_text("old", encoding="utf-8")
    (tmp_path / "link").symlink_to(target)
    with atomic_dir(tmp_path / "link", force=True, marker="marker") as d:
        Path(d, "marker").write_text("new", encoding="utf-8")
    assert (tmp_path / "link").is_symlink() and (target / "marker").read_text(encoding="utf-8") == "new"
    assert _hidden(tmp_path) == []


def test_an_output_caught_between_two_renames_is_restored(tmp_path):
    """What a kill between the two renames of a replacement leaves (where no RENAME_EXCHANGE exists): the old
    output under .NAME.XXXX.PID.old and no NAME.  The next run puts it back before anything else."""
    from nmtkit.files import atomic_dir

    old = tmp_path / f".out.k3j2.{_dead_pid()}.old"
    old.mkdir()
    (old / "marker").write_text("old", encoding="utf-8")
    with pytest.raises(InputError, match="already holds an earlier output; use --force"):
        with atomic_dir(tmp_path / "out", marker="marker"):
            pass
    assert (tmp_path / "out" / "marker").read_text(encoding="utf-8") == "old" and _hidden(tmp_path) == []


def test_a_kill_during_a_checkpoint_save_leaves_a_temporary_that_resume_removes(small, tmp_path):
    run = tmp_path / "run"
    script = textwrap.dedent("""
        import os, signal, sys, torch
        from nmtkit.train.trainer import TrainConfig, train
        save = torch.save
        def save_then_die(obj, f, *a, **k):
            save(obj, f, *a, **k)
            if obj["train"]["state"]["update"] == 4:
                os.kill(os.getpid(), signal.SIGKILL)
        torch.save = save_then_die
        train(TrainConfig(**__import__("json").loads(sys.argv[1])))
    """)
    cfg = json.dumps({**_cfg(small, run, max_updates=6, valid_bleu_sentences=0).__dict__})
    killed = subprocess.run([sys.executable, "-c", script, cfg], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = [n for n in _hidden(run) if n.startswith(".checkpoint4.pt.")]
    assert len(left) == 1, _hidden(run)
    resumed = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-train"), str(small), "-a", "rnnsearch-tiny",
                              "--save-dir", str(run), "--resume", "--max-updates", "6", "--valid-every", "2",
                              "--batch-size", "16", "--pool-batches", "2", "--valid-bleu-sentences", "0",
                              "--threads", "1"], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"removed {run / left[0]}, a temporary left by a killed run" in resumed.stderr
    assert _hidden(run) == []


def test_a_reader_that_closes_stdout_ends_translation_quietly(model, tmp_path):
    """``nmt-translate ... | head -1``: the closed pipe is a normal end (exit 0, nothing on stderr)."""
    source = tmp_path / "in.en"
    source.write_text("".join(f"a man is walking number {i} .\n" for i in range(3000)), encoding="utf-8")
    res = subprocess.run(f"'{sys.executable}' '{REPO / 'bin' / 'nmt-translate'}' -m '{model}' -i '{source}' "
                         "| head -1; exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    assert (res.returncode, res.stderr, len(res.stdout.splitlines())) == (0, "", 1), res.stderr


def test_a_resumed_torchrun_equals_an_uninterrupted_one(small, tmp_path):
    """Two processes of data parallelism, interrupted at update 3 (a --max-updates limit, off the validation
    schedule) and resumed to 6, against the same two processes run straight to 6."""
    import socket

    def torchrun(run, *extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                              "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
                              str(REPO / "bin" / "nmt-train"), str(small), "-a", "rnnsearch-tiny", "--save-dir",
                              str(run), "--batch-size", "15", "--pool-batches", "2", "--valid-every", "2",
                              "--valid-bleu-sentences", "4", "--patience", "3", "-o", "dropout=0.2", "--threads",
                              "1", *extra], capture_output=True, text=True, timeout=300,
                             env=dict(env, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
        assert res.returncode == 0, res.stderr[-3000:]

    torchrun(tmp_path / "A", "--max-updates", "6")
    torchrun(tmp_path / "B", "--max-updates", "3")
    torchrun(tmp_path / "B", "--max-updates", "6", "--resume")
    _same_weights(tmp_path / "A" / "checkpoint_last.pt", tmp_path / "B" / "checkpoint_last.pt")
    a, b = (checkpoint.load(tmp_path / x / "checkpoint_last.pt")["train"] for x in ("A", "B"))
    for key in ("update", "best", "best_update", "bad_validations"):
        assert a["state"][key] == b["state"][key], key


def test_resuming_an_early_stopped_run_trains_no_further(small, tmp_path):
    """A kill after the early stop's checkpoint was saved, then --resume: the run had ended (found by the soak,
    tests/bench/soak_resume.py: the resumed run trained on to --max-updates)."""
    run = tmp_path / "run"
    first = train(_cfg(small, run, max_updates=40, patience=3, best_metric="bleu"))
    assert first["status"] == "early-stopped" and first["update"] < 40
    before = checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]
    again = train(_cfg(small, run, max_updates=40, patience=3, best_metric="bleu", resume=True))
    assert (again["status"], again["update"]) == ("early-stopped", first["update"])
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["state"] == before
    more = train(_cfg(small, run, max_updates=first["update"] + 2, patience=10, best_metric="bleu", resume=True))
    assert more["update"] == first["update"] + 2  # (a larger patience continues it)
