"""Learning-rate schedules of ``nmt-train`` (``--lr-scheduler``, ``--warmup-updates``, ``--lr-decay``, ...).

The learning rate of update u (1-based: the first update is u = 1), for base rate ``lr`` and ``N`` warm-up updates:

- warm-up, with every scheduler: ``lr · u / N`` for u ≤ N (the first update already moves: lr/N, not 0);
- ``constant``: ``lr`` (with N = 0 exactly the rate given, so the default run is the run without a schedule);
- ``inverse-sqrt`` (fairseq's ``inverse_sqrt``): ``lr · sqrt(max(N, 1) / u)``: ``lr`` at the end of the warm-up,
  then decaying as 1/sqrt(u); without warm-up (N = 0) that is ``lr / sqrt(u)``, ``lr`` at the first update
  (fairseq's formula would make every rate 0 there);
- ``linear`` (the budgeted-training schedule of Li et al., ICLR 2020; fairseq's ``polynomial_decay`` of power 1):
  from ``lr`` at the end of the warm-up straight down to ``min_lr`` at update T (``--schedule-updates``, by default
  the run's ``--max-updates``), ``min_lr + (lr − min_lr) · (T − u) / (T − N)``, and ``min_lr`` after T;
- ``cosine`` (Loshchilov & Hutter's SGDR without restarts): over the same span,
  ``min_lr + (lr − min_lr) · (1 + cos(π (u − N) / (T − N))) / 2``;
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

SCHEDULERS = ("constant", "inverse-sqrt", "linear", "cosine", "plateau")
BUDGETED = ("linear", "cosine")  # the schedules that need an update to end at (--schedule-updates or --max-updates)


class LRSchedule:
    """The learning rate at each update; ``lr(u)``, ``on_validation(u, metric)``, ``state_dict()`` for resuming."""

    def __init__(self, kind: str, lr: float, warmup: int = 0, decay: float = 0.5, patience: int = 1,
                 min_lr: float = 0.0, total: int = 0):
        if kind not in SCHEDULERS:
            raise ValueError(f"unknown scheduler '{kind}' (choose from {', '.join(SCHEDULERS)})")
        if kind in BUDGETED and total <= warmup:
            raise ValueError(f"the {kind} schedule needs a last update after the warm-up ({total} <= {warmup})")
        self.kind, self.base, self.warmup, self.total = kind, lr, warmup, total
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
        elif self.kind in BUDGETED:
            done = min(update - self.warmup, self.total - self.warmup) / (self.total - self.warmup)  # in (0, 1]
            left = 1 - done if self.kind == "linear" else (1 + math.cos(math.pi * done)) / 2
            rate = self.min_lr + (self.base - self.min_lr) * left
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
        state = {"factor": self.factor, "bad": self.bad, "best": self.best}
        if self.kind in BUDGETED:
            state["total"] = self.total
        return state

    def load_state_dict(self, state: dict) -> str | None:
        """Restore the state; returns what changed for a resumed run to say (a decaying schedule's last update set
        anew), else None."""
        self.factor, self.bad, self.best = float(state["factor"]), int(state["bad"]), state["best"]
        before = state.get("total")
        if self.kind in BUDGETED and before is not None and before != self.total:
            return f"the {self.kind} schedule now reaches its floor at update {self.total}, not {before}"
        return None
