"""``nmt-train``: the training loop (``trainer``), its settings and recipes (``config``, ``recipes``), the optimizer
(``adadelta``), learning-rate schedules (``schedule``), gradient norms and clipping (``gradients``), weight averaging
(``averaging``), validation (``validation``), exact resume and the run directory (``resume``, ``rundir``) and
TensorBoard logging (``tblog``).

The public names below are importable from the package itself (``from nmtkit.train import Trainer``); each
is looked up in its module on first use, so importing one submodule does not import the others.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Trainer": "trainer",
    "train": "trainer",
    "TrainConfig": "config",
    "TrainState": "config",
    "train_config": "config",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
