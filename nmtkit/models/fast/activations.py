"""tanh through the sigmoid, for the recurrences on the CPU.

torch 2.13's CPU ``tanh`` is not vectorised, ``sigmoid`` is.  Since tanh(x) = 2σ(2x) − 1, ``tanh_`` computes that
instead: four vectorised passes over a block that stays in the cache, faster than torch's tanh over a packed
encoder step's block (tests/bench/results/bench_kernels.txt, row "GRU candidate tanh").  The result is
within 2e-7 of tanh (absolute; float32's own tanh is within ~3e-8): far below the rounding of the products that
feed it.  Other dtypes (float64: the exact tests and gradient checks) and CUDA get torch's tanh.  The attention
computes its tanh the same way, folded into its scores (attention.alignment).
"""

from __future__ import annotations

import torch
from torch import Tensor


def tanh_(x: Tensor) -> Tensor:
    """tanh(x) in place (returns x): 2σ(2x) − 1 for float32 CPU tensors, torch's tanh otherwise."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return x.tanh_()
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


class _PairwiseMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t_tilde: Tensor) -> Tensor:
        t, second = t_tilde.unflatten(-1, (-1, 2)).max(dim=-1)  # (..., l), (..., l)   which of the pair is larger
        ctx.save_for_backward(second)
        return t

    @staticmethod
    def backward(ctx, dt: Tensor) -> Tensor:
        (second,) = ctx.saved_tensors
        dt_tilde = dt.new_zeros(*dt.shape, 2)  # (..., l, 2)
        return dt_tilde.scatter_(-1, second.unsqueeze(-1), dt.unsqueeze(-1)).flatten(-2)  # (..., 2l)


def pairwise_max(t_tilde: Tensor) -> Tensor:
    """The maxout of Appendix A.2.2: t_j = max(t̃_{2j-1}, t̃_{2j}), (..., 2l) -> (..., l).

    Its gradient goes to the larger element of each pair (at a tie, to one of them: a subgradient, where
    ``amax`` would split it).  Written so because ``amax`` over pairs and its backward (a comparison, a count, a
    division) are slower (tests/bench/results/bench_kernels.txt, row "maxout forward + backward").  Without
    autograd: the elementwise
    maximum of the two halves, the same values."""
    if t_tilde.shape[-1] % 2:
        raise ValueError(f"pairwise_max: the last dimension must be even, not {t_tilde.shape[-1]}")
    if torch.is_grad_enabled() and t_tilde.requires_grad:
        return _PairwiseMax.apply(t_tilde)
    return torch.maximum(t_tilde[..., 0::2], t_tilde[..., 1::2])
