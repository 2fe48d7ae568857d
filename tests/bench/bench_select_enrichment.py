#!/usr/bin/env python3
"""How well nmt-select finds in-domain pairs hidden in a general pool, before and after a change.

    python tests/bench/bench_select_enrichment.py --baseline 5c4bc3a              # the 15,003-pair pool
    python tests/bench/bench_select_enrichment.py --baseline 5c4bc3a --parts pool,hansards

In-domain: news-test-2010 + news-test-2011 (``wmt-news-older``). Parts:

``pool``  15,003 pairs: 6,000 Hansards training pairs (every 150th), 6,000 Tatoeba pairs (every 30th) and the 3,003
    pairs of news-test-2012; ``--top-words 70000`` (English words). News is 20% of the pool's pairs.
``hansards``  The whole Hansards training corpus (914,450 pairs) with news-test-2012's 3,003 pairs appended;
    ``--top-pairs 3003``: how many of the selected pairs are the news ones (about 5 minutes a run on two cores).

For the working tree and the ``--baseline`` commit (a temporary git worktree, same interpreter), it prints the
composition of each selection and the median H_gen and H_in (bits per token, English) of the news pairs, and writes
``tests/bench/results/bench_select_enrichment.txt``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")


def _build(work: Path, part: str) -> tuple[list[str], list[str], list[str]]:
    """The in-domain prefix, the general prefixes and their names."""
    for lang in ("en", "fr"):
        _write(work / f"in.{lang}", _lines(DATA / "wmt-news-older" / f"newstest2010.{lang}")
               + _lines(DATA / "wmt-news-older" / f"newstest2011.{lang}"))
        news = _lines(DATA / "wmt14" / f"newstest2012.{lang}")
        hansards = _lines(DATA / "hansards" / f"train.{lang}.gz")
        if part == "pool":
            _write(work / f"hansards.{lang}", hansards[::150][:6000])
            _write(work / f"tatoeba.{lang}", _lines(DATA / "tatoeba" / f"fra-eng.{lang}.gz")[::30][:6000])
        else:
            _write(work / f"hansards.{lang}", hansards)
        _write(work / f"news.{lang}", news)
    names = ["hansards", "tatoeba", "news"] if part == "pool" else ["hansards", "news"]
    return [str(work / "in")], [str(work / n) for n in names], names


def _select(tree: Path, work: Path, in_domain, general, limit: list[str], out: Path) -> tuple[dict, float]:
    cmd = [sys.executable, str(tree / "bin" / "nmt-select"), "-s", "en", "-t", "fr", "-o", str(out),
           "--workers", "2", "-q", *limit]
    for p in in_domain:
        cmd += ["--in-domain", p]
    for p in general:
        cmd += ["--general", p]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode != 0:
        raise SystemExit(f"bench_select_enrichment: {proc.stderr[-800:]}")
    wall = time.perf_counter() - t0
    lines = Path(f"{out}.scores").read_text(encoding="utf-8").splitlines()
    body = [x for x in lines if not x.startswith("#")]
    cols = body[0].split("\t")
    rows = [dict(zip(cols, x.split("\t"))) for x in body[1:]]
    return {"rows": rows}, wall


def _summary(rows: list[dict], names: list[str]) -> dict:
    corpus = np.array([int(r["corpus"]) for r in rows])
    chosen = np.array([r["selected"] == "1" for r in rows])
    h_gen = np.array([float(r["h_gen_en"]) for r in rows])
    h_in = np.array([float(r["h_in_en"]) for r in rows])
    news = corpus == names.index("news") + 1
    ok = np.isfinite(h_gen)
    return {"selected": int(chosen.sum()),
            "by_corpus": {n: int((chosen & (corpus == k + 1)).sum()) for k, n in enumerate(names)},
            "news_h_gen": float(np.median(h_gen[news & ok])), "news_h_in": float(np.median(h_in[news & ok])),
            "other_h_gen": float(np.median(h_gen[~news & ok]))}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True)
    p.add_argument("--parts", default="pool")
    p.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "bench_select_enrichment.txt"))
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    header = peers.start_report("bench_select_enrichment.py", "nmt-select: in-domain pairs found in a general pool",
                                args, a.allow_dirty)
    if header is None:
        return 2
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    report = header + [""]
    report += [f"nmt-select enrichment: in-domain news-test-2010+2011; baseline {a.baseline}, now {head} (+ working "
               "tree); H = median per-token cross-entropy in bits (English side)", ""]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), a.baseline], check=True,
                       capture_output=True)
        try:
            for part in a.parts.split(","):
                work = Path(tmp) / part
                work.mkdir()
                in_domain, general, names = _build(work, part)
                limit = ["--top-words", "70000"] if part == "pool" else ["--top-pairs", "3003"]
                sizes = {n: len(_lines(Path(g + ".en"))) for n, g in zip(names, general)}
                report.append(f"{part}: " + ", ".join(f"{n} {c:,}" for n, c in sizes.items())
                              + f" pairs; {' '.join(limit)}")
                report.append(f"  {'':10} {'selected':>9} " + " ".join(f"{n:>9}" for n in names)
                              + f" {'news H_gen':>11} {'news H_in':>10} {'other H_gen':>12} {'wall s':>7}")
                for label, tree in (("baseline", base), ("now", REPO)):
                    res, wall = _select(tree, work, in_domain, general, limit, work / f"sel-{label}")
                    s = _summary(res["rows"], names)
                    report.append(f"  {label:10} {s['selected']:>9,} " + " ".join(f"{s['by_corpus'][n]:>9,}"
                                                                             for n in names)
                                  + f" {s['news_h_gen']:>11.2f} {s['news_h_in']:>10.2f} {s['other_h_gen']:>12.2f}"
                                  + f" {wall:>7.0f}")
                    print(report[-1], file=sys.stderr)
                report.append("")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)
    text = "\n".join(report) + "\n"
    print(text)
    Path(a.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
