"""Training (nmtkit.train.trainer and nmt-train) on small real Multi30K corpora with the tiny presets.

What is proven here: the model can overfit a few dozen real pairs; the defaults are the paper's recipe and clipping
really rescales; a resumed run reaches bit-identical weights; SIGTERM saves and resumes; two gloo processes equal one
process; bad inputs give one-line errors and touch nothing; checkpoints are self-contained; the stopping rules work;
the learning-rate schedules set each update's rate, the EMA and the average of the last validations are what is
validated and saved, and runs with them resume exactly too; the recipes resolve as documented (the paper's changes
nothing), Glorot initialisation and label smoothing do what they say and resume exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmtkit.train import adadelta
from nmtkit.data import checkpoint
from nmtkit.models import build_from_checkpoint
from nmtkit.train.adadelta import Adadelta
from nmtkit.data.batching import collate, collate_source
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.train.trainer import TrainConfig, Trainer, train
from nmtkit.data.vocab import PAD, Vocabulary
from nmtkit.errors import InputError

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")


# -- fixtures and helpers --------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()  # the runs below use threads=1 (fast on shared cores); give the rest theirs back
    yield
    torch.set_num_threads(n)


def _head(src, dst, n: int) -> None:
    with open(src, encoding="utf-8") as f:
        dst.write_text("".join(itertools.islice(f, n)), encoding="utf-8")


@pytest.fixture(scope="module")
def raw(data_dir, tmp_path_factory):
    """The first 200 training and 20 validation pairs of Multi30K, as raw text files."""
    root = tmp_path_factory.mktemp("raw")
    for lang in ("en", "fr"):
        _head(data_dir / "multi30k" / f"train.{lang}", root / f"train.{lang}", 200)
        _head(data_dir / "multi30k" / f"val.{lang}", root / f"valid.{lang}", 20)
    return root


@pytest.fixture(scope="module")
def small(raw, tmp_path_factory):
    """200 real pairs prepared with joint BPE (150 merges) and small shortlists."""
    dest = tmp_path_factory.mktemp("small") / "data"
    prepare(PrepareConfig("en", "fr", [str(raw / "train")], str(dest), valid=str(raw / "valid"),
                          src_vocab_size=120, tgt_vocab_size=130, bpe_merges=150))
    return dest


@pytest.fixture(scope="module")
def small_other_vocab(raw, tmp_path_factory):
    """The same text as ``small`` with other shortlist sizes."""
    dest = tmp_path_factory.mktemp("other") / "data"
    prepare(PrepareConfig("en", "fr", [str(raw / "train")], str(dest), valid=str(raw / "valid"),
                          src_vocab_size=90, tgt_vocab_size=130, bpe_merges=150))
    return dest


@pytest.fixture(scope="module")
def overfit_data(data_dir, tmp_path_factory):
    """32 short real pairs (at most 7 words a side; at most 10 tokens after tokenisation), full vocabularies."""
    root = tmp_path_factory.mktemp("overfit")
    with open(data_dir / "multi30k" / "train.en", encoding="utf-8") as fe, \
         open(data_dir / "multi30k" / "train.fr", encoding="utf-8") as ff:
        pairs = [(e, f) for e, f in zip(fe, ff) if len(e.split()) <= 7 and len(f.split()) <= 7][:32]
    assert len(pairs) == 32
    (root / "train.en").write_text("".join(e for e, _ in pairs), encoding="utf-8")
    (root / "train.fr").write_text("".join(f for _, f in pairs), encoding="utf-8")
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / "data"), max_len=10))
    return root / "data"


def _cfg(data, save_dir, **kw) -> TrainConfig:
    base = dict(arch="rnnsearch-tiny", batch_size=16, pool_batches=2, valid_every=4, valid_bleu_sentences=4,
                valid_batch_size=20, log_every=1, threads=1)
    base.update(kw)
    return TrainConfig(data=str(data), save_dir=str(save_dir), **base)


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _nmt_train(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, NMT_TRAIN, *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _load_state(path) -> dict:
    return checkpoint.load(path)["train"]["state"]


def _assert_same(a, b, where="") -> None:
    """Deep equality of checkpoint parts; tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, where


def _snapshot(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        p = os.path.join(directory, name)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[name] = (st.st_size, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def _teacher_forced_nll(model, src_corpus, tgt_corpus, ids) -> float:
    model.eval()
    batch = collate(src_corpus, tgt_corpus, np.asarray(ids))
    with torch.no_grad():
        logits = model(batch.src, batch.src_lens, batch.tgt_in)
    return float(F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD,
                                 reduction="sum")) / batch.num_tokens


# -- learning --------------------------------------------------------------------------------------------------------

def test_overfits_a_few_dozen_real_pairs(overfit_data, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.translate.search import greedy

    data = PreparedData.open(overfit_data)
    src, tgt = data.corpus("train", "en"), data.corpus("train", "fr")
    assert len(src) >= 28 and max(src.sizes) <= 10 and max(tgt.sizes) <= 10
    ids = np.arange(len(src))
    summary = train(_cfg(overfit_data, tmp_path / "run", optimizer="adam", lr=0.02, batch_size=32, pool_batches=1,
                         max_updates=150, valid_every=1000, valid_bleu_sentences=0, log_every=10))
    assert summary["status"] == "done" and summary["update"] == 150

    model = build_from_checkpoint(checkpoint.load(tmp_path / "run" / "checkpoint_last.pt"))
    fresh = build_from_checkpoint({**checkpoint.load(tmp_path / "run" / "checkpoint_last.pt"),
                                    "model": type(model)(model.config).state_dict()})
    assert _teacher_forced_nll(fresh, src, tgt, ids) > 3.0  # an untrained model is far from it
    nll = _teacher_forced_nll(model, src, tgt, ids)
    assert nll < 0.1, f"training NLL per token {nll:.4f} after 150 updates"
    # the training log went down with it
    losses = [r["loss"] for r in map(json.loads, open(tmp_path / "run" / "train.jsonl")) if r["type"] == "train"]
    assert len(losses) == 15 and losses[-1] < 0.2 * losses[0]

    batch_src, lens = collate_source([src[i] for i in ids])
    hyps = greedy(model, batch_src, lens)
    exact = sum(h.tokens == tgt[i].tolist() for i, h in zip(ids, hyps))
    assert exact >= 0.9 * len(ids), f"greedy reproduced {exact} of {len(ids)} training targets"
    # batched decoding (with padding) finds what decoding each sentence alone finds
    for i in ids[:6]:
        one_src, one_len = collate_source([src[i]])
        alone = greedy(model, one_src, one_len)[0]
        assert alone.tokens == hyps[i].tokens
        assert alone.score == pytest.approx(hyps[i].score, abs=1e-4)


# -- the paper's recipe ----------------------------------------------------------------------------------------------

def test_default_recipe_is_the_papers(small, tmp_path):
    from nmtkit.cli.train import main

    cfg = TrainConfig(data=str(small), arch="rnnsearch-tiny", save_dir=str(tmp_path / "run"))
    assert (cfg.optimizer, cfg.lr, cfg.rho, cfg.eps) == ("adadelta", 1.0, 0.95, 1e-6)
    assert (cfg.batch_size, cfg.pool_batches, cfg.clip_norm) == (80, 20, 1.0)
    # the command line has the same defaults
    defaults = {p.name: p.default for p in main.params}
    for name in ("optimizer", "lr", "rho", "eps", "batch_size", "pool_batches", "clip_norm"):
        assert defaults[name] == getattr(cfg, name), name
    # and the optimizer built from them is the paper's Adadelta over every weight
    cfg.threads = 1
    trainer = Trainer(cfg)
    opt = trainer.optimizer
    assert type(opt) is Adadelta and isinstance(opt, torch.optim.Adadelta)  # torch's, faster (tests below)
    group = opt.param_groups[0]
    assert (group["rho"], group["eps"], group["lr"], group["weight_decay"]) == (0.95, 1e-6, 1.0, 0)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == \
        sum(p.numel() for p in trainer.model.parameters())


@pytest.fixture(params=["blocked", "kernel"])
def update_path(request, monkeypatch):
    """Adadelta's two ways to update dense float32 parameters: torch's operations block by block (torch's values
    bit for bit), or the compiled kernel (nmtkit/kernels: IEEE square roots where torch's vectorised ones are
    within 1 ulp, so p and E[Δθ²] agree to float32 rounding; E[g²] has no square root: bit for bit where torch
    uses FMA, see ``_same``); or
    "torch-step", for options that only torch's own step covers (weight decay)."""
    from nmtkit import kernels

    calls = []
    if request.param == "kernel":
        request.getfixturevalue("native_kernels")  # (skipped or failed there without a compiler)
    else:  # torch's paths are tested everywhere, with or without a compiler
        monkeypatch.setattr(kernels, "available", lambda: False)
    real = kernels.adadelta
    monkeypatch.setattr(kernels, "adadelta", lambda *a, **k: calls.append(1) or real(*a, **k))
    yield request.param
    assert bool(calls) == (request.param == "kernel")  # the path named is the path taken


# torch's vectorised addcmul rounds once, as the kernel's fmaf, where it runs with FMA (AVX2, AVX-512, ...); its
# plain code ("DEFAULT", on old CPUs or with ATEN_CPU_CAPABILITY=default) rounds twice
TORCH_FMA = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def _same(a: torch.Tensor, b: torch.Tensor, path: str, key: str = "") -> bool:
    """a == b exactly on torch's paths, and on the kernel's for the step count and (torch using FMA) E[g²]; else
    to float32 rounding."""
    if path != "kernel" or key == "step" or key == "square_avg" and TORCH_FMA:
        return torch.equal(a, b)
    scale = float(a.detach().abs().max()) if a.numel() else 0.0  # (a few ulps of the largest value: θ crosses zero)
    return torch.allclose(a, b, rtol=1e-6, atol=4 * torch.finfo(torch.float32).eps * scale)


def _adadelta_pair(opts, seed=0):
    """The same parameters under torch.optim.Adadelta and nmtkit's Adadelta."""
    torch.manual_seed(seed)
    shapes = [(37, 11), (1000,), (3, 5, 7), (1,)]
    ref = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    return ref, ours, torch.optim.Adadelta(ref, **opts), Adadelta(ours, **opts)


@pytest.mark.parametrize("opts, update_path", [
    *((opts, path) for opts in (dict(lr=1.0, rho=0.95, eps=1e-6), dict(lr=0.5, rho=0.9, eps=1e-3))
      for path in ("blocked", "kernel")),
    (dict(lr=1.0, weight_decay=0.1), "torch-step")], indirect=["update_path"])
def test_adadelta_is_torchs(opts, update_path, speed_policy):
    """nmtkit.train.adadelta runs torch's Adadelta operations (block by block, or compiled): the same parameters and
    state (see ``update_path``), with blocks that split tensors (adadelta_block = 64) and a parameter without
    gradient in some steps."""
    speed_policy(adadelta_block=64)
    ref, ours, opt_ref, opt_ours = _adadelta_pair(opts)
    start = [p.detach().clone() for p in ours]
    for k in range(5):
        g = torch.Generator().manual_seed(k)
        for i, (a, b) in enumerate(zip(ref, ours)):
            grad = None if (i == 3 and k % 2) else torch.randn(a.shape, generator=g) * 10.0 ** (i - 2)
            a.grad, b.grad = grad, None if grad is None else grad.clone()
        opt_ref.step()
        opt_ours.step()
        for a, b in zip(ref, ours):
            assert _same(a, b, update_path)
    assert all((a != b).all() for a, b in zip(ours, start))  # every element moved
    s_ref, s_ours = opt_ref.state_dict(), opt_ours.state_dict()
    assert s_ref["param_groups"] == s_ours["param_groups"]
    for i in s_ref["state"]:
        assert s_ref["state"][i].keys() == s_ours["state"][i].keys()
        for key, value in s_ref["state"][i].items():
            assert _same(value, s_ours["state"][i][key], update_path, key), key
    assert float(s_ours["state"][0]["step"]) == 5 and float(s_ours["state"][3]["step"]) == 3


def test_adadelta_rows_without_gradient_are_torchs(update_path, monkeypatch, speed_policy):
    """An embedding-like parameter whose gradient is zero in most rows (a minibatch uses few words) takes the
    rows shortcut -- and ends with torch's parameters and state (see ``update_path``), through sparse and dense
    steps."""
    speed_policy(sparse_min_rows=16)
    speed_policy(adadelta_block=64)
    taken = []
    real_rows = adadelta._update_rows
    monkeypatch.setattr(adadelta, "_update_rows", lambda *a: taken.append(real_rows(*a)) or taken[-1])
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(40, 7)), torch.nn.Parameter(torch.randn(8, 3))]  # (the second: too few rows)
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opts = dict(lr=1.0, rho=0.95, eps=1e-6)
    opt_ref, opt_ours = torch.optim.Adadelta(ref, **opts), Adadelta(ours, **opts)
    for k in range(6):
        g = torch.Generator().manual_seed(k)
        grads = [torch.randn(p.shape, generator=g) for p in ref]
        if k != 3:  # step 3: a dense gradient (the full update); else 5 of 40 rows used, some partly zero
            used = torch.randperm(40, generator=g)[:5]
            keep = torch.zeros(40, 1)
            keep[used] = 1.0
            grads[0] = grads[0] * keep
            grads[0][used[0], 2] = 0.0
            grads[0][used[1]] = -0.0  # a used row whose gradient is (negative) zero: a row without gradient
            grads[0][used[2]] = 0.0
            grads[0][used[2], 4] = -1.5  # a row whose only nonzero entry is negative (its maximum is 0)
        for a, b, grad in zip(ref, ours, grads):
            a.grad, b.grad = grad, grad.clone()
        opt_ref.step()
        opt_ours.step()
        for a, b in zip(ref, ours):
            assert _same(a, b, update_path)
    assert taken == [True, True, True, False, True, True]
    s_ref, s_ours = opt_ref.state_dict(), opt_ours.state_dict()
    for i in s_ref["state"]:
        for key, value in s_ref["state"][i].items():
            assert _same(value, s_ours["state"][i][key], update_path, key), key


