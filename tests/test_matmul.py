"""nmtkit.models.matmul: the products routed through oneDNN on CPU equal torch's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import matmul
from nmtkit.models.matmul import Multiplier, aligned_linear, linear, mm

needs_onednn = pytest.mark.skipif(not matmul.onednn(torch.zeros(1)),
                                  reason="this torch build has no usable oneDNN products (or NMTKIT_ONEDNN=0)")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and os.uname().machine in ("x86_64", "AMD64")),
                    reason="not an x86 torch build with oneDNN")
def test_onednn_route_is_taken_on_x86():
    """On x86 builds (this machine's and CI's) the training products do go through oneDNN."""
    if os.environ.get("NMTKIT_ONEDNN") == "0":
        pytest.skip("NMTKIT_ONEDNN=0 in the environment")
    assert matmul.onednn(torch.zeros(1)) and matmul.onednn(torch.zeros(1, dtype=torch.bfloat16))
    assert not matmul.onednn(torch.zeros(1, dtype=torch.float64))
    from torch.profiler import ProfilerActivity, profile

    x, W = _rand(4, 9).requires_grad_(), _rand(5, 9, seed=1)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        linear(x, W).sum().backward()
        Multiplier(W).product(x.detach())
    names = [e.key for e in p.key_averages()]
    assert "mkldnn::_linear_pointwise" in names and "mkldnn::_reorder_linear_weight" in names


def test_switched_off_by_the_environment():
    code = "import torch; from nmtkit.models.matmul import onednn; print(onednn(torch.zeros(1)))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NMTKIT_ONEDNN": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@needs_onednn
@pytest.mark.parametrize("case", ["plain", "b transposed", "a column slice", "a transposed", "bias", "empty K",
                                  "empty M"])
def test_mm_equals_torch(case):
    """mm(a, b) = a @ b in float32 (to a few ulps: another summation order), whatever the operands' layout."""
    a, b, bias = _rand(13, 40), _rand(40, 24, seed=1), None
    if case == "b transposed":
        b = _rand(24, 40, seed=1).t()
    elif case == "a column slice":
        a = _rand(13, 60)[:, 10:50]
    elif case == "a transposed":  # (torch's GEMM, which reads it in place)
        a = _rand(40, 13).t()
    elif case == "bias":
        bias = _rand(24, seed=2)
    elif case == "empty K":
        a, b = a[:, :0], b[:0]
    elif case == "empty M":
        a = a[:0]
    ref = a.double() @ b.double() + (0 if bias is None else bias.double())
    out = mm(a, b, bias=bias)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lowp", [None, torch.bfloat16])
@pytest.mark.parametrize("rows", [80, 7])
def test_multiplier_equals_torch(lowp, rows):
    """A prepared (reordered) weight gives x Wᵀ and bias + x Wᵀ for any row count, float32 results; in bf16
    as the bf16 product (within bf16 rounding of the result)."""
    W, x, bias = _rand(30, 50), _rand(rows, 50, seed=1), _rand(rows, 30, seed=2)
    by_W = Multiplier(W, lowp)
    if lowp is None:
        ref, tol = x.double() @ W.double().t(), dict(rtol=1e-5, atol=1e-5)
    else:
        ref, tol = (x.to(lowp) @ W.to(lowp).t()).double(), dict(rtol=1e-2, atol=1e-2)
    out = by_W.product(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, **tol)
    into = torch.empty(rows, 30)
    assert by_W.add_product(bias, x, out=into) is into
    torch.testing.assert_close(into.double(), bias.double() + ref, **tol)
    # a weight given as a transposed view (the backward passes' Uᵀ)
    torch.testing.assert_close(Multiplier(W.t(), lowp).product(_rand(rows, 30, seed=3)).double(),
                               (_rand(rows, 30, seed=3).to(lowp or torch.float32) @ W.to(lowp or torch.float32)
                                ).double(), **tol)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("fn", [linear, aligned_linear])
def test_linear_values_and_gradients_equal_f_linear(fn, autocast):
    """linear (and aligned_linear, K = 13 padded to 16) give F.linear's values and gradients: in float32 to a
    few ulps; under bf16 autocast in bf16, like F.linear there."""
    x = _rand(3, 5, 13).requires_grad_()
    W, b = _rand(6, 13, seed=1).requires_grad_(), _rand(6, seed=2).requires_grad_()
    w = _rand(3, 5, 6, seed=3)
    results = []
    for f in (fn, F.linear):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = f(x, W, b)
        results.append((y, torch.autograd.grad((y.float() * w).sum(), (x, W, b))))
    (y, grads), (y_ref, grads_ref) = results
    assert y.dtype == y_ref.dtype == (torch.bfloat16 if autocast else torch.float32)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.float(), y_ref.float(), **tol)
    for g, g_ref in zip(grads, grads_ref):
        assert g.shape == g_ref.shape and g.dtype == g_ref.dtype
        torch.testing.assert_close(g, g_ref, **tol)
