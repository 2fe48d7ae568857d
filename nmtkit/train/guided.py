"""Guided alignment (``nmt-train --guided-alignment``): train the attention towards an external word aligner's links.

Unsupervised, RNNsearch's attention aligns words only roughly, far behind a statistical aligner such as eflomal
(what guidance gains, measured: tests/bench/results/bench_posterior.txt).  Chen et al. (2016, "Guided Alignment Training for
Topic-Aware Neural Machine Translation") add to the translation loss a cross-entropy between each target position's
attention α_i and the normalised links of a statistical aligner; Marian (``--guided-alignment``), fairseq
(``--alignment-lambda``) and OpenNMT-py (``lambda_align``) train alignments so.  Here:

- **The links** come in a Pharaoh file with one line per line of the prepared corpus's ``train.tok.<src>`` and
  ``train.tok.<tgt>`` (what an aligner run on those two files writes: ``i-j``, 0-based word positions; ``i-j-P``
  and ``i?j`` links count as links too).  ``order`` says which side a link names first.  The pairs a length filter
  removed (``train.kept``) are skipped; every other line is checked against its words before training starts (one
  error naming the file, line and link).
- **The target** of a pair's attention (:meth:`GuidedAlignment.targets`): the word links carried to model tokens
  (every unit of target word j linked to every unit of the source words linked to j), ``</s>`` linked to
  ``</s>``, each row normalised to sum to 1.  A target word without links, a pair without any, and a pair whose
  tokens do not read back into the words its line counts, are not guided: their rows stay zero (the last are
  counted, :attr:`GuidedAlignment.unreadable`, and the trainer warns of them).
- **The loss** (:meth:`nmtkit.models.rnnsearch.RNNencdec.training_loss` with ``guide``): Σ −Ã_ij log α_ij over the
  guided rows, added to the translation loss with the weight λ (``--guided-alignment-weight``) before the update's
  mean over sentences, so λ weighs one guided row against one target token's cross-entropy (Marian's scale).
"""

from __future__ import annotations

import hashlib
import os
import re

import numpy as np
import torch

from nmtkit.data.vocab import UNK
from nmtkit.errors import InputError

ORDERS = ("src-tgt", "tgt-src")
_LINK = re.compile(r"^(\d+)[-?](\d+)(?:-[SP])?$")


