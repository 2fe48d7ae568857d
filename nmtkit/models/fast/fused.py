"""Recurrences with hand-written backward passes, for training speed.

The readable implementations are the reference's GRU step (``reference.gru_step``, run over a sequence) and its
step-by-step decoder (``reference.py``, Appendix A as it reads); autograd differentiates those op by op.
The functions here compute the same values (tests compare them, and check the gradients with gradcheck), but record
no autograd graph inside the time loop, and rearrange the work so that the loop does as little as possible:

- the recurrent weights' gradients (U_zr, U, W_a, v_a) are ONE matmul over all time steps after the loop, instead
  of one small matmul and one accumulation per step;
- the two matmuls that read s_{i-1} in the decoder, W_a s_{i-1} (attention) and [U_z; U_r] s_{i-1} (gates), are
  one matmul with the stacked matrix [2 W_a; U_z; U_r] (n' + 2n, n), forwards and backwards;
- the context term of the decoder's gates, C_stack c_i = C_stack Σ_j α_ij h_j = Σ_j α_ij (C_stack h_j), is computed
  from ``CH`` = C_stack h_j for every source position -- one big matmul per sentence before the loop -- so the loop
  does a (1 × Tx)·(Tx × 3n) weighted sum instead of a (2n × 3n) matmul per step; backwards, ∂L/∂α_i reads
  C_stack h_j, and ∂L/∂h, ∂L/∂C_stack come from ∂L/∂(C_stack h_j) = Σ_i α_ijᵀ ∂L/∂g_i once;
- the context c_i = Σ_j α_ij h_j itself is not needed inside the loop (only C_stack c_i is): it is computed for all
  steps after the loop, one (Ty × Tx)·(Tx × 2n) product per sentence, and so are its gradients, the annotations'
  dH = Σ_i α_iᵀ ∂L/∂c_i and the attention weights' ∂L/∂α_ij = ∂L/∂c_i · h_j (before the loop), instead of
  reading every h_j at every step, forwards and backwards;
- on CPU (float32 tensors, the kernels of nmtkit/kernels built), each step's attention -- scores, softmax,
  C_stack c_i, and backwards everything but the weight gradients -- is one call of a C kernel
  (kernels/attention.c) that visits each sentence's real source positions once per direction, σ(…) computed in
  registers and recomputed in the backward from the stored 2 W_a s_{i-1} (faster than the torch ops:
  tests/bench/results/bench_kernels.txt, rows "attentive decoder fwd+bwd"; bench_ab_train-attention.txt).
  Where a row has no real source position, its α is 0 (the torch ops give NaN).  The torch ops below remain the
  path elsewhere (CUDA, float64, no compiler, a source mask that is not right padding; the policy's
  ``attention_kernel`` off);
- torch ops, on CPU and at the paper's sizes: a batch sorted by source length (``nll`` sorts it) attends in
  the policy's ``attention_groups`` row groups, each over its own longest source only, so that the attention's
  elementwise work covers fewer padded source positions than over the batch's longest (``_row_groups``);
- backwards, the attention's v_a is applied after the sums over positions and steps (one pass less per step);
- torch ops, at paper size: the attention's σ(2 (W_a s_{i-1} + U_a h_j)) over (b, T, n') is recomputed in the
  backward from the stored 2 W_a s_{i-1} (B, n' per step) instead of being stored for every step (the kernel
  recomputes it at every size; the policy's ``recompute_min_elements``): stored, it is the pass's largest tensor,
  hundreds of MB at paper size, for no measured gain in speed (tests/bench/results/bench_kernels.txt, part 10,
  rows "σ kept"/"σ recomputed", which give its size; below the threshold, at the small preset's size, it is kept);
- the per-step products go through ``matmul.Multiplier`` (oneDNN on CPU, the weight reordered once per pass).

Low precision (bf16 autocast, ``lowp``): the per-step matmuls run in bfloat16 with the weights cast once per pass;
the states, gates, attention scores and every accumulation stay float32 (as autocast would do for these ops).

Notation as in gru.py: gx = W_stack x + b_stack (rows [z; r; candidate]); s̃ is called h here.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from nmtkit import kernels
from nmtkit.models.fast.activations import tanh_
from nmtkit.models.fast.matmul import Multiplier, autocast_dtype, mm
from nmtkit.models.fast.policy import policy


def _gru_forward_step(gx_t, s, by_U_zr, by_U, zr_out, h_out, rs_out, s_out, pre_zr=None) -> None:
    """The paper's unit, writing z, r (zr_out), s̃ (h_out), r ∘ s (rs_out) and s' (s_out) into given slices.

    by_U_zr and by_U are ``Multiplier``s of the recurrent matrices U_zr (2n, n) and U (n, n); ``pre_zr`` (B, 2n),
    when given, is [U_z; U_r] s already computed (then by_U_zr is not used)."""
    n = s.shape[-1]
    if pre_zr is None:
        by_U_zr.add_product(gx_t[:, : 2 * n], s, out=zr_out).sigmoid_()  # (B, 2n)   [z; r]
    else:
        torch.add(gx_t[:, : 2 * n], pre_zr, out=zr_out).sigmoid_()
    torch.mul(zr_out[:, n:], s, out=rs_out)  # (B, n)   r ∘ s
    tanh_(by_U.add_product(gx_t[:, 2 * n :], rs_out, out=h_out))  # (B, n)   s̃ (activations.py)
    torch.lerp(s, h_out, zr_out[:, :n], out=s_out)  # (B, n)   (1 − z) ∘ s + z ∘ s̃


def gru_backward_step(ds, s, zr, h, by_UT, dg_out) -> Tensor | None:
    """The paper's unit backwards, written once for every fast recurrence (this module's, and packed.py's over both
    encoder directions at once: then every tensor has a leading direction axis, (D, B, ·)).

    Given ds = ∂L/∂s', write ∂L/∂gx (…, 3n) into dg_out; return the part of ∂L/∂s that does NOT go through
    [U_z; U_r] (the caller adds [U_z; U_r]ᵀ ∂L/∂(gates), batched with other products of the same step).
    by_UT: x ↦ x U, the candidate's gradient back through U (a ``Multiplier`` of Uᵀ's ``product``, or one per
    direction).  ``s is None`` is a sequence's first step from the zero state: ∂L/∂r = 0 and nothing flows further
    back (None is returned)."""
    n = h.shape[-1]
    z, r = zr[..., :n], zr[..., n:]
    dh = ds * z  # (…, n)   ∂L/∂s̃
    torch.ops.aten.tanh_backward.grad_input(dh, h, grad_input=dg_out[..., 2 * n :])  # ∂L/∂(cand. pre-activation)
    dzr = dg_out[..., : 2 * n]  # (…, 2n)   ∂L/∂z, ∂L/∂r, then in place ∂L/∂(gate pre-activations)
    if s is None:  # s' = z ∘ s̃
        torch.mul(ds, h, out=dzr[..., :n])
        dzr[..., n:].zero_()
        torch.ops.aten.sigmoid_backward.grad_input(dzr, zr, grad_input=dzr)
        return None
    drs = by_UT(dg_out[..., 2 * n :])  # (…, n)   ∂L/∂(r ∘ s)
    torch.mul(ds, h - s, out=dzr[..., :n])
    torch.mul(drs, s, out=dzr[..., n:])
    torch.ops.aten.sigmoid_backward.grad_input(dzr, zr, grad_input=dzr)
    return torch.addcmul(ds - dh, drs, r)  # (…, n)   (1 − z) ∘ ds + r ∘ drs


class _GRUSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lowp, gx: Tensor, U_zr: Tensor, U: Tensor, s0: Tensor) -> Tensor:
        T, B, _ = gx.shape
        n = U.shape[0]
        by_U_zr, by_U = Multiplier(U_zr, lowp), Multiplier(U, lowp)
        S = gx.new_empty(T + 1, B, n)  # (T+1, B, n)   s_0 … s_T
        S[0] = s0
        ZR = gx.new_empty(T, B, 2 * n)  # (T, B, 2n)
        Hc = gx.new_empty(T, B, n)  # (T, B, n)   s̃_t
        RS = gx.new_empty(T, B, n)  # (T, B, n)   r_t ∘ s_{t-1}
        for t in range(T):
            _gru_forward_step(gx[t], S[t], by_U_zr, by_U, ZR[t], Hc[t], RS[t], S[t + 1])
        ctx.lowp = lowp
        ctx.save_for_backward(U_zr, U, S, ZR, Hc, RS)
        return S[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, dS: Tensor):
        U_zr, U, S, ZR, Hc, RS = ctx.saved_tensors
        lowp = ctx.lowp
        by_U_zrT, by_UT = Multiplier(U_zr.t(), lowp), Multiplier(U.t(), lowp)
        T, B, n = dS.shape
        dgx = dS.new_empty(T, B, 3 * n)  # (T, B, 3n)
        ds = dS.new_zeros(B, n)  # (B, n)
        for t in reversed(range(T)):
            part = gru_backward_step(ds + dS[t], S[t], ZR[t], Hc[t], by_UT.product, dgx[t])
            ds = by_U_zrT.add_product(part, dgx[t, :, : 2 * n], out=part)  # (B, n)   + [U_z; U_r]ᵀ ∂L/∂(gates)
        flat = dgx.view(T * B, 3 * n)
        dU_zr = mm(flat[:, : 2 * n].t(), S[:-1].reshape(T * B, n), lowp)  # (2n, n)
        dU = mm(flat[:, 2 * n :].t(), RS.view(T * B, n), lowp)  # (n, n)   Σ_t ∂cand_tᵀ (r_t ∘ s_{t-1})
        return None, dgx, dU_zr, dU, ds


def gru_sequence(gx: Tensor, U_zr: Tensor, U: Tensor, s0: Tensor | None = None) -> Tensor:
    """The states of ``reference.gru_step`` run over gx (T, B, 3n), the input side precomputed -> (T, B, n).

    Under autocast the recurrent matmuls run in the autocast dtype, everything else in float32."""
    if s0 is None:
        s0 = gx.new_zeros(gx.shape[1], U.shape[0])
    lowp = autocast_dtype(gx)
    if lowp is None:
        return _GRUSequence.apply(None, gx, U_zr, U, s0)
    with torch.autocast(gx.device.type, enabled=False):  # float32 buffers, lowp products
        return _GRUSequence.apply(lowp, gx.float(), U_zr.float(), U.float(), s0.float())


# (the C kernel for the attention's step, the row groups and the recomputed σ start where the speed policy says:
# nmtkit/models/fast/policy.py)


def _row_groups(src_mask: Tensor, n_a: int) -> list[tuple[int, int, int]]:
    """Contiguous row groups (r0, r1, T) whose attention runs over the first T source positions only, T the
    group's longest source: the policy's ``attention_groups`` groups of equal size when the source lengths do not
    increase down the rows (``nll`` sorts its batch so), on CPU, where the attention's elementwise work is proportional to
    the positions it covers (padded to a group's longest source, not to the batch's) and large enough (the policy's
    ``group_min_elements``, n' the attention's size); else one group, (0, B, Tx)."""
    B, Tx = src_mask.shape
    sizes = policy()
    G = sizes.attention_groups
    if src_mask.device.type != "cpu" or B < 2 * G or B * Tx * n_a < sizes.group_min_elements:
        return [(0, B, Tx)]
    lens = src_mask.sum(1).tolist()
    if any(a < b for a, b in zip(lens, lens[1:])):
        return [(0, B, Tx)]
    edges = [round(k * B / G) for k in range(G + 1)]
    groups: list[tuple[int, int, int]] = []
    for r0, r1 in zip(edges, edges[1:]):
        T = max(int(lens[r0]), 1)
        if groups and groups[-1][2] == T:
            groups[-1] = (groups[-1][0], r1, T)
        else:
            groups.append((r0, r1, T))
    return groups


def by_source_length(src: Tensor, src_lens: Tensor, *others: Tensor) -> tuple[Tensor, ...]:
    """The batch (src (B, Tx), src_lens (B,) and others (B, ...)) with its rows in order of non-increasing source
    length (a stable sort: ties keep their order), as ``_row_groups`` wants them; as given when already so."""
    order = torch.argsort(src_lens.cpu(), descending=True, stable=True)
    if torch.equal(order, torch.arange(len(order))):
        return (src, src_lens, *others)
    return tuple(t.index_select(0, order.to(t.device)) for t in (src, src_lens, *others))


def _group_views(groups, flat: Tensor):
    """Per group, (r0, r1, T, view): ``flat`` (Σ_g b_g·T_g, ...) cut into the groups' (b_g, T_g, ...) blocks."""
    out, o = [], 0
    for r0, r1, T in groups:
        out.append((r0, r1, T, flat[o: o + (r1 - r0) * T].view(r1 - r0, T, *flat.shape[1:])))
        o += (r1 - r0) * T
    return out