def _row_sparse(rows: list[int], values: torch.Tensor, shape) -> torch.Tensor:
    """An uncoalesced COO gradient (rows may repeat), as F.embedding(sparse=True) gives."""
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, shape, check_invariants=True)


def test_adadelta_takes_row_sparse_gradients(update_path, monkeypatch):
    """Row-sparse gradients (the embeddings', gradients.py) take the rows path with the rows they name, repeated
    rows summed -- torch's values and state (see ``update_path``; torch given the same gradient made dense); with
    options our step does not cover they are made dense for torch's step."""
    taken = []
    real_at = adadelta._update_at
    monkeypatch.setattr(adadelta, "_update_at", lambda p, rows, *a: taken.append(len(rows)) or real_at(p, rows, *a))
    torch.manual_seed(0)
    opts = dict(lr=1.0, rho=0.95, eps=1e-6)
    for extra in ({}, {"weight_decay": 0.01}):
        ref = [torch.nn.Parameter(torch.randn(40, 7)), torch.nn.Parameter(torch.randn(8, 3))]
        ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
        opt_ref, opt_ours = torch.optim.Adadelta(ref, **opts, **extra), Adadelta(ours, **opts, **extra)
        for k in range(5):
            g = torch.Generator().manual_seed(k)
            rows = torch.randint(0, 40, (12,), generator=g).tolist() + [3, 3]  # repeats, as a minibatch's words
            values = torch.randn(14, 7, generator=g)
            values[0] = 0.0  # a named row without gradient (as <s> in E_tgt: its embedding is masked)
            sparse = _row_sparse(rows, values, (40, 7))
            dense = torch.randn(8, 3, generator=g)
            ref[0].grad, ref[1].grad = sparse.coalesce().to_dense(), dense
            ours[0].grad, ours[1].grad = sparse, dense.clone()
            opt_ref.step()
            opt_ours.step()
            for a, b in zip(ref, ours):
                assert _same(a, b, "blocked" if extra else update_path), (extra, k)
        s_ref, s_ours = opt_ref.state_dict(), opt_ours.state_dict()
        for i in s_ref["state"]:
            for key, value in s_ref["state"][i].items():
                assert _same(value, s_ours["state"][i][key], "blocked" if extra else update_path, key), (extra, key)
        assert len(taken) == (0 if extra else 5) and all(0 < k <= 13 for k in taken)  # distinct rows only
        taken.clear()


@pytest.mark.parametrize("extra, update_path",
                         [({}, "blocked"), ({}, "kernel"), ({"weight_decay": 0.01}, "torch-step")],
                         indirect=["update_path"])
def test_adadelta_grad_scale_equals_clipping_first(monkeypatch, extra, update_path, speed_policy):
    """step(grad_scale=s) -- the trainer's clipping folded into the update -- gives bit for bit the parameters and
    state of clipping the gradients in place and then stepping, on every path: dense (blocked or compiled), the
    rows shortcut, row-sparse gradients (and torch's own step, for options ours does not cover)."""
    from nmtkit.train.gradients import clip_grad_norm_, grad_norm_and_scale

    speed_policy(sparse_min_rows=16)
    speed_policy(adadelta_block=64)
    torch.manual_seed(0)
    shapes = [(40, 7), (40, 7), (8, 3)]  # row-sparse, rows shortcut (dense, few rows used), dense
    first = [torch.randn(s) for s in shapes]
    clipped = [torch.nn.Parameter(w.clone()) for w in first]
    folded = [torch.nn.Parameter(w.clone()) for w in first]
    opts = dict(lr=1.0, rho=0.95, eps=1e-6, **extra)
    opt_clipped, opt_folded = Adadelta(clipped, **opts), Adadelta(folded, **opts)
    for k in range(4):
        g = torch.Generator().manual_seed(k)
        sparse = _row_sparse([1, 5, 5, 30], torch.randn(4, 7, generator=g), (40, 7))
        rows = torch.zeros(40, 7)
        rows[[2, 9]] = torch.randn(2, 7, generator=g)
        grads = [sparse, rows, torch.randn(8, 3, generator=g) * 10]
        for a, b, grad in zip(clipped, folded, grads):
            a.grad, b.grad = grad.clone(), grad.clone()
        norm = clip_grad_norm_(clipped, 1.0)
        opt_clipped.step()
        norm2, scale = grad_norm_and_scale(folded, 1.0)
        assert torch.equal(norm, norm2) and scale < 1
        opt_folded.step(grad_scale=scale)
        for a, b in zip(clipped, folded):
            assert torch.equal(a, b), k
        if not extra:  # the gradients are not touched
            assert torch.equal(folded[2].grad, grads[2])


@pytest.mark.parametrize("max_norm", [0.5, 1e6, math.inf])
def test_clip_grad_norm_takes_row_sparse_gradients(max_norm):
    """gradients.clip_grad_norm_: with row-sparse gradients, the norm and the rescaled gradients of the same
    gradients made dense under torch's clip_grad_norm_; on dense gradients alone, torch's exactly."""
    from nmtkit.train.gradients import clip_grad_norm_, grad_norm_and_scale

    torch.manual_seed(0)
    shapes = [(30, 5), (6, 4), (20, 5)]
    ours = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    ref = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    ours[0].grad = _row_sparse([4, 9, 4, 0], torch.randn(4, 5), (30, 5))
    ours[1].grad = torch.randn(6, 4)
    ours[2].grad = _row_sparse([19], torch.randn(1, 5), (20, 5))
    for a, b in zip(ref, ours):
        a.grad = b.grad.to_dense().clone()
    norm = clip_grad_norm_(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0)
    assert ours[0].grad.is_sparse and ours[0].grad.is_coalesced()
    for a, b in zip(ref, ours):
        torch.testing.assert_close(b.grad.to_dense(), a.grad, rtol=1e-6, atol=0)
    dense = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, q in zip(dense, ref):
        p.grad = torch.randn(q.shape)
        q.grad = p.grad.clone()
    total, scale = grad_norm_and_scale(dense, max_norm)  # (the trainer's path with Adadelta: norm and factor only)
    raw = [p.grad.clone() for p in dense]
    expected = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    assert torch.equal(clip_grad_norm_(dense, max_norm), expected)
    assert torch.equal(total, expected)
    for p, q, g in zip(dense, ref, raw):
        assert torch.equal(p.grad, q.grad)
        assert torch.equal(g * scale, q.grad)


