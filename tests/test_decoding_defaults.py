"""A checkpoint's decoding defaults (nmtkit/translate/defaults.py): ``nmt-translate --save-defaults`` writes the
options its recipe chose into the checkpoint; nmt-translate and nmt-serve decode with them unless told otherwise, and
say so in one line; a damaged entry is one line naming the file.  Real processes, a real server on 127.0.0.1, the
tiny RNNsearch of two updates on real Multi30K pairs (its translations loop: the repeated-n-gram block shows)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, lines_of, one_line_error, run_tool
from test_serve import Server

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
# what the model is saved to decode with (the table: relative to the checkpoint, ../data/candidates.npz)
SAVED = ["--beam", "3", "--no-repeat-ngram", "2", "--source-numbers", "--all-numbers", "--lenpen", "0.5"]


def translate(*args, stdin: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*TRANSLATE, *map(str, args), "--threads", "1", "--workers", "1"], input=stdin,
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def model(small_model, small, tmp_path_factory):
    """A copy of the model in model/ (also linked as checkpoint_best.pt, as nmt-train links it) with its data's
    candidate table in data/, given its decoding defaults by ``nmt-translate --save-defaults``: (checkpoint,
    table, the saving's CompletedProcess, the original's bytes)."""
    root = tmp_path_factory.mktemp("defaults")
    (root / "model").mkdir()
    (root / "data").mkdir()
    ckpt, table = root / "model" / "checkpoint_last.pt", root / "data" / "candidates.npz"
    shutil.copyfile(small_model, ckpt)
    shutil.copyfile(small / "candidates.npz", table)
    os.link(ckpt, root / "model" / "checkpoint_best.pt")
    before = ckpt.read_bytes()
    saved = run_tool("nmt-translate", "-m", ckpt, *SAVED, "--candidates", table, "--save-defaults")
    return ckpt, table, saved, before


@pytest.fixture(scope="module")
def src(multi30k_200):
    return "".join(line + "\n" for line in lines_of(multi30k_200 / "valid.en", 4))


@pytest.fixture(scope="module")
def by_hand(model, src):
    """nmt-translate's output with the saved options given by hand, and with --beam 1 and
    --no-source-numbers over them (by hand: --all-numbers then has no meaning)."""
    ckpt, table, _, _ = model
    return {"saved": translate("-m", ckpt, "--no-defaults", *SAVED, "--candidates", table, stdin=src).stdout,
            "beam 1": translate("-m", ckpt, "--no-defaults", "--beam", "1", "--no-repeat-ngram", "2", "--lenpen",
                                "0.5", "--candidates", table, stdin=src).stdout}


def test_save_defaults_writes_them_into_the_checkpoint_and_keeps_its_links(model, small_model):
    """--save-defaults writes the options given, the table relative to the checkpoint, atomically into the file,
    whose other name (checkpoint_best.pt) still names it; the weights and the training state are untouched."""
    import torch

    from nmtkit.data import checkpoint

    ckpt, table, saved, before = model
    assert saved.returncode == 0 and saved.stdout == "", saved.stderr
    assert saved.stderr.strip() == (
        f"nmt-translate: {ckpt}: decoding defaults saved: --beam 3 --lenpen 0.5 --no-repeat-ngram 2 --source-numbers "
        "--all-numbers --candidates ../data/candidates.npz (--candidates relative to the checkpoint's directory)")
    payload = checkpoint.load(ckpt)
    assert payload["decoding_defaults"] == {"beam": 3, "no_repeat_ngram": 2, "lenpen": 0.5, "source_numbers": True,
                                            "all_numbers": True, "candidates": "../data/candidates.npz"}
    assert os.path.samefile(ckpt, ckpt.parent / "checkpoint_best.pt")
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint_best.pt", "checkpoint_last.pt"]
    original = torch.load(small_model, weights_only=True)
    assert checkpoint.differences(payload, original) == [] and payload["train"].keys() == original["train"].keys()
    assert ckpt.read_bytes() != before


def test_nmt_translate_decodes_with_them_as_with_the_options_given_by_hand(model, src, by_hand):
    ckpt, table, _, _ = model
    proc = translate("-m", ckpt, stdin=src)
    assert proc.stdout == by_hand["saved"]
    # one line says what it applied (the table where it read it from)
    said = [line for line in proc.stderr.splitlines() if "decoding defaults" in line]
    assert said == [f"nmt-translate: decoding defaults saved in {ckpt}: --beam 3 --lenpen 0.5 --no-repeat-ngram 2 "
                    f"--source-numbers --all-numbers --candidates {table}"]
    # --no-defaults: none, and it says which it left
    proc = translate("-m", ckpt, "--no-defaults", stdin=src)
    assert proc.stdout != by_hand["saved"]  # (the built-in defaults: beam 12, no block, and so on)
    assert f"saved in {ckpt} not applied (--no-defaults): --beam 3 " in proc.stderr


def test_an_option_given_wins_and_a_saved_one_against_it_is_set_aside(model, src, by_hand):
    """--beam 1 over the saved beam 3; --no-source-numbers (each switch has its off form) over the saved
    --source-numbers, which sets the saved --all-numbers aside (it needs --source-numbers): said in the line."""
    ckpt, _, _, _ = model
    proc = translate("-m", ckpt, "--beam", "1", "--no-source-numbers", stdin=src)
    assert proc.stdout == by_hand["beam 1"] != by_hand["saved"]
    (said,) = [line for line in proc.stderr.splitlines() if "decoding defaults" in line]
    assert said.startswith(f"nmt-translate: decoding defaults saved in {ckpt}: --lenpen 0.5 --no-repeat-ngram 2 "
                           "--candidates ")
    assert said.endswith("(given here instead: --beam 1 --no-source-numbers; set aside, against the options given: "
                         "--all-numbers)")


def test_nmt_serve_decodes_with_them_under_each_requests_own_settings(model, multi30k_200, by_hand):
    ckpt, table, _, _ = model
    server = Server(str(ckpt))
    try:
        server.ready()
        lines = lines_of(multi30k_200 / "valid.en", 4)
        assert [r["tgt"] + "\n" for r in server.translate(lines)] == by_hand["saved"].splitlines(keepends=True)
        got = server.translate(lines, beam=1, source_numbers=False)  # (a request's own settings win)
        assert [r["tgt"] + "\n" for r in got] == by_hand["beam 1"].splitlines(keepends=True)
        status, models, _ = server.call("/models")
        assert models["models"][0]["decoding_defaults"]["beam"] == 3
        status, schema, _ = server.call("/openapi.json")
        assert schema["components"]["schemas"]["Request"]["properties"]["beam"]["default"] == 3
    finally:
        assert server.stop() == 0
    said = [line for line in server.lines if "decoding defaults" in line]
    assert said == [f"nmt-serve: decoding defaults saved in {ckpt}: {{\"beam\": 3, \"lenpen\": 0.5, \"no_repeat_ngram\": "
                    f"2, \"source_numbers\": true, \"all_numbers\": true}} under each request's own settings; "
                    f"--candidates {table}\n"]


def _with_entry(model, tmp_path, entry):
    """A copy of the model whose decoding defaults are ``entry`` (written as a checkpoint is)."""
    from nmtkit.data import checkpoint

    import torch

    payload = torch.load(model[0], weights_only=True)
    payload["decoding_defaults"] = entry
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "model" / "damaged.pt"
    checkpoint.save(payload, path)
    return path


def test_a_damaged_entry_is_one_line_naming_the_file(model, tmp_path):
    from nmtkit.data import checkpoint
    from nmtkit.errors import InputError
    from nmtkit.translate import defaults

    bad = _with_entry(model, tmp_path, {"beam": "twelve"})
    one_line_error(run_tool("nmt-translate", "-m", bad, stdin="a dog .\n"), "nmt-translate", f"{bad}: malformed "
                   "checkpoint: 'decoding_defaults' holds a setting no decoding takes: --beam must be a whole number")
    bad = _with_entry(model, tmp_path, {"candidates": "/etc/passwd"})
    one_line_error(run_tool("nmt-serve", "-m", bad, "--port", "0"), "nmt-serve",
                   f"{bad}: malformed checkpoint: 'decoding_defaults' 'candidates' is not a file name relative to")
    # every tool's load checks its shape, as it checks the rest of the file; what it means, the tools that apply it
    for entry in ([3], {"beam": [12]}, {3: 1}):
        with pytest.raises(InputError, match="malformed checkpoint: 'decoding_defaults' is not a dict of settings"):
            checkpoint.load(_with_entry(model, tmp_path, entry))
    for entry, problem in (([3], "is not a dict of decoding options by name"),
                           ({"beam": 3, "frobnicate": 1}, "holds 'frobnicate', not a decoding option"),
                           ({"all_numbers": True}, "--all-numbers steers beam search by the source's numbers"),
                           ({"lenpen": float("nan")}, "--lenpen must be a finite number"),
                           ({"candidates": ""}, "'candidates' is not a file name")):
        with pytest.raises(InputError, match="malformed checkpoint: 'decoding_defaults' ") as e:
            defaults.read(str(_with_entry(model, tmp_path, entry)))
        assert problem in str(e.value) and str(e.value).startswith(str(tmp_path)) and "\n" not in str(e.value)


def test_a_checkpoint_moved_without_its_table_is_refused_not_decoded_without_it(model, tmp_path):
    from nmtkit.errors import InputError
    from nmtkit.translate import defaults

    moved = tmp_path / "moved.pt"
    shutil.copyfile(model[0], moved)
    with pytest.raises(InputError) as e:
        defaults.resolve(defaults.read(str(moved)), {}, str(moved))
    assert str(e.value) == (f"{moved}: its decoding defaults name the candidate table '../data/candidates.npz' "
                            f"beside it, which is not there ({tmp_path.parent / 'data' / 'candidates.npz'}): give "
                            "--candidates FILE (the candidates.npz nmt-prepare wrote for its data), or --no-defaults")
    # a table given wins, and none is looked for
    assert defaults.resolve(defaults.read(str(moved)), {"candidates": "t.npz"}, str(moved)).candidates == "t.npz"


def test_save_defaults_refuses_what_it_cannot_save_and_leaves_the_checkpoint(model, tmp_path):
    from nmtkit.errors import InputError
    from nmtkit.translate import defaults

    ckpt = tmp_path / "c.pt"
    shutil.copyfile(model[0], ckpt)
    before = ckpt.read_bytes()
    one_line_error(run_tool("nmt-translate", "-m", ckpt, "-i", "in.en", "--beam", "2", "--save-defaults"),
                   "nmt-translate", "--save-defaults saves decoding options and translates nothing: --input is not")
    for settings, problem in (({"beam": 0}, "need beam >= 1"), ({"candidates": str(tmp_path / "none.npz")},
                                                                 "no such file (candidate table)")):
        with pytest.raises(InputError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            defaults.save(str(ckpt), settings)
    assert ckpt.read_bytes() == before
    defaults.save(str(ckpt), {})  # (none: cleared)
    assert defaults.read(str(ckpt)) == {}


@pytest.mark.parametrize("saved, given, decoded, set_aside", [
    ({"beam": 3, "source_numbers": True, "all_numbers": True}, {"sampling": "topk:3"},
     {"beam": 3, "source_numbers": True, "sampling": "topk:3"}, {"all_numbers": True}),
    ({"beam": 3, "nbest": 3}, {"beam": 2}, {"beam": 2}, {"nbest": 3}),
    ({"coverage_penalty": 0.2, "seed": 4}, {"sampling": "topp:0.9"}, {"seed": 4, "sampling": "topp:0.9"},
     {"coverage_penalty": 0.2}),
    ({"source_numbers": True}, {"all_numbers": True}, {"source_numbers": True, "all_numbers": True}, {}),
    ({"beam": 6, "constrained_beam": 12, "source_numbers": True, "all_numbers": True}, {"sampling": "topk:3"},
     {"beam": 6, "source_numbers": True, "sampling": "topk:3"}, {"all_numbers": True, "constrained_beam": 12}),
    ({"beam": 6, "constrained_beam": 12}, {"beam": 16, "nbest": 16}, {"beam": 16, "nbest": 16},
     {"constrained_beam": 12}),
])
def test_a_given_setting_is_never_dropped_a_saved_one_against_it_is(saved, given, decoded, set_aside):
    from nmtkit.translate import defaults
    from nmtkit.translate.config import DecodeConfig

    got = defaults.resolve(saved, given)
    assert got.decode == DecodeConfig(**decoded) and got.set_aside == set_aside


def test_a_bad_given_setting_is_its_own_error():
    from nmtkit.errors import InputError
    from nmtkit.translate import defaults

    with pytest.raises(InputError, match=r"need beam >= 1 .*got beam 0"):
        defaults.resolve({"beam": 3, "no_repeat_ngram": 2}, {"beam": 0})
