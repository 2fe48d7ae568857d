"""Decoding rules as plug-ins on the search's step: :class:`Rule` and the rules that need nothing but the step
(:func:`nmtkit.translate.searchstep.build_rules` makes a search's list of them from its
:class:`~nmtkit.translate.config.DecodeConfig`).

Every search (:class:`~nmtkit.translate.cohort.BeamCohort`'s beam search, the one-token-at-a-time loop of greedy
decoding and sampling) keeps only its own logic -- the models' step, the top-k, which hypotheses finish and which
continue -- and hands each step's rows to its rules, in the order of :data:`~nmtkit.translate.searchstep.RULES`:

- :meth:`Rule.before` then :meth:`Rule.mask` change the rows' log-probabilities (A·K, V) in place before the top-k
  (``-inf``: the token may not follow; a forced prefix takes its values in ``before``, before any masking);
- :meth:`Rule.observe` reads the step's attention α (A·K, Tx); :meth:`Rule.select` follows the rows kept;
- :meth:`Rule.ends` adds finished hypotheses the top-k did not rank, :meth:`Rule.finished` adjusts a finished
  hypothesis' rank (``norm_score``, ``unmet``), :meth:`Rule.share` may share out the beam among the candidates,
  and :meth:`Rule.revise` may search again once the search is done (beam search only);
- :meth:`Rule.banned` is the same rule for one hypothesis, which
  :func:`~nmtkit.translate.search.beam_search_reference` calls.

Adding a rule: a class here (or in its own module, as the numbers' rules, :mod:`nmtkit.translate.numberrules`), a
field of :class:`~nmtkit.translate.config.DecodeConfig` that switches it on (its ``build`` reads it), its place in
:data:`nmtkit.translate.searchstep.RULES`, and a test of the batched search against the reference search with it
(``tests/test_search_rules.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from nmtkit.data.vocab import BOS, EOS, PAD, UNK
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.ngramblock import ban_repeats, banned_after


@dataclass
class Search:
    """What a search's rules are built from: the batch (src_lens (B,) with ``</s>``, its length limits (B,), the
    forced prefix (B, P) and prefix_lens (B,) or None), K rows a sentence, the target tokens the n-gram block leaves
    free (bool (V,) or None), the source-numbers constraint (or None), whether it is a beam search (else one token
    at a time: greedy decoding, sampling), whether it is the second search of ``--all-numbers`` or ``--terms`` (the
    beam shared: :mod:`nmtkit.translate.banks`), and the glossary's terms (or None)."""

    src_lens: torch.Tensor
    limits: torch.Tensor
    K: int
    device: torch.device
    prefix: torch.Tensor | None = None
    prefix_lens: torch.Tensor | None = None
    numbers: torch.Tensor | None = None
    numbers_from: object | None = None  # nmtkit.translate.sourcenumbers.SourceNumbers
    Tx: int = 0  # the source positions of the batch (src.shape[1])
    beam: bool = True
    banks: bool = False
    terms: object | None = None  # nmtkit.translate.terms.SourceTerms: each sentence's glossary terms


@dataclass
class Step:
    """The rows of one step t: R = A·K hypotheses, K a sentence; ``tokens`` (R, t) each row's tokens so far,
    ``alive`` (A,) the batch ids of their sentences, ``ending`` bool (R,) the rows at their length limit.  What
    several rules read is computed once (``sentences``, the numbers' ``states``)."""

    t: int
    tokens: torch.Tensor | None
    alive: torch.Tensor
    K: int
    ending: torch.Tensor
    numbers_from: object | None = None
    shared: dict = field(default_factory=dict)  # what one rule leaves for another at this step

    @cached_property
    def sentences(self) -> list[int]:
        """(R,) the batch id of each row."""
        return self.alive.repeat_interleave(self.K).tolist()

    @cached_property
    def states(self) -> list:
        """(R,) each row's :class:`~nmtkit.translate.sourcenumbers.State` (None: a sentence without numbers)."""
        return self.numbers_from.states(self.tokens, self.sentences)


