#!/usr/bin/env python3
"""What BPE-dropout costs a training update: ``nmt-train --bpe-dropout 0.1`` against the same run without it.

    python tests/bench/bench_bpe_dropout.py [--pairs 30000] [--updates 60]

Prepares the first ``--pairs`` Hansards training pairs with joint BPE (``--merges``, shortlists of the same size,
``--bpe-dropout 0.1`` so that the shortlists hold the dropout units), then, for ``rnnsearch-small`` with the fast
recipe and batches of 80, times ``--updates`` updates after 5 warm-up ones with dropout off and on (one process,
the machine's threads; each from reading its batch of the schedule, whose pools are sorted by the epoch's dropout
lengths, so a pool's segmenting is in its first update), and the making of one batch alone (segmenting anew and
collating) against collating the prepared ids. Prints the figures and writes them to ``tests/bench/results/bench_bpe_dropout.txt``.
Run it alone on the machine: it measures time.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402

DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))


def trainer_schedule(trainer):
    """The first epoch's schedule as the trainer makes it (with dropout: pools sorted by the epoch's segmentations)."""
    import numpy as np

    from nmtkit.data.batching import EpochSchedule

    for view in trainer.train_views:
        if hasattr(view, "epoch"):
            view.epoch = 0
    cfg = trainer.cfg
    return EpochSchedule(np.asarray(trainer.train_src.sizes), np.asarray(trainer.train_tgt.sizes), trainer.eligible,
                         cfg.batch_size, cfg.pool_batches, cfg.seed, 0, trainer._pool_lengths())


def _timed_updates(trainer, updates: int) -> float:
    """Mean seconds per update over ``updates`` updates after 5 warm-up ones, each timed from reading its batch of
    the schedule (a pool's first batch segments the whole pool) to the end of the update."""
    schedule = trainer_schedule(trainer)
    for k in range(5):  # warm-up
        trainer._step([schedule[k]])
    times = []
    for k in range(5, 5 + updates):
        t0 = time.perf_counter()
        trainer._step([schedule[k]])
        times.append(time.perf_counter() - t0)
    return statistics.mean(times)


def _collate_ms(trainer, count: int) -> tuple[float, float, float]:
    """(mean ms to make a batch: reading it from a fresh schedule, whose first batch of a pool segments the pool,
    and collating it; mean real target tokens; mean padded target positions per batch), over ``count`` batches."""
    from nmtkit.data.batching import collate

    schedule = trainer_schedule(trainer)
    times, real, padded = [], [], []
    for k in range(count):
        t0 = time.perf_counter()
        b = collate(*trainer.train_views, schedule[k])
        times.append(time.perf_counter() - t0)
        real.append(b.num_tokens)
        padded.append(b.tgt_out.numel())
    return 1000 * statistics.mean(times), statistics.mean(real), statistics.mean(padded)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=30000)
    ap.add_argument("--merges", type=int, default=8000)
    ap.add_argument("--updates", type=int, default=60)
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "bench_bpe_dropout.txt"))
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    args = ap.parse_args()
    head = peers.start_report("bench_bpe_dropout.py", "nmtkit: what BPE-dropout costs a training update",
                              sys.argv[1:], args.allow_dirty)
    if head is None:
        return 2

    from nmtkit.prepare import PrepareConfig, prepare
    from nmtkit.train.config import train_config
    from nmtkit.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for lang in ("en", "fr"):
            with gzip.open(DATA / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
                (tmp / f"train.{lang}").write_text("".join(itertools.islice(f, args.pairs)), encoding="utf-8")
        t0 = time.perf_counter()
        prepare(PrepareConfig("en", "fr", [str(tmp / "train")], str(tmp / "data"), src_vocab_size=args.merges,
                              tgt_vocab_size=args.merges, max_len=50, bpe_merges=args.merges, bpe_dropout=0.1,
                              workers=os.cpu_count() or 1))
        prepared = time.perf_counter() - t0
        rows = {}
        for p in (0.0, 0.1):
            cfg = train_config(str(tmp / "data"), "rnnsearch-small", str(tmp / f"run{p}"), bpe_dropout=p,
                               valid_bleu_sentences=0)
            trainer = Trainer(cfg)
            rows[p] = (_timed_updates(trainer, args.updates), _collate_ms(trainer, 100))
            trainer.rundir.unlock()
    lines = [f"BPE-dropout cost per update: rnnsearch-small, fast recipe, batches of 80, the first {args.pairs:,} "
             f"Hansards pairs, {args.merges:,} joint merges (nmt-prepare --bpe-dropout 0.1 took {prepared:.0f} s); "
             f"means of {args.updates} updates; {os.cpu_count()} cores",
             "",
             f"{'':28}{'s/update':>10}{'batch made, ms':>16}{'target tokens':>15}{'with padding':>14}",
             *(f"{name:28}{rows[p][0]:>10.3f}{rows[p][1][0]:>16.1f}{rows[p][1][1]:>15.0f}{rows[p][1][2]:>14.0f}"
               for name, p in (("--bpe-dropout 0 (ids)", 0.0), ("--bpe-dropout 0.1", 0.1))),
             "",
             f"overhead: {100 * (rows[0.1][0] / rows[0.0][0] - 1):+.1f}% per update"]
    text = "\n".join(head + [""] + lines) + "\n"
    print(text, end="")
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
