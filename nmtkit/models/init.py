"""Initialisation as in Appendix B.1 of the paper.

- recurrent matrices (U, U_z, U_r of the encoder and the decoder): random orthogonal, each n×n block separately;
- W_a and U_a (alignment model): N(0, 0.001²);
- v_a and all biases: zero;
- every other matrix (embeddings, W's, C's, W_s, U_o, V_o, C_o, W_o): N(0, 0.01²).

The helpers draw from torch's global generator, so a model is reproducible under ``torch.manual_seed``.  They work
on any device, the meta device included (where they do nothing but keep shapes).
"""

from __future__ import annotations

import torch
from torch import Tensor

PAPER_STD = 0.01  # "every other matrix"
ALIGN_STD = 0.001  # W_a and U_a


@torch.no_grad()
def normal_(t: Tensor, std: float) -> Tensor:
    """N(0, std²) in place."""
    return t.normal_(0.0, std)


@torch.no_grad()
def zeros_(t: Tensor) -> Tensor:
    return t.zero_()


@torch.no_grad()
def orthogonal_blocks_(t: Tensor, n: int) -> Tensor:
    """Fill a (k·n, n) matrix with k independent random orthogonal n×n blocks stacked along the rows."""
    if t.dim() != 2 or t.shape[1] != n or t.shape[0] % n:
        raise ValueError(f"orthogonal_blocks_ expects a (k*{n}, {n}) matrix, got {tuple(t.shape)}")
    for k in range(t.shape[0] // n):
        torch.nn.init.orthogonal_(t[k * n : (k + 1) * n])
    return t
