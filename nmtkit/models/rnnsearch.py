"""RNNsearch and RNNencdec (Bahdanau, Cho & Bengio, ICLR 2015; the equations of arXiv v7, Appendix A).

Token conventions (fixed by the data format, :mod:`nmtkit.data.vocab`): ``PAD, UNK, BOS, EOS = 0, 1, 2, 3``.
- Source: the encoder reads the source ids FOLLOWED BY ``</s>`` (as Cho et al.'s encoder reads the end-of-sentence
  symbol); the caller (batching) appends it and ``src_lens`` counts it.  The model itself adds nothing.
- Target: the decoder input is ``<s> y_1 … y_T`` and the output to predict ``y_1 … y_T </s>``.
- Batches are right-padded with PAD and come with lengths; padding never influences real positions.
- First-word input: E y_0 is the zero vector (GroundHog's convention).  Implemented by masking: wherever the input id
  is ``<s>`` its embedding is replaced by zeros, so the ``<s>`` row of E_tgt is never used (and gets no gradient).

RNNsearch (A.2): bidirectional encoder, annotations h_j = [→h_j; ←h_j] (2n); s_0 = tanh(W_s ←h_1 + b_s); at step i
the alignment model reads s_{i-1} and gives α_i and c_i (attention.py); s_i by the conditional GRU (gru.py); the
deep output reads s_{i-1} (v7), E y_{i-1} and c_i:

    t̃_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i + b_o  (2l),   t_{i,j} = max(t̃_{i,2j-1}, t̃_{i,2j})  (l),
    logits_i = W_o t_i + b_y  (V).

With ``state_word="current"`` (config.py; the small presets) s_i reads y_i instead of y_{i-1}, as the paper's v6
and the authors' GroundHog code: s_{i-1} has then read y_{i-1} when step i attends and predicts.  Only the word fed
to the state moves; in search a state waits for the word the search chooses (``init_decoder``).

RNNencdec (our choices, following Cho et al. 2014 and the appendix's remark): a FORWARD-ONLY encoder (no backward
GRU); the summary c = →h_{T_x}, the forward state at the sentence's own last token (its ``</s>``), is used as c_i at
every step (n dims, so C, C_z, C_r, C_o have n columns); no attention; s_0 = tanh(W_s c + b_s).

Biases (all zero-initialised): encoder b, b_z, b_r per direction; decoder b, b_z, b_r (shared by the W, U and C
terms of each gate); b_s (initial state); b_o (deep output, shared by U_o, V_o, C_o); b_y (output softmax, with
W_o).  No bias in the alignment model (W_a, U_a, v_a), as the paper writes it.  Initialisation: see init.py.

Dropout (config ``dropout``, default 0: the paper used none) applies to source and target embeddings and to the
maxout output t_i.

Speed: everything that does not depend on the recurrence is computed for all steps in one matmul (input projections
of encoder and decoder, U_a h, and the whole deep output after the loop); the loop does only the recurrent work.
For teacher forcing (``forward``) the loops run through fused.py, whose hand-written backward batches the recurrent
weights' gradients over time, and the encoder over packed sentences (packed.py: no work at source padding; U_a h_j
and C_stack h_j at the real positions only).  ``model.backend = "reference"`` (``--backend reference``,
``$NMTKIT_BACKEND``) runs everything -- forward, the losses, encode and decode_step, so training and search -- on
reference.py instead, Appendix A as its equations read; tests/test_reference.py holds every path to it.
``decode_step`` reads C_stack c_i and C_o c_i as Σ_j α_ij [C_stack; C_o] h_j from ``source_projections``, computed
once per sentence, and in search (no autograd) multiplies s_{i-1} and E y_{i-1} through the stacked or tabulated
weights of stepweights.py.

API (used by training, search and alignment):
    forward(src, src_lens, tgt_in[, return_attention]) -> logits (B, Ty, V) [, α (B, Ty, Tx) or None]
    nll(src, src_lens, tgt_in, tgt_out) -> summed −log p of the real targets (the training loss; output.py)
    training_loss(src, src_lens, tgt_in, tgt_out[, label_smoothing]) -> (the loss to backpropagate, label-smoothed
        when label_smoothing > 0; the detached summed −log p, as nll gives it)
    encode(src, src_lens) -> EncoderOut;  init_decoder(enc) -> the first state, s_0 (B, n)
    decode_step(y_prev, state, enc) -> logits (B·K, V), new state (B·K, n), α (B·K, Tx) or None, for K states per
        sentence of enc (beam search); prepare_decoding(enc) precomputes what every step reads of the source.
        The state is the search's to carry and reorder, not to read: with ``state_word="current"`` (config.py) it
        also holds the context that the next step's update of s reads, once y_i is chosen
    reorder_encoder_out(enc, index) -> EncoderOut
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.models import reference
from nmtkit.models.config import RNNencdecConfig, RNNsearchConfig
from nmtkit.models.registry import default_backend, register_model
from nmtkit.models.fast.activations import pairwise_max
from nmtkit.models.attention import AdditiveAttention, alignment
from nmtkit.models.encoder import EncoderStates, SourceEncoder
from nmtkit.models.fast.fused import attentive_decoder, by_source_length, gru_sequence
from nmtkit.models.gru import ConditionalGRU
from nmtkit.models.init import PAPER_STD, normal_, zeros_
from nmtkit.models.fast.matmul import aligned_linear
from nmtkit.models.fast.output import check_label_smoothing, linear_cross_entropy, linear_cross_entropy_with_nll
from nmtkit.models.fast.packed import Packing, packing, unpack
from nmtkit.models.step import step_output, step_products
from nmtkit.data.vocab import BOS, PAD


class EncoderOut(NamedTuple):
    """Everything the decoder needs from the source, batch first (reorder with ``reorder_encoder_out``)."""

    annotations: Tensor  # (B, Tx, ctx): h_j = [→h_j; ←h_j] (RNNsearch, 2n) or →h_j (RNNencdec, n); 0 at padding
    keys: Tensor | None  # (B, Tx, n'): U_a h_j (RNNsearch), None for RNNencdec
    src_mask: Tensor  # (B, Tx) bool, True at real tokens
    init_state: Tensor  # (B, n): s_0
    context: Tensor | None  # (B, n): the fixed c = →h_{T_x} (RNNencdec), None for RNNsearch
    proj: Tensor | None = None  # [C_stack; C_o] h_j (B, Tx, 3n + 2l) or [C_stack; C_o] c (B, 1, 3n + 2l): decoding


# ----------------------------------------------------------------------------------------------------------- models
class _RNNTranslator(nn.Module):
    """What both models share: embeddings, encoder, conditional GRU decoder, W_s, deep output."""

    arch: str  # set by register_model
    config_class: type

    def __init__(self, config: RNNencdecConfig, ctx_dim: int, bidirectional: bool):
        super().__init__()
        self.config = config
        m, n, l, ctx = config.emb_dim, config.hidden_dim, config.maxout_dim, ctx_dim
        self.ctx_dim = ctx
        self.E_src = nn.Parameter(torch.empty(config.src_vocab_size, m))
        self.E_tgt = nn.Parameter(torch.empty(config.tgt_vocab_size, m))
        self.encoder = SourceEncoder(m, n, bidirectional, config.encoder_gru)
        self.decoder = ConditionalGRU(m, n, ctx)
        self.W_s = nn.Parameter(torch.empty(n, n))
        self.b_s = nn.Parameter(torch.empty(n))
        self.U_o = nn.Parameter(torch.empty(2 * l, n))
        self.V_o = nn.Parameter(torch.empty(2 * l, m))
        self.C_o = nn.Parameter(torch.empty(2 * l, ctx))
        self.b_o = nn.Parameter(torch.empty(2 * l))
        self.W_o = nn.Parameter(torch.empty(config.tgt_vocab_size, l))
        self.b_y = nn.Parameter(torch.empty(config.tgt_vocab_size))
        self.dropout = nn.Dropout(config.dropout)
        # The backend, an implementation switch (not a hyperparameter, not saved): "fast" (fast/: the teacher-forced
        # recurrences with hand-written backward passes, the packed encoder, the fused output loss) or "reference",
        # the paper's equations as they read (reference.py): forward, the losses, encode and decode_step then all
        # run on it (training and search).  Same values.
        self.backend = default_backend()  # (registry.py: $NMTKIT_BACKEND, else "fast")
        # Also a switch: the embeddings' gradients as row-sparse COO tensors (the used rows only), for an update
        # that takes them (gradients.py, adadelta.py; the trainer decides).  The same values.
        self.sparse_embedding_grads = False
        self._reset_own_parameters()

    def _reset_own_parameters(self) -> None:
        for p in (self.E_src, self.E_tgt, self.W_s, self.U_o, self.V_o, self.C_o, self.W_o):
            normal_(p, PAPER_STD)
        for p in (self.b_s, self.b_o, self.b_y):
            zeros_(p)

    def reset_parameters(self) -> None:
        """Re-initialise every parameter as in Appendix B.1 (deterministic under torch.manual_seed)."""
        self._reset_own_parameters()
        for module in self.children():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

    # -- pieces
    def embed_source(self, src: Tensor) -> Tensor:
        """src (B, Tx) -> E x, time-major (Tx, B, m)."""
        return self.dropout(F.embedding(src.t(), self.E_src, sparse=self.sparse_embedding_grads))

    def embed_target(self, y: Tensor) -> Tensor:
        """E y for any shape of ids; zero where y is ``<s>`` (E y_0 = 0)."""
        Ey = F.embedding(y, self.E_tgt, sparse=self.sparse_embedding_grads)  # (..., m)
        return self.dropout(Ey.masked_fill((y == BOS).unsqueeze(-1), 0.0))

    def maxout(self, s_prev: Tensor, Ey: Tensor, Cc: Tensor) -> Tensor:
        """s_{i-1} (..., n), E y_{i-1} (..., m), C_o c_i (..., 2l) -> t_i (..., l).  The maxout hidden layer."""
        t_tilde = F.linear(s_prev, self.U_o, self.b_o) + aligned_linear(Ey, self.V_o) + Cc  # (..., 2l)
        return self.pool(t_tilde)

    def pool(self, t_tilde: Tensor) -> Tensor:
        """t̃_i (..., 2l) -> t_i (..., l): t_{i,j} = max(t̃_{i,2j-1}, t̃_{i,2j}), then dropout (if any)."""
        return self.dropout(pairwise_max(t_tilde))  # (activations.py)

    def readout(self, t: Tensor) -> Tensor:
        """t_i (..., l) -> logits W_o t_i + b_y (..., V)."""
        flat = t.reshape(-1, t.shape[-1])  # (N, l)
        return torch.addmm(self.b_y, flat, self.W_o.t()).view(*t.shape[:-1], -1)  # (..., V)   one pass

    def deep_output(self, s_prev: Tensor, Ey: Tensor, Cc: Tensor) -> Tensor:
        """s_{i-1} (..., n), E y_{i-1} (..., m), C_o c_i (..., 2l) -> logits (..., V).  The maxout deep output."""
        return self.readout(self.maxout(s_prev, Ey, Cc))

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, return_attention: bool = False):
        """Teacher-forced logits (B, Ty, V) for tgt_in = <s> y_1 … (B, Ty); return_attention adds α (B, Ty, Tx)
        (None for the RNNencdec, which has no attention)."""
        if self.backend == "reference":
            logits, alpha = reference.model_forward(self, src, src_lens, tgt_in)
            return (logits, alpha) if return_attention else logits
        s_prev, Ey, ctx, alpha = self.teacher_forced(src, src_lens, tgt_in)
        logits = self.deep_output(s_prev, Ey, F.linear(ctx, self.C_o))  # (B, Ty, V)
        return (logits, alpha) if return_attention else logits

    def nll(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """−Σ log p(y_i | y_<i, x) over the real (non-``<pad>``) positions of tgt_out (B, Ty): a float32 scalar.

        The training loss without label smoothing: the same value as cross-entropy on ``forward``'s logits, but the
        output layer is computed only at real positions and fused with the softmax and its gradient (output.py)."""
        if self.backend == "reference":
            return self.training_loss(src, src_lens, tgt_in, tgt_out)[0]
        t, y = self._real_maxout(src, src_lens, tgt_in, tgt_out)  # (N, l), (N,)
        return linear_cross_entropy(t, self.W_o, self.b_y, y)

    def training_loss(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                      label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
        """(the loss to backpropagate, summed over the real positions of tgt_out (B, Ty): the cross-entropy against
        (1 − ε) onehot(y_i) + ε/V with ε = ``label_smoothing`` in [0, 1), ``nll``'s for ε = 0; the summed
        −log p(y_i | y_<i, x), detached, as ``nll`` gives it, for perplexity): two float32 scalars (float64 for a
        float64 model), from one pass of the fused output layer (output.py).  A ValueError for ε outside [0, 1)."""
        eps = check_label_smoothing(label_smoothing)  # (before any work)
        if self.backend == "reference":
            return reference.model_loss(self, src, src_lens, tgt_in, tgt_out, eps)
        t, y = self._real_maxout(src, src_lens, tgt_in, tgt_out)  # (N, l), (N,)
        return linear_cross_entropy_with_nll(t, self.W_o, self.b_y, y, eps)

    def _real_maxout(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """What the output layer reads at the real (non-``<pad>``) positions of tgt_out (B, Ty), for the fused loss:
        t_i (N, l) and y_i (N,).  The sentences are taken longest source first (the fused attention then works in
        groups of similar source length)."""
        src, src_lens, tgt_in, tgt_out = by_source_length(src, src_lens, tgt_in, tgt_out)
        s_prev, Ey, ctx, _ = self.teacher_forced(src, src_lens, tgt_in)
        real = (tgt_out != PAD).flatten().nonzero().squeeze(1)  # (N,)   flat indices of real targets
        pick = lambda x: x.flatten(0, 1).index_select(0, real)  # noqa: E731   (B, Ty, d) -> (N, d)
        if ctx.shape[1] != s_prev.shape[1]:  # the RNNencdec's c, one per sentence: C_o c once per sentence
            Cc = pick(F.linear(ctx, self.C_o).expand(-1, s_prev.shape[1], -1))  # (N, 2l)
        else:  # RNNsearch: C_o c_i at the real targets only
            Cc = F.linear(pick(ctx), self.C_o)  # (N, 2l)
        t = self.maxout(pick(s_prev), pick(Ey), Cc)  # (N, l)
        return t, tgt_out.flatten().index_select(0, real)

    def initial_state(self, summary: Tensor) -> Tensor:
        """s_0 = tanh(W_s summary + b_s): (B, n) -> (B, n)."""
        return torch.tanh(F.linear(summary, self.W_s, self.b_s))

    # -- the interface used by training, search and alignment
    def init_decoder(self, enc: EncoderOut) -> Tensor:
        """The state the first ``decode_step`` reads: s_0 (B, n); with ``state_word="current"`` s_0 and room for
        what the next step's update reads besides y_i (step.py: [U_z; U_r] s and C_stack c, 5n; the reference
        backend: c, ctx), unused at the first step."""
        width = self.ctx_dim if self.backend == "reference" else 5 * self.config.hidden_dim
        return reference.initial_carried(enc.init_state, width, self.config.state_word)

    def state_inputs(self, tgt_in: Tensor, Ey: Tensor) -> Tensor:
        """E of the word each decoder state s_i (i = 1 … Ty) reads, for tgt_in = <s> y_1 … (B, Ty) and its
        embeddings Ey (B, Ty, m): E y_{i-1}, Ey itself (Appendix A), or with ``state_word="current"`` E y_i, of tgt_in
        shifted left by one (the last state, which reads ``<pad>``, is never read by the output)."""
        if self.config.state_word == "previous":
            return Ey
        return self.embed_target(torch.cat([tgt_in[:, 1:], tgt_in.new_full((tgt_in.shape[0], 1), PAD)], dim=1))

    def source_projections(self, enc: EncoderOut) -> Tensor:
        """What the decoder reads of the source through C_stack (gates and candidate) and C_o (deep output):
        [C_stack; C_o] h_j for every position (RNNsearch, (B, Tx, 3n + 2l)) or [C_stack; C_o] c (RNNencdec,
        (B, 1, 3n + 2l)).  Since c_i = Σ_j α_ij h_j, C c_i = Σ_j α_ij (C h_j): a decoding step then needs a (1 × Tx)
        weighted sum of these instead of two matmuls with c_i."""
        source = enc.annotations if enc.context is None else enc.context.unsqueeze(1)  # (B, Tx or 1, ctx)
        return F.linear(source, torch.cat([self.decoder.C_stack, self.C_o]))

    def prepare_decoding(self, enc: EncoderOut) -> EncoderOut:
        """The encoder output with ``source_projections`` computed once, for the many steps of a search."""
        if self.backend == "reference":  # (it multiplies c_i at every step, as the equations read)
            return enc
        return enc._replace(proj=self.source_projections(enc))

    @staticmethod
    def reorder_encoder_out(enc: EncoderOut, index: Tensor) -> EncoderOut:
        """Select (and repeat) batch rows, e.g. for beam search: every tensor ``index_select``-ed along dim 0."""
        return EncoderOut(*(None if t is None else t.index_select(0, index) for t in enc))

    def _run_encoder(self, src: Tensor, src_lens: Tensor) -> tuple[EncoderStates, Tensor, Packing | None]:
        """src (B, Tx), src_lens (B,) -> the encoder's states, the source mask (B, Tx) and, with the paper's unit, the
        packing the encoder ran over (packed.py: nothing computed at padding)."""
        src_lens = src_lens.to(src.device)
        src_mask = self._source_mask(src, src_lens)  # (B, Tx)
        if self.encoder.unit != "paper":  # (torch.nn.GRU over the padded batch)
            return self.encoder(self.embed_source(src), src_lens, src_mask), src_mask, None
        pack = packing(src_lens, src.shape[1])
        ids = src.flatten().index_select(0, pack.fwd_index)  # (N,)   at the real positions
        x = self.dropout(F.embedding(ids, self.E_src, sparse=self.sparse_embedding_grads))  # (N, m)
        return self.encoder.forward_packed(x, pack), src_mask, pack

    def _source_mask(self, src: Tensor, src_lens: Tensor) -> Tensor:
        return torch.arange(src.shape[1], device=src.device).unsqueeze(0) < src_lens.unsqueeze(1)  # (B, Tx)


@register_model("rnnsearch")
class RNNsearch(_RNNTranslator):
    """The paper's model: bidirectional encoder, additive attention, conditional GRU decoder, maxout deep output."""

    config_class = RNNsearchConfig

    def __init__(self, config: RNNsearchConfig):
        n = config.hidden_dim
        super().__init__(config, ctx_dim=2 * n, bidirectional=True)
        self.attention = AdditiveAttention(n, 2 * n, config.attn_dim)

    def encode(self, src: Tensor, src_lens: Tensor) -> EncoderOut:
        """src (B, Tx) long, src_lens (B,) long -> EncoderOut with annotations (B, Tx, 2n) and keys (B, Tx, n')."""
        if self.backend == "reference":
            return EncoderOut(*reference.model_encode(self, src, src_lens))
        return self._encode(src, src_lens)[0]

    def _encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncoderOut, Packing | None]:
        states, src_mask, pack = self._run_encoder(src, src_lens)
        if pack is None:
            keys = self.attention.keys(states.annotations)  # (B, Tx, n')   U_a h_j, once per sentence
        else:
            keys = unpack(self.attention.keys(states.packed), pack)  # (B, Tx, n')   at the real positions only
        s0 = self.initial_state(states.first_backward)  # (B, n)   s_0 = tanh(W_s ←h_1)
        return EncoderOut(states.annotations, keys, src_mask, s0, None), pack

    def teacher_forced(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor):
        """The deep output's inputs for tgt_in = <s> y_1 … (B, Ty): s_{i-1} (B, Ty, n), E y_{i-1} (B, Ty, m),
        c_i (B, Ty, 2n), and α (B, Ty, Tx)."""
        enc, pack = self._encode(src, src_lens)
        Ey = self.embed_target(tgt_in)  # (B, Ty, m)   E y_{i-1}
        gx = self.decoder.input_projections(self.state_inputs(tgt_in, Ey).transpose(0, 1))  # (Ty, B, 3n)
        # W E y_{i-1} + b for all i (E y_i with state_word="current")
        dec, att = self.decoder, self.attention
        s_prev, ctx, alpha = attentive_decoder(
            gx, enc.init_state, enc.annotations, enc.keys, enc.src_mask, att.W_a, att.v_a, dec.U_zr, dec.U,
            dec.C_stack, real=None if pack is None else pack.fwd_index,
        )  # (Ty, B, n), (Ty, B, 2n), (Ty, B, Tx)   s_{i-1}, c_i, α_i
        return s_prev.transpose(0, 1), Ey, ctx.transpose(0, 1), alpha.transpose(0, 1)

    def decode_step(self, y_prev: Tensor, state: Tensor, enc: EncoderOut) -> tuple[Tensor, Tensor, Tensor]:
        """y_{i-1} (B·K,) long, s_{i-1} (B·K, n) -> logits for y_i (B·K, V), s_i (B·K, n), α_i (B·K, Tx).  (With
        ``state_word="current"`` the state carried is [s_{i-2}; [U_z; U_r] s_{i-2}; C_stack c_{i-1}] (B·K, 6n):
        step.py.)

        ``enc`` holds B sentences; state rows come K per sentence, in sentence order (K = 1 outside beam search).
        """
        if self.backend == "reference":
            return reference.model_step(self, y_prev, state, enc.annotations, enc.src_mask, enc.context)
        A, Tx = enc.src_mask.shape
        K = state.shape[0] // A  # hypotheses per sentence
        proj = enc.proj if enc.proj is not None else self.source_projections(enc)  # (A, Tx, 3n + 2l)
        ys, s_prev, Us, w = step_products(self, y_prev, state)  # (A·K, 3n + 2l), (A·K, n), (A·K, n' + 2n + 2l)
        query, Us = Us.split([self.config.attn_dim, Us.shape[1] - self.config.attn_dim], dim=1)  # W_a s_{i-1}
        alpha = alignment(query.view(A, K, -1), enc.keys, self.attention.v_a, enc.src_mask)  # (A, K, Tx)
        Cc = torch.bmm(alpha, proj).view(A * K, -1)  # (A·K, 3n + 2l)   [C_stack; C_o] c_i
        logits, new_state = step_output(self, ys, Cc, Us, s_prev, w)  # (A·K, V), (A·K, n or 6n)
        return logits, new_state, alpha.view(A * K, Tx)


