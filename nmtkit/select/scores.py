"""Cross-entropy-difference scores of general-corpus pairs, and the scores file of ``nmt-select``.

Scoring runs in the processes of a :class:`nmtkit.parallel.Mapper`: :func:`init_worker` gives each one the
preprocessors of the scored languages and, per language, the shared vocabulary with the in-domain language model
and the general models of the folds (inherited, not copied, under ``fork``); :func:`score_chunk` tokenises a chunk
of (fold, pair) and returns the per-token cross-entropies, in bits, H = -log2 P(sentence) / (tokens + 1)
(``</s>`` counted as a token, as in perplexities), H_gen under the general model of the pair's fold.

The scores file, version 2, is tab-separated UTF-8::

    #nmt-select-scores 2
    #score = [H_in(en) - H_gen(en)] + [H_in(fr) - H_gen(fr)]: ...
    #corpus 1 = data/europarl.en.gz,data/europarl.fr.gz
    corpus  line  fold  score  h_in_en  h_gen_en  tokens_en  h_in_fr  h_gen_fr  tokens_fr  selected
    1       1     0     -0.412300  …

with one row per general pair in input order: the corpus number K (from 1, as listed in the ``#corpus K`` lines),
the pair's line in the source file, its fold (:func:`nmtkit.select.config.fold_of`; which general model scored it:
the one trained on a sample of the other fold), the score (``nan``: not scored, a scored side is empty), for each
scored language the two cross-entropies and its number of tokens, and whether the pair was selected (1) or not (0).
:func:`read_scores` reads it back (version 1, without the fold, too).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import TextIO

import numpy as np

from nmtkit.parallel import Mapper
from nmtkit.data.text import Preprocessor, TextConfig

BITS = math.log2(10)  # log10 → log2
SCORES_HEADER = "#nmt-select-scores 2"
_OLDER_HEADERS = ("#nmt-select-scores 1",)

# -- in the worker processes ---------------------------------------------------------------------------------------

_state: dict = {}


def init_worker(text_cfgs: list[dict], models: list | None) -> None:
    """Per process: preprocessors of the scored languages, and (for scoring) per language (vocab, LM_in, the general
    LMs of the folds)."""
    _state["pre"] = [Preprocessor(TextConfig.from_dict(c)) for c in text_cfgs]
    _state["models"] = models


def tokenize_chunk(items: list[tuple[str, ...]]) -> list[list[list[str]]]:
    """Tokens of each text of each item (one text per scored language)."""
    return [[pre.words(text) for pre, text in zip(_state["pre"], item)] for item in items]


def _cross_entropies(lm, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Bits per token of each sentence under lm, and the sentences' lengths."""
    lengths = np.array([len(s) for s in ids], dtype=np.int64)  # (sentences,)
    words = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return -lm.score_ids(lengths, words) * BITS / (lengths + 1), lengths


def score_chunk(items: list[tuple[int, tuple[str, ...]]]) -> np.ndarray:
    """(fold, texts) items → (items, 3 × languages): H_in, H_gen under the fold's general model (bits per token)
    and the number of tokens of each scored side."""
    out = np.empty((len(items), 3 * len(_state["pre"])))
    folds = np.array([fold for fold, _ in items], dtype=np.int64)
    for j, (pre, (vocab, lm_in, lm_gens)) in enumerate(zip(_state["pre"], _state["models"])):
        ids = [vocab.ids(pre.words(texts[j])) for _, texts in items]
        out[:, 3 * j], lengths = _cross_entropies(lm_in, ids)
        out[:, 3 * j + 2] = lengths
        for k, lm in enumerate(lm_gens):
            rows = np.flatnonzero(folds == k)
            if len(rows):
                out[rows, 3 * j + 1] = _cross_entropies(lm, [ids[r] for r in rows])[0]
    return out


# -- the scoring pass ----------------------------------------------------------------------------------------------


