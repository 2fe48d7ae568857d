#!/usr/bin/env python3
"""Word links of a prepared corpus's training pairs by eflomal, for ``nmt-train --guided-alignment``.

    python examples/guide_links.py DATA_DIR -o DATA_DIR/train.align [--symmetrize grow-diag-final-and]
    nmt-train DATA_DIR --arch rnnsearch-small --guided-alignment DATA_DIR/train.align ...

Guided alignment trains RNNsearch's attention towards a statistical aligner's links (nmtkit/train/guided.py).  This
script makes those links: eflomal (Östling & Tiedemann 2016, ``pip install 'eflomal>=2.0,<3'``; see
examples/eflomal_aer.py) aligns the training pairs of a directory ``nmt-prepare`` wrote, both directions, and the two
are symmetrised (grow-diag-final-and by default: the heuristic the guided-alignment recipes of Marian and fairseq
start from; :mod:`nmtkit.symmetrize`).

- **What is aligned**: the pairs the corpus trains on (``train.kept`` names their lines of ``train.tok.*``; all
  lines when the corpus was not filtered), lowercased, nothing else -- no test or trial pair, so the links carry no
  knowledge of an evaluation set.
- **What is written**: one line per line of ``train.tok.<src>``, ``i-j`` source-target 0-based word positions, an
  empty line for a pair the corpus dropped or one with an empty side (nmt-train leaves a pair without links
  unguided); written to a temporary name, then renamed.  ``nmt-train`` reads it
  with ``--guided-alignment-order src-tgt``; a model of the other direction, prepared from the same pairs
  swapped, reads the same file with ``--guided-alignment-order tgt-src``.
- **Time**: eflomal runs three samplers in OpenMP threads; 300,000 Hansards pairs take minutes on two cores.
  eflomal 2.0.0 cannot be seeded, so two runs differ a little (examples/eflomal_aer.py says how much).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (eflomal_aer.py, beside this script)
from eflomal_aer import run_script  # noqa: E402


def say(msg: str) -> None:
    print(f"guide_links: {msg}", file=sys.stderr)


def kept_lines(data) -> list[int]:
    """0-based lines of train.tok.* the corpus trains on."""
    path = data.path("train.kept")
    if not os.path.isfile(path):
        return list(range(len(data.corpus("train", data.source_lang))))
    with open(path, encoding="utf-8") as f:
        return [int(line) - 1 for line in f if line.strip()]


def main(argv=None) -> None:
    from nmtkit.symmetrize import HEURISTICS

    p = argparse.ArgumentParser(prog="guide_links.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a directory nmt-prepare wrote (its train.tok.* and train.kept are read)")
    p.add_argument("-o", "--out", required=True, metavar="FILE", help="the links, one line per line of train.tok")
    p.add_argument("--symmetrize", default="grow-diag-final-and", choices=HEURISTICS,
                   help="how eflomal's two directions are combined [grow-diag-final-and]")
    p.add_argument("--seed", type=int, default=None, help="passed on to an eflomal that takes one (2.0.0 does not)")
    run_script("guide_links", run, p.parse_args(argv))


def run(a) -> None:
    from eflomal_aer import parse_links, run_eflomal

    from nmtkit.data.manifest import PreparedData
    from nmtkit.errors import InputError
    from nmtkit.files import atomic_file, read_segments
    from nmtkit.symmetrize import symmetrize
    from nmtkit.translate.wordalign import pharaoh

    try:
        import eflomal  # noqa: F401
    except ImportError:
        raise SystemExit("guide_links: error: eflomal is not installed (pip install 'eflomal>=2.0,<3')") from None
    data = PreparedData.open(a.data)
    if not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        raise InputError("cannot write -o there: no such directory", a.out)
    tok = [data.path(f"train.tok.{lang}") for lang in (data.source_lang, data.target_lang)]
    for path in tok:
        if not os.path.isfile(path):
            raise InputError(f"has no {os.path.basename(path)} (prepare it again with this nmtkit)", a.data)
    sides = [[" ".join(seg.text.lower().split()) for seg in read_segments(path)] for path in tok]
    if len(sides[0]) != len(sides[1]):
        raise InputError(f"has {len(sides[1])} lines but {tok[0]} has {len(sides[0])}", tok[1])
    lines = kept_lines(data)
    if lines and not 0 <= min(lines) <= max(lines) < len(sides[0]):
        raise InputError(f"names lines outside the {len(sides[0])} of train.tok", data.path("train.kept"))
    both_sides = [k for k in lines if sides[0][k] and sides[1][k]]  # (eflomal cannot align an empty side)
    say(f"eflomal on the {len(both_sides):,} training pairs of {a.data} ...")
    start = time.monotonic()
    fwd, rev, _ = run_eflomal([sides[0][k] for k in both_sides], [sides[1][k] for k in both_sides], a.seed)
    out = [""] * len(sides[0])  # (an empty line: a pair not trained on, or with an empty side: no links)
    links = 0
    for n, k in enumerate(both_sides):
        src_n, tgt_n = sides[0][k].count(" ") + 1, sides[1][k].count(" ") + 1
        both = symmetrize(parse_links(fwd[n], src_n, tgt_n, 1, "forward"),
                          parse_links(rev[n], src_n, tgt_n, 0, "reverse"), a.symmetrize)
        links += len(both)
        out[k] = pharaoh(sorted(both, key=lambda ij: (ij[1], ij[0])))
    with atomic_file(a.out) as f:
        f.write("".join(line + "\n" for line in out))
    say(f"{links:,} links ({a.symmetrize}) for {len(both_sides):,} pairs in {time.monotonic() - start:.0f} s -> "
        f"{a.out}")


if __name__ == "__main__":
    main()
