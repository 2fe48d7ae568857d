"""Learning-rate schedules of ``nmt-train`` (``--lr-scheduler``, ``--warmup-updates``, ``--lr-decay``, ...): one
subclass of :class:`Schedule` each, registered by name in nmtkit/train/registry.py (``SCHEDULES``); the base class
holds the warm-up, the floor and the state, a subclass the rate after the warm-up.

The learning rate of update u (1-based: the first update is u = 1), for base rate ``lr`` and ``N`` warm-up updates:

- warm-up, with every scheduler: ``lr · u / N`` for u ≤ N (the first update already moves: lr/N, not 0);
- ``constant``: ``lr`` (with N = 0 exactly the rate given, so the default run is the run without a schedule);
- ``inverse-sqrt`` (fairseq's ``inverse_sqrt``): ``lr · sqrt(max(N, 1) / u)``: ``lr`` at the end of the warm-up,
  then decaying as 1/sqrt(u); without warm-up (N = 0) that is ``lr / sqrt(u)``, ``lr`` at the first update
  (fairseq's formula would make every rate 0 there);
- ``linear`` (the budgeted-training schedule of Li et al., ICLR 2020; fairseq's ``polynomial_decay`` of power 1):
  from ``lr`` at the end of the warm-up straight down to ``min_lr`` at update T (the horizon, below),
  ``min_lr + (lr − min_lr) · (1 − q)`` with ``q = (u − N) / (T − N)`` the share of the span done, and ``min_lr``
  after T;
- ``cosine`` (Loshchilov & Hutter's SGDR without restarts): over the same span,
  ``min_lr + (lr − min_lr) · (1 + cos(π q)) / 2``;
- with ``--decay-fraction F`` < 1, linear and cosine hold ``lr`` for the first 1 − F of the span and decay over its
  last F only (q above measured over that last part): warm-up, stable, decay, the shape that anneals a run at its
  end without giving up the full rate while the model is far from converged (fairseq's ``tri_stage``);
- ``plateau`` (as torch's ReduceLROnPlateau): ``lr · factor``, where ``factor`` starts at 1 and is multiplied by
  ``decay`` whenever ``patience`` validations in a row have not improved on the best value of the run's metric
  (``--best-metric``) so far; the count restarts after each decay.  Validations during the warm-up do not count
  (the rate is still rising), nor does the checkpoint of an interruption (the trainer passes only the validations
  every ``--valid-every`` updates, which an interrupted and resumed run meets alike).

**The horizon T** of linear and cosine is an update (``--schedule-updates``, else ``--max-updates``) or a time
budget (``--max-time B`` seconds, when no update is given; with both ``--max-time`` and ``--max-updates``, whichever
comes first).  A time budget is turned into updates at every update from the rate measured so far: before update u,
with ``e`` seconds trained in the u − 1 updates before it, ``T = (u − 1) · B / e`` (the mean rate so far, validations
included, carried to the end of the budget), re-estimated at each update, so that q reaches 1, and the rate its
floor, when the clock reaches B, whatever the machine's speed or load.  ``e`` is the run's ``elapsed`` (training and
scheduled validations, across resumptions), saved in every checkpoint: a resumed run goes on from the same point of
the schedule.

After the warm-up no rate falls below ``min_lr`` (the floor of the decaying schedules; 0 = none).  The rate is a
pure function of the update number, the time trained (time budgets only) and of the :class:`Schedule`'s state
(plateau's factor, count and best), which goes into the checkpoint, so that a resumed run follows the schedule of an uninterrupted one exactly.  The trainer writes the
rate into every parameter group of the optimizer (``group["lr"]``) before each update: torch's Adam and SGD and
nmtkit's Adadelta read it there at every step.
"""

from __future__ import annotations

import math

from nmtkit.train.registry import SCHEDULES


