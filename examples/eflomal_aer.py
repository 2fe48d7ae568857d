#!/usr/bin/env python3
"""eflomal's AER on a gold-aligned test set, beside the attention's (issue #37): a real aligner's bar.

``nmt-align --reverse-model`` scores RNNsearch's attention, symmetrised, against the Och & Ney gold links of the
Hansards trial set. An AER means little alone, so this script gives the number a statistical word aligner reaches
on the same data: eflomal (Östling & Tiedemann 2016, ``pip install eflomal``), a Bayesian IBM1 + HMM + fertility
aligner fitted by Gibbs sampling. It is unsupervised and aligns the text it is trained on, so the test pairs are
appended to the training pairs (as fast_align and eflomal users align test sets) and their links are taken back:

    python examples/eflomal_aer.py --train-src train.tok.en --train-tgt train.tok.fr [--max-train N] \\
        -s trial.e -t trial.f --gold trial.align --gold-order tgt-src -o aer-eflomal.json [--pharaoh trial.links]

- **Input.** The training text is tokenized (one sentence a line, words split by whitespace; plain or gzip), such
  as a prepared directory's ``train.tok.en``/``train.tok.fr``; ``--tokenize`` applies nmt-prepare's Moses
  normalisation and tokenisation to raw text first. Both sides are lowercased, as the trial set is (eflomal would
  lowercase them anyway). The test files are read as ``nmt-align`` reads them (``<s snum=N> ... </s>`` unwrapped,
  whitespace words) and the gold links with nmtkit's own reader, ``--gold-order`` as in nmt-align.
- **Links.** eflomal's forward links give each target word at most one source word, its reverse links each source
  word at most one target word; eflomal writes both as ``i-j``, source-target (unlike nmt-align's reverse model,
  nothing needs transposing; the script checks this). Each direction and each of
  :data:`nmtkit.symmetrize.HEURISTICS` is scored with :func:`nmtkit.align.alignment_error`.
- **Output.** JSON shaped like ``nmt-align --json`` with a reverse model: the ``--symmetrize`` choice's scores at
  the top, every method's under ``by_method``; ``--pharaoh`` writes that choice's links, one line a test sentence.
- **Reproducibility.** eflomal 2.0.0 takes no seed: its binary seeds its samplers from ``/dev/urandom``, so two
  runs differ a little (on 20,000 Hansards pairs two runs gave grow-diag-final 0.112 and 0.108, each method within
  0.02 of itself). ``--seed`` is recorded in the JSON (``seeded``: false) and is passed on to an eflomal that takes
  one; everything else (reading, lowercasing, symmetrisation, scoring) is deterministic.
- **Time.** eflomal runs three samplers in OpenMP threads (``OMP_NUM_THREADS`` caps them): 20,000 pairs took
  38 s on one thread of a busy two-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version


def say(msg: str) -> None:
    print(f"eflomal_aer: {msg}", file=sys.stderr)


def read_training(src_path: str, tgt_path: str, max_pairs: int, langs: str | None) -> tuple[list[str], list[str]]:
    """The first ``max_pairs`` (0: all) lines of the two training files, lowercased; Moses-tokenized first when
    ``langs`` (``SRC-TGT``) is given."""
    from nmtkit.errors import InputError
    from nmtkit.files import read_segments

    sides = [[seg.text for seg in read_segments(path)] for path in (src_path, tgt_path)]
    if len(sides[0]) != len(sides[1]):
        raise InputError(f"has {len(sides[1])} lines but --train-src {src_path} has {len(sides[0])}", tgt_path)
    if not sides[0]:
        raise InputError("is empty: no training pairs", src_path)
    if max_pairs:
        sides = [lines[:max_pairs] for lines in sides]
    out = []
    for lines, lang in zip(sides, langs.split("-") if langs else (None, None)):
        if lang:
            from nmtkit.data.text import Preprocessor, TextConfig

            pre = Preprocessor(TextConfig(lang, lowercase=True))
            out.append([" ".join(pre.words(line)) for line in lines])
        else:
            out.append([" ".join(line.lower().split()) for line in lines])
    return out[0], out[1]


def run_eflomal(src: list[str], tgt: list[str], seed: int | None) -> tuple[list[str], list[str], bool]:
    """eflomal's forward and reverse links (Pharaoh lines, source-target) of every pair, in order, and whether
    ``seed`` could be given to it."""
    import inspect

    import eflomal

    kwargs = {}
    if seed is not None and "seed" in inspect.signature(eflomal.Aligner).parameters:  # (not in 2.0.0)
        kwargs["seed"] = seed
    aligner = eflomal.Aligner(**kwargs)
    with tempfile.TemporaryDirectory(prefix="eflomal-aer.") as tmp:
        fwd, rev = os.path.join(tmp, "fwd"), os.path.join(tmp, "rev")
        aligner.align(src, tgt, links_filename_fwd=fwd, links_filename_rev=rev, quiet=True)
        links = []
        for path in (fwd, rev):
            with open(path, encoding="utf-8", newline="\n") as f:
                text = f.read()
            lines = text.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            if len(lines) != len(src):
                raise RuntimeError(f"eflomal wrote {len(lines)} lines of links for {len(src)} sentence pairs")
            links.append(lines)
    return links[0], links[1], bool(kwargs)


def parse_links(line: str, n: int, m: int, functional_on: int, name: str) -> set[tuple[int, int]]:
    """One Pharaoh line of eflomal's as (source i, target j); checks the range and that each word of side
    ``functional_on`` (0: source, 1: target) has at most one link, which is what says the orientation is right."""
    links = {tuple(int(x) for x in raw.split("-")) for raw in line.split()}
    seen = [link[functional_on] for link in links]
    if any(not (0 <= i < n and 0 <= j < m) for i, j in links) or len(seen) != len(set(seen)):
        raise RuntimeError(f"eflomal's {name} links '{line}' are not (source, target) links of a {n}x{m} pair")
    return links


def main(argv=None) -> None:
    from nmtkit.symmetrize import HEURISTICS

    p = argparse.ArgumentParser(prog="eflomal_aer.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-src", required=True, metavar="FILE", help="tokenized training text, source side")
    p.add_argument("--train-tgt", required=True, metavar="FILE", help="its translation, line for line")
    p.add_argument("--max-train", type=int, default=0, metavar="N", help="the first N pairs only [0: all]")
    p.add_argument("--tokenize", metavar="SRC-TGT", help="the training text is raw: normalise and Moses-tokenize it "
                   "first, as nmt-prepare does, for these languages (e.g. en-fr)")
    p.add_argument("-s", "--source", required=True, help="test sentences, source side (tokenized)")
    p.add_argument("-t", "--target", required=True, help="test sentences, target side (tokenized)")
    p.add_argument("--gold", required=True, help="gold links of the test pairs (Pharaoh or NAACL)")
    p.add_argument("--gold-format", default="auto", choices=["auto", "pharaoh", "naacl"])
    p.add_argument("--gold-order", default="src-tgt", choices=["src-tgt", "tgt-src"])
    p.add_argument("--symmetrize", default="grow-diag-final", choices=HEURISTICS,
                   help="the symmetrisation reported at the top and written by --pharaoh [grow-diag-final]")
    p.add_argument("--seed", type=int, default=None, help="recorded; eflomal 2.0.0 cannot be seeded")
    p.add_argument("-o", "--out", required=True, metavar="JSON", help="the report, written atomically")
    p.add_argument("--pharaoh", metavar="FILE", help="the chosen symmetrisation's links, i-j source-target")
    run_script("eflomal_aer", run, p.parse_args(argv))


def run_script(name: str, run, a) -> None:
    """``run(a)``; an InputError becomes one line, ``NAME: error: ...``, and a non-zero exit."""
    from nmtkit.errors import InputError

    try:
        run(a)
    except InputError as e:
        raise SystemExit(f"{name}: error: {e}") from None


def run(a) -> None:
    from nmtkit.align import alignment_error, check_gold, check_pairs, load_gold, read_text
    from nmtkit.errors import InputError
    from nmtkit.files import atomic_file, check_distinct
    from nmtkit.symmetrize import HEURISTICS, symmetrize
    from nmtkit.translate.wordalign import pharaoh

    if a.tokenize is not None and not (len(a.tokenize.split("-")) == 2 and all(a.tokenize.split("-"))):
        raise InputError(f"--tokenize takes the two languages as SRC-TGT, e.g. en-fr (got '{a.tokenize}')")
    if a.max_train < 0:
        raise InputError(f"--max-train must be 0 (all) or more (got {a.max_train})")
    try:
        import eflomal  # noqa: F401
    except ImportError:
        raise SystemExit("eflomal_aer: error: eflomal is not installed (pip install 'eflomal>=2.0,<3')") from None
    for option, path in (("-o", a.out), ("--pharaoh", a.pharaoh)):  # (before minutes of eflomal, not after)
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"cannot write {option} there: no such directory", path)
    check_distinct({"-o": a.out, "--pharaoh": a.pharaoh},
                   {"--train-src": a.train_src, "--train-tgt": a.train_tgt, "--source": a.source,
                    "--target": a.target, "--gold": a.gold})
    # the test set and its gold links first: they are small, and their mistakes are the likelier ones
    src, tgt = read_text(a.source), read_text(a.target)
    check_pairs(src, tgt, a.source, a.target)
    src_words = [s.text.lower().split() for s in src]
    tgt_words = [t.text.lower().split() for t in tgt]
    gold = load_gold(a.gold, a.gold_format, a.gold_order, src)
    check_gold(gold, [len(w) for w in src_words], [len(w) for w in tgt_words], a.gold, [s.name for s in src],
               " (is --gold-order right?)")
    train_src, train_tgt = read_training(a.train_src, a.train_tgt, a.max_train, a.tokenize)
    n_train = len(train_src)
    say(f"eflomal on {n_train:,} training pairs and the {len(src)} test pairs ...")
    start = time.monotonic()
    fwd_lines, rev_lines, seeded = run_eflomal(train_src + [" ".join(w) for w in src_words],
                                               train_tgt + [" ".join(w) for w in tgt_words], a.seed)
    seconds = time.monotonic() - start
    forward, backward = [], []
    for k in range(len(src)):
        n, m = len(src_words[k]), len(tgt_words[k])
        forward.append(parse_links(fwd_lines[n_train + k], n, m, 1, "forward"))
        backward.append(parse_links(rev_lines[n_train + k], n, m, 0, "reverse"))
    methods = {"forward": forward, "backward": backward}
    methods.update({h: [symmetrize(f, b, h) for f, b in zip(forward, backward)] for h in HEURISTICS})
    by_method = {name: alignment_error(links, gold).to_dict() for name, links in methods.items()}
    report = {"gold": a.gold, "sentences": len(src), "aligner": "eflomal", "eflomal_version": version("eflomal"),
              "train_pairs": n_train, "seed": a.seed, "seeded": seeded, "seconds": round(seconds, 1),
              "symmetrization": a.symmetrize, **by_method[a.symmetrize], "by_method": by_method}
    if a.pharaoh:
        with atomic_file(a.pharaoh) as f:
            for links in methods[a.symmetrize]:
                f.write(pharaoh(sorted(links, key=lambda ij: (ij[1], ij[0]))) + "\n")
    with atomic_file(a.out) as f:
        f.write(json.dumps(report, indent=2) + "\n")
    best = min(by_method, key=lambda k: by_method[k]["aer"])
    say(f"{a.symmetrize} AER {report['aer']:.4f} (precision {report['precision']:.4f}, recall "
        f"{report['recall']:.4f}) on {len(src)} test pairs after {n_train:,} training pairs, eflomal "
        f"{seconds:.0f} s; best: {best} {by_method[best]['aer']:.4f} -> {a.out}")


if __name__ == "__main__":
    main()
