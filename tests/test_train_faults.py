"""nmt-train's faults, one test each: interruptions under every training option (a resumed run equals the
uninterrupted one), two runs in one save directory or writing one log file, kills between the links of a checkpoint
and during its save, settings changed on resume, a diverged model, bad settings and options, a full disk at a
checkpoint, a resumed torchrun, and resuming a run that had stopped early.

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
from nmtkit.train.trainer import Trainer, train

from conftest import fault_train_cfg as _cfg  # (``small``: tests/conftest.py; validating every 2 updates)
from conftest import head_lines
from conftest import hidden_files as _hidden
from conftest import one_line_error as _one_line_error
from conftest import run_tool as _nmt
from conftest import run_tool_on_a_full_disk as _nmt_limited
from conftest import wait_until

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


# -- resume equals an uninterrupted run, under every option ----------------------------------------------------------

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


# -- one run per save directory --------------------------------------------------------------------------------------

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
        def has_trained():  # (then it holds the lock)
            if (run / "train.jsonl").exists() and (run / "train.jsonl").stat().st_size:
                return True
            assert first.poll() is None, first.communicate()
            return False

        wait_until(has_trained, 120, f"the first nmt-train to log an update in {run / 'train.jsonl'}", interval=0.05)
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


# -- the best checkpoint survives a kill at any instant --------------------------------------------------------------

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


# -- settings that a resume must not ignore --------------------------------------------------------------------------

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


# -- diverged models -------------------------------------------------------------------------------------------------

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


# -- bad settings and options ----------------------------------------------------------------------------------------

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


# -- a full disk, and a kill, while a checkpoint is saved ------------------------------------------------------------

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