def _kernel_usable(*tensors: Tensor) -> bool:
    """Whether the attention runs through the C kernel (nmtkit/kernels/attention.c): float32 CPU tensors, the
    kernels built, and the policy's ``attention_kernel`` on."""
    return policy().attention_kernel and kernels.usable(*tensors)


def _scores_sigmoid(keys2: Tensor, q: Tensor, r0: int, r1: int, T: int, out: Tensor) -> Tensor:
    """σ(2 U_a h_j + 2 W_a s_{i-1}) for rows r0:r1 and the first T positions: keys2 (B, Tx, n') = 2 U_a h,
    q (B, n') = 2 W_a s_{i-1} (float32 or lowp) -> out (r1 − r0, T, n').  The same call in forward and backward
    (bit-identical values)."""
    return torch.add(keys2[r0:r1, :T], q[r0:r1].unsqueeze(1), out=out).sigmoid_()


class _AttentiveDecoder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keep, lowp, real, gx, s0, H, keys, src_mask, W_a, v_a, U_zr, U, C_stack):
        Ty, B, _ = gx.shape
        n, Tx, ctx_dim, n_a = U.shape[0], H.shape[1], H.shape[2], keys.shape[2]
        keys2, v_a2 = 2.0 * keys, 2.0 * v_a  # tanh(x) = 2σ(2x) − 1; see attention.attend
        Wcat = torch.cat([2.0 * W_a, U_zr])  # (n' + 2n, n)   [2 W_a; U_z; U_r]: both read s_{i-1}
        by_Wcat, by_U = Multiplier(Wcat, lowp), Multiplier(U, lowp)
        # C_stack h_j for every source position: (B, Tx, 3n); one matmul per call, over the real positions
        # ``real`` (flat indices into B·Tx) when given (C_stack h_j = 0 at padding, where h_j = 0)
        pad = ~src_mask  # (B, Tx)
        kernel, lens = _kernel_usable(gx, keys2, H), src_mask.sum(1)  # lens (B,) int64
        if kernel and not torch.equal(src_mask, torch.arange(Tx, device=lens.device) < lens.unsqueeze(1)):
            kernel = False  # the kernel takes each row's first lens[b] positions: right padding only
        # the kernel reads a bf16 product's result as it is: half the bytes of its float32 copy, the same values
        f32 = not (kernel and lowp is torch.bfloat16)
        if real is None:
            CH = mm(H.view(B * Tx, ctx_dim), C_stack.t(), lowp, f32).view(B, Tx, 3 * n)
        else:
            CH_real = mm(H.view(B * Tx, ctx_dim).index_select(0, real), C_stack.t(), lowp, f32)  # (N, 3n)
            CH = CH_real.new_empty(B, Tx, 3 * n)
            CH.view(B * Tx, 3 * n).index_fill_(0, pad.flatten().nonzero().squeeze(1), 0.0).index_copy_(0, real, CH_real)
        if kernel:  # the C kernel: each sentence's real positions, σ(…) recomputed in the backward from Q
            groups, covered = None, 0
            gx, keys2 = gx.contiguous(), keys2.contiguous()  # (no copies: the model's are)
            recompute = keep
        else:
            groups = _row_groups(src_mask, n_a)
            covered = sum((r1 - r0) * T for r0, r1, T in groups)  # source positions the attention runs over
            recompute = keep and covered * n_a >= policy().recompute_min_elements
        S = gx.new_empty(Ty, B, n)  # (Ty, B, n)    s_{i-1}
        # torch ops: σ(2 (W_a s_{i-1} + U_a h_j)) at each step's covered positions, group by group:
        # (Ty, Σ_g b_g·T_g, n'), kept for the backward -- unless a step's is large (paper size): then only one
        # step's, which stays in the cache, and the backward recomputes it from 2 W_a s_{i-1}, kept in Q (Ty, B, n')
        kept = keep and not recompute
        SIG = gx.new_empty(Ty if kept else (0 if kernel else 1), covered, n_a)
        Q = gx.new_empty(Ty if recompute else 0, B, n_a, dtype=lowp or gx.dtype)  # as P
        A = gx.new_zeros(Ty, B, Tx)  # (Ty, B, Tx)   α_i (0 where no group covers; the kernel writes every α_ij)
        m = max(Ty - 1, 0)
        ZR, Hc, RS = gx.new_empty(m, B, 2 * n), gx.new_empty(m, B, n), gx.new_empty(m, B, n)
        g = gx.new_empty(B, 3 * n)
        S[0] = s0
        for i in range(Ty):
            P = by_Wcat.product(S[i], float32=False)  # (B, n' + 2n)   [2 W_a s_{i-1}; U_z s_{i-1}; U_r s_{i-1}]
            if recompute:
                Q[i] = P[:, :n_a]
            if kernel:  # α_i into A[i]; g = W_stack E y + b_stack + C_stack c_i (all but the last step)
                last = i + 1 == Ty
                kernels.attend_forward(keys2, P[:, :n_a].float(), v_a2, lens, A[i], None if last else CH,
                                       None if last else gx[i], None if last else g)
            for r0, r1, T, sig in [] if kernel else _group_views(groups, SIG[i if kept else 0]):  # sig (b, T, n')
                _scores_sigmoid(keys2, P[:, :n_a], r0, r1, T, sig)
                e = (sig @ v_a2).masked_fill_(pad[r0:r1, :T], float("-inf"))  # (b, T)
                alpha = torch.softmax(e, dim=-1).unsqueeze(1)  # (b, 1, T)
                A[i, r0:r1, :T] = alpha.squeeze(1)
                if i + 1 < Ty:  # (b, 3n)   W_stack E y + b_stack + C_stack c_i
                    torch.baddbmm(gx[i, r0:r1].unsqueeze(1), alpha, CH[r0:r1, :T], out=g[r0:r1].unsqueeze(1))
            if i + 1 < Ty:
                _gru_forward_step(g, S[i], None, by_U, ZR[i], Hc[i], RS[i], S[i + 1], pre_zr=P[:, n_a:])
        # c_i = Σ_j α_ij h_j for all steps at once (the loop needs only C_stack c_i): one product per sentence,
        # (Ty × Tx)·(Tx × 2n), instead of a read of every h_j at every step
        CTX = torch.bmm(A.transpose(0, 1), H).transpose(0, 1)  # (Ty, B, 2n)   (batch-major underneath)
        ctx.lowp, ctx.real, ctx.groups, ctx.recompute = lowp, real, groups, recompute
        ctx.lens = lens if kernel else None
        ctx.save_for_backward(H, CH, Wcat, v_a2, U, C_stack, S, keys2, SIG, Q, A, ZR, Hc, RS)
        return S, CTX, A

    @staticmethod
    @once_differentiable
    def backward(ctx, dS, dCTX, dA):
        H, CH, Wcat, v_a2, U, C_stack, S, keys2, SIG, Q, A, ZR, Hc, RS = ctx.saved_tensors
        lowp, recompute = ctx.lowp, ctx.recompute
        by_WcatT, by_UT = Multiplier(Wcat.t(), lowp), Multiplier(U.t(), lowp)
        Ty, B, n = S.shape
        Tx, ctx_dim, n_a = H.shape[1], H.shape[2], keys2.shape[2]
        lens = ctx.lens  # (B,): the C kernel's path (else None: torch ops in row groups)
        if lens is None and recompute:  # one step's σ(…), recomputed (see forward), then ∂L/∂e_ij σ'(…) in place
            SIG = S.new_empty(1, sum((r1 - r0) * T for r0, r1, T in ctx.groups), n_a)
        # D holds, per step, [∂L/∂(2 W_a s_{i-1}) (n') | ∂L/∂g_i: gates (2n), candidate (n)], so that one product
        # with Wcat^T serves each step
        D = S.new_empty(Ty, B, n_a + 3 * n)  # every step writes its parts but the last step's ∂L/∂g (zero)
        D[Ty - 1, :, n_a:] = 0.0
        # ∂L/∂α_i through c_i = Σ_j α_ij h_j, for all steps at once (as c_i in the forward): (Ty, B, Tx)
        dCTX_b = None if dCTX is None else dCTX.transpose(0, 1)  # (B, Ty, 2n)
        dA_c = None if dCTX is None else torch.bmm(dCTX_b, H.transpose(1, 2)).transpose(0, 1)
        if dA is not None:
            dA_c = dA if dA_c is None else dA_c + dA
        dS = torch.zeros_like(S) if dS is None else dS
        DE = S.new_empty(SIG.shape[1])  # (Σ_g b_g·T_g)   ∂L/∂e_i at the covered positions, as SIG
        dkeys2 = H.new_zeros(B, Tx, n_a)  # (B, Tx, n')   Σ_i ∂L/∂e_ij σ'(…), later times 2 v_a2
        # Σ_i Σ_j ∂L/∂e_ij σ(…), later times 2; the kernel sums it in one row per thread
        dv_a = H.new_zeros(n_a) if lens is None else H.new_zeros(torch.get_num_threads(), n_a)
        if lens is not None and dA_c is not None and dA_c.stride(-1) != 1:
            dA_c = dA_c.contiguous()
        ds = torch.zeros_like(S[0])  # ∂L/∂s_i from the steps after i
        CHt = CH.transpose(1, 2)  # (B, 3n, Tx)
        for i in reversed(range(Ty)):
            Di = D[i]
            if i + 1 < Ty:
                ds = gru_backward_step(ds, S[i], ZR[i], Hc[i], by_UT.product, Di[:, n_a : n_a + 3 * n])
            else:
                ds = torch.zeros_like(ds)  # s_Ty is not computed
            ds += dS[i]
            if lens is not None:  # (B, n')   Di[:, :n'] = ∂L/∂(2 W_a s_{i-1}), and the sums into dkeys2, dv_a
                last = i + 1 == Ty  # (∂L/∂g = 0: C_stack h_j is not read)
                kernels.attend_backward(keys2, Q[i].float(), v_a2, lens, A[i], None if dA_c is None else dA_c[i],
                                        None if last else CH, None if last else Di[:, n_a:], dkeys2, dv_a,
                                        Di[:, :n_a])
            for (r0, r1, T, sig), (_, _, _, de) in [] if lens is not None else zip(
                    _group_views(ctx.groups, SIG[0 if recompute else i]), _group_views(ctx.groups, DE)):
                # (b, T)   ∂L/∂α_i via C_stack c_i (the gates) and c_i (the caller's: dA_c)
                dalpha = torch.bmm(Di[r0:r1, n_a:].unsqueeze(1), CHt[r0:r1, :, :T]).squeeze(1)
                if dA_c is not None:
                    dalpha += dA_c[i, r0:r1, :T]
                alpha = A[i, r0:r1, :T]
                torch.mul(alpha, dalpha - (alpha * dalpha).sum(-1, keepdim=True), out=de)  # softmax backward
                if recompute:
                    _scores_sigmoid(keys2, Q[i], r0, r1, T, sig)  # (b, T, n')   σ(2 (W_a s_{i-1} + U_a h_j)) again
                dv_a.addmv_(sig.view(-1, n_a).t(), de.view(-1))  # ∂L/∂v_a2 = Σ_j ∂L/∂e_ij σ(…)
                # ∂L/∂(2 U_a h_j + 2 W_a s) = ∂L/∂e_ij v_a2 ∘ σ'; the factor v_a2 is applied after the sums over j
                # (here) and over i (after the loop), which saves a pass over (b, T, n') per step
                # (b, T, n')   ∂L/∂e_ij σ'(…): in place of a recomputed σ; a kept one stays (a second backward)
                dx = torch.ops.aten.sigmoid_backward.grad_input(de.unsqueeze(-1), sig,
                                                                grad_input=sig if recompute else torch.empty_like(sig))
                dkeys2[r0:r1, :T] += dx
                torch.mul(dx.sum(1), v_a2, out=Di[r0:r1, :n_a])  # (b, n')
            ds = by_WcatT.add_product(ds, Di[:, : n_a + 2 * n], out=ds)  # (B, n)   + [2 W_a; U_z; U_r]ᵀ (…)
        # weight gradients, once over all steps
        flat = D.view(Ty * B, -1)
        # (n' + 2n, n)   the last step's gate rows are zero
        dWcat = mm(flat[:, : n_a + 2 * n].t(), S.view(Ty * B, n), lowp)
        dW_a, dU_zr = 2.0 * dWcat[:n_a], dWcat[n_a:]
        dv_a = (dv_a if lens is None else dv_a.sum(0)).mul_(2.0)  # (n',)
        dkeys = dkeys2.mul_(2.0 * v_a2)  # (B, Tx, n')   (v_a2 from the per-step sums; see above)
        At = A.permute(1, 2, 0)  # (B, Tx, Ty)
        DG = D[:, :, n_a : n_a + 3 * n].transpose(0, 1)  # (B, Ty, 3n)   ∂L/∂g_i (0 at the last step)
        dCH = torch.bmm(At, DG)  # (B, Tx, 3n)   Σ_i α_ijᵀ ∂L/∂g_i = ∂L/∂(C_stack h_j)
        # (B, Tx, 2n)   Σ_i α_iᵀ ∂L/∂c_i
        dH = H.new_zeros(B, Tx, ctx_dim) if dCTX_b is None else torch.bmm(At, dCTX_b)
        dCH_flat, H_flat = dCH.view(B * Tx, 3 * n), H.reshape(B * Tx, ctx_dim)
        real = ctx.real
        if real is not None:  # only the real positions' rows: the padding's are 0 (h_j = 0, α_ij = 0) or unused
            dCH_flat, H_flat = dCH_flat.index_select(0, real), H_flat.index_select(0, real)  # (N, 3n), (N, 2n)
        dH_C = mm(dCH_flat, C_stack, lowp)  # C_stackᵀ ∂L/∂(C_stack h_j)
        if real is None:
            dH += dH_C.view(B, Tx, ctx_dim)
        else:
            dH.view(B * Tx, ctx_dim).index_add_(0, real, dH_C)
        dC = mm(dCH_flat.t(), H_flat, lowp)  # (3n, 2n)
        m = (Ty - 1) * B
        dU = mm(flat[:m, n_a + 2 * n : n_a + 3 * n].t(), RS.reshape(m, n), lowp)  # (n, n)
        return None, None, None, flat[:, n_a : n_a + 3 * n].view(Ty, B, 3 * n), ds, dH, dkeys, None, dW_a, dv_a, \
            dU_zr, dU, dC