def test_adadelta_resumes_from_torchs_state(update_path):
    """A checkpoint's optimizer state from torch.optim.Adadelta loads into ours and continues alike (see
    ``update_path``)."""
    opts = dict(lr=1.0, rho=0.95, eps=1e-6)
    ref, ours, opt_ref, _ = _adadelta_pair(opts)
    for step in range(3):
        for a in ref:
            a.grad = torch.randn(a.shape)
        if step == 1:
            with torch.no_grad():
                for a, b in zip(ref, ours):
                    b.copy_(a)
            opt_ours = Adadelta(ours, **opts)
            opt_ours.load_state_dict(copy.deepcopy(opt_ref.state_dict()))  # (not the live tensors)
        if step >= 1:
            for a, b in zip(ref, ours):
                b.grad = a.grad.clone()
            opt_ours.step()
        opt_ref.step()
    for a, b in zip(ref, ours):
        assert _same(a, b, update_path)


@pytest.mark.parametrize("clip_norm", [1.0, 0.0])
def test_gradient_is_rescaled_to_norm_one(small, tmp_path, monkeypatch, clip_norm):
    """The optimizer sees g * 1/||g|| when ||g|| > 1 (and the raw g with clipping off), g of the GroundHog cost."""
    import nmtkit.train.trainer as train_mod

    seen_ids = []

    def recording_collate(src, tgt, ids):
        seen_ids.append(np.array(ids))
        return collate(src, tgt, ids)

    monkeypatch.setattr(train_mod, "collate", recording_collate)
    trainer = Trainer(_cfg(small, tmp_path / "run", batch_size=80, pool_batches=20, max_updates=1,
                           clip_norm=clip_norm, valid_bleu_sentences=0))
    with torch.no_grad():  # a model with a huge gradient: large output weights
        trainer.model.W_o.mul_(300.0)
    reference = copy.deepcopy(trainer.model)
    reference.sparse_embedding_grads = False  # the reference gradient: dense, as autograd gives it by default
    grads_at_step, sparse = [], []
    step = trainer.optimizer.step

    def recording_step(*a, **k):  # what the update uses: the gradient times grad_scale (Adadelta, see train.py)
        scale = k.get("grad_scale", 1.0)
        grads_at_step.append([p.grad.detach().to_dense() * scale for p in trainer.model.parameters()])
        sparse.append({name for name, p in trainer.model.named_parameters() if p.grad.is_sparse})
        return step(*a, **k)

    trainer.optimizer.step = recording_step
    trainer.train()
    assert len(grads_at_step) == 1
    assert sparse == [{"E_src", "E_tgt"}]  # Adadelta on the CPU: row-sparse embedding gradients (gradients.py)
    ids = seen_ids[0]
    assert len(ids) == 80

    # the unclipped gradient of: summed target NLL averaged over the batch's sentences
    batch = collate(trainer.train_src, trainer.train_tgt, ids)
    reference.train()
    logits = reference(batch.src, batch.src_lens, batch.tgt_in)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD,
                           reduction="sum") / len(ids)
    loss.backward()
    raw_grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in reference.parameters()]
    raw_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in raw_grads)))
    assert raw_norm > 10, raw_norm  # far above the threshold of 1

    got = grads_at_step[0]
    got_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in got)))
    scale = 1.0 / raw_norm if clip_norm else 1.0
    if clip_norm:
        assert got_norm <= 1.0 + 1e-5 and got_norm == pytest.approx(1.0, rel=1e-4)
    else:
        assert got_norm == pytest.approx(raw_norm, rel=1e-4)
    for g, r in zip(got, raw_grads):
        torch.testing.assert_close(g, r * scale, rtol=1e-4, atol=1e-7 * max(scale * raw_norm, 1.0))


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
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if log.is_file() and any('"type": "train"' in line for line in open(log)):
                break
            time.sleep(0.05)
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
    if signum != signal.SIGTERM:
        return  # resuming is the same whatever stopped the run

    res = _nmt_train(*args, "--max-updates", n + 3, "--resume")
    assert res.returncode == 0, res.stderr
    assert f"resumed from update {n}" in res.stderr
    assert _load_state(run / "checkpoint_last.pt")["update"] == n + 3
    trained = [json.loads(line)["update"] for line in open(log) if '"type": "train"' in line]
    assert trained == list(range(1, n + 4))


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
    same total batch, and a two-node run interrupted at update 3 and resumed is the uninterrupted two-node run, bit
    for bit."""
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
    _two_nodes(small, tmp_path / "resumed", {**common, "max_updates": 3})
    _two_nodes(small, tmp_path / "resumed", {**common, "max_updates": 6, "resume": True})
    resumed = checkpoint.load(tmp_path / "resumed" / "checkpoint_last.pt")
    _assert_same(two["model"], resumed["model"], "model")
    _assert_same(two["train"]["rng"], resumed["train"]["rng"], "rng")


# -- bad input through the command line ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(small, tmp_path_factory):
    """A save directory holding the checkpoints of a 4-update run on ``small``."""
    run = tmp_path_factory.mktemp("finished") / "run"
    threads = torch.get_num_threads()
    try:
        train(_cfg(small, run, max_updates=4, valid_every=2, valid_bleu_sentences=0))
    finally:
        torch.set_num_threads(threads)
    return run


def _other_format(small, tmp, run, other):
    data = tmp / "data-v2"
    shutil.copytree(small, data)
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    manifest["format_version"] = 2
    (data / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return [data, "--arch", "rnnsearch-tiny", "--force"], [str(data / "manifest.json"), "version 2"]


def _not_prepared(small, tmp, run, other):
    raw = tmp / "raw"
    raw.mkdir()
    (raw / "train.en").write_text("A man.\n", encoding="utf-8")
    (raw / "train.fr").write_text("Un homme.\n", encoding="utf-8")
    return [raw, "--arch", "rnnsearch-tiny", "--force"], [str(raw), "manifest.json"]


def _vocab_mismatch(small, tmp, run, other):
    ours, theirs = len(Vocabulary.load(small / "vocab.en")), len(Vocabulary.load(other / "vocab.en"))
    assert ours != theirs
    return [other, "--arch", "rnnsearch-tiny", "--resume"], [str(run / "checkpoint_last.pt"), "src vocabulary",
                                                             f"({ours} ", f"({theirs} "]


def _truncated_last(small, tmp, run, other):
    last = run / "checkpoint_last.pt"
    data = last.read_bytes()
    last.unlink()  # a hard link to a numbered checkpoint: break the link, then truncate only this name
    last.write_bytes(data[: len(data) // 2])
    return [small, "--arch", "rnnsearch-tiny", "--resume"], [str(last), "truncated"]


def _garbage_last_as(head: bytes, seed: int):
    """checkpoint_last.pt replaced by 5,000 fixed bytes: ``head``, then seeded noise.  Not os.urandom: random
    garbage that happened to start like a pickle (0x80, protocol byte) once made torch print a UserWarning before
    our error -- a flaky test that hid a real defect; both shapes are now cases of their own."""
    def case(small, tmp, run, other):
        last = run / "checkpoint_last.pt"
        last.unlink()
        noise = random.Random(seed)
        last.write_bytes(head + bytes(noise.getrandbits(8) for _ in range(5000 - len(head))))
        return [small, "--arch", "rnnsearch-tiny", "--resume"], [str(last), "corrupt"]
    return case


def _unknown_preset(small, tmp, run, other):
    return [small, "--arch", "rnnsearch-huge", "--force"], ["rnnsearch-huge", "rnnsearch-tiny"]


def _unknown_model_option(small, tmp, run, other):
    return [small, "--arch", "rnnsearch-tiny", "-o", "hiden_dim=64", "--force"], ["hiden_dim", "hidden_dim"]


def _bad_model_value(small, tmp, run, other):
    return [small, "--arch", "rnnsearch-tiny", "-o", "hidden_dim=-3", "--force"], ["hidden_dim", "-3"]


def _bad_state_word(small, tmp, run, other):
    return [small, "--arch", "rnnsearch-tiny", "-o", "state_word=next", "--force"], ["state_word", "'next'",
                                                                                   "previous, current"]


def _existing_checkpoints(small, tmp, run, other):
    return [small, "--arch", "rnnsearch-tiny"], [str(run), "--resume", "--force"]


def _arch_mismatch(small, tmp, run, other):
    return [small, "--arch", "rnnencdec-tiny", "--resume"], ["rnnencdec", "checkpoint_last.pt"]


def _optimizer_mismatch(small, tmp, run, other):
    """A run of the paper's recipe (Adadelta) resumed as rnnsearch-small, whose recipe is now 'fast' (Adam): Adam
    cannot take Adadelta's state."""
    return [small, "--arch", "rnnsearch-small", "--resume"], [str(run / "checkpoint_last.pt"), "--optimizer adam",
                                                              "'adadelta'", "--optimizer adadelta"]