def score_pairs(pairs: Iterable[tuple[int, int, tuple[str, ...]]], folds: np.ndarray, workers: int,
                text_cfgs: list[dict], models: list, rows: TextIO) -> tuple[np.ndarray, np.ndarray]:
    """Score the pairs given as (corpus, line, texts of the scored sides), streaming; ``folds`` (one per pair)
    says which general model scores each.

    Returns the scores (Σ_lang H_in - H_gen; nan where a side is empty), (pairs,), and the tokens of each scored
    side, (pairs, languages) int32; writes one row per pair (the scores-file columns but ``selected``) to ``rows``.
    """
    total = len(folds)
    n_langs = len(text_cfgs)
    score = np.empty(total)
    tokens = np.empty((total, n_langs), dtype=np.int32)
    where: deque = deque()  # (corpus, line) of the pairs handed to the mapper and not scored yet

    def texts():
        for i, (corpus, line, item) in enumerate(pairs):
            where.append((corpus, line, int(folds[i])))
            yield int(folds[i]), item

    at = 0
    with Mapper(workers, init_worker, (text_cfgs, models)) as mapper:
        for block in mapper.map_chunks(score_chunk, texts()):
            n = len(block)
            h = block.reshape(n, n_langs, 3)  # (pairs, langs, [H_in, H_gen, tokens])
            s = (h[:, :, 0] - h[:, :, 1]).sum(axis=1)  # (pairs,)
            s[(h[:, :, 2] == 0).any(axis=1)] = np.nan
            score[at:at + n] = s
            tokens[at:at + n] = h[:, :, 2]
            for r in range(n):
                corpus, line, fold = where.popleft()
                sides = "\t".join(f"{x:.6f}\t{y:.6f}\t{int(t)}" for x, y, t in h[r].tolist())
                rows.write(f"{corpus}\t{line}\t{fold}\t{s[r]:.6f}\t{sides}\n")
            at += n
    return score, tokens


# -- the scores file -----------------------------------------------------------------------------------------------


def write_scores(f: TextIO, langs: list[str], corpora: list[tuple[str, ...]], rows: Iterable[str],
                 selected: np.ndarray) -> None:
    """The scores file: header, then each row written by :func:`score_pairs` with its ``selected`` flag."""
    formula = " + ".join(f"[H_in({lang}) - H_gen({lang})]" for lang in langs)
    f.write(f"{SCORES_HEADER}\n#score = {formula}: per-token cross-entropies in bits (</s> counted as a token); "
            "lower = more like the in-domain data; nan = not scored (an empty side); H_gen under the general model "
            "of the pair's fold (a hash of its position), trained on a sample of the other fold\n")
    for k, files in enumerate(corpora, start=1):
        f.write(f"#corpus {k} = {','.join(files)}\n")
    cols = "\t".join(f"h_in_{lang}\th_gen_{lang}\ttokens_{lang}" for lang in langs)
    f.write(f"corpus\tline\tfold\tscore\t{cols}\tselected\n")
    for i, row in enumerate(rows):
        f.write(f"{row.rstrip(chr(10))}\t{int(selected[i])}\n")


@dataclass
class Scores:
    """A scores file read back: the corpora (files of each), and each column as an array."""

    corpora: list[list[str]]
    columns: dict[str, np.ndarray]


def read_scores(path: str) -> Scores:
    """Read a scores file (version 2, or 1: without the fold column)."""
    corpora, names, cells = [], None, []
    with open(path, encoding="utf-8", newline="\n") as f:
        first = f.readline().rstrip("\n")
        if first != SCORES_HEADER and first not in _OLDER_HEADERS:
            raise ValueError(f"{path}: not an nmt-select scores file of version 1 or 2 (first line {first[:40]!r})")
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#corpus "):
                corpora.append(line.split(" = ", 1)[1].split(","))
            elif line.startswith("#"):
                continue
            elif names is None:
                names = line.split("\t")
            else:
                cells.append(line.split("\t"))
    table = np.array(cells, dtype=object).reshape(len(cells), len(names))
    columns = {}
    for j, name in enumerate(names):
        kind = float if name == "score" or name.startswith("h_") else int
        columns[name] = np.array([kind(x) for x in table[:, j]], dtype=np.float64 if kind is float else np.int64)
    return Scores(corpora, columns)
