"""ARPA files: the text format of back-off n-gram models that SRILM, KenLM, IRSTLM and Moses read.

::

    # comment lines (KenLM accepts lines starting with '#' before \\data\\)

    \\data\\
    ngram 1=V
    ngram 2=M2
    …

    \\1-grams:
    log10 p(w)<TAB>w<TAB>log10 backoff(w)
    …
    \\2-grams:
    log10 p(w2 | w1)<TAB>w1 w2[<TAB>log10 backoff(w1 w2)]
    …
    \\end\\

A backoff weight is written only for an n-gram that is a context of a longer one (a missing weight means 0, i.e.
weight 1). ``<s>`` gets the conventional log probability -99: it is never predicted. Every word of the vocabulary is
listed as a unigram, seen in training or not, so that a reader knows it.
"""

from __future__ import annotations

from typing import TextIO

import numpy as np

from nmtkit import __version__
from nmtkit.select.lm import NgramLM

ROWS = 100_000  # n-grams formatted per batch


def _fmt(x: float) -> str:
    return f"{x:.7g}"


def write_arpa(lm: NgramLM, f: TextIO, comment: str | None = None) -> None:
    """Write ``lm`` to the text stream ``f`` in ARPA format (optionally after a ``#`` comment line)."""
    f.write(f"# ARPA back-off model written by nmtkit {__version__} (nmt-select): order {lm.order}, interpolated "
            f"modified Kneser-Ney, discounts {_discount_text(lm)}\n")
    if comment:
        for line in comment.split("\n"):
            f.write(f"# {line}\n")
    f.write("\n\\data\\\n")
    for k, size in enumerate(lm.sizes(), start=1):
        f.write(f"ngram {k}={size}\n")
    words = np.array(lm.vocab.words, dtype=object)
    for k in range(1, lm.order + 1):
        f.write(f"\n\\{k}-grams:\n")
        logp = lm.logp[k]  # log10 p(<s>) is -99 already
        bo = lm.backoff[k] if k < lm.order else None
        for lo in range(0, len(lm.keys[k]), ROWS):
            hi = min(lo + ROWS, len(lm.keys[k]))
            ids = lm.ngram_ids(k, lo, hi)
            grams = [" ".join(row) for row in words[ids].tolist()]
            probs = [_fmt(x) for x in logp[lo:hi].tolist()]
            if bo is None:
                f.writelines(f"{p}\t{g}\n" for p, g in zip(probs, grams))
            else:
                f.writelines(f"{p}\t{g}\t{_fmt(b)}\n" if b != 0.0 else f"{p}\t{g}\n"
                             for p, g, b in zip(probs, grams, bo[lo:hi].tolist()))
    f.write("\n\\end\\\n")


def _discount_text(lm: NgramLM) -> str:
    parts = []
    for k in range(1, lm.order + 1):
        d = " ".join(f"{x:.4f}" for x in lm.discounts[k])
        parts.append(f"{k}: {d}{' (fallback)' if lm.discount_fallback[k] else ''}")
    return "; ".join(parts)
