"""nmtkit's Adadelta (nmtkit/train/adadelta.py) against torch's, on its two update paths (torch's operations block
by block, the compiled kernel), with row-sparse gradients, a clipping factor and torch's saved state; and
clip_grad_norm_ on row-sparse gradients (nmtkit/train/gradients.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from nmtkit.train import adadelta
from nmtkit.train.adadelta import Adadelta

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")


pytestmark = pytest.mark.usefixtures("restore_threads")  # (the runs use threads=1: give the rest theirs back)


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
