"""Appendix A of the paper (arXiv v7) as its equations read: the literal reference of RNNsearch and RNNencdec.

Every function here takes the weights by the paper's names (:func:`nmtkit.models.params.paper_weights`: slices of
the model's parameters, so gradients reach them) and computes one equation or one recurrence with plain torch
operations, one step at a time, batch first.  Nothing is stacked, fused, packed, tabulated or reordered for speed:
the fast paths (fused.py, packed.py, stepweights.py, the C kernels) are tested against this module, values and
gradients, and a model with ``backend = "reference"`` trains and searches on it (``ReferenceBackend`` at the
end; ``nmt-train --backend reference``).  Symbols: m embedding size, n hidden units, n' alignment size, l maxout
units, B sentences, Tx source and Ty target positions (padded), V vocabulary size.

The conventions the paper leaves to the implementation are the model's (rnnsearch.py): the source ends with its
``</s>``, which the encoder reads; batches are right-padded and padding never changes a real position's value; the
backward direction starts at each sentence's own last token; E y_0 = 0 for the first target word ``<s>``; one bias
per gate, shared by its W, U and C terms (b, b_z, b_r), b_s for s_0, b_o for the deep output, b_y for the softmax;
the alignment model has no bias.  With ``encoder_gru="torch"`` torch's unit keeps its extra bias inside the reset
product, r ∘ (U h + b_hn).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmtkit.models.attention import attention_cross_entropy
from nmtkit.models.backend import Backend, EncoderOut
from nmtkit.models.params import paper_weights
from nmtkit.data.vocab import BOS, PAD

P = dict[str, Tensor]  # paper_weights(model)


def gru_step(P: P, g: str, x: Tensor, h_prev: Tensor, c: Tensor | None = None) -> Tensor:
    """The gated hidden unit (A.1.1; the decoder's, with the context, A.2.2), for the weights named ``g`` + W, U, ...:

        z = σ(W_z x + U_z h_{t-1} [+ C_z c] + b_z),    r = σ(W_r x + U_r h_{t-1} [+ C_r c] + b_r),
        h̃ = tanh(W x + U [r ∘ h_{t-1}] [+ C c] + b),   h_t = (1 − z) ∘ h_{t-1} + z ∘ h̃.

    x (B, m), h_{t-1} (B, n), c (B, ctx) or None -> h_t (B, n)."""
    def term(name: str, v: Tensor) -> Tensor:
        return v @ P[g + name].T

    z = torch.sigmoid(term("W_z", x) + term("U_z", h_prev) + (term("C_z", c) if c is not None else 0) + P[g + "b_z"])
    r = torch.sigmoid(term("W_r", x) + term("U_r", h_prev) + (term("C_r", c) if c is not None else 0) + P[g + "b_r"])
    if g + "b_hn" in P:  # torch's unit: r ∘ (U h + b_hn)
        reset = r * (term("U", h_prev) + P[g + "b_hn"])
    else:  # the paper's: U [r ∘ h]
        reset = term("U", r * h_prev)
    h_tilde = torch.tanh(term("W", x) + reset + (term("C", c) if c is not None else 0) + P[g + "b"])  # (B, n)
    return (1 - z) * h_prev + z * h_tilde  # (B, n)


def encode(P: P, src: Tensor, src_lens: Tensor, bidirectional: bool, dropout=None) -> tuple[Tensor, Tensor, Tensor]:
    """The encoder (A.2.1): src (B, Tx) ids ending in ``</s>``, src_lens (B,) ->

    - the annotations h_j = [→h_j; ←h_j] (B, Tx, 2n) with →h_j = f(→h_{j-1}, E x_j) from →h_0 = 0 and ←h_j =
      f(←h_{j+1}, E x_j) from ←h_{T_x+1} = 0 (RNNsearch), or →h_j (B, Tx, n) (RNNencdec); zero at padding;
    - the source mask (B, Tx), True at real positions;
    - the summary for s_0: ←h_1 (RNNsearch) or c = →h_{T_x} (RNNencdec), (B, n)."""
    B, Tx = src.shape
    mask = torch.arange(Tx, device=src.device).unsqueeze(0) < src_lens.to(src.device).unsqueeze(1)  # (B, Tx)
    Ex = F.embedding(src, P["E_src"])  # (B, Tx, m)
    Ex = dropout(Ex) if dropout is not None else Ex
    n = P["enc.fwd.U"].shape[0]
    h = Ex.new_zeros(B, n)  # →h_0
    forward = []
    for j in range(Tx):  # padding: the state stays as it was
        h = torch.where(mask[:, j:j + 1], gru_step(P, "enc.fwd.", Ex[:, j], h), h)
        forward.append(h)
    h_fwd = torch.stack(forward, dim=1)  # (B, Tx, n)
    if not bidirectional:
        last = h_fwd[torch.arange(B, device=src.device), src_lens.to(src.device) - 1]  # (B, n)   →h_{T_x}
        return h_fwd * mask.unsqueeze(-1), mask, last
    h = Ex.new_zeros(B, n)  # ←h_{T_x+1}
    backward = [None] * Tx
    for j in reversed(range(Tx)):  # at padding (after the sentence's end) it stays 0 until its last token
        h = torch.where(mask[:, j:j + 1], gru_step(P, "enc.bwd.", Ex[:, j], h), h)
        backward[j] = h
    h_bwd = torch.stack(backward, dim=1)  # (B, Tx, n)
    annotations = torch.cat([h_fwd, h_bwd], dim=-1) * mask.unsqueeze(-1)  # (B, Tx, 2n)
    return annotations, mask, h_bwd[:, 0]  # ←h_1


def initial_state(P: P, summary: Tensor) -> Tensor:
    """s_0 = tanh(W_s ←h_1 + b_s) (RNNsearch; RNNencdec: W_s c + b_s): (B, n) -> (B, n)."""
    return torch.tanh(summary @ P["W_s"].T + P["b_s"])


def alignment(P: P, s_prev: Tensor, H: Tensor, mask: Tensor) -> Tensor:
    """The alignment model (A.1.2) and its softmax (Eq. 6): e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j),
    α_ij = exp(e_ij) / Σ_k exp(e_ik) over the real positions.  s_{i-1} (B, n), H (B, Tx, 2n), mask (B, Tx) ->
    α_i (B, Tx)."""
    e = torch.tanh((s_prev @ P["W_a"].T).unsqueeze(1) + H @ P["U_a"].T) @ P["v_a"]  # (B, Tx)
    return torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)  # (B, Tx)


def embed_target(P: P, y: Tensor) -> Tensor:
    """E y (..., m), with E y_0 = 0 where y is ``<s>``."""
    return F.embedding(y, P["E_tgt"]) * (y != BOS).unsqueeze(-1)


def deep_output(P: P, s_prev: Tensor, Ey_prev: Tensor, c: Tensor, dropout=None) -> Tensor:
    """The deep output with one maxout layer (A.2.2, v7: from s_{i-1}):

        t̃_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i + b_o,   t_{i,j} = max(t̃_{i,2j-1}, t̃_{i,2j}),
        p(y_i | ...) ∝ exp(y_iᵀ (W_o t_i + b_y)).

    s_{i-1} (B, n), E y_{i-1} (B, m), c_i (B, ctx) -> the logits (B, V)."""
    t_tilde = s_prev @ P["U_o"].T + Ey_prev @ P["V_o"].T + c @ P["C_o"].T + P["b_o"]  # (B, 2l)
    t = torch.maximum(t_tilde[:, 0::2], t_tilde[:, 1::2])  # (B, l)   pairs (1-based 2j-1, 2j) = (0-based 2j, 2j+1)
    t = dropout(t) if dropout is not None else t
    return t @ P["W_o"].T + P["b_y"]  # (B, V)


def decoder_step(P: P, y_prev: Tensor, s_prev: Tensor, H: Tensor, mask: Tensor, context: Tensor | None = None,
                 dropout=None) -> tuple[Tensor, Tensor, Tensor | None]:
    """One step of the decoder (A.2.2): y_{i-1} (B,), s_{i-1} (B, n), the annotations H (B, Tx, ctx) and mask ->
    the logits of y_i (B, V), s_i (B, n) and α_i (B, Tx).  RNNencdec: ``context`` is c = →h_{T_x} (B, n), used as
    c_i at every step, and α is None."""
    Ey = embed_target(P, y_prev)  # (B, m)   E y_{i-1}
    Ey = dropout(Ey) if dropout is not None else Ey
    alpha, c = _context(P, s_prev, H, mask, context)  # (B, Tx) or None, (B, ctx)
    logits = deep_output(P, s_prev, Ey, c, dropout)  # (B, V)
    s = gru_step(P, "dec.", Ey, s_prev, c)  # (B, n)   s_i = f(s_{i-1}, y_{i-1}, c_i)
    return logits, s, alpha


def _context(P: P, s_prev: Tensor, H: Tensor, mask: Tensor, context: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """α_i (B, Tx) and c_i = Σ_j α_ij h_j (B, 2n) from s_{i-1} (RNNsearch), or None and the RNNencdec's fixed c."""
    if context is not None:
        return None, context
    alpha = alignment(P, s_prev, H, mask)  # (B, Tx)
    return alpha, (alpha.unsqueeze(-1) * H).sum(dim=1)


