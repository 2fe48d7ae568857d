#!/usr/bin/env python3
"""Shift-Att on RNNsearch: does the attention of the step after a word align it better than its own step's?

    python tests/bench/bench_shift_attention.py -m EN_FR.pt --reverse-model FR_EN.pt -s trial.e -t trial.f \\
        --gold trial.align --gold-order tgt-src

Chen et al. (2020, "Accurate Word Alignment Induction from Neural Machine Translation") link target word y_i by
the attention of step i+1, computed once the decoder has read y_i, and gain much for Transformers.  RNNsearch's
α_i is the step that predicts y_i (its context c_i feeds the deep output), so the shift should hurt: this script
measures it once, with nothing to tune.  Each model's teacher-forced attention (nmtkit.align.forced_attention) is
read as it is and shifted by one step (the last word takes the ``</s>`` step's row), then scored as
``nmt-align --reverse-model ... --symmetrize soft`` scores it: each direction, each heuristic and soft.  The text
as nmt-align reads it with ``--tokenized`` (recased as examples/cpu-scale/run.sh does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402


def shifted(forced):
    """``forced`` (a forced_attention) with row i replaced by row i+1 (the last target token: the ``</s>`` step)."""
    def attention(*args, **kwargs) -> list[np.ndarray]:
        out = []
        for alpha in forced(*args, **kwargs):
            s = alpha.copy()
            s[:-1] = alpha[1:]
            out.append(s)
        return out
    return attention


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--reverse-model", required=True)
    p.add_argument("-s", "--source", required=True)
    p.add_argument("-t", "--target", required=True)
    p.add_argument("--gold", required=True)
    p.add_argument("--gold-order", default="src-tgt", choices=["src-tgt", "tgt-src"])
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    import torch

    import nmtkit.align as align

    torch.set_num_threads(1)
    head = peers.start_report("bench_shift_attention.py", "nmtkit: Shift-Att against RNNsearch's own attention step",
                              args, a.allow_dirty)
    if head is None:
        return 2
    print("\n".join(head) + "\n")
    as_is = align.forced_attention
    print(f"AER against {a.gold} ({a.source}, {a.target}); lower is better")
    for name, reading in (("alpha_i (as nmt-align reads it)", as_is), ("alpha_(i+1) (Shift-Att)", shifted(as_is))):
        align.forced_attention = reading  # (what Aligner.align_words calls)
        try:
            result = align.align_files(align.Aligner(a.model, tokenized=True), a.source, a.target, a.gold, "auto",
                                       a.gold_order, reverse=align.Aligner(a.reverse_model, tokenized=True),
                                       symmetrization="soft")
        finally:
            align.forced_attention = as_is
        print(f"{name:32} " + "  ".join(f"{k} {v.aer:.3f}" for k, v in result.by_method.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
