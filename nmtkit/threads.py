"""How many threads a CPU process computes with: chosen by what each count measures, and chosen again as the load
of the machine changes (``--threads 0``, the default of nmt-train and nmt-translate).

Why.  torch's OpenMP threads meet at a barrier after every parallel region, hundreds of times a training update;
a thread that waits there spins.  When another program holds one of the cores, the thread that shares it with that
program runs only part of the time, and every barrier waits for its next turn while its sibling spins: beside one
busy core (``python -c 'while True: pass'``) two threads make far less than the fair half of the idle rate, and one
thread on the free core far more (``tests/bench/results/bench_steady*.txt``).  Which count wins depends on the
other program (at nice 19 it yields its core and two threads win again) and changes while a run goes on (a
browser, a build, a test suite), so the count is not guessed from the load average: it is measured.

How.  :class:`ThreadGovernor` is told the work done (target tokens, source tokens) and the seconds taken by each
step.  It starts with every core it may use.  After each window of steps it reads how much CPU time the machine
spent outside this process (``/proc/stat`` less ``time.process_time()``), at nice 0 and niced apart: programs at
nice 0 take their share of the cores from us; niced ones (nice 1 to 19: a build, a background job) yield them.
While programs at nice 0 hold a third of a core or more, the next smaller count is tried for one window, and the
count whose window did more work per second by a clear margin (``margin``) is kept; a trial that loses waits twice
as long before the next one (at most ``longest`` steps).  Running on fewer threads, a core left idle or to niced
programs means the other work has stopped: the larger count is tried at once.  On an idle machine, or beside niced
work, there are no trials at all.  Windows are compared next to each other in time, so a slow drift of the step's
cost (longer batches) does not decide.  Where the machine's CPU time cannot be read, trials come at doubling
intervals, and at once when a window falls below ``drop`` of the one the count was chosen with.  The count changes
only between steps.

Decoding (``trials=False``) acts on the reading alone: its batches differ too much in cost (their lengths, a
second pass for the numbers) for one batch to be compared with the next, and an input shorter than a window of
lines has only a few of them; nice-0 work holding a third of a core moves it to the next smaller count at once, a
core left free to the next larger.

The measurements: ``tests/bench/results/bench_steady.txt``; how to choose: docs/performance.rst.

A run that must repeat bit for bit (``--resume`` against an uninterrupted run, a comparison of two commits) fixes
the count (``--threads N``): products summed over another number of threads round differently.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["ThreadGovernor", "thread_counts"]


def thread_counts(most: int) -> list[int]:
    """The counts a governor moves between, largest first: ``most``, then halved down to one (8 → 8, 4, 2, 1)."""
    counts = [max(1, int(most))]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


def machine_cpu_seconds() -> tuple[float, float, float] | None:
    """(busy, niced, idle): seconds the machine's CPUs have spent on programs at nice 0 or less (and the kernel),
    on niced programs, and idle, since boot, all CPUs together (Linux's ``/proc/stat``); None where that cannot be
    read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        return (user + system + irq + softirq + steal) / 100.0, nice / 100.0, (idle + iowait) / 100.0  # USER_HZ
    except (OSError, ValueError):
        return None


def _own_niceness() -> int:
    try:
        return os.nice(0)
    except OSError:
        return 0


def _torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


class ThreadGovernor:
    """Keeps the thread count that does the most work per second (see the module's docstring).

    ``step(work, seconds)`` after every step; ``threads`` is the count in use; ``events(kind, line)`` is called
    with one line for each change of count (kind ``threads``), fall of the rate below ``drop`` of the start's
    (``fell``) and recovery from it (``recovered``); the tools log them."""

    def __init__(self, most: int, *, window: int = 8, first_trial: int = 8, longest: int = 1000,
                 margin: float = 1.12, drop: float = 0.6, warmup: int = 3, settle: int = 1,
                 others_busy: float = 0.3, trials: bool = True,
                 set_threads: Callable[[int], None] | None = None,
                 events: Callable[[str, str], None] | None = None,
                 machine: Callable[[], tuple[float, float, float] | None] = machine_cpu_seconds,
                 own_cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        if window < 1 or first_trial < 1 or longest < first_trial or margin < 1 or not 0 < drop < 1:
            raise ValueError("ThreadGovernor: window, first_trial ≥ 1, longest ≥ first_trial, margin ≥ 1, "
                             "0 < drop < 1")
        self.counts = thread_counts(most)
        self.window, self.first_trial, self.longest = window, first_trial, longest
        self.margin, self.drop, self.others_busy, self.trials_on = margin, drop, others_busy, trials
        self._set = set_threads or _torch_set_threads
        self._events = events or (lambda kind, line: None)
        self.threads = self.counts[0]
        self._set(self.threads)
        self._skip = warmup  # steps not counted: the first ones, and `settle` after each change of count
        self.settle = settle
        self._work = self._seconds = 0.0
        self._steps = 0
        self._trial: int | None = None  # the count on trial, None while running on the chosen one
        self._before = 0.0  # the rate of the chosen count in the window just before the trial
        self._chosen_rate: float | None = None  # the rate the current count was chosen (or last confirmed) with
        self.start_rate: float | None = None  # the first window's rate: what the run measured at its start
        self._fallen = False  # the rate is below `drop` of the start's (said once until it recovers)
        self._wait = first_trial  # steps until the next trial may come
        self._since = 0
        self._side = 0  # which neighbour the next trial takes (alternating where there are two)
        self._machine, self._own, self._clock = machine, own_cpu, clock
        self._niced = _own_niceness() > 0  # (then this process's own time is in the niced column)
        self._mark = self._reading()
        self.trials = 0  # trials run, and how many changed the count (for the tools' summaries and the tests)
        self.changes = 0

    # -- the steps ---------------------------------------------------------------------------------------------

    def step(self, work: float, seconds: float) -> None:
        """Count one step's work (any unit: target tokens, lines) done in ``seconds``."""
        if self._skip:
            self._skip -= 1
            return
        self._work += work
        self._seconds += seconds
        self._steps += 1
        if self._steps < self.window:
            return
        rate = self._work / max(self._seconds, 1e-9)
        self._work = self._seconds = 0.0
        self._steps = 0
        if self._trial is None:
            self._ran(rate)
        else:
            self._tried(rate)

    def _ran(self, rate: float) -> None:
        if self.start_rate is None:
            self.start_rate = rate
        if self._chosen_rate is None:
            self._chosen_rate = rate
        if rate < self.drop * self.start_rate and not self._fallen:
            self._fallen = True
            self._events("fell", f"the rate fell to {rate / self.start_rate:.0%} of the {self.start_rate:,.0f}/s "
                         f"measured at the start ({rate:,.0f}/s with {self.threads} thread(s)): other work on this "
                         "machine?")
        elif rate >= self.drop * self.start_rate and self._fallen:
            self._fallen = False
            self._events("recovered", f"the rate is back to {rate / self.start_rate:.0%} of the start's "
                         f"({rate:,.0f}/s with {self.threads} thread(s))")
        self._since += self.window
        load = self._load()
        if load is None:  # the machine does not say: trials at doubling intervals, at once after a fall
            if rate < self.drop * self._chosen_rate:
                self._wait = min(self._wait, self._since)
            if len(self.counts) > 1 and self._since >= self._wait:
                self._begin_trial(rate, self._neighbours()[self._side % len(self._neighbours())])
                self._side += 1
            return
        others, free = load
        i = self.counts.index(self.threads)
        if i > 0 and free >= 0.5:
            target = self.counts[i - 1]  # a core is free again (idle, or left to niced programs)
        elif i + 1 < len(self.counts) and others >= self.others_busy and (not self.trials_on
                                                                           or self._since >= self._wait):
            target = self.counts[i + 1]  # programs at nice 0 take a share of the cores
        else:
            return
        if self.trials_on:
            self._begin_trial(rate, target)
        else:
            self._events("threads", f"{target} thread(s) instead of {self.threads}: other programs used "
                         f"{others:.1f} core(s), {free:.1f} free")
            self.threads = target
            self._set(target)
            self.changes += 1
            self._skip = self.settle

    def _reading(self) -> tuple[float, float, float, float, float] | None:
        cpu = self._machine()
        return None if cpu is None else (*cpu, self._own(), self._clock())

    def _load(self) -> tuple[float, float] | None:
        """(others, free) since the last window: the cores' worth of CPU time that other programs at nice 0 used,
        and that stood idle or went to niced programs; None where the machine does not say."""
        now = self._reading()
        then, self._mark = self._mark, now
        if now is None or then is None or now[4] <= then[4]:
            return None
        busy, niced, idle, own = ((a - b) / (now[4] - then[4]) for a, b in zip(now[:4], then[:4]))
        if self._niced:
            return max(0.0, busy), max(0.0, niced - own) + idle
        return max(0.0, busy - own), niced + idle

    def _neighbours(self) -> list[int]:
        i = self.counts.index(self.threads)
        return [self.counts[j] for j in (i + 1, i - 1) if 0 <= j < len(self.counts)]

    def _begin_trial(self, rate: float, target: int) -> None:
        self._trial, self._before = target, rate
        self._set(target)
        self._skip = self.settle

    def _tried(self, rate: float) -> None:
        other, self._trial = self._trial, None
        self.trials += 1
        self._since = 0
        if rate > self.margin * self._before:
            self._events("threads", f"{other} thread(s) instead of {self.threads}: {rate:,.0f}/s against "
                         f"{self._before:,.0f}/s")
            self.threads, self._chosen_rate = other, rate
            self.changes += 1
            self._wait = self.first_trial
        else:
            self._set(self.threads)
            self._skip = self.settle
            self._chosen_rate = self._before
            self._wait = min(2 * self._wait, self.longest)