BAD_INPUTS = {
    "other-format-version": _other_format,
    "not-prepared": _not_prepared,
    "vocab-mismatch": _vocab_mismatch,
    "truncated-last": _truncated_last,
    "garbage-last": _garbage_last_as(b"\x80\x9e", 5000),  # starts like a pickle of protocol 158
    "noise-last": _garbage_last_as(b"", 17),
    "unknown-preset": _unknown_preset,
    "unknown-model-option": _unknown_model_option,
    "bad-model-value": _bad_model_value,
    "bad-state-word": _bad_state_word,
    "existing-checkpoints": _existing_checkpoints,
    "arch-mismatch": _arch_mismatch,
    "optimizer-mismatch": _optimizer_mismatch,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_touches_nothing(case, small, small_other_vocab, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    args, words = BAD_INPUTS[case](small, tmp_path, run, small_other_vocab)
    before = _snapshot(run)
    assert any(n.startswith("checkpoint") for n in before)

    res = _nmt_train(*args, "--save-dir", run, "--threads", 1)
    assert res.returncode == 1, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("nmt-train: error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert _snapshot(run) == before


def test_resume_without_a_checkpoint(small, tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    res = _nmt_train(small, "--arch", "rnnsearch-tiny", "--save-dir", run, "--resume")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(run) in lines[0] and "checkpoint_last.pt" in lines[0], res.stderr
    assert os.listdir(run) == []


def test_a_checkpoint_from_before_a_model_field_resumes(small, finished_run, tmp_path):
    # checkpoints written before the model config had state_word hold Appendix A's model: they resume, and --init-from
    # takes them, with the preset that still means that model (the tiny ones); asking for the other model is refused
    run = tmp_path / "old"
    shutil.copytree(finished_run, run)
    last = run / "checkpoint_last.pt"
    payload = checkpoint.load(last)
    del payload["config"]["state_word"]
    checkpoint.save(payload, last)
    train(_cfg(small, run, max_updates=6, valid_every=2, valid_bleu_sentences=0, resume=True))
    assert _load_state(run / "checkpoint_last.pt")["update"] == 6
    assert checkpoint.load(run / "checkpoint_last.pt")["config"]["state_word"] == "previous"
    checkpoint.save(payload, last)
    with pytest.raises(InputError, match=r"state_word 'previous' -> 'current'.*\(here: -o state_word=previous\)"):
        train(_cfg(small, run, max_updates=6, model_options={"state_word": "current"}, resume=True))
    train(_cfg(small, tmp_path / "new", max_updates=1, valid_every=1, valid_bleu_sentences=0, init_from=str(last)))


# -- checkpoints of a run --------------------------------------------------------------------------------------------

def test_checkpoints_are_self_contained_and_rotated(small, raw, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import get_config
    from nmtkit.data.text import Preprocessor, TextConfig

    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, max_updates=8, valid_every=2, keep_last=2, log_every=2))
    summary = trainer.train()
    assert summary["update"] == 8

    # rotation: the two newest numbered checkpoints, plus last and best
    files = sorted(f for f in os.listdir(run) if f.endswith(".pt"))
    assert files == ["checkpoint6.pt", "checkpoint8.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert (run / "checkpoint_last.pt").read_bytes() == (run / "checkpoint8.pt").read_bytes()
    history = summary["history"]
    assert [h["update"] for h in history] == [2, 4, 6, 8]
    bleus = [h["valid_bleu"] for h in history]
    best_update = history[bleus.index(max(bleus))]["update"]  # the first of the best
    assert summary["best_update"] == best_update
    best = checkpoint.load(run / "checkpoint_best.pt")
    assert best["train"]["state"]["update"] == best_update
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]["update"] == 8

    # the JSON log: one train record per log interval, one valid record per validation
    records = [json.loads(line) for line in open(run / "train.jsonl")]
    assert [r["update"] for r in records if r["type"] == "train"] == [2, 4, 6, 8]
    assert [r["update"] for r in records if r["type"] == "valid"] == [2, 4, 6, 8]
    for r in records:
        if r["type"] == "train":
            assert r["loss"] > 0 and r["tgt_tokens_per_s"] > 0 and math.isfinite(r["grad_norm"])

    payload = checkpoint.load(run / "checkpoint_last.pt")
    data = PreparedData.open(small)
    src_vocab, tgt_vocab = Vocabulary.load(small / "vocab.en"), Vocabulary.load(small / "vocab.fr")
    assert payload["vocab"] == {"src": src_vocab.tokens, "tgt": tgt_vocab.tokens}
    assert (payload["source_lang"], payload["target_lang"]) == ("en", "fr")
    codes = (small / "bpe.codes").read_text(encoding="utf-8")
    assert codes.count("\n") > 100
    for side, lang in (("src", "en"), ("tgt", "fr")):
        pre = payload["preprocessing"][side]
        assert pre["bpe_codes"] == codes
        assert pre["lang"] == lang
        assert {k: v for k, v in pre.items() if k != "bpe_codes"} == \
            {k: v for k, v in data.manifest["preprocessing"][lang].items() if k != "bpe_codes"}
    assert payload["arch"] == "rnnsearch"
    assert payload["config"] == get_config("rnnsearch-tiny", src_vocab_size=len(src_vocab),
                                           tgt_vocab_size=len(tgt_vocab)).to_dict()
    assert payload["train"]["config"]["data"] == str(small)

    # the checkpoint alone turns raw validation sentences into the ids the prepared data holds
    subwords = 0
    for side, lang in (("src", "en"), ("tgt", "fr")):
        pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"][side]))
        vocab = Vocabulary(payload["vocab"][side])
        corpus = data.corpus("valid", lang)
        for i, line in enumerate((raw / f"valid.{lang}").read_text(encoding="utf-8").splitlines()):
            tokens = pre.tokenize(line)
            subwords += sum(t.endswith("@@") for t in tokens)
            assert vocab.encode(tokens).tolist() == corpus[i].tolist(), (lang, i)
    assert subwords > 0  # BPE was really applied, from the codes in the checkpoint

    # and rebuilds a model that computes exactly what the trained one computes
    model = build_from_checkpoint(payload).eval()
    trainer.model.eval()
    batch = collate(data.corpus("valid", "en"), data.corpus("valid", "fr"), np.arange(10))
    with torch.no_grad():
        assert torch.equal(model(batch.src, batch.src_lens, batch.tgt_in),
                           trainer.model(batch.src, batch.src_lens, batch.tgt_in))


# -- stopping rules --------------------------------------------------------------------------------------------------

def test_early_stopping_with_patience(small, tmp_path):
    summary = train(_cfg(small, tmp_path / "run", optimizer="sgd", lr=0.0, best_metric="loss", patience=2,
                         valid_every=2, max_updates=100, valid_bleu_sentences=0))
    # nothing can improve: the first validation is the best, two more without improvement stop the run
    assert summary["status"] == "early-stopped"
    assert summary["update"] == 6
    assert [h["update"] for h in summary["history"]] == [2, 4, 6]
    assert len({h["valid_loss"] for h in summary["history"]}) == 1
    assert summary["best_update"] == 2
    assert checkpoint.load(tmp_path / "run" / "checkpoint_best.pt")["train"]["state"]["update"] == 2
    assert _load_state(tmp_path / "run" / "checkpoint_last.pt")["update"] == 6


def test_max_epochs_stops_the_run(small, tmp_path):
    from nmtkit.data.manifest import PreparedData

    data = PreparedData.open(small)
    n = len(data.corpus("train", "en"))
    assert max(data.corpus("train", "en").sizes) <= 50 and max(data.corpus("train", "fr").sizes) <= 50
    summary = train(_cfg(small, tmp_path / "run", batch_size=64, pool_batches=1, max_epochs=2, valid_every=1000,
                         valid_bleu_sentences=0))
    assert summary["status"] == "done"
    assert summary["update"] == 2 * math.ceil(n / 64)  # every pair once per epoch, two epochs
    assert summary["epoch"] == 2
    assert _load_state(tmp_path / "run" / "checkpoint_last.pt")["update"] == summary["update"]


def test_max_time_stops_the_run(small, tmp_path):
    t0 = time.monotonic()
    summary = train(_cfg(small, tmp_path / "run", max_time=1.5, valid_every=100000, valid_bleu_sentences=0,
                         log_every=100000))
    wall = time.monotonic() - t0
    assert summary["status"] == "done"
    state = _load_state(tmp_path / "run" / "checkpoint_last.pt")
    assert state["update"] == summary["update"] >= 1
    assert state["elapsed"] >= 1.5
    assert state["elapsed"] < 1.5 + 5  # stopped within an update or so (one tiny update is far below a second)
    assert wall < 60


def test_validation_bleu_by_beam_search_and_resume_warning(small, tmp_path, caplog):
    import logging

    summary = train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=2, valid_bleu_sentences=8,
                         valid_beam=3))
    record = summary["history"][-1]
    assert record["valid_bleu_sentences"] == 8 and "(beam 3, Moses-tokenised)" in record["valid_bleu_signature"]
    assert 0.0 <= record["valid_bleu"] <= 100.0
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
        train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=4, valid_bleu_sentences=0, resume=True,
                   batch_size=8))
    assert any("--batch-size" in r.getMessage() and "differ" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):  # (the update's own settings: a warning too)
        train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=6, valid_bleu_sentences=0, resume=True,
                   batch_size=8, clip_norm=5.0, rho=0.9, eps=1e-8))
    changed = [r.getMessage() for r in caplog.records if "other training settings" in r.getMessage()]
    assert len(changed) == 1 and all(f"--{k}" in changed[0] for k in ("clip-norm 1.0 -> 5.0", "rho 0.95 -> 0.9",
                                                                      "eps 1e-06 -> 1e-08"))


# -- learning-rate schedules and averaged weights --------------------------------------------------------------------

