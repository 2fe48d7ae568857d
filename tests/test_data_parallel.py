"""Data parallelism under torchrun: two gloo processes equal one process with the same total batch, and two
"nodes" of one process each on 127.0.0.1 equal one process and resume exactly."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")

from conftest import assert_same as _assert_same
from conftest import nmt_train_env as _env
from conftest import train_cfg as _cfg

pytestmark = pytest.mark.usefixtures("restore_threads")  # (the runs use threads=1: give the rest theirs back)


# -- data parallel ---------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("recipe", [
    {},  # the paper's: Adadelta, clipping at norm 1 (of the gradient summed over processes)
    {"optimizer": "sgd", "lr": 0.5, "clip_norm": 0.0},  # plain SGD: any error in the gradient's scale shows
    # plateau's decays come from the lead process's validations: every process must take them
    {"optimizer": "sgd", "lr": 8.0, "lr_scheduler": "plateau", "valid_every": 1, "max_updates": 6, "ema_decay": 0.5},
], ids=["adadelta-clipped", "sgd-unclipped", "sgd-plateau-ema"])
def test_two_process_data_parallel_equals_one_process(small, tmp_path, recipe):
    # batches of 15: the two processes get 8 and 7 sentences
    common = {**dict(batch_size=15, pool_batches=2, max_updates=4, valid_every=100, valid_bleu_sentences=0), **recipe}
    single = Trainer(_cfg(small, tmp_path / "one", **common))
    initial = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.train()

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), NMT_TRAIN, str(small),
           "--arch", "rnnsearch-tiny", "--save-dir", str(tmp_path / "two"), "--threads", "1",
           *itertools.chain.from_iterable((f"--{k.replace('_', '-')}", str(v)) for k, v in common.items())]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("2 process(es)") == 2, res.stderr[-3000:]  # both ranks ran, as one job of two

    one = checkpoint.load(tmp_path / "one" / "checkpoint_last.pt")
    two = checkpoint.load(tmp_path / "two" / "checkpoint_last.pt")
    assert one["train"]["state"]["update"] == two["train"]["state"]["update"] == common["max_updates"]
    moved = 0.0
    for k, w in one["model"].items():
        torch.testing.assert_close(two["model"][k], w, rtol=0, atol=1e-5, msg=k)
        moved = max(moved, float((w - initial[k]).abs().max()))
    assert moved > 1e-3  # the updates were real, so equality is not trivial
    assert one["train"]["state"]["history"][-1]["valid_loss"] == \
        pytest.approx(two["train"]["state"]["history"][-1]["valid_loss"], rel=1e-5)
    if "lr_scheduler" in recipe:
        assert one["train"]["schedule"]["factor"] < 1 and one["train"]["schedule"] == two["train"]["schedule"]
        for k, w in one["train"]["raw_model"].items():
            torch.testing.assert_close(two["train"]["raw_model"][k], w, rtol=0, atol=1e-5, msg=k)


def _two_nodes(small, run, options: dict) -> list[str]:
    """One job of two "nodes" of one process each on 127.0.0.1, each node its own torchrun as on two machines
    (``--nnodes 2 --node_rank 0|1`` with node 0's address as the rendezvous); returns each node's stderr."""
    port = _free_port()
    flags = [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", *(() if v is True else (str(v),)))]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port),
                               NMT_TRAIN, str(small), "--arch", "rnnsearch-tiny", "--save-dir", str(run), "--threads",
                               "1", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for rank in (0, 1)]
    errs = [node.communicate(timeout=300)[1] for node in nodes]
    for node, err in zip(nodes, errs):
        assert node.returncode == 0, err[-3000:]
    return errs


def test_two_nodes_equal_one_process_and_resume_exactly(small, tmp_path):
    """Data parallelism across machines: two nodes of one process each compute the update of one process with the
    same total batch (plain SGD: any error in the gradient's scale shows), and a two-node run interrupted at update
    3 and resumed is the uninterrupted two-node run, bit for bit: its weights, its random state, and its optimizer's
    state (the paper's Adadelta, which keeps two running averages a weight: plain SGD keeps none, so with it a
    resume that lost them would pass)."""
    common = dict(batch_size=15, pool_batches=2, valid_every=2, valid_bleu_sentences=0, optimizer="sgd", lr=0.5,
                  clip_norm=0.0)
    single = Trainer(_cfg(small, tmp_path / "one", max_updates=6, **common))
    initial = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.train()
    errs = _two_nodes(small, tmp_path / "two", {**common, "max_updates": 6})
    assert [err.count("2 process(es)") for err in errs] == [1, 1]  # one process a node, in one job of two
    one, two = (checkpoint.load(tmp_path / x / "checkpoint_last.pt") for x in ("one", "two"))
    assert one["train"]["state"]["update"] == two["train"]["state"]["update"] == 6
    for k, w in one["model"].items():
        torch.testing.assert_close(two["model"][k], w, rtol=0, atol=1e-5, msg=k)
    assert max(float((w - initial[k]).abs().max()) for k, w in one["model"].items()) > 1e-3  # (real updates)
    stateful = {**common, "optimizer": "adadelta", "lr": 1.0, "clip_norm": 1.0}
    _two_nodes(small, tmp_path / "whole", {**stateful, "max_updates": 6})
    _two_nodes(small, tmp_path / "resumed", {**stateful, "max_updates": 3})
    _two_nodes(small, tmp_path / "resumed", {**stateful, "max_updates": 6, "resume": True})
    whole, resumed = (checkpoint.load(tmp_path / x / "checkpoint_last.pt") for x in ("whole", "resumed"))
    _assert_same(whole["model"], resumed["model"], "model")
    _assert_same(whole["train"]["rng"], resumed["train"]["rng"], "rng")
    state = whole["train"]["optimizer"]["state"]
    assert state and sum(float(s["acc_delta"].abs().sum()) for s in state.values()) > 0  # (there is state to lose)
    _assert_same(whole["train"]["optimizer"], resumed["train"]["optimizer"], "optimizer")
    assert checkpoint.differences(whole, resumed) == []  # (and the run's state: update, epoch, data position ...)
