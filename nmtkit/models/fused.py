"""Recurrences with hand-written backward passes, for training speed.

The readable implementations are ``gru.gru_recurrence`` (the paper's GRU over a sequence) and the step-by-step
decoder loop in ``rnnsearch.RNNsearch`` (attention.py + gru.ConditionalGRU); autograd differentiates those op by op.
The functions here compute exactly the same values (tests compare them, and check the gradients with gradcheck),
but record no autograd graph inside the time loop and, in the backward pass,

- compute the gradients of the recurrent weights (U_zr, U, W_a, v_a, C_stack) with ONE matmul over all time steps
  after the loop, instead of one small matmul and one accumulation per step;
- compute the annotations' gradient from the attention weights once, dH = Σ_i α_iᵀ dc_i as one batched matmul,
  instead of an outer product and an accumulation of a (B, Tx, 2n) tensor per step.

Notation as in gru.py: gx = W_stack x + b_stack (rows [z; r; candidate]); s̃ is called h here.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def _gru_forward_step(gx_t, s, U_zr, U, zr_out, h_out, rs_out, s_out) -> None:
    """The paper's unit, writing z, r (zr_out), s̃ (h_out), r ∘ s (rs_out) and s' (s_out) into given slices."""
    n = s.shape[-1]
    torch.addmm(gx_t[:, : 2 * n], s, U_zr.t(), out=zr_out).sigmoid_()  # (B, 2n)   [z; r]
    torch.mul(zr_out[:, n:], s, out=rs_out)  # (B, n)   r ∘ s
    torch.addmm(gx_t[:, 2 * n :], rs_out, U.t(), out=h_out).tanh_()  # (B, n)   s̃
    torch.lerp(s, h_out, zr_out[:, :n], out=s_out)  # (B, n)   (1 − z) ∘ s + z ∘ s̃


def _gru_backward_step(ds, s, zr, h, U_zr, U, dg_out) -> Tensor:
    """Given ds = ∂L/∂s', write ∂L/∂gx (B, 3n) into dg_out; return the part of ∂L/∂s that goes through the unit."""
    n = s.shape[-1]
    z, r = zr[:, :n], zr[:, n:]
    dh = ds * z  # (B, n)   ∂L/∂s̃
    torch.ops.aten.tanh_backward.grad_input(dh, h, grad_input=dg_out[:, 2 * n :])  # (B, n)   ∂L/∂(cand. pre-act.)
    drs = dg_out[:, 2 * n :] @ U  # (B, n)   ∂L/∂(r ∘ s)
    dzr = torch.cat([ds * (h - s), drs * s], dim=1)  # (B, 2n)   ∂L/∂z, ∂L/∂r
    torch.ops.aten.sigmoid_backward.grad_input(dzr, zr, grad_input=dg_out[:, : 2 * n])  # (B, 2n)   ∂L/∂(gate pre-acts)
    ds_prev = torch.addcmul(ds - dh, drs, r)  # (B, n)   (1 − z) ∘ ds + r ∘ drs
    return torch.addmm(ds_prev, dg_out[:, : 2 * n], U_zr)  # (B, n)   + [U_z; U_r]ᵀ ∂L/∂(gates)


class _GRUSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gx: Tensor, U_zr: Tensor, U: Tensor, s0: Tensor) -> Tensor:
        T, B, _ = gx.shape
        n = U.shape[0]
        S = gx.new_empty(T + 1, B, n)  # (T+1, B, n)   s_0 … s_T
        S[0] = s0
        ZR = gx.new_empty(T, B, 2 * n)  # (T, B, 2n)
        Hc = gx.new_empty(T, B, n)  # (T, B, n)   s̃_t
        RS = gx.new_empty(T, B, n)  # (T, B, n)   r_t ∘ s_{t-1}
        for t in range(T):
            _gru_forward_step(gx[t], S[t], U_zr, U, ZR[t], Hc[t], RS[t], S[t + 1])
        ctx.save_for_backward(U_zr, U, S, ZR, Hc, RS)
        return S[1:]

    @staticmethod
    @once_differentiable
    def backward(ctx, dS: Tensor):
        U_zr, U, S, ZR, Hc, RS = ctx.saved_tensors
        T, B, n = dS.shape
        dgx = dS.new_empty(T, B, 3 * n)  # (T, B, 3n)
        ds = dS.new_zeros(B, n)  # (B, n)
        for t in reversed(range(T)):
            ds = _gru_backward_step(ds + dS[t], S[t], ZR[t], Hc[t], U_zr, U, dgx[t])
        flat = dgx.view(T * B, 3 * n)
        dU_zr = flat[:, : 2 * n].t() @ S[:-1].reshape(T * B, n)  # (2n, n)   Σ_t ∂gates_tᵀ s_{t-1}
        dU = flat[:, 2 * n :].t() @ RS.view(T * B, n)  # (n, n)   Σ_t ∂cand_tᵀ (r_t ∘ s_{t-1})
        return dgx, dU_zr, dU, ds


