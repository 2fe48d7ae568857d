"""Matrix products shaped for the CPU: dimensions rounded up to a multiple of 8 with zeros.

On this CPU (AMD EPYC, AVX-512; torch 2.13's fp32 GEMM) a product runs markedly slower when a dimension of its
*result* is not a multiple of 8: the paper's vocabulary 30,000 + 4 specials, its embedding size m = 620 and maxout
size l = 500 all are not (tests/bench/results/bench_kernels.txt).  Zero padding leaves every value as it is (the
extra terms are exact zeros) and costs a copy of one operand, far less than it saves:

- ``padded_vocab``: output layers over V' = V rounded up (zero rows of W_o; the bias of the extra rows chosen by
  the caller: −inf in the loss, so they get probability 0);
- ``aligned_linear``: F.linear with the reduced dimension K rounded up, so that the backward pass's products, whose
  results are K wide (∂L/∂x (N, K) and ∂L/∂W (out, K)), run at full speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ALIGN = 8


def round_up(k: int) -> int:
    """k rounded up to a multiple of ``ALIGN``."""
    return k + (-k % ALIGN)


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
    """F.linear(x, W, b) (x (..., K), W (out, K)) computed with K rounded up to a multiple of ``ALIGN``."""
    extra = round_up(W.shape[1]) - W.shape[1]
    if not extra:
        return F.linear(x, W, b)
    return F.linear(F.pad(x, (0, extra)), F.pad(W, (0, extra)), b)
