"""nmtkit.models.fast.matmul.Multiplier: per-step products through oneDNN on CPU, equal to torch's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nmtkit import kernels
from nmtkit.device import bf16_is_native
from nmtkit.models import build_model
from nmtkit.models.fast import matmul
from nmtkit.models.fast.matmul import Multiplier
from nmtkit.models.fast.policy import SpeedPolicy, policy


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and os.uname().machine in ("x86_64", "AMD64")),
                    reason="not an x86 torch build with oneDNN")
def test_onednn_route_is_taken_for_per_step_products_only():
    """On x86 builds (this machine's and CI's) a training step's per-step products go through oneDNN, and
    nothing else does: oneDNN keeps a primitive per product shape, and the large products' shapes change with
    every batch (matmul.py), so any product with more rows than the batch would make a process grow."""
    if not policy().onednn:
        pytest.skip(f"oneDNN turned off in the environment (NMTKIT_BACKEND={os.environ.get('NMTKIT_BACKEND')})")
    assert matmul.onednn(torch.zeros(1))
    # bf16 where this CPU runs oneDNN's bf16 products (AVX512-BW / AVX-NE-CONVERT), else torch's products
    assert matmul.onednn(torch.zeros(1, dtype=torch.bfloat16)) == matmul._onednn_works(torch.bfloat16)
    assert matmul.onednn(torch.zeros(1), torch.bfloat16) == matmul._onednn_works(torch.bfloat16)
    assert not matmul.onednn(torch.zeros(1, dtype=torch.float64))
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = build_model("rnnsearch-tiny", 30, 30)
    B = 9
    src = torch.randint(4, 30, (B, 7))
    lens = torch.tensor([7, 7, 6, 6, 5, 4, 4, 2, 1])
    src[torch.arange(7).unsqueeze(0) >= lens.unsqueeze(1)] = 0  # <pad>
    tgt = torch.randint(4, 30, (B, 6))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        model.nll(src, lens, tgt, tgt).backward()
    rows = [e.input_shapes[0][0] for e in p.events() if e.name == "mkldnn::_linear_pointwise"]
    assert rows and max(rows) <= B


def test_small_weights_stay_with_torch(speed_policy):
    """Below matmul.ONEDNN_MIN_WEIGHT elements (the small preset's sizes) a Multiplier uses torch's products."""
    speed_policy(onednn_min_weight=SpeedPolicy.onednn_min_weight)  # (as outside the tests)
    assert Multiplier(_rand(256, 512)).packed is None
    assert Multiplier(_rand(1000, 1000)).packed is not None or not matmul.onednn(torch.zeros(1))


def test_switched_off_by_the_environment():
    code = "import torch; from nmtkit.models.fast.matmul import onednn; print(onednn(torch.zeros(1)))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NMTKIT_BACKEND": "fast:no-onednn"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_probe_leaves_the_global_random_state_alone():
    """The first-use check of the oneDNN route runs inside the first product of a training run: drawing from the
    global generator there made a process's first run differ from a resumed one (dropout masks shifted)."""
    matmul._onednn_works.cache_clear()
    before = torch.get_rng_state()
    matmul._onednn_works()
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("lowp", [None, torch.bfloat16])
@pytest.mark.parametrize("rows", [80, 7, 0])
def test_multiplier_equals_torch(lowp, rows):
    """A prepared (reordered) weight gives x Wᵀ and bias + x Wᵀ for any row count (none too), float32 results;
    in bf16 as the bf16 product (within bf16 rounding of the result); a weight given as a transposed view (the
    backward passes' Uᵀ) and a row slice of a wider x (a packed step's rows) alike."""
    W, x, bias = _rand(30, 50), _rand(rows, 50, seed=1), _rand(rows, 30, seed=2)
    by_W = Multiplier(W, lowp)
    dtype = lowp or torch.float32
    if lowp is None:
        ref, tol = x.double() @ W.double().t(), dict(rtol=1e-5, atol=1e-5)
    else:
        ref, tol = (x.to(lowp) @ W.to(lowp).t()).double(), dict(rtol=1e-2, atol=1e-2)
    out = by_W.product(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 30)
    torch.testing.assert_close(out.double(), ref, **tol)
    if lowp is not None:
        assert by_W.product(x, float32=False).dtype == lowp
    into = torch.empty(rows, 30)
    assert by_W.add_product(bias, x, out=into) is into
    torch.testing.assert_close(into.double(), bias.double() + ref, **tol)
    xt = _rand(rows, 30, seed=3)
    torch.testing.assert_close(Multiplier(W.t(), lowp).product(xt).double(),
                               (xt.to(dtype) @ W.to(dtype)).double(), **tol)
    wide = _rand(rows, 70, seed=4)[:, 10:60]  # (rows, 50), not contiguous
    torch.testing.assert_close(by_W.product(wide).double(), (wide.to(dtype) @ W.to(dtype).t()).double(), **tol)


def test_token_counts_are_rounded_to_whole_buckets_in_bf16_on_the_cpu():
    cpu = torch.device("cpu")
    assert [matmul.token_rows(k, torch.bfloat16, cpu) for k in (1, 63, 64, 65, 1355)] == [64, 64, 64, 128, 1408]
    assert [matmul.token_rows(k, None, cpu) for k in (1, 8, 13, 1355)] == [8, 8, 16, 1360]
    # only bf16 on the CPU (oneDNN's compiled products): not float16, not CUDA
    assert matmul.in_buckets(torch.bfloat16, cpu)
    assert not matmul.in_buckets(torch.float16, cpu) and not matmul.in_buckets(None, cpu)
    assert not matmul.in_buckets(torch.bfloat16, torch.device("cuda"))
    assert matmul.token_rows(13, torch.bfloat16, torch.device("cuda")) == 16


@pytest.mark.parametrize("shape", [(37, 29), (64, 64), (1, 130)])
def test_mm_in_bf16_equals_the_unpadded_product(shape):
    """``mm`` pads a bf16 product's token counts (M, K) with zeros: the result has the real rows only, and their
    values are the unpadded product's (extra terms are exact zeros; only the summation order may differ)."""
    M, K = shape
    a, b = _rand(M, K), _rand(K, 16, seed=1)
    out = matmul.mm(a, b, torch.bfloat16)
    assert out.shape == (M, 16) and out.dtype == torch.float32
    ref = (a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=2e-2)
    assert matmul.mm(a, b, torch.bfloat16, float32=False).dtype == torch.bfloat16


def _product_dims(model, src, lens, tgt, bf16: bool) -> set[int]:
    """Every dimension of every matrix product's operands in a training step (forward and backward)."""
    from torch.profiler import ProfilerActivity, profile

    names = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm", "aten::baddbmm",
             "mkldnn::_linear_pointwise"}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model.nll(src, lens, tgt, tgt)
        loss.backward()
    return {d for e in p.events() if e.name in names for shape in e.input_shapes for d in shape}


