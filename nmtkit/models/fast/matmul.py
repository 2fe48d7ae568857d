"""Matrix products shaped and routed for the CPU.

**Per-step products through oneDNN.**  A recurrence multiplies the same weight at every step by a small batch of
states (80 × 1,000 → 3,000 and smaller in the paper's decoder).  torch 2.13's default float32 GEMM (MKL) handles
such thin products poorly on this CPU (AMD EPYC, AVX-512); oneDNN, which the same torch build carries
(``torch.ops.mkldnn``), runs them faster when the weight is reordered once into its blocked layout
(tests/bench/results/bench_kernels.txt, rows "per step").  ``Multiplier(W)`` does
that: W reordered once per forward (or backward) pass, then ``product(x)`` / ``add_product(bias, x, out)`` at every step
(weights of at least the policy's ``onednn_min_weight`` elements: the paper's sizes, not the small preset's).  The
values are float32 GEMM results like torch's, only summed in another order (tests compare).  Elsewhere -- CUDA,
float64, float16 autocast, a torch build without oneDNN, or ``NMTKIT_BACKEND=fast:no-onednn`` in the environment --
``Multiplier`` calls torch's products.

Only these: oneDNN keeps a compiled primitive, with its buffers, for every distinct product shape it meets (up to
1,024 of them).  The per-step shapes are few (rows up to the batch size), but the large products -- the output
layer, the input projections -- change shape with every batch's token count: routed through oneDNN as well (a
little faster each, in one-off measurements) they made a training process grow with every batch until those
caches filled (``test_matmul`` checks that no oneDNN product has more rows than the batch).

**Dimensions rounded up to a multiple of 8** with zeros: a product runs markedly slower on this CPU when a
dimension of its *result* is not one: the paper's vocabulary 30,000 + 4 specials, its embedding size m = 620 and
maxout size l = 500 all are not.  Zero padding leaves every value as it is (the extra terms are exact zeros) and
costs a copy of one operand, far less than it saves:

- ``padded_vocab``: output layers over V' = V rounded up (zero rows of W_o; the bias of the extra rows chosen by
  the caller: −inf in the loss, so they get probability 0); the training loss (output.py) rounds its count of
  target rows up too, the logits being N × V';
- ``aligned_linear``: F.linear with the reduced dimension K rounded up, so that the backward pass's products, whose
  results are K wide (∂L/∂x (N, K) and ∂L/∂W (out, K)), run at full speed.

**Token counts rounded up to a multiple of 64 in bf16 on the CPU** (``token_rows``).  Where the CPU has AMX,
torch's bf16 products go through oneDNN, which compiles a kernel for every new shape it meets (milliseconds for
the output layer's) and keeps at most 1,024 of them.  The products over a batch's tokens -- the encoder's input
projections, the deep output's, the output layer's, the decoder's context terms -- change shape with every batch,
so that a bf16 training step compiled a dozen products every update, and ran slower than float32
(tests/bench/results/bench_bf16_rows.txt).  Rounded up to a multiple of 64 (zero rows, sliced off the result),
the shapes repeat and the compiled kernels are found again.  Float32 products (MKL) compile nothing: rounded to 8
as above.  Even so, a bf16 run meets more shapes than oneDNN keeps (the per-step products' row counts, the
buckets of every token-sized product, forwards and backwards): evicted, they were compiled again, hundreds of
times every 100 updates.  Importing this module therefore sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to
``ONEDNN_CACHE`` (unless the environment sets it): oneDNN reads it at its first product.

``lowp`` arguments: the autocast dtype (bf16) in which a product runs, its operands cast to it and its result
returned in float32 -- how the hand-written recurrences keep states and accumulations in float32.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from nmtkit import kernels
from nmtkit.models.fast.policy import policy

ALIGN = 8
ROWS_HINT = 80  # the batch size oneDNN's weight layout is chosen for (the paper's minibatch); any row count works


LOWP_ROWS = 64  # token counts of bf16 CPU products rounded up to a multiple of this (see above)
ONEDNN_CACHE = 8192  # compiled products oneDNN keeps (its default: 1,024; see above)
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE))


def round_up(k: int) -> int:
    """k rounded up to a multiple of ``ALIGN``."""
    return k + (-k % ALIGN)


def in_buckets(lowp, device: torch.device) -> bool:
    """Whether products in ``lowp`` on ``device`` take token counts in buckets of ``LOWP_ROWS``: bf16 on the CPU."""
    return lowp is torch.bfloat16 and device.type == "cpu"


def token_rows(k: int, lowp, device: torch.device) -> int:
    """A token count k as a product's dimension: rounded up to a multiple of ``LOWP_ROWS`` for a bf16 product on
    the CPU, else to a multiple of ``ALIGN``."""
    return k + (-k % (LOWP_ROWS if in_buckets(lowp, device) else ALIGN))


@functools.cache
def _onednn_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build's oneDNN product with a reordered weight is there, runs in ``dtype`` on this CPU and
    agrees with torch's (checked once per dtype).  bf16 needs CPU support that float32 does not (oneDNN's bf16
    reorder asks for AVX512-BW or AVX-NE-CONVERT): on an AVX2-only CPU the float32 route works, the bf16 one raises."""
    try:  # (its own generator: the probe runs inside a caller's first product and must not move the global RNG)
        g = torch.Generator().manual_seed(0)
        a, w = torch.randn(5, 11, generator=g).to(dtype), torch.randn(7, 11, generator=g).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 5)
        out = torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "").float()
        tol = 1e-5 if dtype == torch.float32 else 5e-2  # (bf16: one rounding of the result)
        return bool(torch.allclose(out, a.float() @ w.float().t(), atol=tol, rtol=tol))
    except (AttributeError, RuntimeError):
        return False


