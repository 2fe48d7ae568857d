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
    """N(0, std²) in place (on the meta device nothing: torch's meta ``normal_`` first loads its Python meta
    kernels, seconds of a checkpoint's loading; registry.empty_model)."""
    return t if t.is_meta else t.normal_(0.0, std)


@torch.no_grad()
def zeros_(t: Tensor) -> Tensor:
    return t.zero_()


@torch.no_grad()
def orthogonal_blocks_(t: Tensor, n: int) -> Tensor:
    """Fill a (k·n, n) matrix with k independent random orthogonal n×n blocks stacked along the rows."""
    if t.dim() != 2 or t.shape[1] != n or t.shape[0] % n:
        raise ValueError(f"orthogonal_blocks_ expects a (k*{n}, {n}) matrix, got {tuple(t.shape)}")
    if t.is_meta:  # (see normal_)
        return t
    for k in range(t.shape[0] // n):
        torch.nn.init.orthogonal_(t[k * n : (k + 1) * n])
    return t


# ------------------------------------------------------------------------------------------- initialisation schemes
# (registered by name for nmt-train --init in nmtkit/train/registry.py: INITS)
RECURRENT = ("U", "U_z", "U_r")  # the paper's recurrent matrices (suffixes of enc.fwd.*, enc.bwd.*, dec.*)


@torch.no_grad()
def paper(model) -> None:
    """Appendix B.1 (see the top of this module), from torch's global generator: the very weights the model's
    constructor draws from the generator's state, i.e. under ``torch.manual_seed(s)`` those of ``build_model``
    under ``torch.manual_seed(s)``."""
    if any(p.is_meta for p in model.parameters()):
        model.reset_parameters()  # (nothing to draw)
        return
    # the weights of the model as built under the generator's state: the constructors draw in another order than
    # reset_parameters (the encoder and decoder first, nn.GRU's own init too), so build one on the CPU, as
    # build_model does, and copy it in
    fresh = type(model)(model.config).state_dict()
    for name, p in model.state_dict().items():
        p.copy_(fresh[name])


@torch.no_grad()
def xavier(model, flat: bool = False) -> None:
    """Glorot-uniform for every non-recurrent matrix of an RNNsearch / RNNencdec, each of the paper's matrices on its
    own shape (W_z, W_r and W separately; embeddings, C's, W_s, U_o, V_o, C_o, W_o, W_a, U_a); v_a as a (1 × n')
    matrix; U, U_z, U_r random orthogonal as in B.1; biases zero; from torch's global generator.  B.1's
    N(0, 0.01²) is 6x smaller than Glorot's scale for a 256 × 256 matrix and its N(0, 0.001²) W_a, U_a with v_a = 0
    start the alignment model flat: with either, a small model learns far less in its first thousands of updates
    (tests/bench/bench_learning.py).  ``flat``: v_a = 0 as in B.1 (:func:`xavier_flat`)."""
    model.reset_parameters()
    from nmtkit.models.params import load_paper_parameters, paper_parameters

    params = {k: v.clone() for k, v in paper_parameters(model).items()}
    for key, p in params.items():
        leaf = key.rsplit(".", 1)[-1]
        if leaf in RECURRENT or leaf.startswith("b"):  # orthogonal (already) and zero biases (b_hn included)
            continue
        if leaf == "v_a":
            torch.nn.init.xavier_uniform_(p.view(1, -1))
            if flat:
                p.zero_()
        else:
            torch.nn.init.xavier_uniform_(p)
    load_paper_parameters(model, params)


def xavier_flat(model) -> None:
    """:func:`xavier`, but v_a = 0 as in B.1, so that α starts uniform (every e_ij = 0) while
    tanh(W_a s_{i-1} + U_a h_j), from Glorot-scaled W_a and U_a, already tells the positions apart."""
    xavier(model, flat=True)