def test_bf16_training_products_never_see_the_batchs_token_counts():
    """Under bf16 autocast on the CPU, no product of a training step has one of the batch's token counts as a
    dimension (43 source, 41 target tokens here): oneDNN compiles a kernel for every new shape, and those counts
    change with every batch (matmul.py).  The float32 step has them, which shows that the check sees them."""
    torch.manual_seed(0)
    model = build_model("rnnsearch-tiny", 30, 30)
    lens = torch.tensor([7, 7, 6, 5, 5, 4, 4, 3, 2])  # Σ = 43 source tokens
    src = torch.randint(4, 30, (9, 7))
    src[torch.arange(7).unsqueeze(0) >= lens.unsqueeze(1)] = 0  # <pad>
    tgt_lens = torch.tensor([6, 6, 5, 5, 5, 4, 4, 4, 2])  # Σ = 41 target tokens
    tgt = torch.randint(4, 30, (9, 6))
    tgt[torch.arange(6).unsqueeze(0) >= tgt_lens.unsqueeze(1)] = 0
    assert {41, 43} <= _product_dims(model, src, lens, tgt, bf16=False)
    assert not {41, 43} & _product_dims(model, src, lens, tgt, bf16=True)


_SHAPES_TWICE = """
import os, sys, torch
import nmtkit.models.fast.matmul
w = torch.randn(16, 16).to(torch.bfloat16)
for m in range(1, 1201):  # 1,200 shapes oneDNN compiles: more than its default cache keeps
    torch.randn(m, 16).to(torch.bfloat16) @ w
print("SECOND PASS", flush=True)
for m in range(1, 1201):
    torch.randn(m, 16).to(torch.bfloat16) @ w
print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], flush=True)
"""


