"""The gradient's L2 norm and its rescaling (the paper's "normalized to 1"), for dense and row-sparse gradients.

A minibatch reads a few hundred of the 30,000 rows of each embedding matrix.  As a dense tensor, an embedding's
gradient costs a 74 MB zero fill (paper size), a pass for its norm, two for clipping and two more for Adadelta to
find its nonzero rows again.  The models can give it row-sparse instead (``sparse_embedding_grads``: a coalesced COO
tensor, the used rows only; the trainer asks for it when the update is nmtkit's Adadelta on the CPU, which takes it,
adadelta.py).  torch's ``clip_grad_norm_`` refuses sparse gradients; ``clip_grad_norm_`` here takes both, and on
dense gradients alone simply is torch's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def clip_grad_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> Tensor:
    """Rescale the parameters' gradients in place to an L2 norm of at most ``max_norm`` (``math.inf``: never) and
    return the norm before rescaling, as ``torch.nn.utils.clip_grad_norm_`` does.  Sparse gradients are coalesced
    (their duplicate rows summed) in place first; their norm is that of their stored values."""
    params = [p for p in parameters if p.grad is not None]
    if not any(p.grad.is_sparse for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total, scale = grad_norm_and_scale(params, max_norm)
    torch._foreach_mul_(_stored(params), scale)
    return total


def grad_norm_and_scale(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> tuple[Tensor, Tensor]:
    """The gradients' L2 norm ‖g‖ and the factor min(1, max_norm / (‖g‖ + 1e-6)) that ``clip_grad_norm_`` would
    multiply them by -- without multiplying: nmtkit's Adadelta takes the factor instead (``step(grad_scale=…)``)
    and applies it block by block, which saves a pass over every gradient.  Coalesces sparse gradients in place."""
    params = [p for p in parameters if p.grad is not None]
    for p in params:
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
    if not params:
        return torch.zeros(()), torch.ones(())
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v) for v in _stored(params)]))
    return total, torch.clamp(max_norm / (total + 1e-6), max=1.0)  # as torch's (1e-6 against a zero norm)


def _stored(params: list[torch.nn.Parameter]) -> list[Tensor]:
    """The gradients' stored values: a coalesced sparse gradient's values, a dense one itself."""
    return [p.grad._values() if p.grad.is_sparse else p.grad for p in params]
