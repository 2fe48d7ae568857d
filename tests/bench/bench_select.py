#!/usr/bin/env python3
"""Benchmark nmt-select: words per second for counting and for scoring, with 1 and 2 workers, and peak memory,
on the whole Hansards training corpus (914,450 pairs, ~14M words a side) as the general corpus; and an estimate of
time and memory for the paper's 850M words.

Two parts, each measured in a fresh process:

A. **nmt-select end to end** (the checkout's ``bin/nmt-select``): in-domain = the six older WMT news sets
   (12,070 pairs), general = ``hansards/train.{en,fr}.gz``, order 4, ``--top-pairs`` 41% of the pairs (the paper
   kept 348M of 850M words), ``--workers 1`` and ``--workers 2``. The step timings come from the run's
   ``OUT.report.json``; memory is sampled from /proc as in ``bench_prepare.py`` (peak RSS of the largest process,
   peak PSS of the process tree). The outputs of the two runs are compared byte for byte.
B. **The language model code at scale**, without Moses tokenisation (whitespace tokens of the English side of the
   same corpus, vocabulary = words seen twice): counting and estimating one order-4 model on all ~14M words, then
   scoring all of them with it, in one process; its peak RSS. This is what the LM code costs when the in-domain
   data (and so the general-corpus sample) is as large as the whole Hansards.

Usage::

    python tests/bench/bench_select.py                       # writes tests/bench/results/bench_select.txt
    python tests/bench/bench_select.py --prefix 200000 --out -    # a measured prefix of the Hansards only

The data is found through ``$NMTKIT_DATA`` or ``../shared/data`` next to the checkout.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import peers  # this script's directory
from bench_prepare import _pss_kib, _tree, cpu_model  # the same /proc measuring (this script's directory)

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "bin" / "nmt-select"
NEWS_OLDER = ["news-test2008", "newssyscomb2009", "newstest2009", "newstest2010", "newstest2011",
              "newsdiscusstest2015"]
PAPER_WORDS = 850e6
KEEP = 0.41  # the paper: 348M of 850M words


def data_root() -> Path:
    for c in (os.environ.get("NMTKIT_DATA"), REPO.parent / "shared" / "data"):
        if c and Path(c, "hansards", "train.en.gz").is_file():
            return Path(c)
    sys.exit("bench_select: real data not found (set $NMTKIT_DATA or place it at ../shared/data)")


# -- measuring a child process (the /proc readers come from bench_prepare.py) ------------------------------------


def _busy_jiffies() -> int:
    """CPU time used by everything on the machine so far (all CPUs, /proc/stat), in clock ticks."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def measure(cmd: list[str]) -> dict:
    """Run ``cmd``; wall time, CPU time, peak memory, exit code and output (call in a fresh process)."""
    busy = _busy_jiffies()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak_pss = 0
    while proc.poll() is None:
        peak_pss = max(peak_pss, sum(_pss_kib(p) for p in _tree(proc.pid)))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    busy = (_busy_jiffies() - busy) / os.sysconf("SC_CLK_TCK")
    out, err = proc.communicate()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": cpu, "others_cores": max(0.0, (busy - cpu) / wall),
            "maxrss_kib": usage.ru_maxrss, "peak_pss_kib": peak_pss, "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace")}


