"""One decoding step of the fast backend, for K hypotheses per sentence: what ``decode_step`` computes around
the attention (rnnsearch.py), split in the two halves on either side of it.

``step_products`` multiplies what the step reads, y_{i-1} and the carried state, through the stacked (or tabulated)
weights of stepweights.py in search, or the parameters with autograd or dropout; with ``state_word="current"``
it first brings the state up to s_{i-1} = f(s_{i-2}, y_{i-1}, c_{i-1}), now that the search has chosen y_{i-1}.
``step_output`` adds the context's projections [C_stack; C_o] c_i and gives the logits of y_i and the state to
carry.  Symbols as in the paper: n hidden units, n' the alignment model's, l maxout units, m embedding size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmtkit.data.vocab import BOS
from nmtkit.models.fast.matmul import aligned_linear
from nmtkit.models.fast.stepweights import StepWeights, step_weights
from nmtkit.models.fast.stepweights import usable as usable_step_weights
from nmtkit.models.gru import gru_update


def step_products(model, y_prev: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor, StepWeights | None]:
    """What a decoding step multiplies (stepweights.py): y_{i-1} (N,), the carried state (the model's
    ``init_decoder``) -> [W_stack E y + b_stack; V_o E y + b_o] (N, 3n + 2l), s_{i-1} (N, n), [W_a; U_z; U_r; U_o]
    s_{i-1} (N, n' + 2n + 2l; no W_a rows for the RNNencdec), and the step weights used (None with autograd or
    dropout: then from the parameters)."""
    dec = model.decoder
    w = step_weights(model) if usable_step_weights(model) else None
    if w is None:
        Ey = model.embed_target(y_prev)  # (N, m)
        ys = torch.cat([dec.input_projections(Ey), aligned_linear(Ey, model.V_o, model.b_o)], dim=1)
        s_stack = torch.cat(([model.attention.W_a] if hasattr(model, "attention") else []) + [dec.U_zr, model.U_o])
    elif w.y_table is not None:
        ys, s_stack = w.y_table.index_select(0, y_prev), w.s_stack  # (N, 3n + 2l)   a row lookup per hypothesis
    else:
        ys, s_stack = torch.addmm(w.y_bias, model.embed_target(y_prev), w.y_stack.t()), w.s_stack  # (N, 3n + 2l)
    s_prev = state
    if model.config.state_word == "current":  # s_{i-1} = f(s_{i-2}, y_{i-1}, c_{i-1}), now that y_{i-1} is known
        n = model.config.hidden_dim
        s_pp, Us_zr, Cc_prev = state.split([n, 2 * n, 3 * n], dim=1)  # s_{i-2}, [U_z; U_r] s_{i-2}, C_stack c_{i-1}
        s_new = gru_update(ys[:, :3 * n] + Cc_prev, Us_zr, s_pp, dec.U)  # (N, n)
        s_prev = torch.where((y_prev == BOS).unsqueeze(1), s_pp, s_new)  # at i = 1 nothing to read: s_0
    return ys, s_prev, F.linear(s_prev, s_stack), w


def step_output(model, ys: Tensor, Cc: Tensor, Us: Tensor, state: Tensor,
                w: StepWeights | None) -> tuple[Tensor, Tensor]:
    """The rest of a step, from [W_stack E y + b_stack; V_o E y + b_o] (N, 3n + 2l), [C_stack; C_o] c_i
    (N, 3n + 2l), [U_z; U_r; U_o] s_{i-1} (N, 2n + 2l), s_{i-1} (N, n) and ``step_products``' step weights ->
    logits (N, V) and the state to carry: s_i (N, n), or with ``state_word="current"`` [s_{i-1}; [U_z; U_r] s_{i-1};
    C_stack c_i] (N, 6n), since s_i reads y_i, which the search has yet to choose (the next step's update then
    multiplies nothing it has not got)."""
    n = model.config.hidden_dim
    pre = ys + Cc  # (N, 3n + 2l)   [W E y + C c + b (GRU input side, 3n); V_o E y + C_o c + b_o (2l)]
    gx, t_part = pre.split([3 * n, pre.shape[1] - 3 * n], dim=1)
    Us_zr, Us_o = Us.split([2 * n, Us.shape[1] - 2 * n], dim=1)
    if model.config.state_word == "current":
        new_state = torch.cat([state, Us_zr, Cc[:, :3 * n]], dim=1)  # (N, 6n)
    else:
        new_state = gru_update(gx, Us_zr, state, model.decoder.U)  # (N, n)   s_i
    t = model.pool(t_part + Us_o)  # (N, l)   from t̃_i = U_o s_{i-1} + V_o E y + C_o c + b_o
    if w is None:
        return model.readout(t), new_state
    V = model.W_o.shape[0]
    logits = torch.addmm(w.b_y, t, w.W_o.t())  # (N, V')   W_o t_i + b_y, V rounded up to a multiple of 8
    return (logits if logits.shape[1] == V else logits[:, :V].contiguous()), new_state
