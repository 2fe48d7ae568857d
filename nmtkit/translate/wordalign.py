"""Word alignments from attention: a sentence's attention over model tokens (subwords) becomes attention over
words (:func:`word_matrix`), then hard links (:func:`hard_links`), written in Pharaoh format (:func:`pharaoh`).
Shared by ``nmt-translate --alignment`` and ``nmt-align`` (:mod:`nmtkit.align`, which also reads gold alignments
and computes AER), so that both give the same links for the same attention.  A line cut into pieces gets one
block-diagonal attention (:func:`block_attention`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nmtkit.data.text import words_of


def word_matrix(src_tokens: Sequence[str], tgt_tokens: Sequence[str], alpha: np.ndarray,
                sep: str | Callable = "@@", tgt_sep: str | Callable | None = None) -> np.ndarray:
    """Token attention (len(tgt)+1, len(src)+1), ``</s>`` last on both axes → word attention with ``</s>`` kept:
    source subword columns summed, target subword rows averaged (rows still sum to 1). ``sep`` says how tokens
    join into words: the BPE separator, or a function tokens → (words, word index of each token) such as
    :meth:`nmtkit.data.text.Preprocessor.words_of`; ``tgt_sep`` the same for the target (default: ``sep``)."""
    def merge(tokens, how):
        return how(list(tokens)) if callable(how) else words_of(list(tokens), how)

    src_words, src_of = merge(src_tokens, sep)
    tgt_words, tgt_of = merge(tgt_tokens, sep if tgt_sep is None else tgt_sep)
    src_of, tgt_of = np.asarray(src_of + [len(src_words)]), np.asarray(tgt_of + [len(tgt_words)])
    a = np.asarray(alpha, dtype=np.float64)[: len(tgt_of), : len(src_of)]
    cols = np.zeros((a.shape[0], len(src_words) + 1))
    np.add.at(cols.T, src_of, a.T)  # (Ty tokens, Tx words + 1)
    rows = np.zeros((len(tgt_words) + 1, len(src_words) + 1))
    np.add.at(rows, tgt_of, cols)
    return rows / np.bincount(tgt_of, minlength=len(tgt_words) + 1)[:, None]


def hard_links(alpha: np.ndarray, rule: str = "argmax", threshold: float = 0.5) -> list[tuple[int, int]]:
    """Hard links (source i, target j) from a word-level matrix (``</s>`` row and column last, left out here).

    ``argmax``: for each target word the most attended source word. ``threshold``: those links together with every
    (i, j) whose weight is at least ``threshold``. Sorted by target, then source.
    """
    a = np.asarray(alpha)[:-1, :-1]  # (target words, source words)
    if a.size == 0:
        return []
    links = {(int(a[j].argmax()), j) for j in range(a.shape[0])}
    if rule == "threshold":
        links |= {(int(i), int(j)) for j, i in zip(*np.nonzero(a >= threshold))}
    elif rule != "argmax":
        raise ValueError(f"unknown rule {rule!r} (argmax or threshold)")
    return sorted(links, key=lambda ij: (ij[1], ij[0]))


def pharaoh(links: list[tuple[int, int]]) -> str:
    """Pharaoh format: ``i-j`` pairs (source-target, 0-based) separated by spaces."""
    return " ".join(f"{i}-{j}" for i, j in links)


def block_matrix(parts: list[tuple[list[str], list[str], np.ndarray]]) -> np.ndarray:
    """The matrices of a line's pieces (source tokens, target tokens, (target + 1, source + 1 or more)) joined into one
    block-diagonal matrix (len(all target) + 1, len(all source) + 1): inner </s> rows and columns dropped."""
    alpha = np.zeros((sum(len(y) for _, y, _ in parts) + 1, sum(len(s) for s, _, _ in parts) + 1), dtype=np.float32)
    r = c = 0
    for k, (s, y, a) in enumerate(parts):
        last = k == len(parts) - 1
        rows, cols = len(y) + (1 if last else 0), len(s) + (1 if last else 0)
        alpha[r: r + rows, c: c + cols] = a[:rows, :cols]
        r, c = r + len(y), c + len(s)
    return alpha


def block_attention(parts: list[tuple[list[str], list[str], np.ndarray]]) -> dict:
    """Join the attention of a line's pieces into one block-diagonal matrix (:func:`block_matrix`), with its tokens."""
    src = [t for s, _, _ in parts for t in s] + ["</s>"]
    tgt = [t for _, y, _ in parts for t in y] + ["</s>"]
    return {"source": src, "target": tgt, "alpha": block_matrix(parts).round(6).tolist()}