def test_a_resumed_run_keeps_the_checkpoints_and_log_of_the_uninterrupted_run(small, tmp_path):
    """An interruption's checkpoint (update 6, off the grid of 4) and its validation record go when the resumed run
    goes past them: --keep-last 2 keeps 12 and 14 as the uninterrupted run does, not 6 in place of 12."""
    common = dict(valid_every=4, keep_last=2, valid_bleu_sentences=0)
    train(_cfg(small, tmp_path / "A", max_updates=14, **common))
    train(_cfg(small, tmp_path / "B", max_updates=6, **common))
    assert _numbered(tmp_path / "B") == ["checkpoint4.pt", "checkpoint6.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 6]  # (6: the limit's, off the grid)
    # resumed at its limit it does not go on, and the record of its end stays
    assert train(_cfg(small, tmp_path / "B", max_updates=6, resume=True, **common))["history"][-1]["update"] == 6
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 6]
    train(_cfg(small, tmp_path / "B", max_updates=14, resume=True, **common))
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B") == ["checkpoint12.pt", "checkpoint14.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 8, 12, 14]
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")
    state = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")["train"]["state"]
    assert [h["update"] for h in state["history"]] == [4, 8, 12, 14]


def _train_records(run) -> list[dict]:
    return [r for r in map(json.loads, open(run / "train.jsonl")) if r["type"] == "train"]


def test_inverse_sqrt_with_warmup_sets_each_updates_rate(small, tmp_path):
    """Plain SGD without clipping: every update is θ − lr_u·g with the schedule's lr_u (warm-up lr·u/N, then
    lr·sqrt(N/u)), the rate the log records."""
    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, optimizer="sgd", lr=0.5, clip_norm=0.0, lr_scheduler="inverse-sqrt",
                           warmup_updates=3, max_updates=8, valid_every=100, valid_bleu_sentences=0))
    expected = [0.5 * u / 3 for u in (1, 2, 3)] + [0.5 * math.sqrt(3 / u) for u in range(4, 9)]
    seen = []
    step = trainer.optimizer.step

    def checking_step(*a, **k):
        lr = trainer.optimizer.param_groups[0]["lr"]
        before = [(p.detach().clone(), p.grad.detach().clone()) for p in trainer.model.parameters()]
        out = step(*a, **k)
        for p, (w, g) in zip(trainer.model.parameters(), before):
            assert torch.equal(p, w.add(g, alpha=-lr))
        seen.append(lr)
        return out

    trainer.optimizer.step = checking_step
    trainer.train()
    assert seen == pytest.approx(expected, rel=1e-12) and seen[2] == 0.5  # the full rate at the warm-up's end
    assert [r["lr"] for r in _train_records(run)] == seen


def test_plateau_decays_after_patience_bad_validations(small, tmp_path, monkeypatch):
    """Real updates with scripted validation losses: the rate halves after two validations in a row without a new
    best (the warm-up's validation not counted), down to --min-lr; the log records every update's rate."""
    losses = {2: 9.0, 4: 5.0, 6: 5.5, 8: 5.2, 10: 4.0, 12: 4.5, 14: 4.6, 16: 4.7, 18: 4.8}
    monkeypatch.setattr(Trainer, "validate", lambda self: {"update": self.state.update,
                                                           "valid_loss": losses[self.state.update], "valid_ppl": 1.0})
    run = tmp_path / "run"
    summary = train(_cfg(small, run, lr_scheduler="plateau", warmup_updates=2, lr_patience=2, lr_decay=0.5,
                         min_lr=0.3, best_metric="loss", valid_every=2, max_updates=18))
    assert summary["update"] == 18
    lrs = [r["lr"] for r in _train_records(run)]
    # updates 1-2: warm-up; 9-14: halved (8 was the second bad validation); 15-: 0.25 floored to 0.3 (14: again)
    assert lrs == [0.5, 1.0] + [1.0] * 6 + [0.5] * 6 + [0.3] * 4
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["schedule"] == {"factor": 0.25, "bad": 0,
                                                                                 "best": -4.0}


def test_ema_is_the_moving_average_of_every_updates_weights(small, tmp_path):
    """With --ema-decay D the EMA is θ₀ then D·ema + (1 − D)·θ_u after every update (computed here by hand from the
    weights after each update); the checkpoint's "model" is it (and differs from the raw weights, which train
    keeps), and the validation loss and BLEU are those of the EMA weights."""
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_bleu, validation_loss

    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, ema_decay=0.8, max_updates=6, valid_every=3, valid_bleu_sentences=8))
    weights = [{k: v.detach().clone() for k, v in trainer.model.state_dict().items()}]
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (step(*a, **k), weights.append(
        {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}))[0]
    summary = trainer.train()
    assert len(weights) == 7
    ema = {k: v.clone() for k, v in weights[0].items()}
    for u in range(1, 7):
        for k in ema:
            ema[k] = 0.8 * ema[k] + 0.2 * weights[u][k]
        if u % 3:
            continue
        payload = checkpoint.load(run / f"checkpoint{u}.pt")
        assert payload["train"]["ema"].keys() == payload["model"].keys() == ema.keys()
        for k in ema:
            torch.testing.assert_close(payload["model"][k], ema[k], rtol=1e-5, atol=1e-7, msg=k)
            assert torch.equal(payload["train"]["ema"][k], payload["model"][k])
            assert torch.equal(payload["train"]["raw_model"][k], weights[u][k])
        assert sum(not torch.equal(payload["model"][k], weights[u][k]) for k in ema) >= len(ema) - 1  # (W_a)

        data = PreparedData.open(small)
        vsrc, vtgt = data.corpus("valid", "en"), data.corpus("valid", "fr")
        record = summary["history"][u // 3 - 1]
        model = build_from_checkpoint(payload)  # what nmt-translate loads: the EMA
        expected = validation_loss(model, vsrc, vtgt, torch.device("cpu"), 20)
        assert record["valid_loss"] == pytest.approx(expected["valid_loss"], rel=1e-6)
        raw_model = build_from_checkpoint({**payload, "model": payload["train"]["raw_model"]})
        assert validation_loss(raw_model, vsrc, vtgt, torch.device("cpu"), 20)["valid_loss"] != \
            pytest.approx(record["valid_loss"], rel=1e-6)
        bleu = validation_bleu(model, data, vsrc, trainer.tgt_vocab, 8, torch.device("cpu"), 1, 20)
        assert record["valid_bleu"] == bleu["valid_bleu"]
    # the trainer goes on from the raw weights, untouched by validating the EMA
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, weights[6][k])


def test_average_last_is_the_mean_of_the_last_validations_raw_weights(small, tmp_path):
    """With --average-last 3 the "model" of each checkpoint is the mean of the raw weights ("train"."raw_model") of
    the last three validations' checkpoints, fewer at the start -- fairseq's average_checkpoints, online; validation
    runs on it."""
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_loss

    run = tmp_path / "run"
    summary = train(_cfg(small, run, average_last=3, keep_last=3, valid_every=2, max_updates=10,
                         valid_bleu_sentences=0))
    assert [h["update"] for h in summary["history"]] == [2, 4, 6, 8, 10]
    files = sorted(f for f in os.listdir(run) if re.fullmatch(r"checkpoint\d+\.pt", f))
    assert files == ["checkpoint10.pt", "checkpoint6.pt", "checkpoint8.pt"]  # --keep-last 3: the three averaged
    last = checkpoint.load(run / "checkpoint10.pt")
    raws = [checkpoint.load(run / f"checkpoint{u}.pt")["train"]["raw_model"] for u in (6, 8, 10)]
    assert last["train"]["average_updates"] == [8, 10]
    for k, v in last["model"].items():
        mean = torch.stack([r[k] for r in raws]).double().mean(0)
        torch.testing.assert_close(v.double(), mean, rtol=1e-6, atol=1e-8, msg=k)
    # (attention.W_a barely moves in 10 updates: v_a starts at 0, Appendix B.1)
    assert sum(not torch.equal(v, raws[-1][k]) for k, v in last["model"].items()) >= len(raws[-1]) - 1
    data = PreparedData.open(small)
    loss = validation_loss(build_from_checkpoint(last), data.corpus("valid", "en"), data.corpus("valid", "fr"),
                           torch.device("cpu"), 20)["valid_loss"]
    assert summary["history"][-1]["valid_loss"] == pytest.approx(loss, rel=1e-6)


def test_average_last_starts_with_fewer(small, tmp_path):
    run = tmp_path / "run"
    train(_cfg(small, run, average_last=3, keep_last=5, valid_every=2, max_updates=4, valid_bleu_sentences=0))
    first, second = checkpoint.load(run / "checkpoint2.pt"), checkpoint.load(run / "checkpoint4.pt")
    for k, v in first["model"].items():
        assert torch.equal(v, first["train"]["raw_model"][k])  # the mean of one
        mean = (first["train"]["raw_model"][k].double() + second["train"]["raw_model"][k].double()) / 2
        assert torch.equal(second["model"][k], mean.float())


def test_average_last_refuses_to_average_another_models_checkpoint_on_resume(small, tmp_path):
    """A numbered checkpoint the resumed average reads back that another model wrote (same shapes, another
    config: here dropout) is refused with one error naming it, not averaged into this run's weights."""
    from nmtkit.errors import InputError

    common = dict(average_last=3, keep_last=5, valid_every=2, valid_bleu_sentences=0)
    run, other = tmp_path / "run", tmp_path / "other"
    train(_cfg(small, run, max_updates=4, **common))
    train(_cfg(small, other, max_updates=2, model_options={"dropout": 0.3}, **common))
    shutil.copyfile(other / "checkpoint2.pt", run / "checkpoint2.pt")
    refused = r"--average-last 3: this checkpoint's config differs from .* another model's"
    with pytest.raises(InputError, match=refused) as e:
        train(_cfg(small, run, max_updates=6, resume=True, **common))
    assert str(run / "checkpoint2.pt") in str(e.value)
    assert _numbered(run) == ["checkpoint2.pt", "checkpoint4.pt"]  # nothing trained or saved


def _untimed(records: list) -> list:
    """Validation records without their times (what two runs on one machine still differ in)."""
    return [{k: v for k, v in h.items() if k != "elapsed"} for h in records]


