"""Adadelta (Zeiler, 2012) as the paper trains with it, in one pass over memory (compiled) or block by block.

    E[g²] ← ρ E[g²] + (1 − ρ) g²
    Δθ = − √(E[Δθ²] + ε) / √(E[g²] + ε) · g
    E[Δθ²] ← ρ E[Δθ²] + (1 − ρ) Δθ²
    θ ← θ + lr · Δθ

torch.optim.Adadelta applies each operation to a whole tensor before the next: about 27 passes over memory per
parameter, each larger than the caches at paper size (80M parameters, ~320 MB per pass), so the step is bound by
memory bandwidth.  ``Adadelta`` here keeps torch's state (``square_avg``, ``acc_delta``, ``step``: checkpoints
interchange) and updates dense, contiguous float32 parameters on CPU in one of two ways:

- with the compiled kernel (nmtkit/kernels, adadelta.c; when a C compiler is there): one loop over the
  elements, each array read and written once -- torch's operations in torch's order, with IEEE square roots
  where torch's vectorised ones are within 1 ulp, so the values agree to float32 rounding (tests compare); faster
  than both the blocked path and torch's step (tests/bench/results/bench_kernels.txt, rows "Adadelta update");
- else the very same torch operations in the same order on blocks of the speed policy's ``adadelta_block``
  elements, so that a block's intermediates stay in the cache and each array is read and written about once:
  torch's values bit for bit (tests compare).

Anything else (CUDA, weight decay, ``maximize``, ...) goes to torch's own step.

**Rows without gradient.**  A minibatch uses a few hundred of the 30,000 words, so most rows of the embedding
matrices' (dense) gradients are zero.  For such a row the update above reduces exactly to E[g²] ← ρ E[g²], E[Δθ²] ← ρ
E[Δθ²], θ unchanged (g = 0 makes Δθ = 0 and adds exact zeros), which needs no square roots.  For 2-D parameters of at
least the speed policy's ``sparse_min_rows`` rows, when at most half the rows have a nonzero gradient, ``Adadelta``
scales the two averages of every row by ρ and runs the full update on the other rows only (gathered into a compact copy
and written back): the same values as the full update (tests compare), in a fraction of its time.  A row-sparse gradient
(a COO tensor, as the models give for their embeddings on request, gradients.py) names its rows itself and takes that
path whatever their number; on torch's own step it is made dense first.
"""

from __future__ import annotations

import torch

from nmtkit import kernels
from nmtkit.models.fast.policy import policy



