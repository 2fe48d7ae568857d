#!/usr/bin/env python3
"""Benchmark nmt-prepare: input pairs per second of wall time and peak memory, with --workers 1 and 2.

Runs the checkout's ``bin/nmt-prepare`` as a subprocess on

- Tatoeba (``tatoeba/fra-eng.{en,fr}.gz``, 153k short pairs), as training data;
- the older WMT news sets (``wmt-news-older/*``, 12k long pairs, six ``--train`` prefixes concatenated);

each with ``--workers 1`` and ``--workers 2``. Every measurement runs in a fresh Python process that starts
nmt-prepare, samples the memory of its process tree from /proc every 50 ms, waits for it, and reads
``resource.getrusage(RUSAGE_CHILDREN)`` — so the largest-process figure of one measurement never mixes with
another's. Two memory figures are given: the peak RSS of the largest single process (getrusage ``ru_maxrss``;
the pool workers are waited for by nmt-prepare, so they count), and the peak sampled PSS of the whole tree
(proportional set size, so pages shared by fork between the parent and the workers are not counted twice).

Usage::

    python tests/bench/bench_prepare.py            # writes tests/bench/results/bench_prepare.txt
    python tests/bench/bench_prepare.py --repeat 3 --out -

The data is found through ``$NMTKIT_DATA`` or ``../shared/data`` next to the checkout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import peers  # this script's directory

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "bin" / "nmt-prepare"
NEWS_OLDER = ["news-test2008", "newssyscomb2009", "newstest2009", "newstest2010", "newstest2011",
              "newsdiscusstest2015"]


def data_root() -> Path:
    for c in (os.environ.get("NMTKIT_DATA"), REPO.parent / "shared" / "data"):
        if c and Path(c, "tatoeba", "fra-eng.en.gz").is_file():
            return Path(c)
    sys.exit("bench_prepare: real data not found (set $NMTKIT_DATA or place it at ../shared/data)")


# -- one measurement, in its own process -----------------------------------------------------------------------


def _tree(root_pid: int) -> list[int]:
    """``root_pid`` and its descendants, from /proc/PID/task/TID/children (cheap: no scan of all of /proc)."""
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _pss_kib(pid: int) -> int:
    return int(peers.proc_kib(pid, "smaps_rollup", "Pss") or 0)


def measure(args: list[str]) -> dict:
    """Run nmt-prepare with ``args``; wall time, peak memory and exit code."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(BIN), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_pss = 0
    while proc.poll() is None:
        peak_pss = max(peak_pss, sum(_pss_kib(p) for p in _tree(proc.pid)))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode("utf-8", "replace")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # nmt-prepare and the workers it waited for
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kib": usage.ru_maxrss, "peak_pss_kib": peak_pss, "stderr": err}


# -- the driver ------------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nmtkit_version() -> str:
    out = subprocess.run([sys.executable, "-c", "import nmtkit; print(nmtkit.__version__)"], capture_output=True,
                         text=True, cwd=REPO)
    return out.stdout.strip() or "unknown"


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return out.stdout.strip() or "unknown"