def attentive_decoder(gx, s0, annotations, keys, src_mask, W_a, v_a, U_zr, U, C_stack, real=None):
    """The RNNsearch decoder loop for teacher forcing.

    gx (Ty, B, 3n) = W_stack E y_{i-1} + b_stack; s0 (B, n); annotations (B, Tx, 2n), zero at padding; keys U_a h
    (B, Tx, n'); src_mask (B, Tx); real (N,), optional: the flat indices (b·Tx + j) of the real source positions,
    to compute C_stack h_j there only.  Returns time-major s_{i-1} (Ty, B, n), c_i (Ty, B, 2n), α_i (Ty, B, Tx).
    Under autocast the per-step matmuls run in the autocast dtype, everything else in float32.
    """
    args = (gx, s0, annotations, keys, src_mask, W_a, v_a, U_zr, U, C_stack)
    keep = torch.is_grad_enabled() and any(a.requires_grad for a in args)  # else keep no per-step attention state
    lowp = autocast_dtype(gx)
    if lowp is None:
        return _AttentiveDecoder.apply(keep, None, real, *args)
    with torch.autocast(gx.device.type, enabled=False):  # one dtype for the loop's buffers: float32
        return _AttentiveDecoder.apply(keep, lowp, real, *(a if a.dtype == torch.bool else a.float() for a in args))