def file_fingerprint(path: str) -> str:
    """The SHA-256 of a file's bytes: what a resumed run checks its links against."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parse(text: str, path: str, line: int) -> list[tuple[int, int]]:
    """One line of Pharaoh links as written (first, second)."""
    out = []
    for raw in text.split():
        m = _LINK.match(raw)
        if m is None:
            raise InputError(f"'{raw}' is not a Pharaoh link (i-j, i-j-P or i?j)", path, line)
        out.append((int(m.group(1)), int(m.group(2))))
    return out


class GuidedAlignment:
    """The word links of every training pair of a prepared corpus, and the attention targets they give a batch.

    ``data``: the :class:`nmtkit.data.manifest.PreparedData` trained on; ``order``: ``src-tgt`` (a link ``i-j``
    names a source word first) or ``tgt-src``.  Read and checked whole when made: the links of every pair trained
    on (the lines of the pairs a length filter removed are not read)."""

    def __init__(self, path: str, data, order: str = "src-tgt"):
        from nmtkit.data.bpedropout import TokenLines
        from nmtkit.data.text import Preprocessor
        from nmtkit.files import read_segments

        if order not in ORDERS:
            raise InputError(f"unknown --guided-alignment-order '{order}' (src-tgt or tgt-src)")
        src, tgt = data.source_lang, data.target_lang
        tok = [data.path(f"train.tok.{lang}") for lang in (src, tgt)]
        for p in tok:
            if not os.path.isfile(p):
                raise InputError(f"--guided-alignment links count the words of {os.path.basename(p)}, which this "
                                 "prepared corpus lacks (prepare it again with this nmtkit)", data.directory)
        self._text = tuple(TokenLines(p) for p in tok)  # the words of each line of train.tok.<src> and .<tgt>
        n_src, n_tgt = (text.word_counts() for text in self._text)
        if len(n_src) != len(n_tgt):
            raise InputError(f"has {len(n_tgt)} lines but {tok[0]} has {len(n_src)}; prepare the data again", tok[1])
        kept = data.path("train.kept")
        lines = (np.loadtxt(kept, dtype=np.int64, ndmin=1) if os.path.isfile(kept)
                 else np.arange(1, len(n_src) + 1))  # the 1-based line of train.tok.* of each corpus pair
        if len(lines) and not 1 <= lines.min() <= lines.max() <= len(n_src):
            raise InputError(f"names lines outside the {len(n_src)} of {tok[0]}; prepare the data again", kept)
        self.path, self.order = path, order
        self.fingerprint = file_fingerprint(path)
        texts = [seg.text for seg in read_segments(path)]
        if len(texts) != len(n_src):
            raise InputError(f"has {len(texts)} lines of links but {tok[0]} has {len(n_src)}: give one line per "
                             "line of train.tok (an aligner run on train.tok.* writes that)", path)
        flat: list[tuple[int, int]] = []
        offsets = [0]
        for line, n, m in zip(lines.tolist(), n_src[lines - 1].tolist(), n_tgt[lines - 1].tolist()):
            pairs = _parse(texts[line - 1], path, line)
            if order == "tgt-src":
                pairs = [(b, a) for a, b in pairs]
            for (i, j), raw in zip(pairs, texts[line - 1].split()):
                if i >= n or j >= m:
                    side, pos, count = ("source", i, n) if i >= n else ("target", j, m)
                    raise InputError(f"link {raw} names {side} word {pos} but that side of the pair has {count} words "
                                     f"(is --guided-alignment-order right?)", path, line)
            flat.extend(pairs)
            offsets.append(len(flat))
        self._links = np.array(flat, dtype=np.int32).reshape(-1, 2)  # (all links, 2): (source word i, target word j)
        self._offsets = np.array(offsets, dtype=np.int64)  # pair k's links: _links[_offsets[k]:_offsets[k + 1]]
        self.lines = lines - 1  # per corpus pair: its 0-based line of train.tok.*
        self.words = (n_src[lines - 1], n_tgt[lines - 1])  # per corpus pair: word counts of each side
        self.total_links = len(flat)
        self._pre = (Preprocessor(data.text_config(src)), Preprocessor(data.text_config(tgt)))
        self._tokens = (data.vocab(src).tokens, data.vocab(tgt).tokens)
        self.unreadable: set[int] = set()  # corpus pairs whose tokens do not read back into their words

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def links(self, k: int) -> np.ndarray:
        """Corpus pair ``k``'s links, (n, 2) (source word i, target word j)."""
        return self._links[self._offsets[k]: self._offsets[k + 1]]

    def _owners(self, side: int, ids: np.ndarray, k: int, view) -> np.ndarray | None:
        """The word (of the links' counting) each model token of sentence ``k`` belongs to, or None when its tokens
        cannot be read so.  Without subwords a token is a word; else the tokens are merged back into words, unless
        one of them is ``<unk>`` (an unknown unit hides where its word ends): then the words of the pair's line
        are segmented again, as ``view`` (what the batch's tokens were read from) segmented them -- BPE-dropout's
        segmentation of this epoch (its ``units_per_word``) or the prepared corpus's."""
        pre = self._pre[side]
        if not pre.segmented:
            owner = np.arange(len(ids))
        elif UNK not in ids:
            tokens = self._tokens[side]
            owner = np.asarray(pre.words_of([tokens[t] for t in ids.tolist()])[1], dtype=np.int64)
        else:
            if hasattr(view, "units_per_word"):
                units = view.units_per_word(k)
            else:
                units = [len(pre.subwords([w])) for w in self._text[side].words(int(self.lines[k])) if w]
            owner = np.repeat(np.arange(len(units)), units) if sum(units) == len(ids) else None
        words = int(owner[-1]) + 1 if owner is not None and len(owner) else 0
        return owner if owner is not None and words == self.words[side][k] else None

    def targets(self, ids: np.ndarray, views: tuple, width: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """The attention targets of a batch: pairs ``ids`` of the corpus, read from ``views`` (the source and target
        corpora the batch was made of, which give each pair's model tokens without ``</s>``) -> (Ã (B, Ty, Tx)
        float32 for ``width`` = (Ty, Tx), the batch's padded target and source lengths with ``</s>``: the rows of
        the guided positions sum to 1, the others are 0; the number of guided rows).  A pair without links is not
        guided at all (not even its ``</s>``)."""
        Ty, Tx = width
        out = np.zeros((len(ids), Ty, Tx), dtype=np.float32)
        for b, k in enumerate(ids):
            k = int(k)
            links = self.links(k)
            if not len(links):
                continue
            x_of, y_of = (self._owners(side, views[side][k], k, views[side]) for side in (0, 1))
            if x_of is None or y_of is None:
                self.unreadable.add(k)
                continue
            L = np.zeros((self.words[1][k], self.words[0][k]), dtype=np.float32)  # (target words, source words)
            L[links[:, 1], links[:, 0]] = 1.0
            out[b, : len(y_of), : len(x_of)] = L[y_of][:, x_of]  # word links carried to every unit
            out[b, len(y_of), len(x_of)] = 1.0  # </s> to </s>
        rows = out.sum(-1, keepdims=True)
        np.divide(out, rows, out=out, where=rows > 0)
        return torch.from_numpy(out), int((rows > 0).sum())

    def where(self, k: int) -> str:
        """Where corpus pair ``k`` comes from, for messages: its line of the links file and of train.tok."""
        return f"{self.path}:{int(self.lines[k]) + 1}"