class Schedule:
    """The learning rate at each update: ``lr(u, elapsed)``, ``on_validation(u, metric)``, ``state_dict()`` for
    resuming.  A subclass gives the rate after the warm-up (:meth:`rate`); ``budgeted`` ones need a horizon (an
    update to end at, or a time budget)."""

    budgeted = False

    def __init__(self, lr: float, warmup: int = 0, decay: float = 0.5, patience: int = 1, min_lr: float = 0.0,
                 total: int = 0, budget: float = 0.0, decay_fraction: float = 1.0, kind: str = ""):
        self.kind = kind or type(self).__name__.lower()  # (the registered name, for messages)
        if self.budgeted and total <= warmup and not budget > 0:
            raise ValueError(f"the {self.kind} schedule needs a last update after the warm-up ({total} <= {warmup}) "
                             "or a time budget")
        if not 0 < decay_fraction <= 1:
            raise ValueError(f"the decay fraction must be in (0, 1] (got {decay_fraction})")
        self.base, self.warmup = lr, warmup
        self.total = total if total > warmup else 0  # (0: no update horizon, the time budget alone)
        self.budget, self.decay_fraction = budget, decay_fraction
        self.decay, self.patience, self.min_lr = decay, patience, min_lr
        self.factor = 1.0  # plateau: the product of the decays so far
        self.bad = 0  # plateau: validations since the last improvement or decay
        self.best: float | None = None  # plateau: the best metric so far (higher is better)

    def horizon(self, update: int, elapsed: float = 0.0) -> float:
        """T, the update at which a linear or cosine schedule reaches its floor, as known before update ``update``
        when ``elapsed`` seconds have been trained: the update horizon, or the time budget at the rate so far,
        whichever comes first (infinite before any time has been measured)."""
        horizon = float(self.total) if self.total else math.inf
        if self.budget > 0 and update > 1 and elapsed > 0:
            horizon = min(horizon, (update - 1) * self.budget / elapsed)
        return horizon

    def lr(self, update: int, elapsed: float = 0.0) -> float:
        """The learning rate of update ``update`` (1-based), ``elapsed`` seconds into the run (time budgets)."""
        if update <= self.warmup:
            return self.base * update / self.warmup
        return max(self.rate(update, elapsed), self.min_lr)

    def rate(self, update: int, elapsed: float) -> float:
        """The rate of an update after the warm-up, before the floor."""
        raise NotImplementedError

    def on_validation(self, update: int, value: float) -> bool:
        """Take the metric ``value`` (higher is better) of a validation at ``update`` into account; True when the
        rate was decayed (plateau)."""
        return False

    def state_dict(self) -> dict:
        state = {"factor": self.factor, "bad": self.bad, "best": self.best}
        if self.budgeted:
            state.update(total=self.total, budget=self.budget, decay_fraction=self.decay_fraction)
        return state

    def load_state_dict(self, state: dict) -> str | None:
        """Restore the state; returns what changed for a resumed run to say (a decaying schedule's last update set
        anew), else None."""
        self.factor, self.bad, self.best = float(state["factor"]), int(state["bad"]), state["best"]
        if not self.budgeted:
            return None
        changes = []
        before = state.get("total")
        if before is not None and before != self.total:
            changes.append(f"reaches its floor at update {self.total or 'the time budget sets'}, not "
                           f"{before or 'the time budget set'}")
        before = state.get("budget", 0.0)
        if before != self.budget:
            changes.append(f"has a time budget of {self.budget:g} s, not {before:g} s" if self.budget else
                           f"has no time budget (it had {before:g} s)")
        before = state.get("decay_fraction", 1.0)
        if before != self.decay_fraction:
            changes.append(f"decays over the last {self.decay_fraction:g} of the run, not {before:g}")
        return f"the {self.kind} schedule now " + " and ".join(changes) if changes else None


class Constant(Schedule):
    def rate(self, update, elapsed):
        return self.base


class InverseSqrt(Schedule):
    def rate(self, update, elapsed):
        return self.base * math.sqrt(max(self.warmup, 1) / update)


class Budgeted(Schedule):
    """From ``lr`` at the end of the warm-up down to ``min_lr`` at the horizon T, held for the first 1 − F of the
    span with ``decay_fraction`` F < 1; ``left(q)``: the share of ``lr − min_lr`` left when q of the decay is done."""

    budgeted = True

    def rate(self, update, elapsed):
        span = self.horizon(update, elapsed) - self.warmup
        done = 1.0 if span <= 0 else min((update - self.warmup) / span, 1.0)  # q, in (0, 1]
        held = 1 - self.decay_fraction  # (the stable part: the full rate)
        done = max(done - held, 0.0) / self.decay_fraction
        return self.min_lr + (self.base - self.min_lr) * self.left(done)

    def left(self, done: float) -> float:
        raise NotImplementedError


class Linear(Budgeted):
    def left(self, done):
        return 1 - done


class Cosine(Budgeted):
    def left(self, done):
        return (1 + math.cos(math.pi * done)) / 2


class Plateau(Schedule):
    def rate(self, update, elapsed):
        return self.base * self.factor

    def on_validation(self, update, value):
        if update <= self.warmup:
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


def schedule_class(kind: str) -> type[Schedule]:
    """The class registered as ``kind`` (ValueError naming the choices when there is none)."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown scheduler '{kind}' (choose from {', '.join(SCHEDULES.names())})")
    cls = SCHEDULES.load(kind)
    if not (isinstance(cls, type) and issubclass(cls, Schedule)):
        raise TypeError(f"schedule '{kind}' is registered as {SCHEDULES[kind].target}, which is not a Schedule")
    return cls


def make_schedule(kind: str, lr: float, **settings) -> Schedule:
    """The schedule registered as ``kind`` with base rate ``lr`` and :class:`Schedule`'s settings."""
    return schedule_class(kind)(lr, kind=kind, **settings)