def onednn(t: Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether products with t, run in ``dtype`` (default t's), go through oneDNN: CPU, float32 or bfloat16, and
    oneDNN usable in that dtype here."""
    dtype = t.dtype if dtype is None else dtype
    return (t.device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and policy().onednn
            and _onednn_works(dtype))


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


def in_lowp(t: Tensor, lowp) -> Tensor:
    """t cast to ``lowp`` (the autocast dtype), or t itself when ``lowp`` is None."""
    return t if lowp is None else t.to(lowp)


def contiguous_in_lowp(t: Tensor, lowp) -> Tensor:
    """t cast to ``lowp`` (when given) and contiguous.  A float32 CPU matrix cast to bfloat16 that is not
    contiguous (the backward pass's Wᵀ, a transposed view) goes through the C kernel (nmtkit/kernels/cast.c):
    torch's strided copy is slower (tests/bench/results/bench_kernels.txt, row "backward's Wcatᵀ to bf16"); the
    values are the same, bit for bit (NaN payloads aside)."""
    if lowp is torch.bfloat16 and t.dim() == 2 and not t.is_contiguous() and kernels.usable(t):
        return kernels.to_bf16(t)
    return in_lowp(t, lowp).contiguous()


def mm(a: Tensor, b: Tensor, lowp=None, float32: bool = True) -> Tensor:
    """a @ b for a (M, K), b (K, N); in ``lowp`` when given, with a float32 result unless ``float32=False``
    (torch's product; as ``Multiplier.product``).  M and K are token counts here (N a weight's dimension): in bf16
    on the CPU they are rounded up with zeros (``token_rows``)."""
    if lowp is None:
        return a @ b
    (M, K), dev = a.shape, a.device
    M2, K2 = (token_rows(M, lowp, dev), token_rows(K, lowp, dev)) if in_buckets(lowp, dev) else (M, K)
    a, b = a.to(lowp), b.to(lowp)
    if (M2, K2) != (M, K):
        a = F.pad(a, (0, K2 - K, 0, M2 - M))  # (M2, K2)
        b = F.pad(b, (0, 0, 0, K2 - K))  # (K2, N)
    out = (a @ b)[:M]
    return out.float() if float32 else out


class Multiplier:
    """A weight W (N, K) prepared for many products x Wᵀ (x (M, K)), in ``lowp`` when given (float32 results)."""

    def __init__(self, W: Tensor, lowp=None):
        self.lowp = lowp
        # the route is chosen on the dtype the products run in (float16 autocast: torch's products)
        if onednn(W, lowp or W.dtype) and W.numel() >= policy().onednn_min_weight:
            W = contiguous_in_lowp(W, lowp)
            self.packed = torch.ops.mkldnn._reorder_linear_weight(W, ROWS_HINT)
        else:
            W = in_lowp(W, lowp)
            self.packed = None
        self.WT = W.t()

    def product(self, x: Tensor, float32: bool = True) -> Tensor:
        """x Wᵀ: (M, K) -> (M, N); with ``lowp``, in float32 unless ``float32=False`` (then in ``lowp``, for a
        caller whose next operation promotes it anyway)."""
        x = in_lowp(x, self.lowp)
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


def padded_vocab(W: Tensor, b: Tensor, b_fill: float, columns: bool = False, dtype=None) -> tuple[Tensor, Tensor]:
    """W (V, l), b (V,) -> the same with V (and l too when ``columns``) rounded up to a multiple of ``ALIGN``:
    zero rows (and columns) in W, ``b_fill`` in b's extra entries; W in ``dtype`` when given (padded straight
    into it).  One copy of W; returned as they are when nothing needs padding or casting."""
    (V, l), V2 = W.shape, round_up(W.shape[0])
    l2 = round_up(l) if columns else l
    if (V2, l2) == (V, l):
        return in_lowp(W, dtype), b
    if dtype is torch.bfloat16 and kernels.usable(W) and not (torch.is_grad_enabled() and W.requires_grad):
        # cast straight into the padded copy (cast.c, faster; it records no autograd graph)
        W2 = W.new_empty(V2, l2, dtype=dtype)
        kernels.to_bf16(W, out=W2[:V, :l])
        W2[V:].zero_()
        W2[:V, l:].zero_()
    else:
        W2 = W.new_zeros(V2, l2, dtype=dtype)
        W2[:V, :l] = W
    return W2, torch.cat([b, b.new_full((V2 - V,), b_fill)])


def aligned_linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, W, b) (x (..., K), W (out, K)) computed with K rounded up to a multiple of ``ALIGN``, and, under
    bf16 autocast on the CPU, the rows of a matrix x (a token count) rounded up too (``token_rows``)."""
    extra = round_up(W.shape[1]) - W.shape[1]
    rows = x.shape[0]
    lowp = autocast_dtype(x) if x.dim() == 2 else None
    more = token_rows(rows, lowp, x.device) - rows if in_buckets(lowp, x.device) else 0
    if not extra and not more:
        return F.linear(x, W, b)
    y = F.linear(F.pad(x, (0, extra, 0, more)), F.pad(W, (0, extra)), b)
    return y[:rows] if more else y