def _recompiled(capacity: str | None) -> tuple[int, str]:
    """(products oneDNN compiled again in the second pass over 1,200 bf16 shapes, the capacity in force)."""
    env = {**os.environ, "ONEDNN_VERBOSE": "2"}
    env.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    if capacity is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    out = subprocess.run([sys.executable, "-c", _SHAPES_TWICE], env=env, capture_output=True, text=True,
                         check=True).stdout
    second = out.split("SECOND PASS", 1)[1]
    return second.count("create:cache_miss"), second.strip().splitlines()[-1]


@pytest.mark.skipif(not bf16_is_native(torch.device("cpu")), reason="this CPU has no native bf16: torch's bf16 "
                    "products do not go through oneDNN")
def test_onednn_keeps_the_compiled_products_of_a_bf16_run():
    """Importing nmtkit's products raises oneDNN's cache of compiled products from 1,024 to ONEDNN_CACHE: 1,200
    shapes met twice are compiled once.  A capacity the user sets is kept (and 1,024 does compile them again,
    which shows the check can see it)."""
    assert _recompiled(None) == (0, str(matmul.ONEDNN_CACHE))
    again, kept = _recompiled("1024")
    assert kept == "1024" and again >= 100


class _NoKernels:
    @staticmethod
    def usable(*tensors):
        return False


def test_bf16_weights_are_the_same_with_and_without_the_cast_kernel(native_kernels, monkeypatch):
    """The C cast (nmtkit/kernels/cast.c) of a transposed weight for a Multiplier, and of W_o into its padded copy,
    gives torch's bfloat16 values bit for bit, so the products are the same."""
    W, x = _rand(300, 1000), _rand(9, 300, seed=1)  # (Wᵀ: 1000 × 300, large enough for the oneDNN route)
    W_o, b_y = _rand(301, 500, seed=2), _rand(301, seed=3)
    calls = []
    real_cast = kernels.to_bf16
    monkeypatch.setattr(kernels, "to_bf16", lambda *a, **k: calls.append(a[0].shape) or real_cast(*a, **k))
    fast = Multiplier(W.t(), torch.bfloat16).product(x)
    W2, b2 = matmul.padded_vocab(W_o, b_y, float("-inf"), columns=True, dtype=torch.bfloat16)
    # the kernel cast W_o, and Wᵀ too where the product goes through oneDNN
    assert calls == ([(1000, 300)] if matmul.onednn(W, torch.bfloat16) else []) + [(301, 500)]
    monkeypatch.setattr(matmul, "kernels", _NoKernels)
    assert torch.equal(fast, Multiplier(W.t(), torch.bfloat16).product(x))
    W2_torch, b2_torch = matmul.padded_vocab(W_o, b_y, float("-inf"), columns=True, dtype=torch.bfloat16)
    assert W2.shape == (304, 504) and torch.equal(W2, W2_torch) and torch.equal(b2, b2_torch)
    assert W2[301:].eq(0).all() and W2[:, 500:].eq(0).all()


def test_float16_autocast_takes_torchs_products():
    """oneDNN's float16 reorder needs CPU features this machine lacks: the route is chosen on the dtype the product
    runs in, so float16 weights stay with torch's products (any weight size)."""
    W, x = _rand(600, 1000), _rand(7, 1000, seed=1)
    by_W = Multiplier(W, torch.float16)
    assert by_W.packed is None
    torch.testing.assert_close(by_W.product(x), (x.half() @ W.half().t()).float())
    assert Multiplier(W.t(), torch.float16).product(_rand(3, 600, seed=2)).shape == (3, 1000)
