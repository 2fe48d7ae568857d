"""Candidate tables: for each source word its likeliest target words, and the most frequent target words -- what a
batch's candidate list is made of (Jean et al. 2015, §3.2; decoding over it: :mod:`nmtkit.translate.candidates`).

:func:`build` makes the table from a prepared corpus' training ids: IBM Model 1's p(f | e) (Brown et al. 1993), a
few EM iterations from uniform over the token pairs that co-occur in a sentence pair, on at most ``max_pairs`` pairs
spread over the corpus.  It keeps the ``MOST_COMMON`` most frequent target ids and, per source id, its
``MOST_PER_WORD`` best translations: a :class:`CandidateTable`, which ``nmt-prepare`` saves as ``candidates.npz``
beside the vocabularies (:func:`save`) and ``nmt-translate --candidates`` reads back, checked whole and against the
checkpoint's vocabularies (:func:`load`).  :meth:`CandidateTable.batch_vocab` is a batch's list.
"""


from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, replace

import numpy as np

from nmtkit.data.corpus import Corpus
from nmtkit.errors import InputError
from nmtkit.files import atomic_file

FILE = "candidates.npz"  # in a prepared directory
FORMAT = "nmtkit-candidates"
VERSION = 1
SPECIALS = 4  # <pad>, <unk>, <s>, </s>: ids 0-3 (nmtkit.data.vocab)
COMMON, PER_WORD = 500, 10  # what a batch's list takes by default: the best BLEU on both development sets of the
# lists tried (tests/bench/results/bench_candidates-tune.txt, -tune-smaller.txt), 1.6-1.7× the lines/s there
MOST_COMMON, MOST_PER_WORD = 4000, 100  # what a table keeps, for lists up to these sizes


def digest(tokens: list[str]) -> str:
    """A vocabulary's identity: the SHA-256 of its tokens in id order."""
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CandidateTable:
    """``common`` (F,) the target ids by frequency, most frequent first; ``translations`` (V_src, k) each source
    id's likeliest target ids, best first, -1 where it has fewer; the vocabularies' digests and sizes; and the sizes
    a batch's list takes (``COMMON``, ``PER_WORD`` unless :meth:`sized` says otherwise; saved with the table)."""

    common_ids: np.ndarray
    translations: np.ndarray
    src_digest: str
    tgt_digest: str
    tgt_size: int
    common: int = COMMON
    per_word: int = PER_WORD

    def sized(self, common: int, per_word: int) -> CandidateTable:
        """The same table giving lists of the ``common`` most frequent ids and ``per_word`` translations a word."""
        if common < 0 or per_word < 0:
            raise ValueError(f"candidate list sizes must be at least 0 (got {common}, {per_word})")
        if common > len(self.common_ids) or per_word > self.translations.shape[1]:
            raise ValueError(f"the table keeps {len(self.common_ids)} common ids and {self.translations.shape[1]} "
                             f"translations a word; asked for {common} and {per_word}")
        return replace(self, common=common, per_word=per_word)

    def batch_vocab(self, sources: list[np.ndarray], must: np.ndarray | None = None) -> np.ndarray:
        """The sorted target ids (V',) int64 a batch of source id arrays decodes over: the specials, the common
        ids, the sources' words' translations, and ``must``."""
        parts = [np.arange(SPECIALS), self.common_ids[: self.common]]
        if sources and self.per_word:
            words = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in sources]))
            words = words[(words >= 0) & (words < len(self.translations))]
            found = self.translations[words, : self.per_word].ravel()
            parts.append(found[found >= 0])
        if must is not None and len(must):
            parts.append(np.asarray(must, dtype=np.int64))
        return np.unique(np.concatenate([p.astype(np.int64) for p in parts]))


