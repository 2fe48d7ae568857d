#!/usr/bin/env python3
"""How well RNNsearch's attention and its alignment posterior align words: AER against gold links (issue #37).

    python tests/bench/bench_posterior.py -s trial.e -t trial.f --gold trial.align --gold-order tgt-src \\
        NAME=EN_FR.pt[,FR_EN.pt] ...

For each model (and its reverse model, when given) the AER of ``nmt-align --method attention`` and ``--method
posterior`` (nmtkit/align.py forced_attention, nmtkit/posterior.py forced_posterior): the forward direction alone
and, with a reverse model, the backward one, each symmetrisation heuristic and ``soft`` (nmtkit/symmetrize.py).
The text is given as nmt-align reads it with ``--tokenized`` (for a cased model: recased as
examples/cpu-scale/run.sh does, with ``examples/steps.py recase``).  Prints one table; seconds are wall clock on
this machine (alone or not: say so).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--source", required=True)
    p.add_argument("-t", "--target", required=True)
    p.add_argument("--gold", required=True)
    p.add_argument("--gold-order", default="src-tgt", choices=["src-tgt", "tgt-src"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("models", nargs="+", metavar="NAME=MODEL[,REVERSE]")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    import torch

    from nmtkit.align import SOFT_ALIGNMENTS, Aligner, align_files

    torch.set_num_threads(a.threads)
    head = peers.start_report("bench_posterior.py", "nmtkit: AER of the attention and of the alignment posterior",
                              args, a.allow_dirty)
    if head is None:
        return 2
    print("\n".join(head) + "\n")
    print(f"AER against {a.gold} ({a.source}, {a.target}); lower is better")
    for spec in a.models:
        name, _, paths = spec.rpartition("=")
        forward, _, backward = paths.partition(",")
        for method in SOFT_ALIGNMENTS:
            start = time.monotonic()
            aligner = Aligner(forward, tokenized=True, method=method)
            reverse = Aligner(backward, tokenized=True, method=method) if backward else None
            result = align_files(aligner, a.source, a.target, a.gold, "auto", a.gold_order, reverse=reverse,
                                 symmetrization="soft" if reverse else "grow-diag-final")
            scores = result.by_method or {"forward": result.scores}
            row = "  ".join(f"{k} {v.aer:.3f}" for k, v in scores.items())
            print(f"{name:28} {method:9} {row}  ({time.monotonic() - start:.0f} s)")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
