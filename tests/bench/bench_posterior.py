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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--source", required=True)
    p.add_argument("-t", "--target", required=True)
    p.add_argument("--gold", required=True)
    p.add_argument("--gold-order", default="src-tgt", choices=["src-tgt", "tgt-src"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("models", nargs="+", metavar="NAME=MODEL[,REVERSE]")
    a = p.parse_args(argv)
    import torch

    from nmtkit.align import SOFT_ALIGNMENTS, Aligner, align_files

    torch.set_num_threads(a.threads)
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


if __name__ == "__main__":
    main()
