"""N-gram counting from streamed sentences of token ids, in numpy arrays (the counting half of :mod:`nmtkit.select.lm`).

The n-grams of each order are kept as a trie flattened into sorted arrays, as KenLM's trie does:

- order 1 is dense: the unigram with id ``w`` has index ``w`` (every vocabulary id has an entry, maybe count 0);
- an n-gram of order k ≥ 2 is the pair (index of its (k-1)-word prefix in order k-1, its last word id), stored as
  the single integer key ``prefix_index * V + word`` (V = vocabulary size). Keys of order k are kept sorted and
  unique in an int64 array, with their counts in a parallel array; an n-gram's index in order k is its position in
  that array.

Because prefix indices are lexicographic ranks, sorting keys sorts n-grams lexicographically, and the keys of a
context's continuations are contiguous. Keys stay below 2**63 as long as (number of (k-1)-grams) × V does, i.e. up to
about 10**12 n-grams per order with a 10-million-word vocabulary; no n-gram is ever held as a Python object.

Counting is streamed: sentences are buffered (int32 ids) and merged into the tables in batches. A batch's n-grams are
keyed against the already merged lower order (so a new (k-1)-gram shifts the indices, and the keys, of the order-k
entries after it; the shift is a cumulative sum, and keys stay sorted). The batch grows with the tables (at least a
quarter of their size), so the number of merges grows only logarithmically with the corpus, and memory stays
bounded by a small multiple of the tables, whatever the size of the corpus.

Sentences are counted as ``<s> w1 … wn </s>`` with a single ``<s>`` and ``</s>``, as KenLM and SRILM do.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

UNK, BOS, EOS = 0, 1, 2  # the ids of <unk>, <s> and </s> in every LM vocabulary
MIN_BATCH_TOKENS = 1 << 20


@dataclass
class NgramCounts:
    """Raw n-gram counts of orders 1..N. ``keys[k]``/``counts[k]`` are order k (index 0 unused, ``keys[1]`` is
    ``arange(V)``); see the module docstring for the key layout."""

    order: int
    vocab_size: int
    keys: list[np.ndarray]
    counts: list[np.ndarray]
    sentences: int
    tokens: int  # words, without <s> and </s>

    def sizes(self) -> list[int]:
        """Number of distinct n-grams of each order 1..N (order 1: ids seen at least once, <s> and </s> included)."""
        return [int(np.count_nonzero(self.counts[1]))] + [len(self.keys[k]) for k in range(2, self.order + 1)]

    def ngram_ids(self, k: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The word ids of the n-grams ``lo:hi`` of order k (all by default), in key order."""
        return ngram_ids(self.keys, self.vocab_size, k, lo, hi)


