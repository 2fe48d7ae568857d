"""Additive attention, the paper's alignment model (Section 3.1, Appendix A.1.2).

    e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)          (no bias: the paper writes none; v_a has none either)
    α_ij = exp(e_ij) / Σ_k exp(e_ik)                  over the sentence's own positions only
    c_i  = Σ_j α_ij h_j

U_a h_j does not depend on i: ``keys(annotations)`` computes it once per sentence, and the caller passes it back in
on every step (nothing is cached on the module, so beam search can reorder it with the rest of the state).  Padding
positions get exactly zero weight (their score is set to −inf before the softmax).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmtkit.models.fast.matmul import aligned_linear
from nmtkit.models.init import ALIGN_STD, normal_, zeros_


class AdditiveAttention(nn.Module):
    """W_a (n', n), U_a (n', ctx), v_a (n',)."""

    def __init__(self, query_dim: int, ctx_dim: int, attn_dim: int):
        super().__init__()
        self.query_dim, self.ctx_dim, self.attn_dim = query_dim, ctx_dim, attn_dim
        self.W_a = nn.Parameter(torch.empty(attn_dim, query_dim))
        self.U_a = nn.Parameter(torch.empty(attn_dim, ctx_dim))
        self.v_a = nn.Parameter(torch.empty(attn_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Appendix B.1: W_a, U_a ~ N(0, 0.001²); v_a = 0."""
        normal_(self.W_a, ALIGN_STD)
        normal_(self.U_a, ALIGN_STD)
        zeros_(self.v_a)

    def keys(self, annotations: Tensor) -> Tensor:
        """U_a h_j for every source position, once per sentence: (B, Tx, ctx) -> (B, Tx, n'), or (N, ctx) -> (N, n')
        over packed positions."""
        return aligned_linear(annotations, self.U_a)


def alignment_for_beams(query: Tensor, keys: Tensor, v_a: Tensor, src_mask: Tensor) -> Tensor:
    """α for K decoder states per sentence (the fast form of the paper's :func:`nmtkit.models.reference.alignment`):
    W_a s (A, K, n'), U_a h (A, Tx, n'), v_a (n'), src_mask (A, Tx) ->
    (A, K, Tx).  (Beam search keeps K hypotheses per sentence: their source side is stored once, not K times.)

    Computed as e'_ij = 2 v_aᵀ σ(2 W_a s_{i-1} + 2 U_a h_j) = e_ij + v_aᵀ1, since tanh(x) = 2σ(2x) − 1: the constant
    v_aᵀ1 is the same for every j and cancels in the softmax, so α is the paper's exactly (up to rounding), and
    sigmoid is several times faster than tanh on CPU (torch 2.13), which matters on an (A, K, Tx, n') tensor per
    step.  Padding positions get exactly zero weight.
    """
    x = torch.add(keys.unsqueeze(1), query.unsqueeze(2)).mul_(2.0).sigmoid_()  # (A, K, Tx, n')
    e = x @ (2.0 * v_a)  # (A, K, Tx)   e_ij + v_aᵀ1
    return torch.softmax(e.masked_fill_(~src_mask.unsqueeze(1), float("-inf")), dim=-1)  # (A, K, Tx)


def attention_cross_entropy(alpha: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """Σ −Ã_ij log α_ij: α (B, Ty, Tx) the attention, Ã the same shape, 0 where unguided (a scalar of α's dtype,
    float32 for a lower one, with α's graph).  α is floored at 1e-30 inside the log (a weight the softmax underflowed
    to 0; where Ã is 0 the term is 0)."""
    a = alpha if alpha.dtype in (torch.float32, torch.float64) else alpha.float()
    return -(guide.to(a.dtype) * a.clamp_min(1e-30).log()).sum()
