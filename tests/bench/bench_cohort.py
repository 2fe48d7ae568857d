"""What a batch in continuous batching costs a step (#36): the model's step against a cohort's own bookkeeping.

    python tests/bench/bench_cohort.py -m MODEL.pt > tests/bench/results/bench_cohort.txt

Beam search at beam 12 over 16 Hansards test sentences (every 9th of 6-40 words: lengths vary), on one or two
threads: (1) one cohort of 1, 4 and 16 sentences stepped to the end, milliseconds per step in the models' step
(``Ensemble.step``) and in the rest of the step (``BeamCohort.advance``: masks, top-k, finished hypotheses,
reordering); (2) the same 16 sentences as one cohort, and as 16 cohorts of one joined into one search by
``ContinuousSearch``: milliseconds for the whole search, and whether both give the same translations.  Run alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--threads", default="1,2")
    a = p.parse_args(argv)
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.continuous import ContinuousSearch
    from nmtkit.translate.translator import Translator

    test = (DATA / "hansards" / "test.en").read_text(encoding="utf-8").splitlines()
    lines = [x for x in test if 6 <= len(x.split()) <= 40][::9][:16]
    git = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"bench_cohort (tests/bench/bench_cohort.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, git "
          f"{git.stdout.strip()}; load average {os.getloadavg()[0]:.2f}\nmodel {a.model}; beam 12; 16 Hansards test "
          f"sentences (every 9th of those of 6-40 words: {min(len(x.split()) for x in lines)}-"
          f"{max(len(x.split()) for x in lines)} words)\n")
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        t = Translator([a.model], DecodeConfig(beam=12), workers=1, threads=threads)
        numbered = list(enumerate(lines, start=1))
        for c in t.begin(numbered[:4])[1]:  # (warm-up)
            while not c.done:
                c.step()
        print(f"{threads} thread(s): one cohort stepped alone")
        for n in (1, 4, 16):
            _, (c,) = t.begin(numbered[:n])
            step_s = advance_s = 0.0
            steps = 0
            while not c.done:
                t0 = time.perf_counter()
                logp, states, alpha = c.ens.step(c.y, c.states, c.encs)
                t1 = time.perf_counter()
                c.advance(logp, states, alpha)
                step_s += t1 - t0
                advance_s += time.perf_counter() - t1
                steps += 1
            print(f"  {n:2} sentence(s): {steps:3} steps; model step {1000 * step_s / steps:6.2f} ms, the cohort's "
                  f"own rest of the step {1000 * advance_s / steps:5.2f} ms")
        w, (one,) = t.begin(numbered)
        t0 = time.perf_counter()
        while not one.done:
            one.step()
        whole = time.perf_counter() - t0
        search, singles = ContinuousSearch(t.models), []
        for line in numbered:
            w1, (c,) = t.begin([line])
            singles.append((w1, c))
            search.add(c)
        t0 = time.perf_counter()
        steps = 0
        while search.cohorts:
            search.step()
            steps += 1
        apart = time.perf_counter() - t0
        same = [x.text for x in t.end(w, [one])] == [t.end(w1, [c])[0].text for w1, c in singles]
        print(f"  16 sentences as one cohort: {1000 * whole:7.0f} ms; as 16 cohorts of one joined "
              f"({steps} steps): {1000 * apart:7.0f} ms ({apart / whole:.2f}x); the same translations: {same}\n")


if __name__ == "__main__":
    main()
