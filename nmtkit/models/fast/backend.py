"""The fast backend (backend.py): RNNsearch and RNNencdec through the fast paths of ``nmtkit/models/fast/``.

The same values as the reference (reference.py), computed for speed:

- everything that does not depend on the recurrence is computed for all steps in one matmul (the input projections
  of encoder and decoder, U_a h_j, the whole deep output after the loop); the loops do only the recurrent work;
- teacher forcing runs the recurrences through fused.py, whose hand-written backward batches the recurrent weights'
  gradients over time, and the encoder over packed sentences (packed.py: no work at source padding; U_a h_j at
  the real positions only); the losses compute the output layer at the real targets only, fused with the softmax
  and its gradient (output.py);
- a search step reads C_stack c_i and C_o c_i as Σ_j α_ij [C_stack; C_o] h_j from ``source_projections``,
  computed once per sentence, and in search (no autograd) multiplies s_{i-1} and E y_{i-1} through the stacked or
  tabulated weights of stepweights.py.  ``step_products`` and ``step_output`` are the step's two halves on either
  side of the attention.

Which fast path runs at which size is the speed policy's (fast/policy.py).  Symbols as in the paper: m embedding
size, n hidden units, n' the alignment model's, l maxout units.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmtkit import kernels
from nmtkit.data.vocab import BOS, PAD
from nmtkit.models.attention import alignment_for_beams, attention_cross_entropy
from nmtkit.models.backend import Backend, EncoderOut
from nmtkit.models.fast.fused import attentive_decoder, by_source_length, gru_sequence
from nmtkit.models.fast.matmul import aligned_linear, autocast_dtype, in_buckets, token_rows
from nmtkit.models.fast.output import linear_cross_entropy, linear_cross_entropy_with_nll
from nmtkit.models.fast.packed import Packing, packing, unpack
from nmtkit.models.fast.stepweights import StepWeights, step_weights
from nmtkit.models.fast.stepweights import usable as usable_step_weights
from nmtkit.models.reference import initial_carried


def gru_update(gx: Tensor, Us_zr: Tensor, s: Tensor, U: Tensor) -> Tensor:
    """A decoding step's GRU (``reference.gru_step``'s values) from its precomputed products: gx (N, 3n) =
    W_stack E y + C_stack c + b_stack in the order [z; r; candidate], Us_zr (N, 2n) = [U_z; U_r] s (multiplied
    with s's other products in one matmul, ``step_products``), s (N, n) -> s' (N, n)."""
    n = s.shape[-1]
    gx_zr, gx_h = gx.split([2 * n, n], dim=1)  # (N, 2n), (N, n)   split, not slicing: its backward is one cat
    z, r = torch.sigmoid(gx_zr + Us_zr).chunk(2, dim=1)  # (N, n) each
    s_tilde = torch.tanh(torch.addmm(gx_h, r * s, U.t()))  # (N, n)   tanh(W E y + U [r ∘ s] + C c + b)
    return torch.lerp(s, s_tilde.to(s.dtype), z.to(s.dtype))  # (N, n)   (1 − z) ∘ s + z ∘ s̃ (dtypes: autocast)


class FastBackend(Backend):
    name = "fast"

    # -- teacher forcing and the losses
    def forward(self, model, src, src_lens, tgt_in):
        s_prev, Ey, ctx, alpha = self.teacher_forced(model, src, src_lens, tgt_in)
        return model.deep_output(s_prev, Ey, F.linear(ctx, model.C_o)), alpha  # (B, Ty, V), (B, Ty, Tx) or None

    def nll(self, model, src, src_lens, tgt_in, tgt_out):
        t, y, _, _ = self._real_maxout(model, src, src_lens, tgt_in, tgt_out)  # (N, l), (N,)
        return linear_cross_entropy(t, model.W_o, model.b_y, y)

    def training_loss(self, model, src, src_lens, tgt_in, tgt_out, eps, guide=None):
        t, y, alpha, guide = self._real_maxout(model, src, src_lens, tgt_in, tgt_out, guide)  # (N, l), (N,)
        losses = linear_cross_entropy_with_nll(t, model.W_o, model.b_y, y, eps)
        return losses if guide is None else (*losses, attention_cross_entropy(alpha, guide))

    def _real_maxout(self, model, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                     guide: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """What the output layer reads at the real (non-``<pad>``) positions of tgt_out (B, Ty), for the fused loss:
        t_i (N, l) and y_i (N,); and α (B, Ty, Tx) with ``guide`` (B, Ty, Tx), in the same order of sentences
        (else None, None).  The sentences are taken longest source first (the fused attention then works in groups
        of similar source length)."""
        src, src_lens, tgt_in, tgt_out, *rest = by_source_length(src, src_lens, tgt_in, tgt_out,
                                                                 *([] if guide is None else [guide]))
        s_prev, Ey, ctx, alpha = self.teacher_forced(model, src, src_lens, tgt_in)
        real = (tgt_out != PAD).flatten().nonzero().squeeze(1)  # (N,)   flat indices of real targets
        N, lowp = len(real), autocast_dtype(s_prev)
        # bf16 on the CPU: the deep output's products over whole buckets of rows (token_rows; the extra rows repeat
        # the first target's and are cut off from t)
        rows = F.pad(real, (0, token_rows(N, lowp, real.device) - N)) if in_buckets(lowp, real.device) else real
        pick = lambda x: x.flatten(0, 1).index_select(0, rows)  # noqa: E731   (B, Ty, d) -> (N, d)
        if ctx.shape[1] != s_prev.shape[1]:  # the RNNencdec's c, one per sentence: C_o c once per sentence
            Cc = pick(F.linear(ctx, model.C_o).expand(-1, s_prev.shape[1], -1))  # (N, 2l)
        else:  # RNNsearch: C_o c_i at the real targets only
            Cc = F.linear(pick(ctx), model.C_o)  # (N, 2l)
        t = model.maxout(pick(s_prev), pick(Ey), Cc)[:N]  # (N, l)
        return t, tgt_out.flatten().index_select(0, real), alpha if rest else None, rest[0] if rest else None

    def teacher_forced(self, model, src: Tensor, src_lens: Tensor, tgt_in: Tensor):
        """The deep output's inputs for tgt_in = <s> y_1 … (B, Ty): s_{i-1} (B, Ty, n), E y_{i-1} (B, Ty, m), and
        c_i (B, Ty, 2n) and α (B, Ty, Tx) (RNNsearch) or c (B, 1, n), the same at every step, and None
        (RNNencdec)."""
        enc, pack = self._encode(model, src, src_lens)
        Ey = model.embed_target(tgt_in)  # (B, Ty, m)   E y_{i-1}
        dec = model.decoder
        gx = dec.input_projections(model.state_inputs(tgt_in, Ey).transpose(0, 1))  # (Ty, B, 3n)
        # W E y_{i-1} + b for all i (E y_i with state_word="current")
        if not model.attentive:  # RNNencdec: [C_z; C_r; C] c, the same at every step
            gx = gx + dec.context_projections(enc.context)  # (Ty, B, 3n)
            s0 = enc.init_state  # (B, n)
            # s_1 … s_{Ty-1}: the last state is never used by the output
            s_rest = gru_sequence(gx[:-1], dec.U_zr, dec.U, s0)  # (Ty-1, B, n)
            s_prev = torch.cat([s0.unsqueeze(0), s_rest]).transpose(0, 1)  # (B, Ty, n)
            return s_prev, Ey, enc.context.unsqueeze(1), None
        att = model.attention
        s_prev, ctx, alpha = attentive_decoder(
            gx, enc.init_state, enc.annotations, enc.keys, enc.src_mask, att.W_a, att.v_a, dec.U_zr, dec.U,
            dec.C_stack, real=None if pack is None else pack.fwd_index,
        )  # (Ty, B, n), (Ty, B, 2n), (Ty, B, Tx)   s_{i-1}, c_i, α_i
        return s_prev.transpose(0, 1), Ey, ctx.transpose(0, 1), alpha.transpose(0, 1)

    # -- the encoder
    def encode(self, model, src, src_lens):
        return self._encode(model, src, src_lens)[0]

    def _encode(self, model, src: Tensor, src_lens: Tensor) -> tuple[EncoderOut, Packing | None]:
        """The encoder output and, with the paper's unit, the packing the encoder ran over (packed.py: nothing
        computed at padding; the RNNsearch's U_a h_j at the real positions only)."""
        src_lens = src_lens.to(src.device)
        src_mask = torch.arange(src.shape[1], device=src.device).unsqueeze(0) < src_lens.unsqueeze(1)  # (B, Tx)
        if model.encoder.unit != "paper":  # (torch.nn.GRU over the padded batch)
            states, pack = model.encoder(model.embed_source(src), src_lens, src_mask), None
        else:
            pack = packing(src_lens, src.shape[1])
            ids = src.flatten().index_select(0, pack.fwd_index)  # (N,)   at the real positions
            x = model.dropout(F.embedding(ids, model.E_src, sparse=model.sparse_embedding_grads))  # (N, m)
            states = model.encoder.forward_packed(x, pack)
        if not model.attentive:
            c = states.last_forward  # (B, n)   c = →h_{T_x}
            return EncoderOut(states.annotations, None, src_mask, model.initial_state(c), c), pack
        if pack is None:
            keys = model.attention.keys(states.annotations)  # (B, Tx, n')   U_a h_j, once per sentence
        else:
            keys = unpack(model.attention.keys(states.packed), pack)  # (B, Tx, n')   at the real positions only
        s0 = model.initial_state(states.first_backward)  # (B, n)   s_0 = tanh(W_s ←h_1)
        return EncoderOut(states.annotations, keys, src_mask, s0, None), pack

    # -- search
    def init_decoder(self, model, enc):
        # with state_word="current": [s_0; room for [U_z; U_r] s and C_stack c (5n)], see step_output
        return initial_carried(enc.init_state, 5 * model.config.hidden_dim, model.config.state_word)

    def prepare_decoding(self, model, enc):
        return enc._replace(proj=source_projections(model, enc))

    def decode_step(self, model, y_prev, state, enc, vocab=None):
        """With ``state_word="current"`` the state carried is [s_{i-2}; [U_z; U_r] s_{i-2}; C_stack c_{i-1}]
        (B·K, 6n) (``step_output``); ``vocab``: W_o's rows multiplied (all: None)."""
        A, Tx = enc.src_mask.shape
        K = state.shape[0] // A  # hypotheses per sentence
        proj = enc.proj if enc.proj is not None else source_projections(model, enc)  # (A, Tx or 1, 3n + 2l)
        ys, s_prev, Us, w = step_products(model, y_prev, state)  # (A·K, 3n + 2l), (A·K, n), (A·K, [n' +] 2n + 2l)
        if not model.attentive:
            Cc = proj.expand(A, K, proj.shape[-1]).reshape(A * K, -1)  # (A·K, 3n + 2l)   [C_stack; C_o] c
            logits, new_state = step_output(model, ys, Cc, Us, s_prev, w, vocab)  # (A·K, V), (A·K, n or 6n)
            return logits, new_state, None
        query, Us = Us.split([model.config.attn_dim, Us.shape[1] - model.config.attn_dim], dim=1)  # W_a s_{i-1}
        if w is not None and kernels.usable(query, enc.keys):  # (no autograd: the kernel has no backward here)
            alpha = beam_alignment(query, enc, model.attention.v_a, K).view(A, K, Tx)  # (A, K, Tx)
        else:
            alpha = alignment_for_beams(query.view(A, K, -1), enc.keys, model.attention.v_a, enc.src_mask)
        Cc = torch.bmm(alpha, proj).view(A * K, -1)  # (A·K, 3n + 2l)   [C_stack; C_o] c_i
        logits, new_state = step_output(model, ys, Cc, Us, s_prev, w, vocab)  # (A·K, V), (A·K, n or 6n)
        return logits, new_state, alpha.view(A * K, Tx)


def beam_alignment(query: Tensor, enc: EncoderOut, v_a: Tensor, K: int) -> Tensor:
    """α_i (A·K, Tx) for K hypotheses per sentence from W_a s_{i-1} (A·K, n'), by the attention's C kernel
    (nmtkit/kernels/attention.c: σ in registers over each sentence's real positions, where
    :func:`~nmtkit.models.attention.alignment_for_beams` makes four passes over an (A, K, Tx, n') tensor); the
    source masks are right-padded (collate_source), so a sentence's real positions are its first Σ mask."""
    A, Tx = enc.src_mask.shape
    alpha = query.new_empty(A * K, Tx)
    kernels.attend_forward(2.0 * enc.keys, 2.0 * query, 2.0 * v_a, enc.src_mask.sum(dim=1), alpha, per=K)
    return alpha


def source_projections(model, enc: EncoderOut) -> Tensor:
    """What the decoder reads of the source through C_stack (gates and candidate) and C_o (deep output):
    [C_stack; C_o] h_j for every position (RNNsearch, (B, Tx, 3n + 2l)) or [C_stack; C_o] c (RNNencdec,
    (B, 1, 3n + 2l)).  Since c_i = Σ_j α_ij h_j, C c_i = Σ_j α_ij (C h_j): a decoding step then needs a (1 × Tx)
    weighted sum of these instead of two matmuls with c_i."""
    source = enc.annotations if enc.context is None else enc.context.unsqueeze(1)  # (B, Tx or 1, ctx)
    return F.linear(source, torch.cat([model.decoder.C_stack, model.C_o]))


def step_products(model, y_prev: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor, StepWeights | None]:
    """What a decoding step multiplies (stepweights.py): y_{i-1} (N,), the carried state (``init_decoder``) ->
    [W_stack E y + b_stack; V_o E y + b_o] (N, 3n + 2l), s_{i-1} (N, n), [W_a; U_z; U_r; U_o] s_{i-1}
    (N, n' + 2n + 2l; no W_a rows for the RNNencdec), and the step weights used (None with autograd or dropout: then
    from the parameters).  With ``state_word="current"`` it first brings the state up to
    s_{i-1} = f(s_{i-2}, y_{i-1}, c_{i-1}), now that the search has chosen y_{i-1}."""
    dec = model.decoder
    w = step_weights(model) if usable_step_weights(model) else None
    if w is None:
        Ey = model.embed_target(y_prev)  # (N, m)
        ys = torch.cat([dec.input_projections(Ey), aligned_linear(Ey, model.V_o, model.b_o)], dim=1)
        s_stack = torch.cat(([model.attention.W_a] if model.attentive else []) + [dec.U_zr, model.U_o])
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


def step_output(model, ys: Tensor, Cc: Tensor, Us: Tensor, state: Tensor, w: StepWeights | None,
                vocab: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The rest of a step, from [W_stack E y + b_stack; V_o E y + b_o] (N, 3n + 2l), [C_stack; C_o] c_i
    (N, 3n + 2l), [U_z; U_r; U_o] s_{i-1} (N, 2n + 2l), s_{i-1} (N, n) and ``step_products``' step weights ->
    logits (N, V) and the state to carry: s_i (N, n), or with ``state_word="current"`` [s_{i-1}; [U_z; U_r] s_{i-1};
    C_stack c_i] (N, 6n), since s_i reads y_i, which the search has yet to choose (the next step's update then
    multiplies nothing it has not got).  Given ``vocab`` (V',) target ids, the logits are those words' (N, V'):
    only their rows of W_o are multiplied."""
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
        logits = model.readout(t)
        return (logits if vocab is None else logits.index_select(1, vocab)), new_state
    if vocab is not None:  # (N, V')   W_o t_i + b_y for the candidates alone
        return torch.addmm(w.b_y.index_select(0, vocab), t, w.W_o.index_select(0, vocab).t()), new_state
    V = model.W_o.shape[0]
    logits = torch.addmm(w.b_y, t, w.W_o.t())  # (N, V')   W_o t_i + b_y, V rounded up to a multiple of 8
    return (logits if logits.shape[1] == V else logits[:, :V].contiguous()), new_state
