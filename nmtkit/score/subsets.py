"""The rows a score is restricted to: the sentences without unknown words (Table 1, second column) and the
sentence-length buckets (Figure 2)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nmtkit.errors import InputError
from nmtkit.score.metrics import moses_tokenize


@dataclass
class Shortlist:
    """The vocabularies and preprocessing that decide which tokens a model knows."""

    origin: str  # the checkpoint or prepared directory they came from
    source_lang: str
    target_lang: str
    src_vocab: object  # nmtkit.data.vocab.Vocabulary
    tgt_vocab: object
    src_config: object  # nmtkit.data.text.TextConfig
    tgt_config: object


def shortlist_from_checkpoint(payload: dict, origin: str) -> Shortlist:
    """The shortlists of a loaded checkpoint (:func:`nmtkit.data.checkpoint.load`)."""
    from nmtkit.data.text import TextConfig
    from nmtkit.data.vocab import Vocabulary

    return Shortlist(origin, payload.get("source_lang", "?"), payload.get("target_lang", "?"),
                     Vocabulary(payload["vocab"]["src"]), Vocabulary(payload["vocab"]["tgt"]),
                     TextConfig.from_dict(payload["preprocessing"]["src"]),
                     TextConfig.from_dict(payload["preprocessing"]["tgt"]))


def shortlist_from_prepared(directory: str) -> Shortlist:
    """The shortlists of a prepared directory (``nmt-prepare``'s output)."""
    from nmtkit.data.manifest import PreparedData

    if not os.path.isdir(directory):
        raise InputError("--vocab takes a prepared directory (the output of nmt-prepare)", directory)
    data = PreparedData.open(directory)
    s, t = data.source_lang, data.target_lang
    return Shortlist(directory, s, t, data.vocab(s), data.vocab(t), data.text_config(s), data.text_config(t))


def no_unk_rows(sources: Sequence[str], references: Sequence[str], shortlist: Shortlist) -> np.ndarray:
    """Indices of the sentences whose source and reference, preprocessed as the model's input is, contain no
    token outside the shortlists (no token the model would see as ``<unk>``)."""
    from nmtkit.data.text import Preprocessor
    from nmtkit.data.vocab import UNK

    src_pre, tgt_pre = Preprocessor(shortlist.src_config), Preprocessor(shortlist.tgt_config)
    keep = [i for i, (s, r) in enumerate(zip(sources, references))
            if UNK not in shortlist.src_vocab.encode(src_pre.tokenize(s))
            and UNK not in shortlist.tgt_vocab.encode(tgt_pre.tokenize(r))]
    return np.asarray(keep, dtype=np.int64)


# -- sentence-length buckets -----------------------------------------------------------------------------------


@dataclass
class Buckets:
    """Sentences grouped by source length: ``index[i]`` is the bucket of sentence i, ``labels[k]`` its name."""

    labels: list[str]
    index: np.ndarray
    lengths: np.ndarray

    def rows(self, k: int) -> np.ndarray:
        return np.flatnonzero(self.index == k)

    def counts(self) -> list[int]:
        return np.bincount(self.index, minlength=len(self.labels)).tolist()


def length_buckets(sources: Sequence[str], lang: str, width: int = 10, top: int = 60) -> Buckets:
    """Buckets of ``width`` words by Moses-tokenized source length: 0–9, 10–19, …, and ``top``+ for the rest."""
    if width < 1 or top < width or top % width:
        raise InputError(f"length buckets need width >= 1 and a top that is a multiple of the width "
                         f"(got width {width}, top {top})")
    lengths = np.array([len(line.split()) for line in moses_tokenize(sources, lang)], dtype=np.int64)
    closed = top // width
    labels = [f"{k * width}-{(k + 1) * width - 1}" for k in range(closed)] + [f"{top}+"]
    return Buckets(labels, np.minimum(lengths // width, closed), lengths)