def _valid_records(run) -> list[dict]:
    return _untimed([r for r in map(json.loads, open(run / "train.jsonl")) if r["type"] == "valid"])


def _numbered(run) -> list[str]:
    return sorted(p.name for p in run.glob("checkpoint[0-9]*.pt"))


# interrupted off the validation grid (the interruption's own checkpoint is not a validation of plateau's or the
# average's) and on it
@pytest.mark.parametrize("stop, options", [
    (6, {"optimizer": "adam", "lr": 0.01, "lr_scheduler": "inverse-sqrt", "warmup_updates": 5}),
    (6, {"optimizer": "adam", "lr": 0.01, "lr_scheduler": "linear", "warmup_updates": 2, "schedule_updates": 14}),
    (10, {"lr_scheduler": "plateau", "lr_patience": 2, "warmup_updates": 3}),
    (6, {"ema_decay": 0.9, "model_options": {"dropout": 0.3}}),
    (6, {"average_last": 3}),
    (8, {"average_last": 3}),
    (6, {"label_smoothing": 0.1, "model_options": {"dropout": 0.3}}),
    (6, {"recipe": "fast", "optimizer": "adam", "lr": 1e-3, "init": "xavier"}),  # (the resumed run must not re-init)
], ids=["inverse-sqrt-warmup", "linear-warmup", "plateau", "ema-dropout", "average-last", "average-last-on-grid", "label-smoothing",
        "xavier-adam"])
def test_resume_with_schedule_and_averaging_equals_uninterrupted(small, tmp_path, stop, options):
    total, common = 14, dict(valid_every=4, keep_last=100, **options)
    train(_cfg(small, tmp_path / "A", max_updates=total, **common))
    train(_cfg(small, tmp_path / "B", max_updates=stop, **common))
    train(_cfg(small, tmp_path / "B", max_updates=total, resume=True, **common))

    a = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")
    b = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    assert a["train"]["state"]["update"] == b["train"]["state"]["update"] == total
    for part in (a, b):
        for key in ("resume", "save_dir"):
            part["train"]["config"].pop(key)
        state = part["train"]["state"]
        state.pop("elapsed")
        state["history"] = _untimed(state["history"])  # (the interruption's validation is not the run's: it went)
    _assert_same(a, b)  # weights (averaged and raw), optimizer, RNG, schedule, metrics, best, ... bit for bit
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")  # and the log's validations
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B")  # the interruption's checkpoint went too
    for u in range(4, total + 1, 4):  # and every scheduled checkpoint's weights on the way
        _assert_same(checkpoint.load(tmp_path / "A" / f"checkpoint{u}.pt")["model"],
                     checkpoint.load(tmp_path / "B" / f"checkpoint{u}.pt")["model"], f"checkpoint{u}")
    assert [r["lr"] for r in _train_records(tmp_path / "A")] == [r["lr"] for r in _train_records(tmp_path / "B")]
    raw = a["train"].get("raw_model", a["model"])
    if "lr_scheduler" in options:  # the schedule really moved the rate
        assert len({r["lr"] for r in _train_records(tmp_path / "A")}) > 2
    if options.get("lr_scheduler") == "plateau":
        assert a["train"]["schedule"]["factor"] < 1
    if "ema_decay" in options or "average_last" in options:
        assert sum(not torch.equal(a["model"][k], raw[k]) for k in raw) >= len(raw) - 1  # (W_a: see above)


class _Clock:
    """A deterministic clock for the trainer (``nmtkit.train.trainer.clock``): every reading is one second after the
    one before, so an update and a scheduled validation each take one second; at reading ``term_at`` it sends this
    process a real SIGTERM."""

    def __init__(self, term_at: int | None = None):
        self.readings, self.term_at = 0, term_at

    def __call__(self) -> float:
        self.readings += 1
        if self.readings == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return float(self.readings)


def test_a_run_stopped_by_a_real_sigterm_keeps_after_resuming_what_the_uninterrupted_run_keeps(small, tmp_path,
                                                                                                 monkeypatch):
    """#34 item 9 with the signal itself (the test above stops at --max-updates): SIGTERM lands in update 7, off
    the grid of 4; its checkpoint and its validation record go once the resumed run is past them."""
    import nmtkit.train.trainer as trainer_module

    common = dict(valid_every=4, keep_last=2, valid_bleu_sentences=0, max_updates=14)
    train(_cfg(small, tmp_path / "A", **common))
    # two clock readings per update and per scheduled validation: reading 15 starts update 7 (see below)
    monkeypatch.setattr(trainer_module, "clock", _Clock(term_at=15))
    stopped = train(_cfg(small, tmp_path / "B", **common))
    assert stopped["status"] == "interrupted" and stopped["update"] == 7
    assert _numbered(tmp_path / "B") == ["checkpoint4.pt", "checkpoint7.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 7]
    monkeypatch.undo()
    train(_cfg(small, tmp_path / "B", resume=True, **common))
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B") == ["checkpoint12.pt", "checkpoint14.pt"]
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 8, 12, 14]
    state = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")["train"]["state"]
    assert [h["update"] for h in state["history"]] == [4, 8, 12, 14]


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_a_time_budget_anneals_by_the_clock_and_resumes_exactly(small, tmp_path, monkeypatch, kind):
    """--max-time with a decaying schedule: the rate reaches --min-lr when the run's time (updates and scheduled
    validations) reaches the budget, and a run stopped by SIGTERM and resumed follows the uninterrupted run's rates
    and reaches its weights bit for bit (given the same clock readings: time is the schedule's input)."""
    import nmtkit.train.trainer as trainer_module

    common = dict(optimizer="adam", lr=0.01, lr_scheduler=kind, warmup_updates=2, decay_fraction=0.5, min_lr=1e-4,
                  max_time=24, valid_every=4, keep_last=100)
    monkeypatch.setattr(trainer_module, "clock", _Clock())
    a = train(_cfg(small, tmp_path / "A", **common))
    # two readings per update and per scheduled validation: reading 15 starts update 7 (after 6 updates and one
    # validation), which the signal lets finish
    monkeypatch.setattr(trainer_module, "clock", _Clock(term_at=15))
    stopped = train(_cfg(small, tmp_path / "B", **common))
    assert stopped["status"] == "interrupted" and stopped["update"] == 7
    monkeypatch.setattr(trainer_module, "clock", _Clock())
    b = train(_cfg(small, tmp_path / "B", resume=True, **common))
    # 1 s an update and 1 s a scheduled validation (updates 4, 8, 12, 16): 24 s are reached at update 20 (20 + 4)
    assert a["status"] == b["status"] == "done" and a["update"] == b["update"] == 20
    lrs = [r["lr"] for r in _train_records(tmp_path / "A")]
    assert lrs == [r["lr"] for r in _train_records(tmp_path / "B")]
    assert lrs[:2] == pytest.approx([0.005, 0.01])  # warm-up
    assert lrs[2:6] == pytest.approx([0.01] * 4)  # held: the first half of the span after the warm-up
    assert all(x > y for x, y in zip(lrs[10:], lrs[11:]))  # then decaying ...
    assert lrs[-1] == pytest.approx(1e-4, rel=0.2)  # ... to the floor as the time runs out
    ca = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")
    cb = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    assert ca["train"]["state"]["elapsed"] == cb["train"]["state"]["elapsed"] == 25.0  # (and update 20's validation)
    assert ca["train"]["schedule"] == cb["train"]["schedule"] == {"factor": 1.0, "bad": 0, "best": None, "total": 0,
                                                                  "budget": 24.0, "decay_fraction": 0.5}
    _assert_same(ca["model"], cb["model"], "model")
    _assert_same(ca["train"]["optimizer"], cb["train"]["optimizer"], "optimizer")


@pytest.mark.parametrize("options, words", [
    ({"lr_scheduler": "noam"}, "--lr-scheduler 'noam'"),
    ({"lr_scheduler": "linear"}, "--lr-scheduler linear decays to --min-lr at the end of the run: it needs "
                                 "--schedule-updates or --max-updates above --warmup-updates (got 0 and 0), or a time "
                                 "budget (--max-time)"),
    ({"lr_scheduler": "linear", "max_time": 60, "decay_fraction": 0.0}, "--decay-fraction must be in (0, 1] (got 0.0)"),
    ({"lr_scheduler": "cosine", "max_time": 60, "decay_fraction": 1.5}, "--decay-fraction must be in (0, 1] (got 1.5)"),
    ({"lr_scheduler": "cosine", "max_updates": 10, "warmup_updates": 10}, "(got 10 and 10)"),
    ({"warmup_updates": -1}, "--warmup-updates must be at least 0 (got -1)"),
    ({"lr_decay": 1.0}, "--lr-decay must be in (0, 1) (got 1.0)"),
    ({"lr_decay": 0.0}, "--lr-decay must be in (0, 1) (got 0.0)"),
    ({"lr_patience": 0}, "--lr-patience must be at least 1 (got 0)"),
    ({"min_lr": -0.1}, "--min-lr must be finite and at least 0 (got -0.1)"),
    ({"min_lr": math.inf}, "--min-lr must be finite and at least 0 (got inf)"),
    ({"ema_decay": 1.5}, "--ema-decay must be in [0, 1) (got 1.5)"),
    ({"ema_decay": 1.0}, "--ema-decay must be in [0, 1) (got 1.0)"),
    ({"ema_decay": math.nan}, "--ema-decay must be in [0, 1) (got nan)"),
    ({"average_last": -2}, "--average-last must be at least 0 (got -2)"),
    ({"average_last": 5, "keep_last": 3}, "--keep-last (3) must be at least --average-last (5)"),
    ({"average_last": 2, "ema_decay": 0.99}, "--ema-decay and --average-last exclude each other"),
])
def test_bad_schedule_and_averaging_values_are_refused(small, tmp_path, options, words):
    from nmtkit.errors import InputError

    with pytest.raises(InputError) as e:
        Trainer(_cfg(small, tmp_path / "run", **options))
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_bad_values_on_the_command_line_and_plateau_without_validation(overfit_data, small, tmp_path):
    res = _nmt_train(small, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--ema-decay", 1.5)
    assert res.returncode == 1 and res.stderr.strip() == "nmt-train: error: --ema-decay must be in [0, 1) (got 1.5)"
    res = _nmt_train(overfit_data, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run",
                     "--lr-scheduler", "plateau")  # (no valid split)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "plateau needs a validation set" in lines[0], res.stderr
    assert not (tmp_path / "run").exists()


def test_resuming_an_old_checkpoint_with_ema_starts_it_from_the_weights(small, tmp_path, caplog):
    """A checkpoint without the new train entries (an older run: its "model" is the raw weights) resumes with
    averaging switched on: the EMA starts from those weights, with warnings about the changed settings."""
    import logging

    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=4, valid_bleu_sentences=0))
    old = checkpoint.load(run / "checkpoint_last.pt")
    del old["train"]["schedule"]
    for k in ("lr_scheduler", "warmup_updates", "lr_decay", "lr_patience", "min_lr", "ema_decay", "average_last"):
        del old["train"]["config"][k]
    checkpoint.save(old, run / "checkpoint_last.pt")
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
        trainer = Trainer(_cfg(small, run, max_updates=4, valid_bleu_sentences=0, resume=True, ema_decay=0.5))
    assert any("--ema-decay 0.0 -> 0.5" in r.getMessage() for r in caplog.records)
    assert any("holds no EMA" in r.getMessage() for r in caplog.records)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, old["model"][k]) and torch.equal(trainer.averager.weights()[k], v)