class Rule:
    """One decoding rule; every hook does nothing unless the rule overrides it."""

    @classmethod
    def build(cls, decode: DecodeConfig, search: Search) -> Rule | None:
        """The rule for this search, or None where ``decode`` leaves it off."""
        raise NotImplementedError

    def before(self, logp: torch.Tensor, step: Step) -> None:
        """Before any rule masks ``logp`` (R, V)."""

    def mask(self, logp: torch.Tensor, step: Step) -> None:
        """In place: the tokens that may not follow each row set to -inf."""

    def observe(self, alpha: torch.Tensor, step: Step) -> None:
        """The step's attention α (R, Tx), read after the masks."""

    def ends(self, cand: torch.Tensor, step: Step, ended: list[tuple[int, int, float]]
             ) -> list[tuple[int, int, float]]:
        """(beam search) More hypotheses to finish than the top-k's ``</s>`` expansions ``ended`` (sentence a,
        beam, score), from cand (A, K·V)."""
        return []

    def finished(self, hyp, row: int, sentence: int, step: Step) -> None:
        """(beam search) In place: a hypothesis of ``sentence`` that finished from ``row``; its rank may change."""

    def share(self, step: Step, cand: torch.Tensor, top_scores: torch.Tensor, top_idx: torch.Tensor) -> dict:
        """(beam search) The continuations of some sentences instead of the first K that are not ``</s>``:
        {a: K (score, beam, token)}."""
        return {}

    def select(self, rows: torch.Tensor) -> None:
        """The rows (R',) kept, in their new order (after the top-k, and as sentences leave)."""

    def revise(self, search, hyps: list) -> list:
        """(beam search) The finished search's hypotheses per sentence, possibly searched again."""
        return hyps

    def banned(self, tokens: list[int], t: int, ending: bool) -> set[int]:
        """The same rule for one hypothesis of a batch of one sentence: the tokens that may not follow ``tokens``
        at step t (``ending``: at its length limit)."""
        return set()


class Vocabulary(Rule):
    """``<pad>`` and ``<s>`` are never written; with ``no_unk`` neither is ``<unk>``."""

    def __init__(self, no_unk: bool):
        self.tokens = [PAD, BOS] + ([UNK] if no_unk else [])

    @classmethod
    def build(cls, decode, search):
        return cls(decode.no_unk)

    def mask(self, logp, step):
        for tok in self.tokens:
            logp[:, tok] = -math.inf

    def banned(self, tokens, t, ending):
        return set(self.tokens)


class NgramBlock(Rule):
    """``no_repeat_ngram``: no hypothesis writes an n-gram twice (:mod:`nmtkit.translate.ngramblock`); the tokens
    of numbers are free."""

    def __init__(self, n: int, free: torch.Tensor | None):
        self.n, self.free = n, free
        self.free_set = frozenset() if free is None else frozenset(free.nonzero().flatten().tolist())

    @classmethod
    def build(cls, decode, search):
        if not decode.no_repeat_ngram:
            return None
        free = None if search.numbers is None else torch.as_tensor(search.numbers, dtype=torch.bool).to(search.device)
        return cls(decode.no_repeat_ngram, free)

    def mask(self, logp, step):
        ban_repeats(logp, step.tokens, self.n, self.free)

    def banned(self, tokens, t, ending):
        return banned_after(tokens, self.n, self.free_set)  # (the prefix counts as history; its tokens are forced)


class MinLength(Rule):
    """``min_length_ratio`` r: no hypothesis ends before ⌈r · source words⌉ tokens (a forced prefix's count), nor
    before its length limit allows."""

    def __init__(self, minimum: torch.Tensor, minimum_l: list[int]):
        self.minimum, self.minimum_l = minimum, minimum_l  # (B,) tokens before </s> may follow

    @classmethod
    def build(cls, decode, search):
        if not decode.min_length_ratio:
            return None
        words = (search.src_lens - 1).double().to(search.device)
        minimum = torch.minimum(torch.ceil(decode.min_length_ratio * words).long(), search.limits.to(search.device))
        return cls(minimum, minimum.tolist())

    def mask(self, logp, step):
        early = (step.t < self.minimum[step.alive]).repeat_interleave(step.K) & ~step.ending  # (R,)
        if bool(early.any()):
            logp[early, EOS] = -math.inf

    def banned(self, tokens, t, ending):
        return {EOS} if t < self.minimum_l[0] and not ending else set()