def decoder_step_current(P: P, y_prev: Tensor, state: Tensor, H: Tensor, mask: Tensor,
                         context: Tensor | None = None, dropout=None) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`decoder_step` with the state reading the CURRENT word (``state_word="current"``; v6's equations and
    the authors' GroundHog code): s_i = f(s_{i-1}, y_i, c_i), the rest as Appendix A.  So s_i waits for y_i, and a
    step carries [s_{i-2}; c_{i-1}] (B, n + ctx) (at i = 1: [s_0; anything]):

        s_{i-1} = f(s_{i-2}, y_{i-1}, c_{i-1})  (s_0 at i = 1, where y_0 = <s>),   α_i, c_i from s_{i-1},
        logits of y_i from s_{i-1}, E y_{i-1}, c_i.

    y_{i-1} (B,) -> the logits of y_i (B, V), [s_{i-1}; c_i] (B, n + ctx), α_i (B, Tx) or None (RNNencdec)."""
    n = P["dec.U"].shape[0]
    s_before, c_before = state[:, :n], state[:, n:]  # s_{i-2}, c_{i-1}
    Ey = embed_target(P, y_prev)  # (B, m)   E y_{i-1}
    Ey = dropout(Ey) if dropout is not None else Ey
    first = (y_prev == BOS).unsqueeze(1)  # (B, 1)
    s_prev = torch.where(first, s_before, gru_step(P, "dec.", Ey, s_before, c_before))  # (B, n)   s_{i-1}
    alpha, c = _context(P, s_prev, H, mask, context)  # (B, Tx) or None, (B, ctx)
    return deep_output(P, s_prev, Ey, c, dropout), torch.cat([s_prev, c], dim=1), alpha


def initial_carried(s0: Tensor, ctx_dim: int, state_word: str) -> Tensor:
    """The state a first step reads: s_0 (B, n), or [s_0; 0] (B, n + ctx) for ``state_word="current"``."""
    return s0 if state_word == "previous" else torch.cat([s0, s0.new_zeros(s0.shape[0], ctx_dim)], dim=1)


def teacher_forced(P: P, src: Tensor, src_lens: Tensor, tgt_in: Tensor, attention: bool,
                   dropout=None, state_word: str = "previous") -> tuple[Tensor, Tensor | None]:
    """The whole model over a batch: tgt_in = ``<s>`` y_1 … (B, Ty) -> the logits (B, Ty, V) of y_1 … ``</s>``
    and α (B, Ty, Tx) (None for the RNNencdec, ``attention=False``)."""
    H, mask, summary = encode(P, src, src_lens, bidirectional=attention, dropout=dropout)
    context = None if attention else summary  # RNNencdec: c = →h_{T_x}
    s = initial_carried(initial_state(P, summary), H.shape[-1], state_word)  # (B, n)   s_0
    step = decoder_step if state_word == "previous" else decoder_step_current
    logits, alphas = [], []
    for i in range(tgt_in.shape[1]):
        out, s, alpha = step(P, tgt_in[:, i], s, H, mask, context, dropout)
        logits.append(out)
        alphas.append(alpha)
    return torch.stack(logits, dim=1), (torch.stack(alphas, dim=1) if attention else None)


# -- the reference backend (backend.py): a model's computation on the functions above, its weights by the paper's
#    names (params.paper_weights: slices of its parameters, so gradients reach them)


class ReferenceBackend(Backend):
    name = "reference"

    def forward(self, model, src, src_lens, tgt_in):
        """:func:`teacher_forced` on the model's weights (and its dropout)."""
        return teacher_forced(paper_weights(model), src, src_lens.to(src.device), tgt_in, model.attentive,
                              model.dropout, model.config.state_word)

    def training_loss(self, model, src, src_lens, tgt_in, tgt_out, eps, guide=None):
        logits, alpha = self.forward(model, src, src_lens, tgt_in)
        logits = logits.flatten(0, 1)  # (B·Ty, V)
        if logits.dtype not in (torch.float32, torch.float64):  # (bf16 autocast: the loss in float32, as fast)
            logits = logits.float()
        y = tgt_out.flatten()
        loss = F.cross_entropy(logits, y, ignore_index=PAD, reduction="sum", label_smoothing=eps)
        nll = F.cross_entropy(logits.detach(), y, ignore_index=PAD, reduction="sum")
        return (loss, nll) if guide is None else (loss, nll, attention_cross_entropy(alpha, guide))

    def encode(self, model, src, src_lens):
        """The annotations (B, Tx, ctx), no keys (U_a h_j is computed at every step, as the equations read), the
        mask, s_0 (B, n) and the RNNencdec's c (B, n) (None for RNNsearch)."""
        P = paper_weights(model)
        H, mask, summary = encode(P, src, src_lens.to(src.device), model.attentive, model.dropout)
        return EncoderOut(H, None, mask, initial_state(P, summary), None if model.attentive else summary)

    def init_decoder(self, model, enc):
        return initial_carried(enc.init_state, model.ctx_dim, model.config.state_word)  # s_0 or [s_0; c]

    def decode_step(self, model, y_prev, state, enc, vocab=None):
        """:func:`decoder_step` (or ``decoder_step_current``) for K states per sentence: each state reads its
        sentence's annotations, mask and c (it multiplies c_i at every step, as the equations read); ``vocab``:
        the columns of the whole vocabulary's logits kept."""
        mask = enc.src_mask
        K = state.shape[0] // mask.shape[0]
        rows = torch.arange(mask.shape[0], device=state.device).repeat_interleave(K)  # (B·K,)   each one's sentence
        step = decoder_step if model.config.state_word == "previous" else decoder_step_current
        logits, s_new, alpha = step(paper_weights(model), y_prev, state, enc.annotations.index_select(0, rows),
                                    mask.index_select(0, rows),
                                    None if enc.context is None else enc.context.index_select(0, rows), model.dropout)
        return (logits if vocab is None else logits.index_select(1, vocab)), s_new, alpha
