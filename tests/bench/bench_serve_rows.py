#!/usr/bin/env python3
"""Static against continuous batching without HTTP (#36): where continuous batching's time goes.

    python tests/bench/bench_serve_rows.py -m runs/quickstart/recipe/model/checkpoint_last.pt

16 clients in lock-step, as tests/bench/bench_serve.py's 16 clients are once the server keeps them in one batch:
each sends its own lines (the bench's lines, the same order), one at a time, 12 each, beam 12, in this process,
decoded (a) as static batches of the 16 lines sent together (``Translator.translate``) and (b) as one continuous
search that each line joins alone as soon as its client's previous line is done (``Translator.begin``, a
``ContinuousSearch``, ``Translator.end``) -- what nmt-serve --batching continuous does with --join-wait-ms 0.  Every
beam-search step is timed (``BeamCohort.step``: the model's step and the search's advance) and its rows and source
width recorded.  Printed: sentences a second, steps, rows and source width per step, the time in steps and in all.
Run it alone.
"""

from __future__ import annotations

import argparse
import time

import torch

from nmtkit.translate import cohort
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.continuous import ContinuousSearch
from nmtkit.translate.translator import Translator

from bench_serve import bench_lines  # (the bench's lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--each", type=int, default=12, help="lines each client sends")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    lines = bench_lines()
    t = Translator([a.model], DecodeConfig(beam=12))
    t.translate_lines(lines[:16])  # (warm-up)
    C, R = a.clients, a.each
    per = len(lines) // C
    queues = [[lines[(k * per + r) % len(lines)] for r in range(R)] for k in range(C)]

    def static() -> None:
        for r in range(R):
            t.translate_lines([queues[k][r] for k in range(C)])

    def continuous() -> None:
        search, sent, live = ContinuousSearch(t.models), [0] * C, {}

        def send(k: int) -> None:
            window, cohorts = t.begin([(1, queues[k][sent[k]])])
            sent[k] += 1
            for c in cohorts:
                search.add(c)
            live[id(cohorts[0])] = (k, window, cohorts)

        for k in range(C):
            send(k)
        while search.cohorts:
            for c in search.step():
                k, window, cohorts = live.pop(id(c))
                t.end(window, cohorts)
                if sent[k] < R:
                    send(k)

    steps: list[tuple[int, int, float]] = []
    step = cohort.BeamCohort.step

    def timed_step(self) -> None:
        start = time.perf_counter()
        step(self)
        steps.append((self.rows, self.Tx, time.perf_counter() - start))

    cohort.BeamCohort.step = timed_step
    print(f"bench_serve_rows: {C} clients x {R} lines, beam 12, {a.threads} threads, {a.model}")
    for _ in range(a.repeats):
        for f in (static, continuous):
            steps.clear()
            start = time.perf_counter()
            f()
            wall = time.perf_counter() - start
            n, busy = len(steps), sum(s[2] for s in steps)
            print(f"{f.__name__:>10}: {C * R / wall:5.1f} sentences/s; {n} steps, {sum(s[0] for s in steps) / n:6.1f} "
                  f"rows and {sum(s[1] for s in steps) / n:5.1f} source positions a step; {busy:5.2f} s in steps "
                  f"({1000 * busy / n:5.2f} ms each) of {wall:5.2f} s", flush=True)


if __name__ == "__main__":
    main()
