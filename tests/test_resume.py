"""Resuming (nmt-train --resume): a resumed run reaches the uninterrupted run's weights, optimizer state and data
position bit for bit; an update moves every weight's version; a finished run trains no further; SIGTERM and SIGINT
save and resume."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.train.trainer import Trainer, train

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")

from conftest import assert_same as _assert_same
from conftest import load_state as _load_state
from conftest import nmt_train_env as _env
from conftest import run_nmt_train as _nmt_train
from conftest import snapshot as _snapshot
from conftest import train_cfg as _cfg
from conftest import wait_until

pytestmark = pytest.mark.usefixtures("restore_threads")  # (the runs use threads=1: give the rest theirs back)


# -- resuming --------------------------------------------------------------------------------------------------------

def _batches_per_epoch(data_dir, batch_size: int, pool_batches: int) -> int:
    """Minibatches in an epoch of the pooled schedule: full pools give pool_batches, the rest ceil(rest / size)."""
    from nmtkit.data.manifest import PreparedData

    data = PreparedData.open(data_dir)
    src, tgt = data.corpus("train", "en"), data.corpus("train", "fr")
    assert max(src.sizes) <= 50 and max(tgt.sizes) <= 50  # every pair is trained on (tiny preset: max_len 50)
    pool = batch_size * pool_batches
    return len(src) // pool * pool_batches + math.ceil(len(src) % pool / batch_size)


# stop and total are relative to the epoch's length E (batches of 16 in pools of 2 batches)
@pytest.mark.parametrize("stop, total, options", [
    (6, 11, {}),  # interrupted mid-epoch, resumed within it
    (-3, 4, {"dropout": 0.3}),  # mid-epoch, resumed across the epoch boundary; dropout draws random numbers
    (0, 3, {}),  # interrupted exactly at the end of the first epoch
    (6, 11, {"state_word": "current", "dropout": 0.3}),  # the small presets' decoder (validation BLEU searches it)
], ids=["mid-epoch", "across-epochs-dropout", "epoch-end", "mid-epoch-state-word-current"])
def test_resume_equals_uninterrupted(small, tmp_path, stop, total, options):
    epoch = _batches_per_epoch(small, 16, 2)
    assert epoch > 11  # so that 6 and 11 lie inside the first epoch
    if stop <= 0:
        stop, total = epoch + stop, epoch + total
    straight = train(_cfg(small, tmp_path / "A", max_updates=total, model_options=options))
    assert straight["update"] == total

    first = train(_cfg(small, tmp_path / "B", max_updates=stop, model_options=options, keep_last=100))
    assert first["update"] == stop
    at_stop = _load_state(tmp_path / "B" / "checkpoint_last.pt")
    assert at_stop["update"] == stop
    mid = checkpoint.load(tmp_path / "B" / f"checkpoint{stop}.pt")  # (off the grid: the resumed run deletes it)
    if stop < epoch:
        assert (at_stop["epoch"], at_stop["batch_in_epoch"]) == (0, stop)
    else:
        assert (at_stop["epoch"], at_stop["batch_in_epoch"]) in ((0, epoch), (1, 0))
    second = train(_cfg(small, tmp_path / "B", max_updates=total, model_options=options, resume=True,
                        keep_last=100))
    assert second["update"] == total

    records = [json.loads(line) for line in open(tmp_path / "B" / "train.jsonl")]
    updates = [r["update"] for r in records if r["type"] == "train"]
    assert updates == list(range(1, total + 1))  # the resumed run went on from stop + 1, and appended its log

    a = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")
    b = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert not all(torch.equal(a["model"][k], mid["model"][k]) for k in a["model"])  # it did train after resuming
    _assert_same(a["train"]["optimizer"], b["train"]["optimizer"], "optimizer")
    assert torch.equal(a["train"]["rng"]["torch"], b["train"]["rng"]["torch"])
    for key in ("update", "epoch", "batch_in_epoch"):
        assert a["train"]["state"][key] == b["train"]["state"][key], key


@pytest.mark.parametrize("recipe", [{}, {"optimizer": "adam", "lr": 0.01}, {"optimizer": "sgd", "lr": 0.1}],
                         ids=["adadelta", "adam", "sgd"])
def test_an_update_moves_every_weights_version(small, tmp_path, recipe):
    """After each update every parameter's version counter has moved -- torch's fused Adam and the compiled Adadelta
    kernel write without moving it -- so that the search's cached weights (models/fast/stepweights.py) are rebuilt for
    the next validation's BLEU instead of decoding with the weights of an earlier one."""
    trainer = Trainer(_cfg(small, tmp_path / "run", max_updates=2, valid_every=100, valid_bleu_sentences=0,
                           **recipe))
    versions = []
    step = trainer._step
    trainer._step = lambda ids: (versions.append([p._version for p in trainer.model.parameters()]), step(ids))[1]
    trainer.train()
    versions.append([p._version for p in trainer.model.parameters()])
    assert all(b > a for before, after in zip(versions, versions[1:]) for a, b in zip(before, after))


def test_resuming_a_finished_run_trains_no_further(small, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = _snapshot(run)
    summary = train(_cfg(small, run, max_updates=4, valid_every=2, valid_bleu_sentences=0, resume=True))
    assert (summary["status"], summary["update"]) == ("done", 4)
    assert _snapshot(run) == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_and_resume_continues(small, tmp_path, signum):
    run = tmp_path / "run"
    args = [small, "--arch", "rnnsearch-tiny", "--save-dir", run, "--batch-size", 8, "--pool-batches", 2,
            "--valid-every", 100000, "--valid-bleu-sentences", 2, "--log-every", 1, "--threads", 1]
    proc = subprocess.Popen([sys.executable, NMT_TRAIN, *map(str, args), "--max-updates", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    log = run / "train.jsonl"
    try:
        def has_trained():
            if log.is_file() and any('"type": "train"' in line for line in open(log)):
                return True
            assert proc.poll() is None, proc.communicate()
            return False

        wait_until(has_trained, 90, f"nmt-train to log an update in {log}", interval=0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    last_line = err.strip().splitlines()[-1]
    assert "interrupted at update" in last_line and "--resume" in last_line and str(run) in last_line, err
    n = int(last_line.split("interrupted at update ")[1].split(";")[0])
    assert n >= 1
    assert _load_state(run / "checkpoint_last.pt")["update"] == n
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]
    trained = [json.loads(line)["update"] for line in open(log) if '"type": "train"' in line]
    assert trained == list(range(1, n + 1))
    # saved at once, before any validation (a supervisor's SIGKILL follows its SIGTERM within seconds): the
    # interruption is no validation of the run's, so no record of one and no best checkpoint yet
    assert f"update {n}: interrupted; saved" in err and "(not validated)" in err, err
    assert not [line for line in open(log) if '"type": "valid"' in line]
    assert not (run / "checkpoint_best.pt").exists()
    if signum != signal.SIGTERM:
        return  # resuming is the same whatever stopped the run

    res = _nmt_train(*args, "--max-updates", n + 3, "--resume")
    assert res.returncode == 0, res.stderr
    assert f"resumed from update {n}" in res.stderr
    assert _load_state(run / "checkpoint_last.pt")["update"] == n + 3
    trained = [json.loads(line)["update"] for line in open(log) if '"type": "train"' in line]
    assert trained == list(range(1, n + 4))
