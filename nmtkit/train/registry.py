"""The named parts of a training run that a contributor adds to: the optimizers (``--optimizer``), the learning-rate
schedules (``--lr-scheduler``) and the weight initialisations (``--init``).

A registry maps a name to an :class:`Entry`: the help ``nmt-train`` shows for it, the :class:`~nmtkit.train.config.
TrainConfig` settings that it alone reads, and its implementation, named ``"module:attribute"`` and imported when a
run builds it.  That keeps this module free of torch: ``nmt-train``'s options (their choices and help come from
here) are read without importing it, and ``TrainConfig.check`` refuses an unknown name before anything is loaded.

To add one (``docs/design.rst``, "How to extend"):

- an optimizer: a subclass of :class:`nmtkit.train.optimizers.UpdateRule` (which builds torch's optimizer and owns
  its clipping, its step and its bookkeeping) and one ``OPTIMIZERS.register`` line below;
- a schedule: a subclass of :class:`nmtkit.train.schedule.Schedule` (the rate after the warm-up) and one
  ``SCHEDULES.register`` line;
- an initialisation: a function ``(model) -> None`` in ``nmtkit/models/init.py`` and one ``INITS.register`` line.

``tests/test_registries.py`` loads every entry and checks it is of its kind, and that the CLI offers exactly these.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from nmtkit.errors import InputError


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "module:attribute" of the implementation
    help: str
    settings: tuple[str, ...] = ()  # the TrainConfig fields only this entry reads (Adadelta's rho, eps, ...)

    def load(self) -> Any:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


class Registry:
    """Names of one kind of part (``what``, set by the option ``option``) -> their entries, in registration order."""

    def __init__(self, what: str, option: str):
        self.what, self.option = what, option
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target: str, help: str, settings: tuple[str, ...] = ()) -> Entry:
        if name in self._entries:
            raise ValueError(f"{self.what} '{name}' is registered already")
        if ":" not in target:
            raise ValueError(f"{self.what} '{name}': the target must be 'module:attribute' (got {target!r})")
        self._entries[name] = entry = Entry(name, target, help, tuple(settings))
        return entry

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Entry:
        self.check(name)
        return self._entries[name]

    def check(self, name: str) -> None:
        """One line naming the option and the choices when ``name`` is not registered."""
        if name not in self._entries:
            raise InputError(f"unknown {self.option} '{name}' (choose from {', '.join(self._entries)})")

    def load(self, name: str) -> Any:
        """The implementation registered as ``name`` (its module imported now)."""
        return self[name].load()

    def describe(self) -> str:
        """The choices with their help, for the option's help text."""
        return "; ".join(f"{e.name}: {e.help}" for e in self._entries.values())


OPTIMIZERS = Registry("optimizer", "--optimizer")
OPTIMIZERS.register("adadelta", "nmtkit.train.optimizers:AdadeltaRule",
                    "the paper's (Section 4.2; lr 1.0, --rho, --eps), one pass over memory", settings=("rho", "eps"))
OPTIMIZERS.register("adam", "nmtkit.train.optimizers:AdamRule", "Adam (lr 1e-3 is usual), torch's fused kernel")
OPTIMIZERS.register("sgd", "nmtkit.train.optimizers:SGDRule", "plain stochastic gradient descent")

SCHEDULES = Registry("learning-rate schedule", "--lr-scheduler")
SCHEDULES.register("constant", "nmtkit.train.schedule:Constant", "lr")
SCHEDULES.register("inverse-sqrt", "nmtkit.train.schedule:InverseSqrt", "lr·sqrt(N/u) after N warm-up updates")
SCHEDULES.register("linear", "nmtkit.train.schedule:Linear",
                   "from lr after the warm-up straight down to --min-lr at --schedule-updates, else at --max-updates "
                   "or when --max-time runs out, whichever comes first", settings=("decay_fraction",))
SCHEDULES.register("cosine", "nmtkit.train.schedule:Cosine", "as linear, along a half cosine",
                   settings=("decay_fraction",))
SCHEDULES.register("plateau", "nmtkit.train.schedule:Plateau",
                   "lr times --lr-decay after --lr-patience validations without improvement",
                   settings=("lr_decay", "lr_patience"))

INITS = Registry("initialisation", "--init")
INITS.register("paper", "nmtkit.models.init:paper", "the paper's Appendix B.1")
INITS.register("xavier", "nmtkit.models.init:xavier",
               "Glorot-uniform for every non-recurrent matrix (recurrent ones orthogonal, as in B.1)")
INITS.register("xavier-flat", "nmtkit.models.init:xavier_flat", "xavier with v_a = 0, so that α starts uniform")
