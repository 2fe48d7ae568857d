"""The source encoder: forward (and, for RNNsearch, backward) gated recurrent layers over a batch of sentences.

The paper's unit runs over *packed* sentences (``forward_packed``, packed.py): nothing is computed at padding, the
backward direction reads each sentence from its own last token, and both directions step in one loop; the
annotations come back right-padded, zero at padding.  ``torch.nn.GRU`` (``unit="torch"``, a different unit) runs
over the padded batch through torch's own packing (``forward``).  The literal reference of the equations, one
sentence position at a time, is ``reference.encode``; tests hold the packed encoder to it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmtkit.models.gru import PaperGRU
from nmtkit.models.init import normal_, orthogonal_blocks_, zeros_
from nmtkit.models.fast.matmul import aligned_linear
from nmtkit.models.fast.packed import Packing, gru_packed, unpack

GRU_UNITS = ("paper", "torch")


class EncoderStates(NamedTuple):
    annotations: Tensor  # (B, Tx, D·n): [→h_j; ←h_j] (D = 2) or →h_j (D = 1), zero at padding
    last_forward: Tensor  # (B, n): →h_{T_x}, the forward state at each sentence's own last token
    first_backward: Tensor | None  # (B, n): ←h_1, or None without a backward direction
    packed: Tensor | None = None  # (N, D·n): the annotations at the real positions, forward-packed (forward_packed)


class SourceEncoder(nn.Module):
    """Bidirectional (RNNsearch) or forward-only (RNNencdec) encoder over embedded source words.

    unit="paper" (default): the paper's GRU (reset gate before U), ``PaperGRU`` per direction, named ``fwd``/``bwd``.
    unit="torch": ``torch.nn.GRU`` over packed sequences, named ``rnn`` -- a different unit (see ``gru.py``).
    """

    def __init__(self, emb_dim: int, hidden_dim: int, bidirectional: bool, unit: str = "paper"):
        super().__init__()
        if unit not in GRU_UNITS:
            raise ValueError(f"unknown encoder_gru {unit!r}; valid: {', '.join(GRU_UNITS)}")
        self.emb_dim, self.hidden_dim, self.bidirectional, self.unit = emb_dim, hidden_dim, bidirectional, unit
        if unit == "paper":
            self.fwd = PaperGRU(emb_dim, hidden_dim)
            self.bwd = PaperGRU(emb_dim, hidden_dim) if bidirectional else None
        else:
            self.rnn = nn.GRU(emb_dim, hidden_dim, bidirectional=bidirectional)
        self.reset_parameters()

    @property
    def output_dim(self) -> int:
        return self.hidden_dim * (2 if self.bidirectional else 1)

    def reset_parameters(self) -> None:
        if self.unit == "paper":
            self.fwd.reset_parameters()
            if self.bwd is not None:
                self.bwd.reset_parameters()
            return
        for name, p in self.rnn.named_parameters():  # same scheme for torch's unit: W ~ N(0, 0.01²), U orthogonal
            if name.startswith("weight_ih"):
                normal_(p, 0.01)
            elif name.startswith("weight_hh"):
                orthogonal_blocks_(p, self.hidden_dim)
            else:
                zeros_(p)

    def forward(self, x: Tensor, src_lens: Tensor, src_mask: Tensor) -> EncoderStates:
        """``torch.nn.GRU``'s unit over the padded batch: x, the embedded source, time-major (Tx, B, m); src_lens (B,);
        src_mask (B, Tx) bool.  The paper's unit runs over packed sentences only (``forward_packed``)."""
        if self.unit != "torch":
            raise ValueError("the paper's unit runs over packed sentences: forward_packed")
        return self._forward_torch(x, src_lens, src_mask)

    def forward_packed(self, x: Tensor, pack: Packing) -> EncoderStates:
        """The paper's unit over packed sentences: x (N, m), the embedded source at its real positions in
        forward-packed order (``packed.packing``)."""
        if self.unit != "paper":
            raise ValueError("forward_packed runs the paper's unit only")
        grus = [self.fwd] if self.bwd is None else [self.fwd, self.bwd]
        D, n = len(grus), self.hidden_dim
        gx = aligned_linear(x, torch.cat([g.W_stack for g in grus]), torch.cat([g.b_stack for g in grus]))  # (N, D·3n)
        if D == 1:
            gx = gx.unsqueeze(0)  # (1, N, 3n)
        else:  # the backward direction's rows in its own reading order
            gx = torch.stack([gx[:, : 3 * n], gx[:, 3 * n:].index_select(0, pack.fwd_of_bwd)])  # (2, N, 3n)
        H = gru_packed(gx, torch.stack([g.U_zr for g in grus]), torch.stack([g.U for g in grus]), pack)  # (D, N, n)
        last_forward = H[0].index_select(0, pack.last_rows)  # (B, n)   →h_{T_x}
        if D == 1:
            packed, first_backward = H[0], None
        else:
            packed = torch.cat([H[0], H[1].index_select(0, pack.bwd_of_fwd)], dim=1)  # (N, 2n)   [→h_j; ←h_j]
            first_backward = H[1].index_select(0, pack.last_rows)  # (B, n)   ←h_1: after reading position 0
        return EncoderStates(unpack(packed, pack), last_forward, first_backward, packed)

    def _forward_torch(self, x: Tensor, src_lens: Tensor, src_mask: Tensor) -> EncoderStates:
        Tx = x.shape[0]
        packed = pack_padded_sequence(x, src_lens.cpu(), enforce_sorted=False)
        out, h_n = self.rnn(packed)  # h_n (D, B, n)
        out, _ = pad_packed_sequence(out, total_length=Tx)  # (Tx, B, D·n), zero at padding
        annotations = out.transpose(0, 1).contiguous()  # (B, Tx, D·n)
        return EncoderStates(annotations, h_n[0], h_n[1] if self.bidirectional else None)
