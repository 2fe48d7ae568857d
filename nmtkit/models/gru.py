"""The gated hidden unit of Cho et al. (2014) as Bahdanau et al. (2015) use it (Appendix A.1.1, arXiv v7).

For an input x and the previous state s (biases written out; the paper omits them):

    z  = σ(W_z x + U_z s + b_z)                  update gate
    r  = σ(W_r x + U_r s + b_r)                  reset gate
    s̃  = tanh(W x + U [r ∘ s] + b)               candidate: the reset gate is applied BEFORE U
    s' = (1 − z) ∘ s + z ∘ s̃

``torch.nn.GRU`` computes a different unit: its candidate is ``tanh(W_in x + b_in + r ∘ (W_hn s + b_hn))`` (reset
applied AFTER the recurrent matrix, with an extra bias ``b_hn`` inside), and its update gate is complementary
(``s' = (1 − z) ∘ s̃ + z ∘ s``).  The encoder uses it only when asked to (``encoder_gru="torch"``): that is a
different model from the paper's.  The decoder always uses the paper's unit.

Layout.  The three input-side matrices are stored stacked so one matmul projects a whole sequence at once:

    W_stack = [W_z; W_r; W]   (3n, in)        b_stack = [b_z; b_r; b]   (3n,)
    U_zr    = [U_z; U_r]      (2n, n)         U                         (n, n)
    C_stack = [C_z; C_r; C]   (3n, ctx)       (decoder only: the context terms of Appendix A.2.2)

``nmtkit.models.params.paper_parameters`` hands out the individual matrices under the paper's names.

Sequences are time-major, ``(T, B, ·)``, so that one time step is a contiguous slice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.models.init import normal_, orthogonal_blocks_, zeros_
from nmtkit.models.fast.matmul import aligned_linear


class PaperGRU(nn.Module):
    """One direction of the paper's gated recurrent layer: its parameters.

    The encoder projects a whole sequence at once with W_stack (one big matmul, both directions together); the
    recurrence, whose per-step work is the two recurrent matmuls only, runs in the fast paths
    (``fast.packed.gru_packed``, both directions over packed sentences) or, as the equations read, in
    ``reference.gru_step``.
    """

    def __init__(self, input_dim: int, hidden_dim: int):
        super().__init__()
        n = hidden_dim
        self.input_dim, self.hidden_dim = input_dim, hidden_dim
        self.W_stack = nn.Parameter(torch.empty(3 * n, input_dim))  # [W_z; W_r; W]
        self.b_stack = nn.Parameter(torch.empty(3 * n))  # [b_z; b_r; b]
        self.U_zr = nn.Parameter(torch.empty(2 * n, n))  # [U_z; U_r]
        self.U = nn.Parameter(torch.empty(n, n))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Appendix B.1: U, U_z, U_r random orthogonal (each n×n block); W's N(0, 0.01²); biases zero."""
        normal_(self.W_stack, 0.01)
        zeros_(self.b_stack)
        orthogonal_blocks_(self.U_zr, self.hidden_dim)
        orthogonal_blocks_(self.U, self.hidden_dim)


class ConditionalGRU(nn.Module):
    """The decoder's gated unit (Appendix A.2.2): the paper's GRU whose gates and candidate also see c_i.

        z_i = σ(W_z E y_{i-1} + U_z s_{i-1} + C_z c_i + b_z)
        r_i = σ(W_r E y_{i-1} + U_r s_{i-1} + C_r c_i + b_r)
        s̃_i = tanh(W E y_{i-1} + U [r_i ∘ s_{i-1}] + C c_i + b)
        s_i = (1 − z_i) ∘ s_{i-1} + z_i ∘ s̃_i

    The C's share the gate biases (one bias per gate, as in the encoder).
    """

    def __init__(self, emb_dim: int, hidden_dim: int, ctx_dim: int):
        super().__init__()
        n = hidden_dim
        self.emb_dim, self.hidden_dim, self.ctx_dim = emb_dim, hidden_dim, ctx_dim
        self.W_stack = nn.Parameter(torch.empty(3 * n, emb_dim))  # [W_z; W_r; W]
        self.b_stack = nn.Parameter(torch.empty(3 * n))  # [b_z; b_r; b]
        self.U_zr = nn.Parameter(torch.empty(2 * n, n))  # [U_z; U_r]
        self.U = nn.Parameter(torch.empty(n, n))
        self.C_stack = nn.Parameter(torch.empty(3 * n, ctx_dim))  # [C_z; C_r; C]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        normal_(self.W_stack, 0.01)
        zeros_(self.b_stack)
        orthogonal_blocks_(self.U_zr, self.hidden_dim)
        orthogonal_blocks_(self.U, self.hidden_dim)
        normal_(self.C_stack, 0.01)

    def input_projections(self, Ey: Tensor) -> Tensor:
        """E y_{i-1} (..., m) -> W_stack E y_{i-1} + b_stack (..., 3n), for all steps at once."""
        return aligned_linear(Ey, self.W_stack, self.b_stack)

    def context_projections(self, c: Tensor) -> Tensor:
        """c (..., ctx) -> C_stack c (..., 3n)."""
        return F.linear(c, self.C_stack)