def _autocast_on(t: Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(t.device.type)  # torch >= 2.4
    except TypeError:
        return torch.is_autocast_cpu_enabled() if t.device.type == "cpu" else torch.is_autocast_enabled()


def gru_sequence(gx: Tensor, U_zr: Tensor, U: Tensor, s0: Tensor | None = None) -> Tensor:
    """Same values as ``gru.gru_recurrence``: gx (T, B, 3n) -> states (T, B, n).

    Under autocast the loop runs in float32 (its preallocated buffers need one dtype); the big matmuls around it
    still follow autocast.
    """
    if s0 is None:
        s0 = gx.new_zeros(gx.shape[1], U.shape[0])
    if _autocast_on(gx):
        with torch.autocast(gx.device.type, enabled=False):
            return _GRUSequence.apply(gx.float(), U_zr.float(), U.float(), s0.float())
    return _GRUSequence.apply(gx, U_zr, U, s0)


class _AttentiveDecoder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keep, gx, s0, H, keys, src_mask, W_a, v_a, U_zr, U, C_stack):
        Ty, B, _ = gx.shape
        n, Tx, ctx_dim, n_a = U.shape[0], H.shape[1], H.shape[2], keys.shape[2]
        W_a2, v_a2, keys2 = 2.0 * W_a, 2.0 * v_a, 2.0 * keys  # tanh(x) = 2σ(2x) − 1; see attention.attend
        pad = ~src_mask  # (B, Tx)
        S = gx.new_empty(Ty, B, n)  # (Ty, B, n)    s_{i-1}
        SIG = gx.new_empty(Ty if keep else 1, B, Tx, n_a)  # (Ty, B, Tx, n')   σ(2 (W_a s_{i-1} + U_a h_j))
        A = gx.new_empty(Ty, B, Tx)  # (Ty, B, Tx)   α_i
        CTX = gx.new_empty(Ty, B, ctx_dim)  # (Ty, B, 2n)   c_i
        ZR = gx.new_empty(max(Ty - 1, 0), B, 2 * n)
        Hc = gx.new_empty(max(Ty - 1, 0), B, n)
        RS = gx.new_empty(max(Ty - 1, 0), B, n)
        S[0] = s0
        for i in range(Ty):
            sig = SIG[i if keep else 0]  # without a backward to come, one step's buffer is enough
            torch.add(keys2, (S[i] @ W_a2.t()).unsqueeze(1), out=sig).sigmoid_()  # (B, Tx, n')
            e = (sig @ v_a2).masked_fill_(pad, float("-inf"))  # (B, Tx)
            torch.softmax(e, dim=-1, out=A[i])  # (B, Tx)
            torch.bmm(A[i].unsqueeze(1), H, out=CTX[i].unsqueeze(1))  # (B, 1, 2n)
            if i + 1 < Ty:
                g = torch.addmm(gx[i], CTX[i], C_stack.t())  # (B, 3n)
                _gru_forward_step(g, S[i], U_zr, U, ZR[i], Hc[i], RS[i], S[i + 1])
        ctx.save_for_backward(H, W_a2, v_a2, U_zr, U, C_stack, S, SIG, A, CTX, ZR, Hc, RS)
        return S, CTX, A

    @staticmethod
    @once_differentiable
    def backward(ctx, dS, dCTX, dA):
        H, W_a2, v_a2, U_zr, U, C_stack, S, SIG, A, CTX, ZR, Hc, RS = ctx.saved_tensors
        Ty, B, n = S.shape
        n_a = SIG.shape[-1]
        dS = torch.zeros_like(S) if dS is None else dS
        dCTX = torch.zeros_like(CTX) if dCTX is None else dCTX
        dgx = S.new_zeros(Ty, B, 3 * n)  # (Ty, B, 3n); the last step's stays zero (s_Ty is not computed)
        DC = S.new_empty(Ty, B, H.shape[2])  # (Ty, B, 2n)   ∂L/∂c_i
        DQ = S.new_empty(Ty, B, n_a)  # (Ty, B, n')   ∂L/∂(2 W_a s_{i-1})
        DE = S.new_empty(Ty, B, A.shape[2])  # (Ty, B, Tx)   ∂L/∂e_i
        dkeys2 = torch.zeros_like(SIG[0])  # (B, Tx, n')
        ds = torch.zeros_like(S[0])  # ∂L/∂s_i from the steps after i
        Ht = H.transpose(1, 2)  # (B, 2n, Tx)
        for i in reversed(range(Ty)):
            if i + 1 < Ty:
                ds = _gru_backward_step(ds, S[i], ZR[i], Hc[i], U_zr, U, dgx[i])
                torch.addmm(dCTX[i], dgx[i], C_stack, out=DC[i])  # (B, 2n)
            else:
                ds = torch.zeros_like(ds)
                DC[i] = dCTX[i]
            ds = ds + dS[i]
            dalpha = torch.bmm(DC[i].unsqueeze(1), Ht).squeeze(1)  # (B, Tx)   h_jᵀ ∂L/∂c_i
            if dA is not None:
                dalpha = dalpha + dA[i]
            alpha = A[i]
            torch.mul(alpha, dalpha - (alpha * dalpha).sum(-1, keepdim=True), out=DE[i])  # softmax backward
            dsig = DE[i].unsqueeze(-1) * v_a2  # (B, Tx, n')
            dx = torch.ops.aten.sigmoid_backward(dsig, SIG[i])  # (B, Tx, n')
            dkeys2 += dx
            torch.sum(dx, dim=1, out=DQ[i])  # (B, n')
            ds = torch.addmm(ds, DQ[i], W_a2)  # (B, n)
        # weight gradients, once over all steps
        S_flat = S.view(Ty * B, n)
        dW_a = 2.0 * (DQ.view(Ty * B, n_a).t() @ S_flat)  # (n', n)
        dv_a = 2.0 * (SIG.view(-1, n_a).t() @ DE.view(-1))  # (n',)
        dkeys = 2.0 * dkeys2  # (B, Tx, n')
        dH = torch.bmm(A.permute(1, 2, 0), DC.transpose(0, 1))  # (B, Tx, 2n)   Σ_i α_iᵀ ∂L/∂c_i
        m = (Ty - 1) * B
        dg = dgx[: Ty - 1].reshape(m, 3 * n)
        dU_zr = dg[:, : 2 * n].t() @ S[: Ty - 1].reshape(m, n)  # (2n, n)
        dU = dg[:, 2 * n :].t() @ RS.reshape(m, n)  # (n, n)
        dC = dg.t() @ CTX[: Ty - 1].reshape(m, CTX.shape[-1])  # (3n, 2n)
        return None, dgx, ds, dH, dkeys, None, dW_a, dv_a, dU_zr, dU, dC


def attentive_decoder(gx, s0, annotations, keys, src_mask, W_a, v_a, U_zr, U, C_stack):
    """The RNNsearch decoder loop for teacher forcing.

    gx (Ty, B, 3n) = W_stack E y_{i-1} + b_stack; s0 (B, n); annotations (B, Tx, 2n); keys U_a h (B, Tx, n');
    src_mask (B, Tx).  Returns time-major s_{i-1} (Ty, B, n), c_i (Ty, B, 2n) and α_i (Ty, B, Tx).
    """
    args = (gx, s0, annotations, keys, src_mask, W_a, v_a, U_zr, U, C_stack)
    keep = torch.is_grad_enabled() and any(a.requires_grad for a in args)  # else keep no per-step attention state
    if _autocast_on(gx):  # one dtype for the loop's buffers: float32
        with torch.autocast(gx.device.type, enabled=False):
            return _AttentiveDecoder.apply(keep, *(a if a.dtype == torch.bool else a.float() for a in args))
    return _AttentiveDecoder.apply(keep, *args)