def ngram_ids(keys: list[np.ndarray], V: int, k: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Walk the trie up from the n-grams ``lo:hi`` of order k: their word ids, (hi - lo, k)."""
    cur = keys[k][lo:hi]
    out = np.empty((len(cur), k), dtype=np.int64)  # (hi - lo, k)
    for j in range(k - 1, 0, -1):
        out[:, j] = cur % V
        cur = keys[j][cur // V]
    out[:, 0] = cur
    return out


def find(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Index of each query key in the sorted ``keys`` array, or -1 where it is absent."""
    idx = np.searchsorted(keys, queries)
    inside = idx < len(keys)
    found = np.zeros(len(queries), dtype=bool)
    found[inside] = keys[idx[inside]] == queries[inside]
    return np.where(found, idx, -1)


def flatten(lengths: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sentences (concatenated ``words``, ``lengths`` words each) → ``<s> w… </s>`` token stream.

    Returns (tokens, position of each token in its sentence (0 for <s>), start offset of each sentence).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    padded = lengths + 2
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(padded[:-1], out=starts[1:])
    total = int(padded.sum())
    tok = np.empty(total, dtype=np.int64)  # (total,)
    is_word = np.ones(total, dtype=bool)
    is_word[starts] = False
    is_word[starts + padded - 1] = False
    tok[starts] = BOS
    tok[starts + padded - 1] = EOS
    tok[is_word] = words
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, padded)  # (total,)
    return tok, pos, starts


def _merge(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray):
    """Add sorted unique (new_keys, new_counts) into sorted unique (keys, counts).

    Returns (keys, counts, shift) where old entry i is now at ``i + shift[i]``.
    """
    ins = np.searchsorted(keys, new_keys)
    present = np.zeros(len(new_keys), dtype=bool)
    inside = ins < len(keys)
    present[inside] = keys[ins[inside]] == new_keys[inside]
    counts[ins[present]] += new_counts[present]
    fresh = ~present
    shift = np.cumsum(np.bincount(ins[fresh], minlength=len(keys) + 1))[: len(keys)]
    return np.insert(keys, ins[fresh], new_keys[fresh]), np.insert(counts, ins[fresh], new_counts[fresh]), shift


class NgramCounter:
    """Counts n-grams of orders 1..``order`` over sentences of ids in ``[0, vocab_size)``.

    >>> c = NgramCounter(2, 4)
    >>> c.add([3, 3])
    >>> counts = c.finish()
    >>> counts.counts[1].tolist(), counts.keys[2].tolist(), counts.counts[2].tolist()
    ([0, 1, 1, 2], [7, 14, 15], [1, 1, 1])
    """

    def __init__(self, order: int, vocab_size: int, min_batch_tokens: int = MIN_BATCH_TOKENS):
        if order < 1:
            raise ValueError(f"n-gram order must be at least 1 (got {order})")
        if vocab_size < 3:
            raise ValueError("the vocabulary must hold at least <unk>, <s> and </s>")
        self.order = order
        self.V = vocab_size
        self.min_batch_tokens = min_batch_tokens
        self.keys = [np.zeros(0, np.int64) for _ in range(order + 1)]
        self.counts = [np.zeros(0, np.int64) for _ in range(order + 1)]
        self.keys[1] = np.arange(vocab_size, dtype=np.int64)
        self.counts[1] = np.zeros(vocab_size, dtype=np.int64)
        self.sentences = 0
        self.tokens = 0
        self._words = array("i")
        self._lengths = array("i")
        self._batch = min_batch_tokens  # flush when this many words are buffered

    def add(self, ids: Sequence[int]) -> None:
        """Count one sentence (its word ids, without <s>/</s>)."""
        self._words.extend(ids)
        self._lengths.append(len(ids))
        if len(self._words) >= self._batch:
            self._flush()
            self._batch = max(self.min_batch_tokens, sum(len(k) for k in self.keys[2:]) // 4)

    def add_all(self, sentences: Iterable[Sequence[int]]) -> NgramCounter:
        for ids in sentences:
            self.add(ids)
        return self

    def finish(self) -> NgramCounts:
        """The counts so far (the counter can go on counting afterwards)."""
        self._flush()
        return NgramCounts(self.order, self.V, list(self.keys), list(self.counts), self.sentences, self.tokens)

    def _flush(self) -> None:
        if not self._lengths:
            return
        words = np.frombuffer(self._words, dtype=np.int32).astype(np.int64)
        lengths = np.frombuffer(self._lengths, dtype=np.int32)
        if len(words) and (words.min() < 0 or words.max() >= self.V):
            raise ValueError(f"word ids must lie in [0, {self.V})")
        self._words, self._lengths = array("i"), array("i")
        self.sentences += len(lengths)
        self.tokens += len(words)
        tok, pos, _ = flatten(lengths, words)
        self.counts[1] += np.bincount(tok, minlength=self.V)
        V = self.V
        prev = tok  # index in order k-1 of the (k-1)-gram ending at each position (order 1: the id itself)
        shift = None  # how far each old entry of order k-1 moved in this merge
        for k in range(2, self.order + 1):
            at = np.flatnonzero(pos >= k - 1)  # positions where a k-gram ends (maybe none: then only re-keying)
            q = prev[at - 1] * V + tok[at]  # (n,) keys of the k-grams, against the merged order k-1
            uq, uc = np.unique(q, return_counts=True)
            keys = self.keys[k]
            if shift is not None and len(keys):
                p = keys // V
                keys = (p + shift[p]) * V + keys % V  # re-key after the lower order's insertions (still sorted)
            self.keys[k], self.counts[k], shift = _merge(keys, self.counts[k], uq, uc.astype(np.int64))
            prev = np.full(len(tok), -1, dtype=np.int64)
            prev[at] = np.searchsorted(self.keys[k], q)
