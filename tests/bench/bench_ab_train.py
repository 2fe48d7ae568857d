#!/usr/bin/env python3
"""Two versions of nmtkit head to head: rnnsearch-50 training speed at one revision against another, interleaved
(about five minutes)::

    python tests/bench/bench_ab_train.py --old dafe6bb            # new = HEAD; bf16; 3 repeats
    # writes tests/bench/results/bench_ab_train.txt

On this shared VM one run's figure moves by up to ±6% with the machine's phase (bench_train.txt), more than a
change under test may gain; runs of the two versions made alternately (new, old, old, new, new, old, ...) see the
same phases, so their medians compare the code, not the hour.  Each run is ``bench_train.py``'s paper-size run:
``nmt-train`` of the revision's own checkout (a git worktree in the work directory) on the prepared Hansards, the
same seed and batches, target tokens/s over updates 4–23 from its JSON log.  (The worktrees are registered in
the repository's .git; ``git worktree prune`` forgets them once the work directory is gone.)

``--paired`` runs the two versions at the same time instead, each on one core of its own (``taskset``, one torch
thread), swapping the cores at every repeat: both see the same phase of the machine, so the ratio of the two runs
of a repeat compares the code even when the phases move by more than the change under test.  (One thread per run:
the figures are not the two-thread ones of the default mode, only their ratio compares.)

``--calls N`` measures no time: it runs each revision once for N updates under cProfile and prints how many Python
function calls the whole run made and the loss of every update -- a count the machine's noise does not move, for a
change meant to leave the computation alone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import worktree  # noqa: E402  (bench_ab_decode.py takes it from here too)

WARMUP, UPDATES = 3, 20


def run(checkout: Path, prep: Path, runs: Path, name: str, precision: str, cpu: int | None = None) -> float:
    """One paper-size run of ``checkout``'s nmt-train: its target tokens/s (on core ``cpu`` alone, one thread, when
    given)."""
    d = runs / name
    shutil.rmtree(d, ignore_errors=True)
    pin = [] if cpu is None else ["taskset", "-c", cpu]
    threads = [] if cpu is None else ["--threads", 1]
    peers.run_measured(pin + [sys.executable, checkout / "bin" / "nmt-train", prep, "--arch", "rnnsearch-50",
                        "--save-dir", d, "--max-updates", WARMUP + UPDATES, "--log-every", 1,
                        "--valid-every", 10 ** 9, "--valid-bleu-sentences", 0, "--seed", 1, "--force",
                        "--keep-last", 1] + threads + (["--bf16"] if precision == "bf16" else []),
                       env={**peers.quiet_env(), **peers.checkout_env(checkout)}, log_path=runs / f"{name}.log")
    tok_s = peers.nmtkit_tokens_per_s(d / "train.jsonl", WARMUP)["tok_s"]
    shutil.rmtree(d, ignore_errors=True)
    return tok_s


def calls(checkout: Path, prep: Path, runs: Path, name: str, precision: str, updates: int) -> tuple[int, list]:
    """``checkout``'s nmt-train for ``updates`` updates under cProfile: (Python function calls, the losses)."""
    import json
    import pstats

    d, prof = runs / name, runs / f"{name}.prof"
    shutil.rmtree(d, ignore_errors=True)
    peers.run_measured([sys.executable, "-m", "cProfile", "-o", prof, checkout / "bin" / "nmt-train", prep,
                        "--arch", "rnnsearch-50", "--save-dir", d, "--max-updates", updates, "--log-every", 1,
                        "--valid-every", 10 ** 9, "--valid-bleu-sentences", 0, "--seed", 1, "--force",
                        "--keep-last", 1] + (["--bf16"] if precision == "bf16" else []),
                       env={**peers.quiet_env(), **peers.checkout_env(checkout)}, log_path=runs / f"{name}.log")
    losses = [r["loss"] for r in map(json.loads, (d / "train.jsonl").read_text().splitlines()) if r["type"] == "train"]
    shutil.rmtree(d, ignore_errors=True)
    return pstats.Stats(str(prof)).total_calls, losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the revision to compare against")
    p.add_argument("--new", default="HEAD", help="the revision under test [HEAD]")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--repeats", type=int, default=3, help="runs of each version [3]")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=peers.REPO / "tests" / "bench" / "results" / "bench_ab_train.txt")
    p.add_argument("--paired", action="store_true", help="both versions at once, one core each (see above)")
    p.add_argument("--calls", type=int, metavar="N", help="count Python calls over N updates instead (see above)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args()
    t0 = time.time()
    out = peers.start_report("bench_ab_train.py", "nmtkit A/B training benchmark", sys.argv[1:], a.allow_dirty)
    if out is None:
        return 2
    try:
        prep = peers.prepare_real(a.work)
        runs = a.work / "ab-runs"
        checkouts = {v: worktree(a.work, getattr(a, v)) for v in ("new", "old")}
        if a.calls:
            counted = {v: calls(checkouts[v], prep, runs, f"calls-{v}", a.precision, a.calls) for v in ("new", "old")}
            out += ["", f"rnnsearch-50 {a.precision}, the first 150,000 Hansards pairs, {a.calls} updates under "
                    "cProfile (start-up included)", ""]
            out += peers.table(["version", "revision", "Python calls", "losses"],
                               [[v, f"{getattr(a, v)} ({checkouts[v].name[3:]})", f"{counted[v][0]:,}",
                                 " ".join(f"{x:.4f}" for x in counted[v][1])] for v in ("new", "old")])
            same = counted["new"][1] == counted["old"][1]
            out += ["", f"new / old calls: {counted['new'][0] / counted['old'][0]:.4f}; losses identical: "
                    f"{'yes' if same else 'NO'}", f"\ntotal time {(time.time() - t0) / 60:.1f} min"]
            return peers.fail_report(out, a.out, None)
        results: dict[str, list[float]] = {"new": [], "old": []}
        order = []
        for r in range(a.repeats):
            if a.paired:  # both at once, on cores swapped at every repeat
                cores = {"new": r % 2, "old": 1 - r % 2}
                peers.log(f"repeat {r + 1}/{a.repeats}: new on core {cores['new']}, old on core {cores['old']}")
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    jobs = {v: pool.submit(run, checkouts[v], prep, runs, f"{v}-r{r}", a.precision, cores[v])
                            for v in ("new", "old")}
                    for v in ("new", "old"):
                        results[v].append(jobs[v].result())
                order.append(f"new {results['new'][-1]:,.0f} | old {results['old'][-1]:,.0f}")
                peers.log(f"  → {order[-1]} target tokens/s")
                continue
            for v in ("new", "old") if r % 2 == 0 else ("old", "new"):
                peers.log(f"repeat {r + 1}/{a.repeats}: {v} ({getattr(a, v)})")
                tok_s = run(checkouts[v], prep, runs, f"{v}-r{r}", a.precision)
                results[v].append(tok_s)
                order.append(f"{v} {tok_s:,.0f}")
                peers.log(f"  → {tok_s:,.0f} target tokens/s")
    except (peers.BenchError, subprocess.CalledProcessError) as e:
        return peers.fail_report(out, a.out, e)
    med = {v: peers.median(x) for v, x in results.items()}
    out += ["", f"rnnsearch-50 {a.precision}, 30k vocabularies, the first 150,000 Hansards pairs, batch 80, "
            f"Adadelta; target tokens/s over updates {WARMUP + 1}–{WARMUP + UPDATES}, "
            + ("the two versions at once, one core and one thread each, cores swapped every repeat" if a.paired
               else "runs made alternately"), ""]
    out += peers.table(["version", "revision", "tok/s", "(min–max)"],
                       [[v, f"{getattr(a, v)} ({checkouts[v].name[3:]})", f"{med[v]:,.0f}",
                         peers.spread(results[v])] for v in ("new", "old")])
    out += ["", "Runs in the order made: " + "; ".join(order),
            f"new / old: {med['new'] / med['old']:.3f} (ratio of medians); per repeat (its two runs "
            + ("at the same time" if a.paired else "neighbours in time") + "): "
            f"{', '.join(f'{n / o:.3f}' for n, o in zip(results['new'], results['old']))} (median "
            f"{peers.median([n / o for n, o in zip(results['new'], results['old'])]):.3f})",
            f"\nload average at end: {peers.load_average()}; total time {(time.time() - t0) / 60:.1f} min"]
    return peers.fail_report(out, a.out, None)


if __name__ == "__main__":
    sys.exit(main())