# -- recipes, initialisation and label smoothing ---------------------------------------------------------------------

def test_recipes_resolve_to_train_configs(small, tmp_path):
    from nmtkit.train.recipes import RECIPES, default_recipe, recipe_settings
    from nmtkit.train.config import train_config

    assert [default_recipe(a) for a in ("rnnsearch-small", "rnnencdec-small", "rnnsearch-tiny", "rnnencdec-tiny",
                                        "rnnsearch", "rnnencdec", "rnnsearch-50", "rnnencdec-30")] == \
        ["fast", "fast"] + ["paper"] * 6
    old = TrainConfig(data=str(small), arch="rnnsearch-tiny", save_dir=str(tmp_path))
    assert train_config(str(small), "rnnsearch-tiny", str(tmp_path)) == old  # the paper's recipe: the defaults
    assert train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="paper") == \
        dataclasses.replace(old, arch="rnnsearch-small")
    fast = train_config(str(small), "rnnsearch-small", str(tmp_path))
    assert (fast.recipe, fast.optimizer, fast.lr, fast.init) == ("fast", "adam", 1e-3, "xavier-flat")
    assert dataclasses.replace(fast, recipe="paper", optimizer="adadelta", lr=1.0, init="paper") == \
        dataclasses.replace(old, arch="rnnsearch-small")  # nothing else differs
    mine = train_config(str(small), "rnnsearch-small", str(tmp_path), lr=0.002, label_smoothing=0.1)
    assert (mine.recipe, mine.optimizer, mine.lr, mine.init, mine.label_smoothing) == \
        ("fast", "adam", 0.002, "xavier-flat", 0.1)
    settings = recipe_settings("fast")
    settings["lr"] = 5.0
    assert RECIPES["fast"]["lr"] == 1e-3  # a copy
    budget = train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="budget", max_time=600)
    assert dataclasses.replace(budget, recipe="fast", lr_scheduler="constant", decay_fraction=1.0, min_lr=0.0,
                               max_time=0.0) == fast  # fast, annealed over the last 30% to 1e-5
    assert (budget.lr_scheduler, budget.decay_fraction, budget.min_lr) == ("linear", 0.3, 1e-5)
    with pytest.raises(InputError, match="or a time budget \\(--max-time\\)"):  # it needs a budget
        train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="budget").check()
    with pytest.raises(ValueError, match="unknown recipe 'quick' \\(choose from paper, fast, budget\\)"):
        recipe_settings("quick")

    with pytest.raises(InputError, match="unknown recipe 'quick'"):
        Trainer(_cfg(small, tmp_path / "run", recipe="quick"))
    with pytest.raises(InputError, match="unknown --init 'glorot' \\(choose from paper, xavier, "
                                         "xavier-flat\\)"):
        Trainer(_cfg(small, tmp_path / "run", init="glorot"))
    assert not (tmp_path / "run").exists()


CLI_SMALL = ("--batch-size", 16, "--pool-batches", 2, "--max-updates", 1, "--valid-bleu-sentences", 0,
             "--threads", 1, "-q")


@pytest.mark.parametrize("args, want", [
    (["-a", "rnnsearch-small"], ("fast", "adam", 1e-3, "xavier-flat")),
    (["-a", "rnnencdec-small"], ("fast", "adam", 1e-3, "xavier-flat")),
    (["-a", "rnnsearch-tiny"], ("paper", "adadelta", 1.0, "paper")),
    (["-a", "rnnsearch", "-o", "emb_dim=16", "-o", "hidden_dim=24", "-o", "attn_dim=16", "-o", "maxout_dim=8"],
     ("paper", "adadelta", 1.0, "paper")),
    (["-a", "rnnsearch-small", "--lr", "0.002", "--recipe", "fast"], ("fast", "adam", 0.002, "xavier-flat")),
    (["-a", "rnnsearch-small", "--recipe", "paper"], ("paper", "adadelta", 1.0, "paper")),
    # an option given explicitly wins even when it spells the option's default
    (["-a", "rnnsearch-small", "--init", "paper", "--optimizer", "adadelta"], ("fast", "adadelta", 1e-3, "paper")),
    (["-a", "rnnsearch-tiny", "--recipe", "fast", "--optimizer", "sgd"], ("fast", "sgd", 1e-3, "xavier-flat")),
], ids=["small", "encdec-small", "tiny", "bare-arch", "fast-explicit-lr", "small-paper", "explicit-defaults",
        "tiny-fast-sgd"])
def test_recipe_on_the_command_line(small, tmp_path, args, want):
    run = tmp_path / "run"
    res = _nmt_train(small, *args, "--save-dir", run, *CLI_SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    last = checkpoint.load(run / "checkpoint_last.pt")
    cfg = last["train"]["config"]
    assert (cfg["recipe"], cfg["optimizer"], cfg["lr"], cfg["init"]) == want
    assert (cfg["label_smoothing"], cfg["lr_scheduler"], cfg["ema_decay"], cfg["batch_size"]) == (0, "constant", 0, 16)
    state = last["train"]["optimizer"]["state"]  # (SGD without momentum keeps none)
    assert bool(state) == (want[1] != "sgd")
    assert all(("exp_avg" in v) == (want[1] == "adam") and ("square_avg" in v) == (want[1] == "adadelta")
               for v in state.values())
    assert last["train"]["optimizer"]["param_groups"][0]["lr"] == want[2]
    # the weights after one update are near their initialisation's scale: B.1's N(0, 0.01²) or Glorot's
    E = last["model"]["E_src"]
    glorot = (2 / sum(E.shape)) ** 0.5
    if want[3].startswith("xavier"):
        assert abs(E.std().item() / glorot - 1) < 0.25, E.std().item()
    else:
        assert E.std().item() < 0.03 < 0.5 * glorot, E.std().item()


def test_unknown_recipe_or_init_is_a_usage_error(small, tmp_path):
    for option, value in (("--recipe", "quick"), ("--init", "glorot")):
        res = _nmt_train(small, "-a", "rnnsearch-small", "--save-dir", tmp_path / "run", option, value)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"nmt-train: error: Invalid value for '{option}'") and f"'{value}'" in res.stderr
    assert not (tmp_path / "run").exists()


