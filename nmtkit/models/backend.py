"""How a model computes: the interface of a backend, the one object a model hands all its computation to.

A model (rnnsearch.py) owns the parameters and the paper's small pieces (embeddings, the deep output, s_0); what it
computes over a batch -- teacher forcing, the losses, the encoder, a search step -- is its backend's, chosen once
per model by name (``model.backend = "fast" | "reference"``; :func:`nmtkit.models.registry.make_backend`, which
reads ``$NMTKIT_BACKEND`` for the default).  Two implement it, with the same values:

- ``reference`` (reference.py): Appendix A as its equations read, one step at a time with plain torch operations;
- ``fast`` (fast/backend.py): the same model through the fast paths of ``nmtkit/models/fast/`` (fused
  recurrences with hand-written backward passes, the packed encoder, the fused output loss, the search's step
  weights) and the C kernels, each of them tested against the reference, values and gradients.

The search loops (nmtkit/translate/search.py, sampling.py) are written once, over ``encode``, ``init_decoder``,
``prepare_decoding`` and ``decode_step``; what differs per backend is the step.  Teacher forcing is the one
recurrence the fast backend writes again, whole (fused.py), because its backward pass is hand-written.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class EncoderOut(NamedTuple):
    """Everything the decoder needs from the source, batch first (reorder with ``reorder_encoder_out``)."""

    annotations: Tensor  # (B, Tx, ctx): h_j = [→h_j; ←h_j] (RNNsearch, 2n) or →h_j (RNNencdec, n); 0 at padding
    keys: Tensor | None  # (B, Tx, n'): U_a h_j (RNNsearch, fast backend), None otherwise
    src_mask: Tensor  # (B, Tx) bool, True at real tokens
    init_state: Tensor  # (B, n): s_0
    context: Tensor | None  # (B, n): the fixed c = →h_{T_x} (RNNencdec), None for RNNsearch
    proj: Tensor | None = None  # [C_stack; C_o] h_j (B, Tx, 3n + 2l) or [C_stack; C_o] c (B, 1, 3n + 2l): decoding


class Backend:
    """What a backend computes for a model (``model`` is the RNNsearch or RNNencdec whose weights it reads; its
    class attribute ``attentive`` tells them apart).  Shapes: B sentences, Tx source and Ty target positions
    (padded), V target vocabulary, n hidden units; K states per sentence in search (K = 1 outside beam search)."""

    name: str

    def forward(self, model, src: Tensor, src_lens: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced logits (B, Ty, V) for tgt_in = <s> y_1 … (B, Ty), and α (B, Ty, Tx) (None: RNNencdec)."""
        raise NotImplementedError

    def training_loss(self, model, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                      eps: float, guide: Tensor | None = None) -> tuple[Tensor, ...]:
        """(the summed cross-entropy against (1 − ε) onehot(y_i) + ε/V over the real positions of tgt_out (B, Ty);
        the summed −log p(y_i | y_<i, x), detached): float32 scalars (float64 for a float64 model); with ``guide``
        (B, Ty, Tx) a third, the attention's cross-entropy against it (guided alignment; RNNsearch only)."""
        raise NotImplementedError

    def nll(self, model, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """The summed −log p of the real targets, with its graph: ``training_loss`` at ε = 0."""
        return self.training_loss(model, src, src_lens, tgt_in, tgt_out, 0.0)[0]

    def encode(self, model, src: Tensor, src_lens: Tensor) -> EncoderOut:
        """src (B, Tx) ids ending in ``</s>``, src_lens (B,) -> the source as every step reads it."""
        raise NotImplementedError

    def init_decoder(self, model, enc: EncoderOut) -> Tensor:
        """The state the first ``decode_step`` reads: s_0 (B, n), or with ``state_word="current"`` s_0 and room
        for what the next step's update reads besides y_i (its width is the backend's)."""
        raise NotImplementedError

    def prepare_decoding(self, model, enc: EncoderOut) -> EncoderOut:
        """``enc`` with whatever the many steps of a search read of the source computed once."""
        return enc

    def decode_step(self, model, y_prev: Tensor, state: Tensor, enc: EncoderOut,
                    vocab: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """y_{i-1} (B·K,) long and the carried state (B·K, ·) -> the logits of y_i (B·K, V), the next state and
        α_i (B·K, Tx) (None: RNNencdec), for K states per sentence of ``enc``, in sentence order; given ``vocab``
        (V',) target ids, only those words' logits (B·K, V')."""
        raise NotImplementedError