def _pairs(src: Corpus, tgt: Corpus, max_pairs: int, max_links: int) -> np.ndarray:
    """The sentence pairs used, evenly spread over the corpus: all, or as many as keep them to ``max_pairs`` and
    their source × target token pairs to about ``max_links`` (the memory :func:`model1` takes); pairs with an empty
    side left out."""
    sizes_s, sizes_t = np.asarray(src.sizes, dtype=np.int64), np.asarray(tgt.sizes, dtype=np.int64)
    usable = np.flatnonzero((sizes_s > 0) & (sizes_t > 0))
    links = int((sizes_s[usable] * sizes_t[usable]).sum())
    n = min(len(usable), max_pairs, int(len(usable) * max_links / links) if links > max_links else len(usable))
    if n >= len(usable):
        return usable
    return usable[np.linspace(0, len(usable) - 1, n).round().astype(np.int64)]


def _gather(corpus: Corpus, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chosen sentences' ids, concatenated (int64), and their lengths."""
    offsets, data = np.asarray(corpus._offsets), np.asarray(corpus._data)
    lens = (offsets[chosen + 1] - offsets[chosen]).astype(np.int64)
    starts = np.repeat(offsets[chosen] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return data[np.arange(lens.sum()) + starts].astype(np.int64), lens


def model1(src: Corpus, tgt: Corpus, src_size: int, tgt_size: int, max_pairs: int = 200_000,
           max_links: int = 20_000_000, iterations: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IBM Model 1's translation table p(f | e) for the token pairs (e, f) that co-occur in a sentence pair:
    (e (P,), f (P,), p (P,)), sorted by e then f.  Every target position's alignment is spread over its sentence's
    source positions in proportion to p(f | e) (E step), and p(f | e) is the expected count of (e, f) over that of
    e (M step), from uniform.  No NULL word: a candidate list needs each source word's translations, not the
    target words that translate nothing."""
    chosen = _pairs(src, tgt, max_pairs, max_links)
    e_ids, e_lens = _gather(src, chosen)
    f_ids, f_lens = _gather(tgt, chosen)
    links = e_lens * f_lens  # (S,) the (i, j) pairs of each sentence pair
    e_start, f_start = np.cumsum(e_lens) - e_lens, np.cumsum(f_lens) - f_lens
    key = np.empty(int(links.sum()), dtype=np.int64)  # each link's (e, f) as e · V_f + f
    f_pos = np.empty(len(key), dtype=np.int32)  # each link's target position
    done, step = 0, max(1, len(chosen) // 16)
    for a in range(0, len(chosen), step):  # (in chunks of pairs: the index arithmetic's arrays stay small)
        n = links[a: a + step]
        pair = np.repeat(np.arange(a, a + len(n)), n)
        r = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # position within its pair
        i, j = r % e_lens[pair], r // e_lens[pair]
        at = f_start[pair] + j
        key[done: done + len(r)] = e_ids[e_start[pair] + i] * tgt_size + f_ids[at]
        f_pos[done: done + len(r)] = at
        done += len(r)
    keys, link_key = np.unique(key, return_inverse=True)  # (P,) the distinct (e, f), each link's one
    del key
    link_key = link_key.astype(np.int32)
    e_of = keys // tgt_size
    p = np.ones(len(keys))
    for _ in range(iterations):
        w = p[link_key]  # p(f_j | e_i) per link
        w /= np.bincount(f_pos, weights=w, minlength=len(f_ids))[f_pos]  # the alignment posterior of the link
        counts = np.bincount(link_key, weights=w, minlength=len(keys))  # expected count of (e, f)
        p = counts / np.bincount(e_of, weights=counts, minlength=src_size)[e_of]
    return e_of, keys % tgt_size, p


def build(src: Corpus, tgt: Corpus, src_tokens: list[str], tgt_tokens: list[str], max_pairs: int = 200_000,
          max_links: int = 20_000_000, iterations: int = 4) -> CandidateTable:
    """A :class:`CandidateTable` from a training corpus' ids and its vocabularies (:func:`model1`'s table)."""
    V_src, V_tgt = len(src_tokens), len(tgt_tokens)
    counts = np.bincount(np.asarray(tgt._data).astype(np.int64), minlength=V_tgt)[:V_tgt]
    counts[:SPECIALS] = 0  # (in every list anyway)
    common = np.argsort(-counts, kind="stable")[: min(MOST_COMMON, V_tgt - SPECIALS)]
    common = common[counts[common] > 0].astype(np.int32)
    e, f, p = model1(src, tgt, V_src, V_tgt, max_pairs, max_links, iterations)
    order = np.lexsort((-p, e))  # by source id, then best first
    e, f = e[order], f[order]
    starts = np.searchsorted(e, np.arange(V_src))
    rank = np.arange(len(e)) - starts[e]
    keep = rank < MOST_PER_WORD
    translations = np.full((V_src, MOST_PER_WORD), -1, dtype=np.int32)
    translations[e[keep], rank[keep]] = f[keep]
    table = CandidateTable(common, translations, digest(src_tokens), digest(tgt_tokens), V_tgt)
    return table.sized(min(COMMON, len(common)), PER_WORD)


def save(table: CandidateTable, path: str) -> None:
    """Write ``table`` to ``path`` (.npz), whole or not at all."""
    with atomic_file(path, "wb", encoding=None) as f:
        np.savez(f, format=np.array(FORMAT), version=np.array(VERSION), common_ids=table.common_ids,
                 translations=table.translations, src_digest=np.array(table.src_digest),
                 tgt_digest=np.array(table.tgt_digest), tgt_size=np.array(table.tgt_size),
                 sizes=np.array([table.common, table.per_word]))


def load(path: str, src_tokens: list[str], tgt_tokens: list[str]) -> CandidateTable:
    """The table at ``path``, checked whole and against the vocabularies it is to decode with (one
    :class:`~nmtkit.errors.InputError` naming the file otherwise)."""
    if not os.path.isfile(path):
        raise InputError("no such file (candidate table)", path)
    try:
        with np.load(path, allow_pickle=False) as z:
            fields = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"not a candidate table (.npz) nmtkit can read: {e}", path) from None
    missing = sorted({"format", "version", "common_ids", "translations", "src_digest", "tgt_digest", "tgt_size",
                      "sizes"} - set(fields))
    if missing or str(fields["format"]) != FORMAT:
        raise InputError(f"not an nmtkit candidate table (format {FORMAT!r}; missing {', '.join(missing)})"
                         if missing else f"not an nmtkit candidate table (format {str(fields['format'])!r})", path)
    if int(fields["version"]) != VERSION:
        raise InputError(f"candidate table version {int(fields['version'])} is not understood (this nmtkit reads "
                         f"version {VERSION})", path)
    common, translations = fields["common_ids"], fields["translations"]
    V_tgt = len(tgt_tokens)
    if str(fields["src_digest"]) != digest(src_tokens) or str(fields["tgt_digest"]) != digest(tgt_tokens):
        raise InputError("built for other vocabularies than the checkpoint's: rebuild it from the corpus the model "
                         "was trained on (nmt-prepare writes candidates.npz)", path)
    if (common.dtype.kind not in "iu" or translations.dtype.kind not in "iu" or common.ndim != 1
            or translations.ndim != 2 or translations.shape[0] != len(src_tokens) or int(fields["tgt_size"]) != V_tgt):
        raise InputError("candidate table has the wrong shapes or types for its vocabularies: corrupt", path)
    if (len(common) and (common.min() < 0 or common.max() >= V_tgt)) or \
            (translations.size and (translations.min() < -1 or translations.max() >= V_tgt)):
        raise InputError(f"candidate table holds target ids outside 0-{V_tgt - 1}: corrupt", path)
    table = CandidateTable(common.astype(np.int32), translations.astype(np.int32), str(fields["src_digest"]),
                           str(fields["tgt_digest"]), V_tgt)
    sizes = fields["sizes"]
    if sizes.dtype.kind not in "iu" or sizes.shape != (2,):
        raise InputError("candidate table's list sizes are not two integers: corrupt", path)
    try:
        return table.sized(int(sizes[0]), int(sizes[1]))
    except ValueError as e:
        raise InputError(f"candidate table's list sizes do not fit it: {e}", path) from None
