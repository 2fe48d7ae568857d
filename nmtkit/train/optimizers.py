"""The update rule ``--optimizer`` names: Adadelta (the paper's, Section 4.2: ε = 10⁻⁶, ρ = 0.95), Adam or SGD."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nmtkit.train.adadelta import Adadelta
from nmtkit.train.config import TrainConfig


def make_optimizer(cfg: TrainConfig, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    params = list(parameters)
    if cfg.optimizer == "adadelta":
        return Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps)  # torch's, in one pass over memory
    if cfg.optimizer == "adam":
        try:  # one fused kernel per tensor (torch >= 2.4 on CPU): the same update rule in fewer passes
            return torch.optim.Adam(params, lr=cfg.lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.SGD(params, lr=cfg.lr)


def takes_sparse_embedding_grads(optimizer: torch.optim.Optimizer, device: torch.device, cfg: TrainConfig,
                                 backend: str) -> bool:
    """Whether the model should hand row-sparse embedding gradients to the update (nmtkit/train/gradients.py):
    only nmtkit's Adadelta on the CPU takes them, and only the fast backend makes them."""
    return (isinstance(optimizer, Adadelta) and device.type == "cpu"
            and cfg.update_freq == 1  # (accumulated gradients stay dense)
            and backend == "fast")  # (the reference's are dense)