def measured(cmd: list[str]) -> dict:
    """:func:`measure` in a fresh interpreter, so that RUSAGE_CHILDREN covers this command only."""
    out = subprocess.run([sys.executable, __file__, "--measure-json", json.dumps(cmd)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"bench_select: measurement failed: {out.stderr}")
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        sys.exit(f"bench_select: {cmd[1]} failed ({r['rc']}): {r['stderr'][-3000:]}")
    return r


# -- part B: the LM code alone, at scale ---------------------------------------------------------------------------


def lm_scale(path: str, lines: int | None) -> dict:
    """Count, estimate and score an order-4 model on whitespace tokens of ``path`` (run in its own process)."""
    sys.path.insert(0, str(REPO))
    from collections import Counter
    from itertools import islice

    import numpy as np

    from nmtkit.select.lm import LMVocab, NgramLM
    from nmtkit.select.lm_count import NgramCounter

    def sentences():
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
            for line in islice(f, lines):
                yield line.split()

    t0 = time.perf_counter()
    counts = Counter()
    for s in sentences():
        counts.update(s)
    vocab = LMVocab.build(counts, 2)
    del counts
    t1 = time.perf_counter()
    counter = NgramCounter(4, len(vocab))
    for s in sentences():
        counter.add(vocab.ids(s))
    ngrams = counter.finish()
    t2 = time.perf_counter()
    rss_counted = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lm = NgramLM.estimate(ngrams, vocab)
    del ngrams, counter
    t3 = time.perf_counter()
    model_bytes = sum(a.nbytes for arrays in (lm.keys, lm.logp, lm.backoff) for a in arrays if a is not None)
    total, batch, it = 0.0, 1000, sentences()
    t4 = time.perf_counter()
    while block := list(islice(it, batch)):
        ids = [vocab.ids(s) for s in block]
        words = np.fromiter((i for s in ids for i in s), dtype=np.int64)
        total += float(lm.score_ids([len(s) for s in ids], words).sum())
    t5 = time.perf_counter()
    return {"words": lm.tokens, "sentences": lm.sentences, "vocab": len(vocab), "ngrams": lm.sizes(),
            "vocab_s": t1 - t0, "count_s": t2 - t1, "estimate_s": t3 - t2, "score_s": t5 - t4,
            "rss_counted_kib": rss_counted, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "model_bytes": model_bytes, "perplexity": 10 ** (-total / (lm.tokens + lm.sentences))}


# -- the driver ------------------------------------------------------------------------------------------------------


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(["git", "status", "--porcelain", "nmtkit"], capture_output=True, text=True, cwd=REPO)
    return (out.stdout.strip() or "unknown") + (" + uncommitted changes" if dirty.stdout.strip() else "")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda cs: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths)))  # noqa
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, help="use only the first N Hansards pairs (and say so)")
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "bench_select.txt"),
                    help="result file ('-' for stdout only)")
    ap.add_argument("--measure-json", help=argparse.SUPPRESS)
    ap.add_argument("--lm-scale-json", help=argparse.SUPPRESS)
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = ap.parse_args()
    if a.measure_json:
        print(json.dumps(measure(json.loads(a.measure_json))))
        return 0
    if a.lm_scale_json:
        print(json.dumps(lm_scale(*json.loads(a.lm_scale_json))))
        return 0
    head = peers.start_report("bench_select.py", "nmt-select benchmark", sys.argv[1:], a.allow_dirty)
    if head is None:
        return 2

    data = data_root()
    started = datetime.datetime.now().astimezone()
    loads = [os.getloadavg()]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench_select.") as scratch:
        scratch = Path(scratch)
        general = data / "hansards" / "train"
        if a.prefix:
            for lang in ("en", "fr"):
                with gzip.open(f"{general}.{lang}.gz", "rt", encoding="utf-8", newline="\n") as f, \
                        open(scratch / f"general.{lang}", "w", encoding="utf-8", newline="\n") as out:
                    for _, line in zip(range(a.prefix), f):
                        out.write(line)
            general = scratch / "general"
        pairs = a.prefix or 914450
        for workers in (1, 2):
            out = scratch / f"sel-j{workers}"
            cmd = [sys.executable, str(BIN), "-s", "en", "-t", "fr", "--general", str(general),
                   "--top-pairs", str(round(KEEP * pairs)), "-o", str(out), "--workers", str(workers), "-q",
                   *sum((["--in-domain", str(data / "wmt-news-older" / p)] for p in NEWS_OLDER), [])]
            print(f"bench_select: nmt-select --workers {workers} ...", file=sys.stderr, flush=True)
            r = measured(cmd)
            r["report"] = json.loads(Path(f"{out}.report.json").read_text(encoding="utf-8"))
            r["hashes"] = {s: sha256(Path(f"{out}.{s}")) for s in ("en", "fr", "scores")}
            r["scores_bytes"] = os.path.getsize(f"{out}.scores")
            runs[workers] = r
            loads.append(os.getloadavg())
            for s in ("en", "fr", "scores", "report.json"):
                Path(f"{out}.{s}").unlink()
        print("bench_select: LM code at scale ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--lm-scale-json",
                              json.dumps([str(data / "hansards" / "train.en.gz"), a.prefix])],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"bench_select: LM scale run failed: {out.stderr}")
        scale = json.loads(out.stdout)
        loads.append(os.getloadavg())
    text = "\n".join(head) + "\n\n" + render(a, started, loads, runs, scale)
    print(text)
    if a.out != "-":
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text, encoding="utf-8")
    return 0


