"""Learning-rate schedules of ``nmt-train`` (``--lr-scheduler``, ``--warmup-updates``, ``--lr-decay``, ...).

The learning rate of update u (1-based: the first update is u = 1), for base rate ``lr`` and ``N`` warm-up updates:

- warm-up, with every scheduler: ``lr · u / N`` for u ≤ N (the first update already moves: lr/N, not 0);
- ``constant``: ``lr`` (with N = 0 exactly the rate given, so the default run is the run without a schedule);
- ``inverse-sqrt`` (fairseq's ``inverse_sqrt``): ``lr · sqrt(max(N, 1) / u)``: ``lr`` at the end of the warm-up,
  then decaying as 1/sqrt(u); without warm-up (N = 0) that is ``lr / sqrt(u)``, ``lr`` at the first update
  (fairseq's formula would make every rate 0 there);
- ``plateau`` (as torch's ReduceLROnPlateau): ``lr · factor``, where ``factor`` starts at 1 and is multiplied by
  ``decay`` whenever ``patience`` validations in a row have not improved on the best value of the run's metric
  (``--best-metric``) so far; the count restarts after each decay.  Validations during the warm-up do not count
  (the rate is still rising), nor does the checkpoint of an interruption (the trainer passes only the validations
  every ``--valid-every`` updates, which an interrupted and resumed run meets alike).

After the warm-up no rate falls below ``min_lr`` (the floor of the decaying schedules; 0 = none).  The rate is a
pure function of the update number and of :class:`LRSchedule`'s state (plateau's factor, count and best), which goes
into the checkpoint, so that a resumed run follows the schedule of an uninterrupted one exactly.  The trainer writes the
rate into every parameter group of the optimizer (``group["lr"]``) before each update: torch's Adam and SGD and
nmtkit's Adadelta read it there at every step.
"""

from __future__ import annotations

import math

SCHEDULERS = ("constant", "inverse-sqrt", "plateau")


class LRSchedule:
    """The learning rate at each update; ``lr(u)``, ``on_validation(u, metric)``, ``state_dict()`` for resuming."""

    def __init__(self, kind: str, lr: float, warmup: int = 0, decay: float = 0.5, patience: int = 1,
                 min_lr: float = 0.0):
        if kind not in SCHEDULERS:
            raise ValueError(f"unknown scheduler '{kind}' (choose from {', '.join(SCHEDULERS)})")
        self.kind, self.base, self.warmup = kind, lr, warmup
        self.decay, self.patience, self.min_lr = decay, patience, min_lr
        self.factor = 1.0  # plateau: the product of the decays so far
        self.bad = 0  # plateau: validations since the last improvement or decay
        self.best: float | None = None  # plateau: the best metric so far (higher is better)

    def lr(self, update: int) -> float:
        """The learning rate of update ``update`` (1-based)."""
        if update <= self.warmup:
            return self.base * update / self.warmup
        if self.kind == "constant":
            rate = self.base
        elif self.kind == "inverse-sqrt":
            rate = self.base * math.sqrt(max(self.warmup, 1) / update)
        else:
            rate = self.base * self.factor
        return max(rate, self.min_lr)

    def on_validation(self, update: int, value: float) -> bool:
        """Take the metric ``value`` (higher is better) of a validation at ``update`` into account (plateau); True
        when the rate was decayed."""
        if self.kind != "plateau" or update <= self.warmup:
            return False
        improved = self.best is None or value > self.best
        self.best = value if improved else self.best
        self.bad = 0 if improved else self.bad + 1
        if self.bad < self.patience:
            return False
        self.bad = 0
        if self.base * self.factor <= self.min_lr:
            return False  # already at the floor: the factor stays where the floor took over
        self.factor *= self.decay
        return True

    def state_dict(self) -> dict:
        return {"factor": self.factor, "bad": self.bad, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.factor, self.bad, self.best = float(state["factor"]), int(state["bad"]), state["best"]
