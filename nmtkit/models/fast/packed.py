"""The encoder's recurrences over packed sentences: no work at padding.

A batch of source sentences is right-padded to its longest, and in a length-sorted minibatch of the paper's recipe
about a third of the source positions are still padding on the Hansards, since the pools are sorted by target
length (tests/bench/results/bench_kernels.txt, with the encoder's time padded against packed).  Padding positions
are never read (annotations there are zero and get zero attention), so computing them only costs time: here the
two directions of the encoder run over *packed* sentences, as ``torch.nn.utils.rnn.PackedSequence`` lays them out:

    sentences sorted by decreasing length (stable); at reading step t the b_t sentences still reading
    (b_0 ≥ b_1 ≥ …) are the first b_t of that order, so step t is the contiguous row block
    [o_t, o_t + b_t) of a (N, ·) array, N = Σ lengths, o_t = b_0 + … + b_{t-1}.

The forward direction reads sentence b's position t at step t; the backward direction reads position L_b − 1 − t
(each sentence backwards from its own last token, as in encoder.py).  Both have the same b_t, so one loop steps
both, and a sentence's previous state is the row of the same rank in the previous block (o_{t-1} + b).  The input
projections, U_a h_j and C_stack h_j are then computed only at the N real positions.

``gru_packed`` has a hand-written backward like fused.py's recurrences (fused.gru_backward_step, batched over the
directions): the recurrent weights' gradients are one matmul per direction over all N rows after the loop.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from nmtkit.models.fast.activations import tanh_
from nmtkit.models.fast.fused import gru_backward_step
from nmtkit.models.fast.matmul import Multiplier, autocast_dtype, mm


class Packing(NamedTuple):
    """Where the N real positions of a (B, Tx) batch go in the packed layout (all index tensors on its device)."""

    batch_sizes: list[int]  # b_t: sentences still reading at step t (Tx_max entries)
    offsets: list[int]  # o_t: first packed row of step t
    fwd_index: Tensor  # (N,) flat position b·Tx + j of each packed row in forward reading order (j = t)
    bwd_of_fwd: Tensor  # (N,) for each forward-packed row, the backward-packed row that reads the same position
    fwd_of_bwd: Tensor  # (N,) the inverse: for each backward-packed row, the forward-packed row of its position
    prev_rows: Tensor  # (N − b_0,) for the rows of steps t ≥ 1, the row of the same sentence at step t − 1
    last_rows: Tensor  # (B,) per sentence (batch order), the packed row of its last reading step
    shape: tuple[int, int]  # (B, Tx) of the padded batch


def packing(src_lens: Tensor, Tx: int) -> Packing:
    """The packed layout of a right-padded batch with lengths src_lens (B,) (all ≥ 1) and width Tx."""
    dev = src_lens.device
    lens = src_lens.long()
    order = torch.sort(lens, descending=True, stable=True).indices  # (B,)   rank -> sentence
    L = lens[order]  # (B,)   lengths by rank, decreasing
    steps = torch.arange(int(L[0]), device=dev)  # (T,)
    reading = steps.unsqueeze(1) < L.unsqueeze(0)  # (T, B)   rank b still reading at step t
    sizes = reading.sum(1)  # (T,)   b_t
    offsets = torch.cumsum(sizes, 0) - sizes  # (T,)   o_t
    t, b = reading.nonzero(as_tuple=True)  # (N,) each, row-major: exactly the packed order
    sent = order[b]  # (N,)   the sentence of each packed row
    fwd_index = sent * Tx + t  # (N,)
    bwd_of_fwd = offsets[L[b] - 1 - t] + b  # (N,)   position t is read backwards at step L_b − 1 − t
    fwd_of_bwd = torch.empty_like(bwd_of_fwd)
    fwd_of_bwd[bwd_of_fwd] = torch.arange(len(t), device=dev)
    b0 = int(sizes[0])
    prev_rows = offsets[t[b0:] - 1] + b[b0:]  # (N − b_0,)
    last_by_rank = offsets[L - 1] + torch.arange(len(L), device=dev)  # (B,)
    last_rows = torch.empty_like(last_by_rank)
    last_rows[order] = last_by_rank
    return Packing(sizes.tolist(), offsets.tolist(), fwd_index, bwd_of_fwd, fwd_of_bwd, prev_rows, last_rows,
                   (len(L), Tx))


def _steps(pack: Packing):
    """(t, rows of step t, rows of the same sentences at step t − 1 or None) for every step."""
    prev = None
    for t, (o, b) in enumerate(zip(pack.offsets, pack.batch_sizes)):
        yield t, slice(o, o + b), None if prev is None else slice(prev, prev + b)
        prev = o


class _PackedGRUs(torch.autograd.Function):
    """D independent recurrences of the paper's unit (D = 2: both encoder directions) over one packing."""

    @staticmethod
    def forward(ctx, lowp, pack: Packing, gx: Tensor, U_zr: Tensor, U: Tensor) -> Tensor:
        D, N, _ = gx.shape  # gx (D, N, 3n): W_stack x + b_stack at each direction's packed rows
        n = U.shape[-1]
        by_U_zr = [Multiplier(U_zr[d], lowp) for d in range(D)]  # x ↦ x U_zrᵀ = [U_z; U_r] s
        by_U = [Multiplier(U[d], lowp) for d in range(D)]
        H = gx.new_empty(D, N, n)  # (D, N, n)   the states
        ZR = gx.new_empty(D, N, 2 * n)  # (D, N, 2n)   [z; r]
        Hc = gx.new_empty(D, N, n)  # (D, N, n)   s̃
        RS = gx.new_empty(D, N, n)  # (D, N, n)   r ∘ s_prev
        for t, rows, prev in _steps(pack):
            zr, h, rs = ZR[:, rows], Hc[:, rows], RS[:, rows]  # (D, b, ·) views
            if prev is None:  # s_prev = 0: [U_z; U_r] s and U [r ∘ s] vanish
                zr.copy_(gx[:, rows, : 2 * n]).sigmoid_()
                rs.zero_()
                tanh_(h.copy_(gx[:, rows, 2 * n:]))
                torch.mul(h, zr[..., :n], out=H[:, rows])  # (1 − z) ∘ 0 + z ∘ s̃
                continue
            s = H[:, prev]  # (D, b, n)   s_prev of the same sentences
            for d in range(D):
                by_U_zr[d].add_product(gx[d, rows, : 2 * n], s[d], out=zr[d])
            zr.sigmoid_()
            torch.mul(zr[..., n:], s, out=rs)  # r ∘ s
            for d in range(D):
                by_U[d].add_product(gx[d, rows, 2 * n:], rs[d], out=h[d])
            tanh_(h)  # s̃ = tanh(W x + U [r ∘ s] + b)   (activations.py)
            torch.lerp(s, h, zr[..., :n], out=H[:, rows])  # (1 − z) ∘ s + z ∘ s̃
        ctx.lowp, ctx.pack = lowp, pack
        ctx.save_for_backward(U_zr, U, H, ZR, Hc, RS)
        return H

    @staticmethod
    @once_differentiable
    def backward(ctx, dH: Tensor):
        U_zr, U, H, ZR, Hc, RS = ctx.saved_tensors
        lowp, pack = ctx.lowp, ctx.pack
        D, N, n = H.shape
        by_U_zrT = [Multiplier(U_zr[d].t(), lowp) for d in range(D)]  # x ↦ x [U_z; U_r]
        by_UT = [Multiplier(U[d].t(), lowp) for d in range(D)]

        def drs_of(dc: Tensor) -> Tensor:  # (D, b, n) ∂L/∂(candidate pre-activations) -> ∂L/∂(r ∘ s), x ↦ x U
            return torch.stack([by_UT[d].product(dc[d]) for d in range(D)])

        dgx = H.new_empty(D, N, 3 * n)  # (D, N, 3n)   ∂L/∂(pre-activations) = ∂L/∂gx
        ds = H.new_zeros(D, pack.batch_sizes[0], n)  # ∂L/∂s from later steps; rows never reached stay 0
        for t, rows, prev in reversed(list(_steps(pack))):
            b = rows.stop - rows.start
            g = ds[:, :b] + dH[:, rows]  # (D, b, n)   ∂L/∂s_t
            s = None if prev is None else H[:, prev]  # s_prev of the same sentences (step 0: the zero state)
            part = gru_backward_step(g, s, ZR[:, rows], Hc[:, rows], drs_of, dgx[:, rows])
            if part is None:  # nothing flows back from step 0
                continue
            for d in range(D):
                by_U_zrT[d].add_product(part[d], dgx[d, rows, : 2 * n], out=part[d])  # + [U_z; U_r]ᵀ ∂L/∂(gates)
            ds[:, :b] = part
        b0 = pack.batch_sizes[0]
        dU_zr, dU = torch.zeros_like(U_zr), torch.empty_like(U)
        for d in range(D):  # once over all rows; step 0 (s_prev = 0) adds nothing to ∂L/∂U_zr and ∂L/∂U
            S_prev = H[d].index_select(0, pack.prev_rows)  # (N − b_0, n)
            dU_zr[d] = mm(dgx[d, b0:, : 2 * n].t(), S_prev, lowp)  # (2n, n)
            dU[d] = mm(dgx[d, :, 2 * n:].t(), RS[d], lowp)  # (n, n)   Σ_t ∂cand_tᵀ (r_t ∘ s_{t-1})
        return None, None, dgx, dU_zr, dU


def gru_packed(gx: Tensor, U_zr: Tensor, U: Tensor, pack: Packing) -> Tensor:
    """D recurrences of the paper's unit from zero states over packed rows: gx (D, N, 3n), U_zr (D, 2n, n),
    U (D, n, n) -> states (D, N, n).  Under autocast the recurrent matmuls run in the autocast dtype, the rest in
    float32 (as fused.gru_sequence)."""
    lowp = autocast_dtype(gx)
    if lowp is None:
        return _PackedGRUs.apply(None, pack, gx, U_zr, U)
    with torch.autocast(gx.device.type, enabled=False):
        return _PackedGRUs.apply(lowp, pack, gx.float(), U_zr.float(), U.float())


def unpack(packed: Tensor, pack: Packing) -> Tensor:
    """Forward-packed rows (N, d) -> (B, Tx, d), zero at padding."""
    B, Tx = pack.shape
    return packed.new_zeros(B * Tx, packed.shape[1]).index_copy(0, pack.fwd_index, packed).view(B, Tx, -1)