def run_one(name: str, train_args: list[str], workers: int, scratch: Path) -> dict:
    dest = scratch / f"{name}-j{workers}"
    shutil.rmtree(dest, ignore_errors=True)
    args = ["-s", "en", "-t", "fr", *train_args, "--dest", str(dest), "--workers", str(workers), "--quiet"]
    # A fresh interpreter per measurement, so RUSAGE_CHILDREN covers this run only.
    out = subprocess.run([sys.executable, __file__, "--measure-json", json.dumps(args)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"bench_prepare: measurement failed: {out.stderr}")
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        sys.exit(f"bench_prepare: nmt-prepare failed ({r['rc']}): {r['stderr']}")
    with open(dest / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    r["pairs"] = sum(s["lines_in"] for s in manifest["splits"].values())
    r["kept"] = manifest["splits"]["train"]["lines_out"]
    r["tokens"] = sum(manifest["splits"]["train"]["tokens"].values())
    r["files"] = {p.name: p.read_bytes() for p in sorted(dest.iterdir())}
    shutil.rmtree(dest)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting; the fastest is reported")
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "bench_prepare.txt"),
                    help="result file ('-' for stdout only)")
    ap.add_argument("--measure-json", help=argparse.SUPPRESS)
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = ap.parse_args()
    if a.measure_json:
        print(json.dumps(measure(json.loads(a.measure_json))))
        return 0
    header = peers.start_report("bench_prepare.py", "nmt-prepare benchmark", sys.argv[1:], a.allow_dirty)
    if header is None:
        return 2

    data = data_root()
    corpora = [
        ("tatoeba", "Tatoeba fra-eng (gzip)", ["--train", str(data / "tatoeba" / "fra-eng")]),
        ("news-older", "WMT news 2008-2011, 2015 (6 files)",
         sum((["--train", str(data / "wmt-news-older" / p)] for p in NEWS_OLDER), [])),
    ]
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare.") as scratch:
        for name, label, train_args in corpora:
            results = {}
            for workers in (1, 2):
                runs = [run_one(name, train_args, workers, Path(scratch)) for _ in range(a.repeat)]
                best = min(runs, key=lambda r: r["wall_s"])
                results[workers] = best
                print(f"{name} --workers {workers}: {best['pairs']} pairs in {best['wall_s']:.1f} s", file=sys.stderr)
            identical = results[1]["files"] == results[2]["files"]
            for workers, r in results.items():
                rows.append((label, r["pairs"], r["kept"], r["tokens"], workers, r["wall_s"], r["pairs"] / r["wall_s"],
                             r["cpu_s"], r["maxrss_kib"] / 1024, r["peak_pss_kib"] / 1024,
                             results[1]["wall_s"] / r["wall_s"], identical))
    load_after = os.getloadavg()

    head = ["corpus", "pairs in", "train out", "train tokens", "workers", "wall s", "pairs/s", "CPU s",
            "max RSS MiB (largest process)", "peak PSS MiB (process tree)", "speed-up", "j1 == j2 bytes"]
    cells = [[label, f"{pairs:,}", f"{kept:,}", f"{tok:,}", str(w), f"{wall:.1f}", f"{lps:,.0f}", f"{cpu:.1f}",
              f"{rss:.0f}", f"{pss:.0f}", f"{sp:.2f}x", "yes" if same else "NO"]
             for label, pairs, kept, tok, w, wall, lps, cpu, rss, pss, sp, same in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda cs: "  ".join(c.ljust(wd) if i == 0 else c.rjust(wd) for i, (c, wd) in enumerate(zip(cs, widths)))
    table = "\n".join([line(head), line(["-" * wd for wd in widths])] + [line(c) for c in cells])

    text = "\n".join(header + [
        "",
        "nmt-prepare benchmark (tests/bench/bench_prepare.py)",
        f"date:        {started:%Y-%m-%d %H:%M %Z}",
        f"cpu:         {cpu_model()} ({os.cpu_count()} logical CPUs visible)",
        f"load avg:    {load_before[0]:.2f} before, {load_after[0]:.2f} after (1-minute; a shared machine)",
        f"nmtkit:      {nmtkit_version()} (git {git_commit()}), Python {platform.python_version()}",
        "settings:    defaults (Moses normalisation + tokenisation, 30,000-word shortlists, --max-len 50, no BPE),"
        " train split only",
        f"runs:        {a.repeat} per setting, fastest reported; wall time includes interpreter start-up",
        "",
        table,
        "",
        "pairs/s = input pairs / wall time. CPU s = user + system time of nmt-prepare and its workers (less "
        "sensitive to other load than wall time).",
        "max RSS = getrusage(RUSAGE_CHILDREN).ru_maxrss in a fresh process per "
        "run (largest single process);",
        "peak PSS = peak of the summed proportional set size of nmt-prepare and its workers, sampled every 50 ms.",
        "",
    ])
    print(text)
    if a.out != "-":
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
