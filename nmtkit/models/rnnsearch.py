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

How it computes is the backend's (backend.py), one object chosen by name once per model: ``model.backend = "fast"``
(the default; fast/backend.py, over the other fast paths of fast/) or ``"reference"`` (``--backend reference``,
``$NMTKIT_BACKEND``: reference.py, Appendix A as its equations read).  Forward, the losses, encode and decode_step --
so training and search -- all run on it, with the same values; tests/test_reference.py holds every path to it.

API (used by training, search and alignment):
    forward(src, src_lens, tgt_in[, return_attention]) -> logits (B, Ty, V) [, α (B, Ty, Tx) or None]
    nll(src, src_lens, tgt_in, tgt_out) -> summed −log p of the real targets (the training loss; output.py)
    training_loss(src, src_lens, tgt_in, tgt_out[, label_smoothing][, guide]) -> (the loss to backpropagate,
        label-smoothed when label_smoothing > 0; the detached summed −log p, as nll gives it[; with guide, the
        attention's cross-entropy against it: guided alignment])
    encode(src, src_lens) -> EncoderOut;  init_decoder(enc) -> the first state, s_0 (B, n)
    decode_step(y_prev, state, enc) -> logits (B·K, V), new state (B·K, n), α (B·K, Tx) or None, for K states per
        sentence of enc (beam search); prepare_decoding(enc) precomputes what every step reads of the source.
        The state is the search's to carry and reorder, not to read: with ``state_word="current"`` (config.py) it
        also holds the context that the next step's update of s reads, once y_i is chosen
    reorder_encoder_out(enc, index) -> EncoderOut
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.data.vocab import BOS, PAD
from nmtkit.models.attention import AdditiveAttention
from nmtkit.models.backend import Backend, EncoderOut
from nmtkit.models.config import RNNencdecConfig, RNNsearchConfig
from nmtkit.models.encoder import SourceEncoder
from nmtkit.models.fast.activations import pairwise_max
from nmtkit.models.fast.matmul import aligned_linear
from nmtkit.models.fast.output import check_label_smoothing
from nmtkit.models.gru import ConditionalGRU
from nmtkit.models.init import PAPER_STD, normal_, zeros_
from nmtkit.models.registry import make_backend, register_model

__all__ = ["EncoderOut", "RNNencdec", "RNNsearch"]


# ----------------------------------------------------------------------------------------------------------- models
class _RNNTranslator(nn.Module):
    """What both models share: embeddings, encoder, conditional GRU decoder, W_s, deep output."""

    arch: str  # set by register_model
    config_class: type
    attentive: bool  # RNNsearch: c_i from the alignment model; RNNencdec: the fixed c

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
        # How it computes (backend.py), an implementation switch (not a hyperparameter, not saved): the backend
        # named by $NMTKIT_BACKEND, else "fast" (registry.make_backend); set ``model.backend`` to change it.
        self._backend: Backend = make_backend()
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

    @property
    def backend(self) -> str:
        """The name of the backend the model computes with: ``"fast"`` or ``"reference"`` (same values)."""
        return self._backend.name

    @backend.setter
    def backend(self, name: str) -> None:
        self._backend = make_backend(name)  # (unknown -> ValueError)

    # -- pieces (the paper's; both backends read them)
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

    def initial_state(self, summary: Tensor) -> Tensor:
        """s_0 = tanh(W_s summary + b_s): (B, n) -> (B, n)."""
        return torch.tanh(F.linear(summary, self.W_s, self.b_s))

    def state_inputs(self, tgt_in: Tensor, Ey: Tensor) -> Tensor:
        """E of the word each decoder state s_i (i = 1 … Ty) reads, for tgt_in = <s> y_1 … (B, Ty) and its
        embeddings Ey (B, Ty, m): E y_{i-1}, Ey itself (Appendix A), or with ``state_word="current"`` E y_i, of tgt_in
        shifted left by one (the last state, which reads ``<pad>``, is never read by the output)."""
        if self.config.state_word == "previous":
            return Ey
        return self.embed_target(torch.cat([tgt_in[:, 1:], tgt_in.new_full((tgt_in.shape[0], 1), PAD)], dim=1))

    # -- the interface used by training, search and alignment: the backend's (backend.py)
    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, return_attention: bool = False):
        """Teacher-forced logits (B, Ty, V) for tgt_in = <s> y_1 … (B, Ty); return_attention adds α (B, Ty, Tx)
        (None for the RNNencdec, which has no attention)."""
        logits, alpha = self._backend.forward(self, src, src_lens, tgt_in)
        return (logits, alpha) if return_attention else logits

    def nll(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """−Σ log p(y_i | y_<i, x) over the real (non-``<pad>``) positions of tgt_out (B, Ty): a float32 scalar.

        The training loss without label smoothing: the same value as cross-entropy on ``forward``'s logits (the
        fast backend computes the output layer only at real positions, fused with the softmax and its gradient)."""
        return self._backend.nll(self, src, src_lens, tgt_in, tgt_out)

    def training_loss(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                      label_smoothing: float = 0.0, guide: Tensor | None = None) -> tuple[Tensor, ...]:
        """(the loss to backpropagate, summed over the real positions of tgt_out (B, Ty): the cross-entropy against
        (1 − ε) onehot(y_i) + ε/V with ε = ``label_smoothing`` in [0, 1), ``nll``'s for ε = 0; the summed
        −log p(y_i | y_<i, x), detached, as ``nll`` gives it, for perplexity): two float32 scalars (float64 for a
        float64 model), from one pass of the output layer.  A ValueError for ε outside [0, 1).

        ``guide`` (B, Ty, Tx), RNNsearch only: what each target position's attention is trained towards (guided
        alignment, nmtkit/train/guided.py; rows summing to 1, or 0 where unguided): a third scalar, Σ −guide·log α
        over the guided rows, with its graph (``attention_cross_entropy`` in attention.py)."""
        eps = check_label_smoothing(label_smoothing)  # (before any work)
        if guide is not None:
            if not self.attentive:
                raise ValueError(f"guided alignment trains attention; {self.arch} has none")
            if guide.shape != (*tgt_out.shape, src.shape[1]):
                raise ValueError(f"guide of shape {tuple(guide.shape)} for {tuple(tgt_out.shape)} targets and "
                                 f"{tuple(src.shape)} sources: want (B, Ty, Tx)")
            return self._backend.training_loss(self, src, src_lens, tgt_in, tgt_out, eps, guide)
        return self._backend.training_loss(self, src, src_lens, tgt_in, tgt_out, eps)

    def encode(self, src: Tensor, src_lens: Tensor) -> EncoderOut:
        """src (B, Tx) long, src_lens (B,) long -> EncoderOut: annotations (B, Tx, ctx), s_0, and the RNNsearch's
        keys U_a h_j (B, Tx, n') (fast backend) or the RNNencdec's context c = →h_{T_x} (B, n)."""
        return self._backend.encode(self, src, src_lens)

    def init_decoder(self, enc: EncoderOut) -> Tensor:
        """The state the first ``decode_step`` reads: s_0 (B, n); with ``state_word="current"`` s_0 and room for
        what the next step's update reads besides y_i (the backend's), unused at the first step."""
        return self._backend.init_decoder(self, enc)

    def prepare_decoding(self, enc: EncoderOut) -> EncoderOut:
        """The encoder output with what every step of a search reads of the source computed once."""
        return self._backend.prepare_decoding(self, enc)

    def decode_step(self, y_prev: Tensor, state: Tensor, enc: EncoderOut,
                    vocab: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """y_{i-1} (B·K,) long, the carried state (B·K, ·) -> logits for y_i (B·K, V), the next state and α_i
        (B·K, Tx) (None for the RNNencdec).  ``enc`` holds B sentences; state rows come K per sentence, in sentence
        order (K = 1 outside beam search).  The state is s_{i-1} (B·K, n), or with ``state_word="current"`` what
        the backend carries until y_{i-1} is chosen.  Given ``vocab`` (V',) long, target ids, the logits are those
        of these words only (B·K, V'), in that order: W_o's other rows are never multiplied (candidate lists,
        :mod:`nmtkit.translate.candidates`)."""
        return self._backend.decode_step(self, y_prev, state, enc, vocab)

    @staticmethod
    def reorder_encoder_out(enc: EncoderOut, index: Tensor) -> EncoderOut:
        """Select (and repeat) batch rows, e.g. for beam search: every tensor ``index_select``-ed along dim 0."""
        return EncoderOut(*(None if t is None else t.index_select(0, index) for t in enc))


@register_model("rnnsearch")
class RNNsearch(_RNNTranslator):
    """The paper's model: bidirectional encoder, additive attention, conditional GRU decoder, maxout deep output."""

    config_class = RNNsearchConfig
    attentive = True  # c_i from the alignment model

    def __init__(self, config: RNNsearchConfig):
        n = config.hidden_dim
        super().__init__(config, ctx_dim=2 * n, bidirectional=True)
        self.attention = AdditiveAttention(n, 2 * n, config.attn_dim)


@register_model("rnnencdec")
class RNNencdec(_RNNTranslator):
    """The RNN Encoder-Decoder baseline: the same decoder with c_i fixed to c = →h_{T_x}, no attention."""

    config_class = RNNencdecConfig
    attentive = False  # c_i = c = →h_{T_x} at every step

    def __init__(self, config: RNNencdecConfig):
        super().__init__(config, ctx_dim=config.hidden_dim, bidirectional=False)