class Prefix(Rule):
    """A forced target prefix: while t < its length a row may only continue with the prefix's token t, at its
    log-probability before any masking (so never blocked)."""

    def __init__(self, prefix: torch.Tensor, prefix_lens: torch.Tensor):
        self.prefix, self.prefix_lens = prefix, prefix_lens
        self.prefix_l = prefix[0, : int(prefix_lens[0])].tolist() if prefix.shape[0] == 1 else None

    @classmethod
    def build(cls, decode, search):
        if search.prefix is None:
            return None
        return cls(search.prefix.to(search.device), search.prefix_lens.to(search.device))

    def before(self, logp, step):
        t, K = step.t, step.K
        if t < self.prefix.shape[1]:
            rows = (t < self.prefix_lens[step.alive]).repeat_interleave(K).nonzero().squeeze(1)  # (F,)
            if rows.numel():
                tok = self.prefix[step.alive, t].repeat_interleave(K)[rows]  # (F,)
                step.shared[Prefix] = rows, tok, logp[rows, tok]  # (a copy of F values, taken before the masking)

    def mask(self, logp, step):
        forced = step.shared.get(Prefix)
        if forced is not None:
            rows, tok, kept = forced
            logp[rows] = -math.inf
            logp[rows, tok] = kept

    def forced(self, t: int) -> int | None:
        """(one sentence) The token step t must write, or None."""
        return self.prefix_l[t] if t < len(self.prefix_l) else None


class LengthLimit(Rule):
    """At its length limit a row may only end (``</s>``)."""

    @classmethod
    def build(cls, decode, search):
        return cls()

    def mask(self, logp, step):
        if bool(step.ending.any()):
            eos = torch.arange(logp.shape[1], device=logp.device) == EOS
            logp[step.ending] = torch.where(eos, logp[step.ending], -math.inf)

    def banned(self, tokens, t, ending):
        return _NOT_EOS if ending else set()


class _NotEos(set):
    """Every token but ``</s>`` (as a set the reference search tests membership in)."""

    def __contains__(self, v):
        return v != EOS


_NOT_EOS = _NotEos()


class CoveragePenalty(Rule):
    """Wu et al. (2016)'s coverage penalty β Σ_j log min(Σ_i α_ij, 1) over the source words j, added to a finished
    hypothesis' rank (:func:`coverage`); it does not change which expansions stay in the beam."""

    def __init__(self, beta: float, words: torch.Tensor, cov: torch.Tensor):
        self.beta = beta
        self.words, self.cov = words, cov  # (R, Tx) which positions are source words, Σ_i α_ij so far
        self._penalty: tuple[int, list[float]] | None = None  # (step, each row's penalty) once read at that step

    @classmethod
    def build(cls, decode, search):
        if not decode.coverage_penalty or not search.beam:
            return None
        Tx, K, dev = search.Tx, search.K, search.device
        words = (torch.arange(Tx, device=dev) < (search.src_lens.to(dev) - 1).unsqueeze(1)).repeat_interleave(K, 0)
        return cls(decode.coverage_penalty, words, torch.zeros(words.shape, device=dev))

    def observe(self, alpha, step):
        if alpha is None:
            raise ValueError("the coverage penalty needs an attention model (rnnsearch)")
        self.cov = self.cov + alpha  # (R, Tx) Σ_i α_ij including this step

    def finished(self, hyp, row, sentence, step):
        if self._penalty is None or self._penalty[0] != step.t:
            self._penalty = step.t, coverage(self.cov, self.words, self.beta).tolist()
        hyp.norm_score += self._penalty[1][row]

    def select(self, rows):
        self.cov, self.words = self.cov.index_select(0, rows), self.words.index_select(0, rows)

    def one(self, cov: list[float]) -> float:
        """(one hypothesis) The penalty of Σ_i α_ij per source word ``cov``."""
        return self.beta * sum(math.log(min(max(c, 1e-12), 1.0)) for c in cov)


def coverage(cov: torch.Tensor, words: torch.Tensor, beta: float) -> torch.Tensor:
    """Wu et al. (2016)'s coverage penalty: cov (N, Tx) Σ_i α_ij so far, words (N, Tx) bool, the source words (not
    </s>, not padding) -> β Σ_j log min(cov_j, 1) (N,), at most 0 (a word never attended counts log 10⁻¹²)."""
    return beta * (cov.clamp(min=1e-12, max=1.0).log() * words).sum(dim=1)