class Adadelta(torch.optim.Adadelta):
    """torch.optim.Adadelta in one pass over memory, or blocked for the CPU's caches (see the module docstring)."""

    def _blockable(self) -> bool:
        for group in self.param_groups:
            if group["weight_decay"] or group["maximize"] or group.get("differentiable") or group.get("capturable"):
                return False
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if p.device.type != "cpu" or p.dtype != torch.float32 or g.dtype != p.dtype or not p.is_contiguous():
                    return False
                if not (g.dim() == 2 and g.sparse_dim() == 1 if g.is_sparse else g.is_contiguous()):
                    return False
        return True

    @torch.no_grad()
    def step(self, closure=None, grad_scale: torch.Tensor | float | None = None):
        """One update; with ``grad_scale`` (a 0-dim tensor or a number), from the gradients times it -- the same
        values as multiplying them in place first (gradient clipping, gradients.grad_norm_and_scale), in one pass
        less over memory: the gradients are left as they are (but multiplied in place before torch's own step,
        where that is taken)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._blockable():
            grads = []
            for group in self.param_groups:  # torch's step takes no sparse gradients
                for p in group["params"]:
                    if p.grad is not None and p.grad.is_sparse:
                        p.grad = p.grad.to_dense()
                    if p.grad is not None:
                        grads.append(p.grad)
            if grad_scale is not None:
                torch._foreach_mul_(grads, grad_scale)
            super().step()
            return loss
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:  # as torch.optim.Adadelta initialises it
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["acc_delta"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                g, sq, acc = p.grad, state["square_avg"], state["acc_delta"]
                hyper = (group["lr"], group["rho"], group["eps"], grad_scale)
                if g.is_sparse:
                    g = g.coalesce()  # (k rows, C) values at distinct rows
                    _update_at(p, g._indices()[0], g._values(), sq, acc, *hyper)
                elif not (p.dim() == 2 and p.shape[0] >= policy().sparse_min_rows
                          and _update_rows(p, g, sq, acc, *hyper)):
                    _update(p, g, sq, acc, *hyper)
        return loss


def _update_rows(p, g, sq, acc, lr, rho, eps, scale=None) -> bool:
    """The update of a 2-D p (R, C) when at most half its rows have a nonzero gradient (see the module docstring):
    E[g²] and E[Δθ²] scaled by ρ everywhere, the full update on the gradient's nonzero rows; False (nothing done)
    when more rows than that have one."""
    used = g.amax(dim=1) != 0  # (R,)   (two reductions: faster here than any(), and NaN counts as nonzero)
    if 2 * int(used.sum()) > p.shape[0]:
        return False
    rows = used.logical_or_(g.amin(dim=1) != 0).nonzero().squeeze(1)  # (k,)   rows with a nonzero gradient
    if 2 * len(rows) > p.shape[0]:
        return False
    _update_at(p, rows, g.index_select(0, rows), sq, acc, lr, rho, eps, scale)
    return True


def _update_at(p, rows, g_k, sq, acc, lr, rho, eps, scale=None) -> None:
    """The update of a 2-D p (R, C) whose gradient is g_k (k, C) (times ``scale``) at the distinct ``rows`` (k,)
    and zero elsewhere: the full update at those rows, E[g²] and E[Δθ²] scaled by ρ at the others."""
    p_k, sq_k, acc_k = (t.index_select(0, rows) for t in (p, sq, acc))  # (k, C) compact copies
    g_k = g_k.contiguous() if scale is None else g_k * scale  # (a copy, never the caller's gradient)
    _update(p_k, g_k, sq_k, acc_k, lr, rho, eps)
    sq.mul_(rho)  # rows without gradient: E[g²] ← ρ E[g²] + (1 − ρ)·0
    acc.mul_(rho)  # and E[Δθ²] ← ρ E[Δθ²] + (1 − ρ)·0², θ unchanged
    for t, t_k in ((p, p_k), (sq, sq_k), (acc, acc_k)):
        t.index_copy_(0, rows, t_k)


def _update(p, g, sq, acc, lr, rho, eps, scale=None) -> None:
    """One Adadelta update of p from g (times ``scale``, if given), in place in p and the state sq = E[g²],
    acc = E[Δθ²] (all contiguous, of one shape): by the compiled kernel when there is one, else blockwise."""
    if kernels.usable(p, g, sq, acc):
        kernels.adadelta(p, g, sq, acc, lr, rho, eps, None if scale is None else float(scale))
        return
    p, g, sq, acc = p.view(-1), g.view(-1), sq.view(-1), acc.view(-1)  # (N,)
    N, BLOCK = p.numel(), policy().adadelta_block
    std_buf = torch.empty(min(BLOCK, N))
    delta_buf = torch.empty_like(std_buf)
    g_buf = None if scale is None else torch.empty_like(std_buf)
    for s in range(0, N, BLOCK):
        e = min(s + BLOCK, N)
        pb, gb, sqb, accb = p[s:e], g[s:e], sq[s:e], acc[s:e]
        std, delta = std_buf[: e - s], delta_buf[: e - s]
        if g_buf is not None:
            gb = torch.mul(gb, scale, out=g_buf[: e - s])  # the rescaled gradient (clipping), block by block
        sqb.mul_(rho).addcmul_(gb, gb, value=1 - rho)  # E[g²]
        torch.add(sqb, eps, out=std).sqrt_()  # √(E[g²] + ε)
        torch.add(accb, eps, out=delta).sqrt_().div_(std).mul_(gb)  # √(E[Δθ²] + ε) / √(E[g²] + ε) · g = −Δθ
        accb.mul_(rho).addcmul_(delta, delta, value=1 - rho)  # E[Δθ²]
        pb.add_(delta, alpha=-lr)  # θ + lr Δθ