@register_model("rnnencdec")
class RNNencdec(_RNNTranslator):
    """The RNN Encoder-Decoder baseline: the same decoder with c_i fixed to c = →h_{T_x}, no attention."""

    config_class = RNNencdecConfig

    def __init__(self, config: RNNencdecConfig):
        super().__init__(config, ctx_dim=config.hidden_dim, bidirectional=False)

    def encode(self, src: Tensor, src_lens: Tensor) -> EncoderOut:
        """src (B, Tx), src_lens (B,) -> EncoderOut with annotations →h_j (B, Tx, n) and context c = →h_{T_x}."""
        if self.backend == "reference":
            return EncoderOut(*reference.model_encode(self, src, src_lens))
        states, src_mask, _ = self._run_encoder(src, src_lens)
        c = states.last_forward  # (B, n)
        return EncoderOut(states.annotations, None, src_mask, self.initial_state(c), c)

    def teacher_forced(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor):
        """The deep output's inputs for tgt_in (B, Ty): s_{i-1} (B, Ty, n), E y_{i-1} (B, Ty, m), c (B, 1, n)
        (the same at every step), and None (no attention)."""
        enc = self.encode(src, src_lens)
        Ey = self.embed_target(tgt_in)  # (B, Ty, m)
        Cc = self.decoder.context_projections(enc.context)  # (B, 3n)   [C_z; C_r; C] c, the same at every step
        gx = self.decoder.input_projections(self.state_inputs(tgt_in, Ey).transpose(0, 1)) + Cc  # (Ty, B, 3n)
        s0 = enc.init_state  # (B, n)
        # s_1 … s_{Ty-1}: the last state is never used by the output
        s_rest = gru_sequence(gx[:-1], self.decoder.U_zr, self.decoder.U, s0)  # (Ty-1, B, n)
        s_prev = torch.cat([s0.unsqueeze(0), s_rest]).transpose(0, 1)  # (B, Ty, n)
        return s_prev, Ey, enc.context.unsqueeze(1), None

    def decode_step(self, y_prev: Tensor, state: Tensor, enc: EncoderOut) -> tuple[Tensor, Tensor, None]:
        """y_{i-1} (B·K,), s_{i-1} (B·K, n) -> logits (B·K, V), s_i (B·K, n), None (no attention).  (The carried
        state of ``state_word="current"``: see ``init_decoder``.)

        ``enc`` holds B sentences; state rows come K per sentence, in sentence order (K = 1 outside beam search)."""
        if self.backend == "reference":
            return reference.model_step(self, y_prev, state, enc.annotations, enc.src_mask, enc.context)
        A = enc.src_mask.shape[0]
        K = state.shape[0] // A
        proj = enc.proj if enc.proj is not None else self.source_projections(enc)  # (A, 1, 3n + 2l)
        ys, s_prev, Us, w = step_products(self, y_prev, state)  # (A·K, 3n + 2l), (A·K, n), (A·K, 2n + 2l)
        Cc = proj.expand(A, K, proj.shape[-1]).reshape(A * K, -1)  # (A·K, 3n + 2l)   [C_stack; C_o] c
        logits, new_state = step_output(self, ys, Cc, Us, s_prev, w)  # (A·K, V), (A·K, n or 6n)
        return logits, new_state, None
