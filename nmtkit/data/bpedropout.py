"""BPE-dropout (Provilkov et al., 2020): while training, each merge of a word's segmentation is skipped with
probability p, so the model sees many segmentations of the same words; translation keeps the deterministic one.

The algorithm is subword-nmt's (``apply_bpe.encode`` with ``dropout``): at every step the pairs of adjacent
symbols that are merges are listed, each dropped with probability p (one uniform number drawn per adjacent pair, in
order), and the best-ranked remaining merge is applied everywhere it occurs; with no merge left the word is done.
Units outside the model's vocabulary are then split back by undoing their merges (subword-nmt's
``--vocabulary``), so dropout does not turn known words into ``<unk>``.  It is written here rather than called
because subword-nmt draws from Python's global random state and stores a dropped-out segmentation in the cache
that its deterministic segmentation reads; here every sentence's draws come from its own generator, seeded by
(seed, epoch, sentence, side): an epoch's segmentations are a pure function of those, so a resumed run sees the
units an uninterrupted one would have seen.

:class:`DropoutCorpus` serves a training split's ids with dropout applied: the schedule still sorts the pools by
the deterministic lengths of the prepared corpus (the two differ by a few units).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

import numpy as np

from nmtkit.errors import InputError
from nmtkit.data.text import BPE_SEPARATOR, bpe_codes_problem
from nmtkit.data.vocab import Vocabulary

_END = "</w>"


class BPEDropout:
    """Segment words with the merges of a subword-nmt codes text, dropping each with probability ``p``.

    ``vocab`` (the model's units) restricts the output as subword-nmt's ``--vocabulary`` does; ``p = 0`` gives
    subword-nmt's own deterministic segmentation.
    """

    def __init__(self, codes: str, p: float, vocab: Vocabulary | None = None, separator: str = BPE_SEPARATOR):
        if not 0 <= p < 1:
            raise ValueError(f"BPE-dropout must be in [0, 1) (got {p})")
        problem = bpe_codes_problem(codes)
        if problem is not None:
            raise ValueError(f"bad BPE codes: {problem}")
        lines = codes.split("\n")
        self.version = (0, 1)
        if lines and lines[0].startswith("#version:"):
            self.version = tuple(int(x) for x in lines[0].split()[-1].split("."))
            lines = lines[1:]
        self.rank: dict[tuple[str, str], int] = {}
        for line in lines:
            pair = tuple(line.strip("\r\n ").split(" "))
            if len(pair) == 2:
                self.rank.setdefault(pair, len(self.rank))  # (the first occurrence of a merge is its rank)
        self.split_of = {a + b: (a, b) for (a, b) in self.rank}  # merged unit → the pair it was made of
        self.p, self.sep = p, separator
        self.vocab = None if vocab is None else vocab.index

    def word(self, word: str, rng: random.Random) -> list[str]:
        """One word → its units (separator on all but the last)."""
        if len(word) == 1:
            return [word]  # (as subword-nmt: a one-character word is never split or checked)
        symbols = list(word) + [_END] if self.version == (0, 1) else list(word[:-1]) + [word[-1] + _END]
        p, rank = self.p, self.rank
        while len(symbols) > 1:
            candidates = [(rank[pair], i, pair) for i, pair in enumerate(zip(symbols, symbols[1:]))
                          if (not p or rng.random() > p) and pair in rank]
            if not candidates:
                break
            best, _, pair = min(candidates)
            merged, out, i = pair[0] + pair[1], [], 0
            for j in (j for r, j, _ in candidates if r == best):  # (in order)
                if j < i:  # (overlapping occurrences: x x x → xx x)
                    continue
                out.extend(symbols[i:j])
                out.append(merged)
                i = j + 2
            out.extend(symbols[i:])
            symbols = out
        if symbols[-1] == _END:
            symbols = symbols[:-1]
        elif symbols[-1].endswith(_END):
            symbols[-1] = symbols[-1][: -len(_END)]
        if self.vocab is not None:
            symbols = self._in_vocab(symbols)
        return [s + self.sep for s in symbols[:-1]] + [symbols[-1]]

    def words(self, words: Sequence[str], rng: random.Random) -> list[str]:
        """A sentence's words → its units (empty words skipped, as subword-nmt does)."""
        return [unit for w in words if w for unit in self.word(w, rng)]

    def _in_vocab(self, symbols: list[str]) -> list[str]:
        out: list[str] = []
        for k, s in enumerate(symbols):
            out.extend(self._split(s, final=k == len(symbols) - 1))
        return out

    def _split(self, unit: str, final: bool) -> list[str]:
        """A unit outside the vocabulary → the units of the merge that made it, recursively (as subword-nmt)."""
        if (unit if final else unit + self.sep) in self.vocab:
            return [unit]
        if final:
            made = self.split_of.get(unit + _END)
            pair = None if made is None else (made[0], made[1][: -len(_END)])
        else:
            pair = self.split_of.get(unit)
        if pair is None:
            return [unit]
        return self._split(pair[0], False) + self._split(pair[1], final)


def sentence_rng(seed: int, epoch: int, sentence: int, side: int) -> random.Random:
    """The generator of one sentence's dropout draws in one epoch (a string seed: the same in every process)."""
    return random.Random(f"bpe-dropout:{seed}:{epoch}:{sentence}:{side}")


class TokenLines:
    """Random access to the lines of a prepared ``<split>.tok.<lang>`` file (memory-mapped)."""

    def __init__(self, path: str):
        self.path = path
        self.buf = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
        ends = np.flatnonzero(self.buf == 10)
        self.starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else np.zeros(0, np.int64)
        self.ends = ends

    def __len__(self) -> int:
        return len(self.ends)

    def words(self, i: int) -> list[str]:
        line = bytes(self.buf[self.starts[i]: self.ends[i]]).decode("utf-8")
        return line.split(" ") if line else []

    def word_counts(self) -> np.ndarray:
        """The number of words of every line (nmt-prepare writes them separated by single spaces)."""
        spaces = np.zeros(len(self.ends) + 1, dtype=np.int64)
        np.add.at(spaces, np.searchsorted(self.ends, np.flatnonzero(self.buf == 32)), 1)
        return np.where(self.ends > self.starts, spaces[:-1] + 1, 0)


class DropoutCorpus:
    """A training split of one language as ids, each sentence segmented anew with BPE-dropout in every epoch.

    Sentence ``k`` is the ``k``-th kept training pair (``train.kept`` gives its line in ``train.tok.<lang>``).
    Set :attr:`epoch` before reading an epoch's sentences.
    """

    def __init__(self, directory: str, lang: str, side: int, codes: str, p: float, vocab: Vocabulary, seed: int,
                 size: int):
        self.words = TokenLines(os.path.join(directory, f"train.tok.{lang}"))
        kept_path = os.path.join(directory, "train.kept")
        try:
            self.line_of = np.loadtxt(kept_path, dtype=np.int64, ndmin=1) - 1
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read the kept training lines that BPE-dropout needs ({e})", kept_path) from None
        if len(self.line_of) != size or (size and (self.line_of.min() < 0 or self.line_of.max() >= len(self.words))):
            raise InputError(f"does not match the binarized training corpus ({len(self.line_of)} kept lines for "
                             f"{size} pairs, {len(self.words)} tokenised lines); prepare the data again",
                             kept_path)
        self.bpe = BPEDropout(codes, p, vocab)
        self.vocab, self.seed, self.side, self._epoch = vocab, seed, side, 0
        self._made: dict[int, np.ndarray] = {}  # the sentences of the last pool that ``lengths`` segmented

    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        if value != self._epoch:
            self._made = {}
        self._epoch = value

    def __len__(self) -> int:
        return len(self.line_of)

    def _segment(self, k: int) -> np.ndarray:
        rng = sentence_rng(self.seed, self._epoch, int(k), self.side)
        units = self.bpe.words(self.words.words(int(self.line_of[k])), rng)
        return self.vocab.encode(units)

    def units_per_word(self, k: int) -> list[int]:
        """How many units each word of sentence ``k`` has in this epoch's segmentation (the same draws as its ids:
        guided alignment carries word links to units with it)."""
        rng = sentence_rng(self.seed, self._epoch, int(k), self.side)
        return [len(self.bpe.word(w, rng)) for w in self.words.words(int(self.line_of[k])) if w]

    def __getitem__(self, k: int) -> np.ndarray:
        made = self._made.get(int(k))
        return made if made is not None else self._segment(k)

    def lengths(self, ids: np.ndarray) -> np.ndarray:
        """The lengths of sentences ``ids`` in this epoch's segmentation, which are kept until the next call: the
        trainer sorts a pool by them (batching.EpochSchedule), then reads the same sentences back without
        segmenting them again."""
        self._made = {int(k): self._segment(k) for k in ids}
        return np.array([len(self._made[int(k)]) for k in ids], dtype=np.int64)
