"""N-gram language models: interpolated modified Kneser–Ney smoothing (Chen & Goodman, 1998) in numpy arrays.

The pieces, each a plain function or class:

- :class:`LMVocab`: the words a model knows, with ids 0 ``<unk>``, 1 ``<s>``, 2 ``</s>``; every other word maps to
  ``<unk>``, which is an ordinary word class of the model (it has counts, n-grams and probabilities);
- :class:`nmtkit.select.lm_count.NgramCounter`: n-gram counts from streamed sentences of ids, in sorted key arrays;
- :meth:`NgramLM.estimate`: counts → probabilities and backoff weights of every n-gram seen, as arrays;
- :meth:`NgramLM.score_ids` / :meth:`NgramLM.sentence_logprobs`: log10 P(sentence) with ``<s>``/``</s>``, batched;
- :func:`nmtkit.select.lm_arpa.write_arpa`: the model as an ARPA file, the format SRILM, KenLM and Moses read.

The estimate, for an n-gram ``h w`` of order k (context h, its suffix h' without the first word)::

    p(w | h) = (a(h w) - D_k(a(h w))) / Σ_v a(h v)  +  γ(h) p(w | h')
    γ(h)     = (D_k,1 N_1(h •) + D_k,2 N_2(h •) + D_k,3+ N_3+(h •)) / Σ_v a(h v)

where a() is the raw count at the highest order and the continuation count N_1+(• h w) (distinct words seen to the
left) at lower orders, except for n-grams that start with ``<s>``, which have nothing to their left and keep their
raw count (as KenLM's lmplz does); N_r(h •) is the number of words that follow h with a() = r. The discounts come from
the count-of-counts n_1..n_4 of a() at each order: Y = n_1 / (n_1 + 2 n_2), D_r = r - (r + 1) Y n_{r+1} / n_r
(r = 1, 2, 3+). When a count-of-count is zero or a discount falls outside (0, r) — tiny corpora — the order falls
back to D = (0.5, 1, 1.5) (KenLM's ``--discount_fallback``) and :attr:`NgramLM.discount_fallback` says so. The
unigrams interpolate with the uniform distribution over the predictable words (the vocabulary, ``</s>`` and
``<unk>``; never ``<s>``), so every known word, even one unseen in training, has a probability.

Unseen n-grams back off in the ARPA way: p(w | h) = γ(h) p(w | h') when ``h w`` was not seen, with backoff weight
γ(h) for a context h that was seen and 1 for one that was not. For interpolated Kneser–Ney this is exact: the stored
probability of a seen n-gram is the interpolated one, so the ARPA file and :meth:`NgramLM.score_ids` give the same
numbers (KenLM's ``model.score(sentence, bos=True, eos=True)`` reads the ARPA file written here; a test checks
that the two agree).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nmtkit.select.lm_count import BOS, EOS, UNK, NgramCounts, find, flatten, ngram_ids

SPECIALS = ("<unk>", "<s>", "</s>")
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


class LMVocab:
    """Words → ids for a language model: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, then the words.

    >>> v = LMVocab.build({"the": 3, "cat": 1, "sat": 2}, min_count=2)
    >>> v.words, v.ids(["the", "cat", "sat"])
    (['<unk>', '<s>', '</s>', 'the', 'sat'], [3, 0, 4])
    """

    def __init__(self, words: Sequence[str]):
        if tuple(words[:3]) != SPECIALS:
            raise ValueError(f"an LM vocabulary starts with {', '.join(SPECIALS)}")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("duplicate words in an LM vocabulary")

    @classmethod
    def build(cls, counts: Mapping[str, int], min_count: int = 1) -> LMVocab:
        """The words counted at least ``min_count`` times, most frequent first (ties by word)."""
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        index = self.index
        return [index.get(t, UNK) for t in tokens]


@dataclass
class NgramLM:
    """An interpolated modified Kneser–Ney model of order N as arrays (see the module docstring).

    For order k (index 0 unused): ``keys[k]`` the sorted n-gram keys (:mod:`nmtkit.select.lm_count`; order 1 is dense,
    index = word id), ``logp[k]`` log10 p(w | h) of each n-gram, ``backoff[k]`` (k < N) log10 γ of each n-gram as a
    context (0 where it never is one). ``discounts[k]`` = (D_1, D_2, D_3+).
    """

    order: int
    vocab: LMVocab
    keys: list[np.ndarray]
    logp: list[np.ndarray]
    backoff: list[np.ndarray]
    discounts: list[tuple[float, float, float]]
    discount_fallback: list[bool]
    sentences: int = 0
    tokens: int = 0

    # -- estimation ----------------------------------------------------------------------------------------------

    @classmethod
    def estimate(cls, counts: NgramCounts, vocab: LMVocab,
                 discounts: Sequence[tuple[float, float, float]] | None = None) -> NgramLM:
        """Interpolated modified Kneser–Ney estimates from raw counts (``discounts``, one triple per order 1..N,
        override the ones computed from the count-of-counts)."""
        N, V, keys = counts.order, counts.vocab_size, counts.keys
        if V != len(vocab):
            raise ValueError(f"counts over {V} ids but a vocabulary of {len(vocab)} words")
        if counts.sentences == 0:
            raise ValueError("no sentence was counted")
        # suffix (w2..wk) index in order k-1, and whether the n-gram starts with <s>, for every n-gram
        suffix: list = [None, None]
        starts_bos: list = [None, keys[1] == BOS]
        for k in range(2, N + 1):
            p, w = keys[k] // V, keys[k] % V
            starts_bos.append(starts_bos[k - 1][p])
            suffix.append(w if k == 2 else find(keys[k - 1], suffix[k - 1][p] * V + w))
            assert (suffix[k] >= 0).all(), "every suffix of a counted n-gram is counted"
        # a(): raw counts at the top order and for n-grams starting with <s>, continuation counts elsewhere
        adjusted: list = [None] * (N + 1)
        adjusted[N] = counts.counts[N]
        for k in range(N - 1, 0, -1):
            cont = np.bincount(suffix[k + 1], minlength=len(keys[k]))
            adjusted[k] = np.where(starts_bos[k], counts.counts[k], cont)
        adjusted[1] = adjusted[1].copy()
        adjusted[1][BOS] = 0  # <s> is a context only, never predicted

        disc, fallback = [(0.0, 0.0, 0.0)], [False]
        for k in range(1, N + 1):
            if discounts is not None:
                d, fb = tuple(float(x) for x in discounts[k - 1]), False
            else:
                d, fb = kneser_ney_discounts(adjusted[k])
            disc.append(d)
            fallback.append(fb)

        # unigrams: interpolated with the uniform distribution over the V - 1 predictable ids
        a = adjusted[1]
        D = np.array((0.0, *disc[1]))  # D[r] for r = 0, 1, 2, 3+
        d = D[np.minimum(a, 3)]
        total = a.sum()
        gamma = d.sum() / total
        prob = [None, (a - d) / total + gamma / (V - 1)]
        prob[1][BOS] = 0.0
        backoff = [None] * (N + 1)
        for k in range(2, N + 1):
            a = adjusted[k]
            p = keys[k] // V
            D = np.array((0.0, *disc[k]))
            d = D[np.minimum(a, 3)]
            total = np.bincount(p, weights=a, minlength=len(keys[k - 1]))  # Σ_v a(h v), per context h
            mass = np.bincount(p, weights=d, minlength=len(keys[k - 1]))  # Σ_v D(a(h v))
            gamma = np.divide(mass, total, out=np.ones_like(mass), where=total > 0)  # γ(h), 1 where h is no context
            prob.append((a - d) / total[p] + gamma[p] * prob[k - 1][suffix[k]])
            backoff[k - 1] = np.log10(gamma)
        prob[1][BOS] = 1.0
        logp = [None] + [np.minimum(np.log10(pk), 0.0) for pk in prob[1:]]
        logp[1][BOS] = -99.0  # as in ARPA files (and KenLM): <s> is never predicted
        return cls(N, vocab, list(keys), logp, backoff, disc, fallback, counts.sentences, counts.tokens)

    # -- queries -------------------------------------------------------------------------------------------------

    def _logprob(self, ctx: list[np.ndarray], w: np.ndarray) -> np.ndarray:
        """log10 p(w | context) for a batch of queries. ``ctx[m]`` (m = 1..N-1) is the index in order m of each
        query's context m-gram (the m tokens before w), -1 where it is not in the model or does not fit."""
        V = len(self.vocab)
        out = np.zeros(len(w))
        done = np.zeros(len(w), dtype=bool)
        for k in range(self.order, 1, -1):
            c = ctx[k - 1]
            at = np.flatnonzero(~done & (c >= 0))  # queries whose (k-1)-word context is a known n-gram
            j = find(self.keys[k], c[at] * V + w[at])
            hit = j >= 0
            out[at[hit]] += self.logp[k][j[hit]]
            out[at[~hit]] += self.backoff[k - 1][c[at[~hit]]]  # h w unseen: back off from h to h'
            done[at[hit]] = True
        rest = ~done
        out[rest] += self.logp[1][w[rest]]
        return out

    def _ngram_indices(self, tok: np.ndarray, pos: np.ndarray) -> list[np.ndarray]:
        """For m = 1..N-1: index in order m of the m-gram ending at each position (-1: unknown or not fitting)."""
        V = len(self.vocab)
        idx = [None, tok]
        for m in range(2, self.order):
            prev = idx[m - 1]
            at = np.flatnonzero(pos >= m - 1)
            at = at[prev[at - 1] >= 0]
            cur = np.full(len(tok), -1, dtype=np.int64)
            cur[at] = find(self.keys[m], prev[at - 1] * V + tok[at])
            idx.append(cur)
        return idx

    def token_logprobs(self, lengths: Sequence[int], words: np.ndarray) -> np.ndarray:
        """log10 p of every predicted token (w1..wn and </s> of each sentence, in order) for sentences given as
        their ``lengths`` and concatenated word ids."""
        tok, pos, _ = flatten(np.asarray(lengths), np.asarray(words, dtype=np.int64))
        idx = self._ngram_indices(tok, pos)
        t = np.flatnonzero(pos >= 1)  # (n,) predicted positions: everything but <s>
        ctx = [None] + [idx[m][t - 1] for m in range(1, self.order)]
        return self._logprob(ctx, tok[t])

    def score_ids(self, lengths: Sequence[int], words: np.ndarray) -> np.ndarray:
        """log10 P(</s> w_n … w_1 | <s>) of each sentence, from its ``lengths`` and concatenated word ids."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) == 0:
            return np.zeros(0)
        lp = self.token_logprobs(lengths, words)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        return np.add.reduceat(lp, starts)

    def sentence_logprobs(self, sentences: Iterable[Sequence[str]]) -> np.ndarray:
        """log10 P(sentence) with ``<s>`` before and ``</s>`` after (KenLM's ``score(s, bos=True, eos=True)``)."""
        ids = [self.vocab.ids(s) for s in sentences]
        words = np.fromiter((i for s in ids for i in s), dtype=np.int64)
        return self.score_ids([len(s) for s in ids], words)

    def perplexity(self, sentences: Iterable[Sequence[str]]) -> float:
        """10 ** (-Σ log10 P / (words + sentences)): every word and every </s> counts, as in SRILM and KenLM."""
        sentences = list(sentences)
        if not sentences:
            return float("nan")
        total = float(self.sentence_logprobs(sentences).sum())
        return 10.0 ** (-total / (sum(len(s) for s in sentences) + len(sentences)))

    def conditional(self, context: Sequence[str]) -> np.ndarray:
        """log10 p(w | context) for every id w of the vocabulary (``-inf`` for ``<s>``). ``context`` may start
        with ``"<s>"``; only its last N-1 tokens matter."""
        V = len(self.vocab)
        ids = self.vocab.ids(context)[-(self.order - 1):] if self.order > 1 else []
        ctx: list = [None]
        for m in range(1, self.order):
            i = self._index_of(ids[len(ids) - m:]) if m <= len(ids) else -1  # the last m context tokens
            ctx.append(np.full(V, i, dtype=np.int64))
        out = self._logprob(ctx, np.arange(V, dtype=np.int64))
        out[BOS] = -np.inf
        return out

    def _index_of(self, ids: Sequence[int]) -> int:
        """Index of the n-gram ``ids`` in its order, or -1."""
        V = len(self.vocab)
        i = ids[0]
        for k, w in enumerate(ids[1:], start=2):
            i = int(find(self.keys[k], np.array([i * V + w], dtype=np.int64))[0])
            if i < 0:
                return -1
        return i

    def logprob(self, word: str, context: Sequence[str] = ()) -> float:
        """log10 p(word | context)."""
        return float(self.conditional(context)[self.vocab.index.get(word, UNK)])

    # -- inspection ----------------------------------------------------------------------------------------------

    def sizes(self) -> list[int]:
        """Number of n-grams of each order 1..N, as listed in the ARPA file (order 1: the whole vocabulary)."""
        return [len(self.keys[k]) for k in range(1, self.order + 1)]

    def ngram_ids(self, k: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The word ids of the n-grams ``lo:hi`` of order k (all by default), in key order."""
        return ngram_ids(self.keys, len(self.vocab), k, lo, hi)


def kneser_ney_discounts(adjusted: np.ndarray) -> tuple[tuple[float, float, float], bool]:
    """Chen & Goodman's D_1, D_2, D_3+ from the count-of-counts of the (adjusted) counts of one order, and whether
    they fell back to (0.5, 1, 1.5) because a count-of-count was zero or a discount fell outside (0, r)."""
    n = np.bincount(np.minimum(adjusted, 5), minlength=6)[1:5]  # n_1..n_4
    if (n == 0).any():
        return FALLBACK_DISCOUNTS, True
    n1, n2, n3, n4 = (float(x) for x in n)
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < dr < r for r, dr in enumerate(d, start=1)):
        return FALLBACK_DISCOUNTS, True
    return d, False


__all__ = ["BOS", "EOS", "UNK", "SPECIALS", "LMVocab", "NgramLM", "kneser_ney_discounts"]
