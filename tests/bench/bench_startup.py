#!/usr/bin/env python3
"""Start-up cost of ``nmt-translate``: one line through a shell pipeline, and a large file, before and after.

    python tests/bench/bench_startup.py --model runs/quality/nmtkit/model/checkpoint_last.pt --baseline 99a56cc

For the working tree and for the ``--baseline`` commit (checked out in a temporary git worktree, run with the same
interpreter and packages), alternately, ``--repeats`` times each:

- **one line**: ``echo LINE | nmt-translate -m MODEL`` with default options, the wall time of the whole process
  (interpreter start, imports, model loading, decoding, exit), measured from here;
- **large file**: the first ``--sentences`` lines of news-test-2014 (default 1,000), default options, the same wall
  time, reported as sentences per second.

Medians are printed with the spread (min-max) and appended to ``tests/bench/results/bench_startup.txt``. Run it alone
on the machine: it measures wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)
LINE = "The committee will report to the House before the end of the month."


def _wall(cmd: list[str], stdin: bytes, cwd: Path) -> tuple[float, bytes]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # (the tree's own nmtkit: bin/ has no sys.path of its own)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, cwd=cwd, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_startup: {' '.join(cmd)} failed: {proc.stderr.decode()[-500:]}")
    return wall, proc.stdout


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a small model's checkpoint")
    p.add_argument("--baseline", required=True, help="the commit to compare with (e.g. the main before the change)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "bench_startup.txt"))
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    start = peers.start_report("bench_startup.py", "nmt-translate start-up against an older commit", args,
                               a.allow_dirty)
    if start is None:
        return 2
    model = str(Path(a.model).resolve())
    big = "".join(f"{x}\n" for x in (DATA / "wmt14" / "newstest2014.en").read_text(encoding="utf-8")
                  .splitlines()[: a.sentences]).encode()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), a.baseline], check=True,
                       capture_output=True)
        try:
            trees = {"baseline": base, "now": REPO}
            times: dict[tuple[str, str], list[float]] = {}
            outputs: dict[tuple[str, str], bytes] = {}
            for r in range(a.repeats):
                for name in (("baseline", "now") if r % 2 == 0 else ("now", "baseline")):
                    tool = [sys.executable, str(trees[name] / "bin" / "nmt-translate"), "-m", model, "-q"]
                    for job, stdin in (("one line", (LINE + "\n").encode()), ("large file", big)):
                        wall, out = _wall(tool, stdin, trees[name])
                        times.setdefault((name, job), []).append(wall)
                        outputs[(name, job)] = out
                        print(f"repeat {r + 1} {name:8} {job:10} {wall:7.2f} s", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    lines = [f"nmt-translate start-up: {Path(a.model).name} ({a.model}); default options; {a.repeats} alternate runs "
             f"each; medians (min-max); {os.cpu_count()} cores", "",
             f"{'':28}{'baseline ' + a.baseline:>26}{'now ' + head:>26}{'ratio':>8}"]
    t = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: f"({min(v):.2f}-{max(v):.2f})" for k, v in times.items()}
    lines.append(f"{'one line, wall s':28}" + "".join(f"{t[(n, 'one line')]:>12.2f} {spread[(n, 'one line')]:>13}"
                                                       for n in ("baseline", "now"))
                 + f"{t[('now', 'one line')] / t[('baseline', 'one line')]:>8.2f}")
    sps = {n: a.sentences / t[(n, "large file")] for n in ("baseline", "now")}
    lines.append(f"{f'{a.sentences:,} lines, sent/s':28}" + "".join(f"{sps[n]:>12.1f} {spread[(n, 'large file')]:>13}"
                                                                   for n in ("baseline", "now"))
                 + f"{sps['now'] / sps['baseline']:>8.2f}")
    lines.append("")
    same = all(outputs[("baseline", j)] == outputs[("now", j)] for j in ("one line", "large file"))
    lines.append(f"outputs identical between the two: {'yes' if same else 'NO'}  (large-file spreads are wall s)")
    text = "\n".join(lines) + "\n"
    print("\n".join(start) + "\n")
    print(text)
    out = Path(a.out)  # (appended: the file keeps every run, each under its command line)
    earlier = out.read_text(encoding="utf-8") if out.is_file() else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = ("\n" + "=" * 118 + "\n" if earlier else "") + "\n".join(start) + "\n\n" \
        + f"Run of {when}: {' '.join(['python', *sys.argv])}\n\n"
    out.write_text(earlier + header + text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
