"""The update rules ``--optimizer`` names (nmtkit/train/registry.py: ``OPTIMIZERS``): Adadelta (the paper's, Section
4.2: ε = 10⁻⁶, ρ = 0.95), Adam and SGD.

An :class:`UpdateRule` is everything the trainer needs to know of one optimizer: it builds torch's optimizer, says
whether it takes row-sparse embedding gradients, and makes one update -- the gradient's norm, the clipping to
``--clip-norm`` and the step -- with whatever bookkeeping its step needs.  The trainer writes the learning rate into
``group["lr"]`` before each update (nmtkit/train/schedule.py); every rule's optimizer reads it there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from nmtkit.train.adadelta import Adadelta
from nmtkit.train.config import TrainConfig
from nmtkit.train.gradients import clip_grad_norm_, grad_norm_and_scale
from nmtkit.train.registry import OPTIMIZERS


class UpdateRule:
    """One optimizer's update.  Subclasses implement :meth:`build`; :meth:`step` is the clipped step of torch's
    optimizers, which a rule replaces where its optimizer clips in another way."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def build(self, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def takes_sparse_embedding_grads(self, device: torch.device, backend: str) -> bool:
        """Whether the model should hand it row-sparse embedding gradients (nmtkit/train/gradients.py)."""
        return False

    def step(self, optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter], max_norm: float,
             check: Callable[[torch.Tensor], None]) -> torch.Tensor:
        """Rescale the gradients to an L2 norm of at most ``max_norm`` (``math.inf``: never), let ``check`` see the
        norm before rescaling (it raises to stop before the weights change), update, and return that norm."""
        norm = clip_grad_norm_(parameters, max_norm)
        check(norm)
        optimizer.step()
        self.after_step(parameters)
        return norm

    def after_step(self, parameters: list[torch.nn.Parameter]) -> None:
        """Move every weight's version counter, on which caches of derived weights are keyed (models/fast/
        stepweights.py: the search's, in validation BLEU).  torch's fused Adam and nmtkit's compiled Adadelta
        write the weights without moving them; a rule whose optimizer is known to move them may skip this."""
        for p in parameters:
            torch.autograd.graph.increment_version(p)


class AdadeltaRule(UpdateRule):
    """nmtkit's Adadelta (adadelta.py): torch's update rule in one pass over memory; it takes the clipping factor
    and rescales block by block (one pass less over the gradients), and row-sparse embedding gradients on the CPU."""

    def build(self, parameters):
        return Adadelta(parameters, lr=self.cfg.lr, rho=self.cfg.rho, eps=self.cfg.eps)

    def takes_sparse_embedding_grads(self, device, backend):
        return (device.type == "cpu"
                and self.cfg.update_freq == 1  # (accumulated gradients stay dense)
                and backend == "fast")  # (the reference's are dense)

    def step(self, optimizer, parameters, max_norm, check):
        norm, scale = grad_norm_and_scale(parameters, max_norm)
        check(norm)
        optimizer.step(grad_scale=scale)
        self.after_step(parameters)
        return norm


class AdamRule(UpdateRule):
    def build(self, parameters):
        try:  # one fused kernel per tensor (torch >= 2.4 on CPU): the same update rule in fewer passes
            return torch.optim.Adam(parameters, lr=self.cfg.lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.Adam(parameters, lr=self.cfg.lr)


class SGDRule(UpdateRule):
    def build(self, parameters):
        return torch.optim.SGD(parameters, lr=self.cfg.lr)


def update_rule(cfg: TrainConfig) -> UpdateRule:
    """The rule ``cfg.optimizer`` names."""
    rule = OPTIMIZERS.load(cfg.optimizer)(cfg)
    if not isinstance(rule, UpdateRule):
        raise TypeError(f"optimizer '{cfg.optimizer}' is registered as {OPTIMIZERS[cfg.optimizer].target}, which "
                        "is not an UpdateRule")
    return rule


def make_optimizer(cfg: TrainConfig, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch's optimizer for ``cfg.optimizer`` over ``parameters`` (its rule's :meth:`UpdateRule.build`)."""
    return update_rule(cfg).build(list(parameters))