def test_paper_recipe_changes_nothing(small, tmp_path):
    """--recipe paper, and no recipe on a tiny preset, train to the very weights of a TrainConfig of the defaults
    (the settings from before recipes existed).  That run too in a process of its own: BLAS's sums may be ordered
    otherwise inside pytest's process (differences of 1e-9)."""
    code = ("import sys; from nmtkit.train.trainer import TrainConfig, train; train(TrainConfig(data=sys.argv[1], "
            "arch='rnnsearch-tiny', save_dir=sys.argv[2], batch_size=16, pool_batches=2, valid_every=4, "
            "valid_bleu_sentences=0, valid_batch_size=20, log_every=1, threads=1, max_updates=3))")
    res = subprocess.run([sys.executable, "-c", code, str(small), str(tmp_path / "old")], capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    common = ("-a", "rnnsearch-tiny", "--batch-size", 16, "--pool-batches", 2, "--valid-every", 4,
              "--valid-bleu-sentences", 0, "--valid-batch-size", 20, "--log-every", 1, "--threads", 1,
              "--max-updates", 3, "-q")
    for name, extra in (("paper", ("--recipe", "paper")), ("none", ())):
        res = _nmt_train(small, *common, *extra, "--save-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
    old = checkpoint.load(tmp_path / "old" / "checkpoint_last.pt")
    for name in ("paper", "none"):
        new = checkpoint.load(tmp_path / name / "checkpoint_last.pt")
        _assert_same(old["model"], new["model"], name)
        _assert_same(old["train"]["optimizer"], new["train"]["optimizer"], name)
        assert torch.equal(old["train"]["rng"]["torch"], new["train"]["rng"]["torch"])
        a, b = (dict(c["train"]["config"]) for c in (old, new))
        for c in (a, b):
            c.pop("save_dir")
        assert a == b and b["recipe"] == "paper"
    torch.manual_seed(1)  # (the run's seed: its initial weights)
    from nmtkit.models import build_model

    fresh = build_model("rnnsearch-tiny", len(old["vocab"]["src"]), len(old["vocab"]["tgt"])).state_dict()
    trained = sum(not torch.equal(v, fresh[k]) for k, v in old["model"].items())
    assert trained >= len(fresh) - 2  # it did train, so the equality says something (v_a = 0 at first: W_a, U_a
    # get no gradient from the first update)


def _smoothed_loss_per_token(model, src_corpus, tgt_corpus, eps) -> float:
    from nmtkit.data.batching import eval_batches

    model.eval()
    loss, ntok = 0.0, 0
    for ids in eval_batches(np.asarray(src_corpus.sizes), np.asarray(tgt_corpus.sizes), 80):
        batch = collate(src_corpus, tgt_corpus, ids)
        with torch.no_grad():
            loss += float(model.training_loss(batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out, eps)[0])
        ntok += batch.num_tokens
    return loss / ntok


def test_label_smoothing_changes_the_updates_not_the_logged_losses(small, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_loss

    common = dict(max_updates=4, valid_every=4, valid_bleu_sentences=0, optimizer="adam", lr=1e-3, init="xavier")
    train(_cfg(small, tmp_path / "plain", **common))
    train(_cfg(small, tmp_path / "smooth", label_smoothing=0.1, **common))
    plain = checkpoint.load(tmp_path / "plain" / "checkpoint4.pt")
    smooth = checkpoint.load(tmp_path / "smooth" / "checkpoint4.pt")
    assert smooth["train"]["config"]["label_smoothing"] == 0.1
    differ = sum(not torch.equal(v, smooth["model"][k]) for k, v in plain["model"].items())
    assert differ >= len(plain["model"]) - 1, differ
    # the logged training loss is the NLL: at update 1 both runs had the same weights and the same batch
    p_log, s_log = _train_records(tmp_path / "plain"), _train_records(tmp_path / "smooth")
    assert [r["update"] for r in s_log] == [1, 2, 3, 4]
    assert s_log[0]["loss"] == pytest.approx(p_log[0]["loss"], rel=1e-6)
    assert s_log[0]["ppl"] == pytest.approx(math.exp(s_log[0]["loss"]), rel=1e-9)
    # the logged validation loss is the NLL of the saved model, not its smoothed loss
    data = PreparedData.open(small)
    vsrc, vtgt = data.corpus("valid", "en"), data.corpus("valid", "fr")
    model = build_from_checkpoint(smooth)
    nll = validation_loss(model, vsrc, vtgt, torch.device("cpu"), 20)["valid_loss"]
    logged = smooth["train"]["state"]["history"][-1]
    assert logged["update"] == 4 and logged["valid_loss"] == pytest.approx(nll, rel=1e-6)
    valid_records = [json.loads(line) for line in open(tmp_path / "smooth" / "train.jsonl")
                     if '"type": "valid"' in line]
    assert valid_records[-1]["valid_loss"] == pytest.approx(nll, rel=1e-6)
    assert _smoothed_loss_per_token(model, vsrc, vtgt, 0.1) > nll + 1e-3  # (which would differ)
    assert _smoothed_loss_per_token(model, vsrc, vtgt, 0.0) == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "1.5"])
def test_bad_label_smoothing_is_refused(small, tmp_path, value):
    res = _nmt_train(small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--label-smoothing", value)
    shown = repr(float(value))
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == f"nmt-train: error: --label-smoothing must be in [0, 1) (got {shown})", res.stderr
    assert not (tmp_path / "run").exists()


def test_xavier_init_changes_the_initial_weights_and_is_reproducible(small, tmp_path):
    from nmtkit.models.params import paper_parameters

    paper = Trainer(_cfg(small, tmp_path / "p0"))
    xavier = Trainer(_cfg(small, tmp_path / "x0", init="xavier"))
    P, X = paper_parameters(paper.model), paper_parameters(xavier.model)
    for key, x in X.items():
        name = key.rsplit(".", 1)[-1]
        if name.startswith("b"):
            assert torch.all(x == 0) and torch.all(P[key] == 0), key
        elif name not in ("U", "U_z", "U_r"):
            assert not torch.equal(x, P[key]), key
            bound = (6 / (x.shape[0] + (x.shape[1] if x.dim() == 2 else 1))) ** 0.5
            assert x.abs().max() <= bound and x.abs().max() > 0.8 * bound, key  # Glorot's scale, not B.1's
            assert P[key].abs().max() < 0.6 * bound, key
    # a fresh run is reproducible under its seed and starts from other weights than the paper's init
    runs = {}
    for name, kw in (("x1", dict(init="xavier")), ("x2", dict(init="xavier")), ("seed2", dict(init="xavier", seed=2)),
                     ("paper", {})):
        train(_cfg(small, tmp_path / name, max_updates=2, valid_every=1, valid_bleu_sentences=0, **kw))
        runs[name] = checkpoint.load(tmp_path / name / "checkpoint1.pt")
    _assert_same(runs["x1"]["model"], runs["x2"]["model"])
    _assert_same(checkpoint.load(tmp_path / "x1" / "checkpoint2.pt")["model"],
                 checkpoint.load(tmp_path / "x2" / "checkpoint2.pt")["model"])
    for other in ("seed2", "paper"):
        assert not torch.equal(runs["x1"]["model"]["E_src"], runs[other]["model"]["E_src"]), other
        assert not torch.equal(runs["x1"]["model"]["W_o"], runs[other]["model"]["W_o"]), other
    assert runs["x1"]["train"]["config"]["init"] == "xavier" and runs["paper"]["train"]["config"]["init"] == "paper"
    # one Adadelta update moves a weight by about 1e-3 at most: the first checkpoint is still at Glorot's scale
    W = runs["x1"]["model"]["W_s"]
    bound = (6 / sum(W.shape)) ** 0.5
    assert abs(W.std().item() / (bound / 3 ** 0.5) - 1) < 0.25
    assert runs["paper"]["model"]["W_s"].std().item() < 0.2 * bound / 3 ** 0.5


def test_progress_lines_report_the_log_windows_mean_like_the_json_records(small, tmp_path, caplog):
    # (a single update's loss swings with its batch: the log line once read 0.67 amid losses of 4)
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="nmtkit.train"):
        train(_cfg(small, tmp_path / "run", max_updates=8, log_every=3, valid_every=6, valid_bleu_sentences=0))
    lines = [r.getMessage() for r in caplog.records if re.match(r"update \d+ epoch", r.getMessage())]
    records = {r["update"]: r for r in map(json.loads, (tmp_path / "run" / "train.jsonl").read_text().splitlines())
               if r["type"] == "train"}
    assert [int(line.split()[1]) for line in lines] == sorted(records) == [3, 6]
    for line in lines:
        update = int(line.split()[1])
        loss = float(re.search(r"loss ([0-9.]+)", line).group(1))
        assert loss == pytest.approx(records[update]["loss"], abs=6e-5)
    assert lines[0].endswith("validation in 3 updates") and lines[1].endswith("validating")


def test_bf16_where_it_is_emulated_is_warned_about(small, tmp_path, caplog, monkeypatch):
    # (on a CPU without AVX-512 BF16 or AMX, rnnsearch-50 trained at 11 target tokens/s with --bf16, 369 without)
    import logging

    from nmtkit import device

    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert device.bf16_is_native(torch.device("cpu")) is bool(native)
    assert device.bf16_is_native(torch.device("cuda")) is True
    for is_native in (False, True):
        monkeypatch.setattr(device, "bf16_is_native", lambda d, v=is_native: v)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
            Trainer(_cfg(small, tmp_path / f"run{is_native}", bf16=True)).rundir.unlock()
        warned = [r.getMessage() for r in caplog.records if "--bf16 on this CPU" in r.getMessage()]
        assert len(warned) == (0 if is_native else 1)
        assert not warned or "emulated" in warned[0]


def test_the_reference_backend_trains_to_the_fast_ones_weights(small, tmp_path):
    """nmt-train --backend reference: the paper's equations as written (nmtkit/models/reference.py) make the same
    updates as the fast paths, to float32 rounding (plain SGD, no clipping: each update is linear in the gradient)."""
    runs = {}
    for backend in ("fast", "reference"):
        trainer = Trainer(_cfg(small, tmp_path / backend, optimizer="sgd", lr=0.5, clip_norm=0.0, max_updates=3,
                               valid_every=3, valid_bleu_sentences=2, backend=backend))
        assert trainer.model.backend == backend
        trainer.train()
        runs[backend] = checkpoint.load(tmp_path / backend / "checkpoint_last.pt")
    fast, ref = runs["fast"]["model"], runs["reference"]["model"]
    for k in fast:
        torch.testing.assert_close(ref[k], fast[k], atol=2e-5, rtol=1e-4, msg=k)
    assert runs["reference"]["train"]["config"]["backend"] == "reference"
    ref_valid, fast_valid = (runs[b]["train"]["state"]["history"][-1] for b in ("reference", "fast"))
    assert ref_valid["valid_loss"] == pytest.approx(fast_valid["valid_loss"], rel=1e-4)
    assert ref_valid.get("bleu") == pytest.approx(fast_valid.get("bleu"), abs=1e-6)  # (greedy search on each)


def test_a_bad_backend_is_one_line(small, tmp_path):
    res = _nmt_train(small, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--backend", "slow")
    assert res.returncode == 2 and "'slow' is not one of 'fast', 'reference'" in res.stderr, res.stderr
    env = dict(_env(), NMTKIT_BACKEND="slow")
    res = subprocess.run([sys.executable, NMT_TRAIN, str(small), "--arch", "rnnsearch-tiny", "--save-dir",
                          str(tmp_path / "run"), "--max-updates", "1"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        ("nmt-train: error: NMTKIT_BACKEND='slow' is not a backend (choose from fast, reference, or "
         "fast:no-onednn,no-kernels with either switch)")], res.stderr
    assert not (tmp_path / "run").exists()
