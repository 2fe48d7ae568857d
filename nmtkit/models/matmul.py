"""Matrix products shaped and routed for the CPU.

**Through oneDNN.**  On this CPU (AMD EPYC, AVX-512) torch 2.13's default float32 GEMM (MKL) reaches 120–180
GFLOP/s on the training step's products; oneDNN, which the same torch build carries (``torch.ops.mkldnn``), reaches
160–220 on the very same products, and more again on the decoder's and encoder's per-step products (80 × 1,000 ×
3,000 and smaller) when the weight is reordered once into oneDNN's blocked layout instead of at every call
(tests/bench/results/bench_kernels.txt).  So on CPU, in float32 and bfloat16:

- ``mm(a, b)`` and the autograd-aware ``linear(x, W, b)`` run through oneDNN;
- ``Multiplier(W)`` prepares a weight for many products x Wᵀ -- the per-step products of a recurrence, where the
  weight is the same at every step: reordered once per forward (or backward) pass.

The values are float32 GEMM results like torch's, only summed in another order (differences of a few ulps; tests
compare both routes).  Anywhere else -- CUDA, float64, a torch build without oneDNN, or ``NMTKIT_ONEDNN=0`` in the
environment -- the same functions call torch's own products.

**Dimensions rounded up to a multiple of 8** with zeros: a product runs markedly slower on this CPU when a
dimension of its *result* is not one: the paper's vocabulary 30,000 + 4 specials, its embedding size m = 620 and
maxout size l = 500 all are not.  Zero padding leaves every value as it is (the extra terms are exact zeros) and
costs a copy of one operand, far less than it saves:

- ``padded_vocab``: output layers over V' = V rounded up (zero rows of W_o; the bias of the extra rows chosen by
  the caller: −inf in the loss, so they get probability 0);
- ``aligned_linear``: ``linear`` with the reduced dimension K rounded up, so that the backward pass's products,
  whose results are K wide (∂L/∂x (N, K) and ∂L/∂W (out, K)), run at full speed.

``lowp`` arguments: the autocast dtype (bf16) in which a product runs, its operands cast to it and its result
returned in float32 -- how the hand-written recurrences keep states and accumulations in float32.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

ALIGN = 8
ROWS_HINT = 80  # the batch size oneDNN's weight layout is chosen for (the paper's minibatch); any row count works


def round_up(k: int) -> int:
    """k rounded up to a multiple of ``ALIGN``."""
    return k + (-k % ALIGN)


@functools.cache
def _onednn_works() -> bool:
    """Whether this torch build's oneDNN products are there and agree with torch.mm (checked once)."""
    if os.environ.get("NMTKIT_ONEDNN", "1") == "0":
        return False
    try:
        a, w = torch.randn(5, 11), torch.randn(7, 11)
        plain = torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
        packed = torch.ops.mkldnn._linear_pointwise(a, torch.ops.mkldnn._reorder_linear_weight(w, 5), None,
                                                    "none", [], "")
        return bool(torch.allclose(plain, a @ w.t(), atol=1e-5) and torch.allclose(packed, a @ w.t(), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def onednn(t: Tensor) -> bool:
    """Whether products with t go through oneDNN (CPU, float32 or bfloat16, oneDNN usable)."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.bfloat16) and _onednn_works()


def autocast_dtype(t: Tensor):
    """The autocast dtype when autocast is on for t's device, else None."""
    dev = t.device.type
    try:
        on = torch.is_autocast_enabled(dev)  # torch >= 2.4
    except TypeError:
        on = torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()
    if not on:
        return None
    try:
        return torch.get_autocast_dtype(dev)
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if dev == "cpu" else torch.get_autocast_gpu_dtype()


def _low(t: Tensor, lowp) -> Tensor:
    return t if lowp is None else t.to(lowp)


def mm(a: Tensor, b: Tensor, lowp=None, bias: Tensor | None = None) -> Tensor:
    """a @ b (+ bias) for a (M, K), b (K, N), bias (N,); in ``lowp`` with a float32 result when given (the bias
    then added in float32)."""
    a, b = _low(a, lowp), _low(b, lowp)
    low_bias = bias if lowp is None else None
    # oneDNN's product wants a row-major a (it would copy a transposed one, e.g. in a weight gradient Gᵀ X, where
    # torch's GEMM reads it in place) and refuses empty operands
    if onednn(a) and a.stride(-1) == 1 and a.numel() and b.numel():
        out = torch.ops.mkldnn._linear_pointwise(a, b.t(), low_bias, "none", [], "")
    else:
        out = a @ b if low_bias is None else torch.addmm(low_bias, a, b)
    if lowp is None:
        return out
    return out.float() if bias is None else out.float().add_(bias)


class Multiplier:
    """A weight W (N, K) prepared for many products x Wᵀ (x (M, K)), in ``lowp`` when given (float32 results)."""

    def __init__(self, W: Tensor, lowp=None):
        self.lowp = lowp
        W = _low(W, lowp)
        if onednn(W):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(W.contiguous(), ROWS_HINT)
        else:
            self.packed = None
        self.WT = W.t()

    def product(self, x: Tensor, float32: bool = True) -> Tensor:
        """x Wᵀ: (M, K) -> (M, N); with ``lowp``, in float32 unless ``float32=False`` (then in ``lowp``, for a
        caller whose next operation promotes it anyway)."""
        x = _low(x, self.lowp)
        if self.packed is None or not x.numel():
            out = x @ self.WT
        else:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return out if self.lowp is None or not float32 else out.float()

    def add_product(self, bias: Tensor, x: Tensor, out: Tensor) -> Tensor:
        """out = bias + x Wᵀ (bias, out (M, N), float32; a ``lowp`` product is promoted by the addition)."""
        if self.packed is None and self.lowp is None:
            return torch.addmm(bias, x, self.WT, out=out)
        return torch.add(bias, self.product(x, float32=False), out=out)


class _Linear(torch.autograd.Function):
    """x Wᵀ + b through oneDNN, forwards and backwards (x (..., K), W (N, K), b (N,) or None)."""

    @staticmethod
    def forward(ctx, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, W)
        ctx.has_bias = b is not None
        return torch.ops.mkldnn._linear_pointwise(x, W, b, "none", [], "")

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        x, W = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])  # (M, N)
        dx = mm(dy2, W).view(x.shape) if ctx.needs_input_grad[0] else None  # (..., K)
        dW = mm(dy2.t(), x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None  # (N, K)
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None  # (N,)
        return dx, dW, db


def linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, W, b), through oneDNN on CPU (see the module docstring); under autocast in its dtype, as
    F.linear would be."""
    lowp = autocast_dtype(x)
    if lowp is None:
        same = x.dtype == W.dtype and (b is None or b.dtype == W.dtype)
        return _Linear.apply(x, W, b) if same and onednn(x) and x.numel() and W.numel() else F.linear(x, W, b)
    if not (onednn(x.new_empty(0, dtype=lowp)) and x.numel() and W.numel()):
        return F.linear(x, W, b)
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x.to(lowp), W.to(lowp), None if b is None else b.to(lowp))


def padded_vocab(W: Tensor, b: Tensor, b_fill: float, columns: bool = False) -> tuple[Tensor, Tensor]:
    """W (V, l), b (V,) -> the same with V (and l too when ``columns``) rounded up to a multiple of ``ALIGN``:
    zero rows (and columns) in W, ``b_fill`` in b's extra entries.  One copy of W; returned as they are when
    nothing needs padding."""
    (V, l), V2 = W.shape, round_up(W.shape[0])
    l2 = round_up(l) if columns else l
    if (V2, l2) == (V, l):
        return W, b
    W2 = W.new_zeros(V2, l2)
    W2[:V, :l] = W
    return W2, torch.cat([b, b.new_full((V2 - V,), b_fill)])


def aligned_linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """``linear(x, W, b)`` (x (..., K), W (out, K)) computed with K rounded up to a multiple of ``ALIGN``."""
    extra = round_up(W.shape[1]) - W.shape[1]
    if not extra:
        return linear(x, W, b)
    return linear(F.pad(x, (0, extra)), F.pad(W, (0, extra)), b)