def render(a, started, loads, runs, scale) -> str:
    rep1 = runs[1]["report"]
    gen_en = rep1["general"]["tokens"]["en"]
    gen_words = sum(rep1["general"]["tokens"].values())
    samples = rep1["general"]["sample"]["models"]  # one per fold (each scores its half, trained on the other)
    lm_tokens = sum(rep1["in_domain"]["tokens"].values()) + sum(sum(m["tokens"].values()) for m in samples)
    rows = []
    for w, r in runs.items():
        sec = r["report"]["seconds"]
        rows.append([str(w), f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}",
                     f"{sec['in_domain_tokenize'] + sec['sample_tokenize']:.0f}", f"{sec['lm_count_estimate']:.1f}",
                     f"{lm_tokens / sec['lm_count_estimate']:,.0f}", f"{sec['score']:.0f}",
                     f"{gen_en / sec['score']:,.0f}", f"{gen_words / sec['score']:,.0f}",
                     f"{sum(rep1['general']['pairs']) / sec['score']:,.0f}", f"{r['maxrss_kib'] / 1024:.0f}",
                     f"{r['peak_pss_kib'] / 1024:.0f}", f"{runs[1]['wall_s'] / r['wall_s']:.2f}x",
                     f"{r['others_cores']:.2f}"])
    same = runs[1]["hashes"] == runs[2]["hashes"]
    head = ["workers", "wall s", "CPU s", "tokenise LM data s", "count+estimate s", "LM words/s",
            "score s", "scored en words/s", "scored words/s (en+fr)", "pairs/s", "max RSS MiB",
            "peak PSS MiB", "speed-up", "other jobs' CPUs"]
    j2 = runs[2]["report"]["seconds"]
    scale_factor = PAPER_WORDS / gen_en
    pairs_850 = sum(rep1["general"]["pairs"]) * scale_factor
    # what grows with the general corpus: the scoring pass, and three passes that read it (count and validate,
    # pick the sample, write the selection), each about as long as the first one (general_read)
    read_s = j2["general_read"]
    grows_s = j2["score"] + 3 * read_s
    fixed_s = runs[2]["wall_s"] - grows_s  # start-up, in-domain text, LM sample tokenisation, LMs
    per_pair = 8 + 4 * 2 + 8 + 8 + 8 + 4 + 1  # score, tokens, argsort (+ its workspace), cumsum, gather, mask
    mem_850 = runs[2]["maxrss_kib"] * 1024 + per_pair * (pairs_850 - sum(rep1["general"]["pairs"]))
    s = scale
    scale_rows = [[f"{s['words']:,}", f"{s['vocab']:,}", "/".join(f"{n:,}" for n in s["ngrams"]),
                   f"{s['count_s']:.1f}", f"{s['words'] / s['count_s']:,.0f}", f"{s['estimate_s']:.1f}",
                   f"{s['score_s']:.1f}", f"{s['words'] / s['score_s']:,.0f}", f"{s['model_bytes'] / 2**20:.0f}",
                   f"{s['rss_counted_kib'] / 1024:.0f}", f"{s['maxrss_kib'] / 1024:.0f}"]]
    scale_head = ["words", "vocab", "n-grams (orders 1-4)", "count s", "count words/s", "estimate s", "score s",
                  "score words/s", "model MiB", "max RSS after counting MiB", "max RSS MiB"]
    corpus = (f"first {a.prefix:,} pairs of hansards/train (a measured prefix)" if a.prefix else
              "hansards/train.{en,fr}.gz, all 914,450 pairs")
    m1 = rep1["models"]["en"]
    score_bytes = runs[2]["scores_bytes"] / sum(rep1["general"]["pairs"])
    return "\n".join([
        "nmt-select benchmark (tests/bench/bench_select.py)",
        f"date:        {started:%Y-%m-%d %H:%M %Z}",
        f"cpu:         {cpu_model()} ({os.cpu_count()} logical CPUs visible)",
        "load avg:    " + ", ".join(f"{x[0]:.2f}" for x in loads) + " (1-minute, before/after each run; a "
        "shared machine: other jobs ran too, so wall times are upper bounds)",
        f"nmtkit:      {rep1['nmtkit_version']} (git {git_commit()}), Python {platform.python_version()}",
        f"general:     {corpus}: {gen_en:,} en + {rep1['general']['tokens']['fr']:,} fr tokens (Moses)",
        f"in-domain:   wmt-news-older (6 sets, {rep1['in_domain']['pairs']:,} pairs, 1 in 10 held out); LM samples "
        f"{' + '.join(format(m['pairs'], ',') for m in samples)} general pairs; LM data {lm_tokens:,} tokens in all",
        f"settings:    order 4, --min-count 2, --top-pairs {round(KEEP * sum(rep1['general']['pairs'])):,} (41%); "
        f"LM vocab en {m1['vocab']:,}; in-domain en n-grams {'/'.join(map(str, m1['in']['ngrams']))}",
        f"outputs:     --workers 1 and 2 byte-identical (selected text and scores): {'yes' if same else 'NO'}",
        "",
        "A. nmt-select end to end",
        table(head, rows),
        "",
        "LM words/s = in-domain + sample tokens of both languages / (count + estimate + held-out perplexity) time; "
        "this step runs in",
        "the main process (the tokenising before it runs in the workers). score s = the pass that tokenises and "
        "scores every general",
        "pair with 4 models (tokenisation, sacremoses, is most of it). max RSS = largest single process "
        "(getrusage); peak PSS = process tree.",
        "other jobs' CPUs = CPU time that other processes on this machine used during the run / wall time (from "
        "/proc/stat), out of",
        f"{os.cpu_count()}: the workers' speed-up depends on how many CPUs the other jobs left free.",
        "",
        "B. The LM code alone at scale (whitespace tokens of the English side, one process, no tokenisation)",
        table(scale_head, scale_rows),
        "",
        f"Estimate for the paper's 850M words (x{scale_factor:.0f} the general corpus, ~{pairs_850 / 1e6:.0f}M pairs "
        "at the Hansards' words per pair), 2 workers on this machine:",
        f"- time: scoring {j2['score']:.0f} s + 3 reading passes of ~{read_s:.0f} s here -> "
        f"~{grows_s * scale_factor / 3600:.1f} h (scoring at {gen_en / j2['score']:,.0f} en words/s), plus "
        f"{fixed_s:.0f} s that depend on the in-domain size only;",
        "  scoring is tokenisation-bound (sacremoses) and runs in the workers: 2 workers used "
        f"{runs[2]['cpu_s'] / runs[1]['cpu_s'] - 1:.0%} more CPU time than 1, so with W free CPUs it takes about 1/W "
        f"of the 1-worker time (here other jobs held ~{runs[2]['others_cores']:.1f} of the {os.cpu_count()} CPUs).",
        f"  The LM code itself (part B) counts+estimates at {s['words'] / (s['count_s'] + s['estimate_s']):,.0f} "
        "words/s.",
        f"- memory: {per_pair} bytes per general pair (score, token counts, ranking) -> "
        f"~{per_pair * pairs_850 / 2**30:.1f} GiB for {pairs_850 / 1e6:.0f}M pairs, plus the models "
        f"(peak here {runs[2]['maxrss_kib'] / 1024:.0f} MiB) -> ~{mem_850 / 2**30:.1f} GiB peak;",
        f"  models grow with the in-domain data: a {s['words'] / 1e6:.1f}M-word order-4 model takes "
        f"{s['model_bytes'] / 2**20:.0f} MiB of arrays ({s['maxrss_kib'] / 1024:.0f} MiB peak while built), i.e. "
        f"~{s['model_bytes'] / sum(s['ngrams']):.0f} bytes per n-gram.",
        f"- disk: the scores file ({score_bytes:.0f} bytes per pair) -> ~{score_bytes * pairs_850 / 2**30:.1f} GiB, "
        "written to a temporary file first, then to OUT.scores (twice that while it runs).",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
