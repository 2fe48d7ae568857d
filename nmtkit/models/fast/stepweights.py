"""What one decoding step multiplies, rearranged once per set of weights (used by ``decode_step``).

A step of search reads s_{i-1} through four matrices and y_{i-1} through two (Appendix A.2.2):

    W_a s_{i-1}, U_z s_{i-1}, U_r s_{i-1}        attention query and the two gates
    U_o s_{i-1}                                  deep output
    W_stack E y_{i-1} + b_stack                  the GRU's input side [W_z; W_r; W] E y + [b_z; b_r; b]
    V_o E y_{i-1} + b_o                          deep output

- ``s_stack`` = [W_a; U_z; U_r; U_o] (n' + 2n + 2l, n), without W_a for the RNNencdec: one matmul with s_{i-1}
  instead of three (the GRU's U [r ∘ s] must wait for r, so U stays apart);
- ``y_table`` = [W_stack E y + b_stack; V_o E y + b_o] for every target word y (V, 3n + 2l): E y_{i-1} takes only V
  values, so the whole input side of a step becomes a row lookup instead of two matmuls (a sixth of the small model's
  multiply-adds per hypothesis).  Row ``<s>`` is built from E y_0 = 0 (the model's first-word convention).  The table
  costs V × (3n + 2l) floats: it is built when that is at most the policy's ``table_max_elements`` (the small preset's
  8,000 × 1,024 is; the paper's 30,000 × 4,000 = 480 MB is not, and there the input side is a tenth of the work);
  otherwise ``y_stack`` = [W_stack; V_o] (3n + 2l, m) and ``y_bias`` give the same values from one matmul;
- ``W_o``, ``b_y`` padded to a vocabulary size that is a multiple of 8 (``matmul.padded_vocab``: much faster
  products when V is not, as with 7,897 words or the paper's 30,000 + 4 specials).

Everything is computed in float32 from the current weights and cached on the model, keyed by the weights' storage
and version counters, so an optimizer update or ``model.to(device)`` rebuilds it on the next call.  Only used
without autograd in eval mode (search); with gradients or dropout ``decode_step`` computes the same from the
parameters directly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nmtkit.models.fast.matmul import padded_vocab
from nmtkit.models.fast.policy import policy
from nmtkit.data.vocab import BOS



class StepWeights(NamedTuple):
    s_stack: Tensor  # (n' + 2n + 2l, n) RNNsearch, (2n + 2l, n) RNNencdec
    y_table: Tensor | None  # (V, 3n + 2l), or None when too large
    y_stack: Tensor  # (3n + 2l, m)
    y_bias: Tensor  # (3n + 2l,)
    W_o: Tensor  # (V', l): W_o with V rounded up to a multiple of 8 (zero rows; matmul.padded_vocab)
    b_y: Tensor  # (V',)


def _sources(model) -> list[Tensor]:
    dec = model.decoder
    s_side = ([model.attention.W_a] if model.attentive else []) + [dec.U_zr, model.U_o]
    return s_side + [dec.W_stack, model.V_o, dec.b_stack, model.b_o, model.E_tgt, model.W_o, model.b_y]


def usable(model) -> bool:
    """Whether ``decode_step`` may use the cached weights: no autograd, no dropout."""
    return not torch.is_grad_enabled() and not (model.training and model.config.dropout > 0)


@torch.no_grad()
def step_weights(model) -> StepWeights:
    """The model's :class:`StepWeights`, rebuilt when any weight it derives from has changed."""
    sources = _sources(model)
    key = tuple((p.data_ptr(), p._version, p.dtype) for p in sources)
    cached = model.__dict__.get("_step_weights")
    if cached is not None and cached[0] == key:
        return cached[1]
    *s_side, W_stack, V_o, b_stack, b_o, E, W_o, b_y = (p.float() for p in sources)
    with torch.autocast(E.device.type, enabled=False):
        s_stack = torch.cat(s_side)  # (n' + 2n + 2l, n)
        y_stack = torch.cat([W_stack, V_o])  # (3n + 2l, m)
        y_bias = torch.cat([b_stack, b_o])  # (3n + 2l,)
        table = None
        if E.shape[0] * y_stack.shape[0] <= policy().table_max_elements:
            table = F.linear(E, y_stack, y_bias)  # (V, 3n + 2l)
            table[BOS] = y_bias  # E y_0 = 0
        W_o, b_y = padded_vocab(W_o, b_y, 0.0)
    weights = StepWeights(s_stack, table, y_stack, y_bias, W_o, b_y)
    model.__dict__["_step_weights"] = (key, weights)
    return weights
