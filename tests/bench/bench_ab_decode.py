#!/usr/bin/env python3
"""Two versions of nmtkit head to head: ``nmt-translate`` at one revision against another, on the same checkpoint,
the same lines and options (about ten minutes)::

    python tests/bench/bench_ab_decode.py --old a975d8e -m runs/hour/nmtkit/run/model/checkpoint_last.pt \\
        --input ../shared/data/wmt14/newstest2014.en --lines 300 --paired --repeats 6
    # writes tests/bench/results/bench_ab_decode.txt

Each run is the revision's own ``bin/nmt-translate`` (a git worktree in the work directory, as
``bench_ab_train.py`` makes them) decoding the first ``--lines`` lines of ``--input`` with ``--beam 12`` (or
``--options``), in one process of one thread.  Its decoding time is the wall clock of that run less the wall clock
of the same command on one line (start-up, model loading and one sentence), measured in the same repeat, so a
change in start-up does not count as decoding speed.  ``--paired`` runs the two versions at the same time, each on
one core of its own (``taskset``), swapping the cores at every repeat (as ``bench_ab_train.py --paired``): the
ratio of a repeat's two runs compares the code even when the machine's phase moves.  The outputs of every run are
compared line by line: a change meant to leave decoding alone must give the same text.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from bench_ab_train import worktree  # noqa: E402


def run(checkout: Path, model: Path, source: Path, out: Path, options: list[str], cpu: int | None) -> float:
    """One ``nmt-translate`` of ``checkout`` over ``source`` into ``out``, one thread (on core ``cpu`` when given):
    its wall clock in seconds."""
    pin = [] if cpu is None else ["taskset", "-c", cpu]
    m = peers.run_measured(pin + [sys.executable, checkout / "bin" / "nmt-translate", "-m", model, "-i", source,
                                  "-o", out, "--threads", 1, "--workers", 1, "-q", *options],
                           env={**peers.quiet_env(), **peers.checkout_env(checkout), "OMP_NUM_THREADS": "1"},
                           log_path=out.with_suffix(".log"))
    return m.wall_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the revision to compare against")
    p.add_argument("--new", default="HEAD", help="the revision under test [HEAD]")
    p.add_argument("-m", "--model", type=Path, required=True, help="a checkpoint both revisions can read")
    p.add_argument("--input", type=Path, required=True, help="source text, one sentence a line")
    p.add_argument("--lines", type=int, default=300, help="lines of --input decoded [300]")
    p.add_argument("--options", default="--beam 12", help="nmt-translate's decoding options [--beam 12]")
    p.add_argument("--repeats", type=int, default=6, help="runs of each version [6]")
    p.add_argument("--paired", action="store_true", help="both versions at once, one core each (see above)")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=peers.REPO / "tests" / "bench" / "results" / "bench_ab_decode.txt")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args()
    t0 = time.time()
    out = peers.start_report("bench_ab_decode.py", "nmtkit A/B decoding benchmark", sys.argv[1:], a.allow_dirty)
    if out is None:
        return 2
    options = shlex.split(a.options)
    runs = a.work / "ab-decode"
    runs.mkdir(parents=True, exist_ok=True)
    source, one = runs / "source.txt", runs / "one.txt"
    with open(a.input, encoding="utf-8") as f:
        lines = list(itertools.islice(f, a.lines))
    if len(lines) < a.lines:
        raise SystemExit(f"bench_ab_decode: {a.input} has {len(lines)} lines, fewer than --lines {a.lines}")
    source.write_text("".join(lines), encoding="utf-8")
    one.write_text(lines[0], encoding="utf-8")
    try:
        checkouts = {v: worktree(a.work, getattr(a, v)) for v in ("new", "old")}
        decode: dict[str, list[float]] = {"new": [], "old": []}
        start: dict[str, list[float]] = {"new": [], "old": []}
        outputs: dict[str, set[str]] = {"new": set(), "old": set()}
        order = []

        def both(job, r):
            """``job(version, core)`` for the two versions, at once (paired) or one after the other."""
            if not a.paired:
                return {v: job(v, None) for v in (("new", "old") if r % 2 == 0 else ("old", "new"))}
            cores = {"new": r % 2, "old": 1 - r % 2}
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                jobs = {v: pool.submit(job, v, cores[v]) for v in ("new", "old")}
                return {v: jobs[v].result() for v in ("new", "old")}

        for r in range(a.repeats):
            peers.log(f"repeat {r + 1}/{a.repeats}")
            s = both(lambda v, c: run(checkouts[v], a.model, one, runs / f"{v}-one.out", options, c), r)
            w = both(lambda v, c: run(checkouts[v], a.model, source, runs / f"{v}-r{r}.out", options, c), r)
            for v in ("new", "old"):
                start[v].append(s[v])
                decode[v].append(w[v] - s[v])
                outputs[v].add(hashlib.sha256((runs / f"{v}-r{r}.out").read_bytes()).hexdigest())
            order.append(f"new {a.lines / decode['new'][-1]:.2f} | old {a.lines / decode['old'][-1]:.2f}")
            peers.log(f"  → {order[-1]} sentences/s")
    except (peers.BenchError, subprocess.CalledProcessError) as e:
        return peers.fail_report(out, a.out, e)
    new_lines = (runs / "new-r0.out").read_text(encoding="utf-8").splitlines()
    old_lines = (runs / "old-r0.out").read_text(encoding="utf-8").splitlines()
    differ = sum(x != y for x, y in zip(new_lines, old_lines)) + abs(len(new_lines) - len(old_lines))
    rate = {v: [a.lines / t for t in decode[v]] for v in decode}
    med = {v: peers.median(x) for v, x in rate.items()}
    out += ["", f"nmt-translate {a.options}, one process of one thread, the first {a.lines} lines of {a.input.name}; "
            f"checkpoint {a.model}; decoding time = wall clock of the run less that of the same command on its first "
            "line; " + ("the two versions at once, one core each, cores swapped every repeat" if a.paired
                        else "runs made alternately"), ""]
    out += peers.table(["version", "revision", "sentences/s", "(min–max)", "start-up s"],
                       [[v, f"{getattr(a, v)} ({checkouts[v].name[3:]})", f"{med[v]:.2f}", peers.spread(rate[v]),
                         f"{peers.median(start[v]):.2f}"] for v in ("new", "old")])
    ratios = [n / o for n, o in zip(rate["new"], rate["old"])]
    out += ["", "Runs in the order made: " + "; ".join(order),
            f"new / old: {med['new'] / med['old']:.3f} (ratio of medians); per repeat: "
            f"{', '.join(f'{x:.3f}' for x in ratios)} (median {peers.median(ratios):.3f})",
            "outputs: every run of a version the same text: "
            f"{'yes' if all(len(o) == 1 for o in outputs.values()) else 'NO'}; new against old: {differ} of {a.lines} "
            "lines differ",
            f"\nload average at end: {peers.load_average()}; total time {(time.time() - t0) / 60:.1f} min"]
    return peers.fail_report(out, a.out, None)


if __name__ == "__main__":
    sys.exit(main())
