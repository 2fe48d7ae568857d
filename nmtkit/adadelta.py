"""Adadelta (Zeiler, 2012) as the paper trains with it, one cache-sized block at a time.

    E[g²] ← ρ E[g²] + (1 − ρ) g²
    Δθ = − √(E[Δθ²] + ε) / √(E[g²] + ε) · g
    E[Δθ²] ← ρ E[Δθ²] + (1 − ρ) Δθ²
    θ ← θ + lr · Δθ

torch.optim.Adadelta applies each operation to a whole tensor before the next: about 27 passes over memory per
parameter, each larger than the caches at paper size (80M parameters, ~320 MB per pass), so the step is bound by
memory bandwidth.  ``Adadelta`` here runs the very same operations in the same order on blocks of ``BLOCK``
elements, so that a block's intermediates stay in the cache and each array is read and written about once: the
same values bit for bit (tests compare) and the same state (``square_avg``, ``acc_delta``, ``step``: checkpoints
interchange).  It takes this path for dense, contiguous float32 parameters on CPU; anything else (CUDA, sparse
gradients, weight decay, ``maximize``, ...) goes to torch's own step.
"""

from __future__ import annotations

import torch

BLOCK = 1 << 19  # elements per block (2 MB of float32 per array; 2^18 … 2^21 measure alike here, 2^15 gains nothing)


class Adadelta(torch.optim.Adadelta):
    """torch.optim.Adadelta, blocked for the CPU's caches (see the module docstring)."""

    def _blockable(self) -> bool:
        for group in self.param_groups:
            if group["weight_decay"] or group["maximize"] or group.get("differentiable") or group.get("capturable"):
                return False
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if (p.device.type != "cpu" or p.dtype != torch.float32 or g.is_sparse or g.dtype != p.dtype
                        or not (p.is_contiguous() and g.is_contiguous())):
                    return False
        return True

    @torch.no_grad()
    def step(self, closure=None):
        if not self._blockable():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
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
                _update(p.view(-1), p.grad.view(-1), state["square_avg"].view(-1), state["acc_delta"].view(-1),
                        group["lr"], group["rho"], group["eps"])
        return loss


def _update(p, g, sq, acc, lr, rho, eps) -> None:
    """One Adadelta update of flat p (N,) from g, in place in p and the state sq = E[g²], acc = E[Δθ²]."""
    N = p.numel()
    std_buf = torch.empty(min(BLOCK, N))
    delta_buf = torch.empty_like(std_buf)
    for s in range(0, N, BLOCK):
        e = min(s + BLOCK, N)
        pb, gb, sqb, accb = p[s:e], g[s:e], sq[s:e], acc[s:e]
        std, delta = std_buf[: e - s], delta_buf[: e - s]
        sqb.mul_(rho).addcmul_(gb, gb, value=1 - rho)  # E[g²]
        torch.add(sqb, eps, out=std).sqrt_()  # √(E[g²] + ε)
        torch.add(accb, eps, out=delta).sqrt_().div_(std).mul_(gb)  # √(E[Δθ²] + ε) / √(E[g²] + ε) · g = −Δθ
        accb.mul_(rho).addcmul_(delta, delta, value=1 - rho)  # E[Δθ²]
        pb.add_(delta, alpha=-lr)  # θ + lr Δθ
