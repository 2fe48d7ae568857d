#!/usr/bin/env python3
"""Whether a change meant to leave decoding alone did: ``nmt-translate`` at one revision against another, on the same
checkpoint and lines, under every kind of search, compared byte for byte (a refactoring's evidence)::

    python tests/bench/bench_same_outputs.py --old 00b9d9f -m /tmp/nmtkit-bench/cand/model/checkpoint_last.pt \\
        --candidates /tmp/nmtkit-bench/prep-hour150k-spm16000/candidates.npz
    # writes tests/bench/results/bench_same_outputs.txt

Each revision's own ``bin/nmt-translate`` (a git worktree in the work directory) decodes the first ``--lines``
lines of ``hansards/test`` and of ``newstest2014`` (from ``$NMTKIT_DATA`` or ``../shared/data``) once per setting
of :data:`SETTINGS` -- one-hour.sh's options (with ``--candidates`` when given, and without), greedy, an n-best
list of 5, forced prefixes (the first two words of the reference, on every other line), sampling with a seed, the
coverage penalty with ``--replace-unk``, posterior alignments -- writing the translations, the n-best list (text,
features, scores), the Pharaoh links and the scores.  Every file of the new revision must equal the old one's.  The
two revisions run side by side, one core and one thread each: this script times nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

HOUR = ["--beam", "12", "--no-repeat-ngram", "4", "--source-numbers", "--all-numbers"]  # examples/one-hour.sh
# name -> (nmt-translate's options, whether it reads the candidate table, whether it is forced through prefixes)
SETTINGS = {
    "one-hour.sh, n-best 5": (HOUR + ["--nbest", "5"], True, False),
    "one-hour.sh, whole vocabulary": (HOUR + ["--nbest", "5"], False, False),
    "beam 12, n-best 5": (["--beam", "12", "--nbest", "5"], False, False),
    "greedy (beam 1), posterior links": (["--beam", "1", "--alignment-method", "posterior"], False, False),
    "prefixes, one-hour.sh": (HOUR + ["--nbest", "3"], True, True),
    "sampling topk:10, seed 7, 3 a line": (["--sampling", "topk:10", "--seed", "7", "--nbest", "3"], False, False),
    "coverage 0.2, --replace-unk, --no-repeat-ngram 3": (
        ["--beam", "5", "--nbest", "2", "--coverage-penalty", "0.2", "--replace-unk", "--no-repeat-ngram", "3"],
        False, False),
}
FILES = ("out", "nbest", "links", "scores")


def translate(checkout: Path, model: Path, src: Path, dest: Path, options: list[str], prefix: Path | None,
              cpu: int) -> None:
    """One decoding of ``src`` by ``checkout``'s nmt-translate, its files ``dest``.{out,nbest,links,scores}."""
    cmd = ["taskset", "-c", str(cpu), sys.executable, checkout / "bin" / "nmt-translate", "-m", model, "-i", src,
           "-o", dest.with_suffix(".out"), "--nbest-file", dest.with_suffix(".nbest"),
           "--alignments", dest.with_suffix(".links"), "--scores", dest.with_suffix(".scores"),
           "--threads", "1", "--workers", "1", "-q", *options] + (["--prefix", prefix] if prefix else [])
    peers.run_measured([str(c) for c in cmd], env={**peers.quiet_env(), **peers.checkout_env(checkout),
                                                   "OMP_NUM_THREADS": "1"}, log_path=dest.with_suffix(".log"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the revision to compare against")
    p.add_argument("--new", default="HEAD", help="the revision under test [HEAD]")
    p.add_argument("-m", "--model", type=Path, required=True, help="a checkpoint both revisions can read")
    p.add_argument("--candidates", type=Path, help="the model's candidate table (one-hour.sh's --candidates)")
    p.add_argument("--lines", type=int, default=200, help="lines of each set [200]")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=peers.REPO / "tests" / "bench" / "results" / "bench_same_outputs.txt")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args()
    t0 = time.time()
    out = peers.start_report("bench_same_outputs.py", "nmtkit: the same outputs before and after a change",
                             sys.argv[1:], a.allow_dirty)
    if out is None:
        return 2
    root = peers.data_root()
    if root is None:
        return peers.fail_report(out, a.out, peers.BenchError("no data: set NMTKIT_DATA or ../shared/data"))
    runs = a.work / "same-outputs"
    runs.mkdir(parents=True, exist_ok=True)
    sets = {}
    for name, stem in (("hansards/test", root / "hansards" / "test"), ("newstest2014", root / "wmt14" / "newstest2014")):
        key = name.replace("/", "-")
        with open(f"{stem}.en", encoding="utf-8") as f, open(f"{stem}.fr", encoding="utf-8") as g:
            pairs = list(itertools.islice(zip(f, g), a.lines))
        (runs / f"{key}.en").write_text("".join(en for en, _ in pairs), encoding="utf-8")
        (runs / f"{key}.prefix").write_text("".join(" ".join(fr.split()[:2]) + "\n" if k % 2 == 0 else "\n"
                                                    for k, (_, fr) in enumerate(pairs)), encoding="utf-8")
        sets[name] = key
    try:
        checkouts = {v: peers.worktree(a.work, getattr(a, v), prefix="same") for v in ("old", "new")}
        rows = []
        for setting, (options, lists, prefixed) in SETTINGS.items():
            if lists and a.candidates is None:
                continue
            options = options + (["--candidates", str(a.candidates)] if lists else [])
            for name, key in sets.items():
                peers.log(f"{setting} | {name}")
                dest = {v: runs / f"{v}-{len(rows)}" for v in checkouts}
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    jobs = [pool.submit(translate, checkouts[v], a.model, runs / f"{key}.en", dest[v], options,
                                        runs / f"{key}.prefix" if prefixed else None, cpu)
                            for cpu, v in enumerate(checkouts)]
                    for job in jobs:
                        job.result()
                same, differ = [], []
                for kind in FILES:
                    old, new = (dest[v].with_suffix(f".{kind}").read_bytes() for v in ("old", "new"))
                    if old == new:
                        same.append(kind)
                    else:
                        lines = sum(x != y for x, y in itertools.zip_longest(old.splitlines(), new.splitlines()))
                        differ.append(f"{kind} ({lines} lines)")
                digest = hashlib.sha256(dest["new"].with_suffix(".nbest").read_bytes()).hexdigest()[:12]
                rows.append([setting, name, "yes" if not differ else "NO: " + ", ".join(differ), digest])
    except (peers.BenchError, subprocess.CalledProcessError) as e:
        return peers.fail_report(out, a.out, e)
    out += ["", f"old {a.old} ({peers.commit_of(a.old)[:12]}), new {a.new} ({peers.commit_of(a.new)[:12]}); "
            f"checkpoint {a.model}; candidates {a.candidates}; the first {a.lines} lines of each set; files compared: "
            f"translations, n-best list, Pharaoh links, scores", ""]
    out += peers.table(["setting", "set", "identical", "n-best sha256"], rows, align="llll")
    same = all(r[2] == "yes" for r in rows)
    out += ["", f"every file identical: {'yes' if same else 'NO'}",
            f"load average at end: {peers.load_average()}; total time {(time.time() - t0) / 60:.1f} min"]
    peers.fail_report(out, a.out, None)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
