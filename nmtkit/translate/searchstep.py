"""What every search shares, whatever loop runs it (:mod:`nmtkit.translate.search`'s greedy decoding and sampling,
:mod:`nmtkit.translate.cohort`'s beam search): the models' step as one ensemble (:class:`Ensemble`), the finished
:class:`Hypothesis`, the length limits, the decoding rules in their order (:data:`RULES`) and a fast top-k.  What a
decoding option changes at a step is a rule's (:mod:`nmtkit.translate.rules`); the procedure they make is described in :mod:`nmtkit.translate.search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nmtkit.models.fast.policy import policy
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.banks import Banks, SearchAgain, TermsMissed
from nmtkit.translate.numberrules import SourceNumbersRule
from nmtkit.translate.rules import (CoveragePenalty, LengthLimit, MinLength, NgramBlock, Prefix, Rule, Search,
                                    Vocabulary)
from nmtkit.translate.sourcenumbers import SourceNumbers

# the decoding rules (nmtkit.translate.rules) in the order they act: masks first, the forced prefix after them (it
# keeps its token whatever they say), the length limit last; then what ranks finished hypotheses and searches again
RULES: tuple[type[Rule], ...] = (Vocabulary, NgramBlock, SourceNumbersRule, Banks, MinLength, Prefix, LengthLimit,
                                 CoveragePenalty, TermsMissed, SearchAgain)


def build_rules(decode: DecodeConfig, search: Search) -> list[Rule]:
    """The rules ``decode`` asks for in this search, in the order they act (:data:`RULES`)."""
    return [r for r in (cls.build(decode, search) for cls in RULES) if r is not None]


@dataclass
class Hypothesis:
    tokens: list[int]  # ids, without </s>
    score: float  # log p(tokens, </s> | source): the model's own log-probability
    norm_score: float  # score / (len(tokens) + 1) ** lenpen, what ranks hypotheses
    attention: torch.Tensor | None = None  # (len(tokens) + 1, Tx) α for each output token and </s>, or None
    unmet: int = 0  # in a second search (banks): the numbers and terms it was to write and did not (at its limit)
    missed: list[int] | None = None  # with terms: the sentence's terms (indices) it did not write
    posterior: np.ndarray | None = None  # (len(tokens) + 1, len(source) + 1) alignment posterior (add_posteriors)

    def rank(self) -> tuple[int, float]:
        """What orders finished hypotheses, best first: those that wrote all their numbers, then by norm_score."""
        return self.unmet, -self.norm_score


class Ensemble:
    """One or more models decoded together: averaged log-probabilities and attention."""

    def __init__(self, models):
        self.models = list(models) if isinstance(models, (list, tuple)) else [models]

    def encode(self, src, src_lens):
        return [m.prepare_decoding(m.encode(src, src_lens)) for m in self.models]

    def init(self, encs):
        return [m.init_decoder(e) for m, e in zip(self.models, encs)]

    def step(self, y, states, encs):
        """y (N,) → averaged log-probabilities (N, V) float32, new states, averaged α (N, Tx) or None."""
        logps, new_states, alphas = [], [], []
        for m, s, e in zip(self.models, states, encs):
            logits, s_new, alpha = m.decode_step(y, s, e)
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            new_states.append(s_new)
            if alpha is not None:
                alphas.append(alpha.float())
        logp = logps[0] if len(logps) == 1 else torch.stack(logps).mean(0)
        alpha = None if not alphas else alphas[0] if len(alphas) == 1 else torch.stack(alphas).mean(0)
        return logp, new_states, alpha


def check_numbers_from(decode: DecodeConfig, numbers_from: SourceNumbers | None) -> None:
    """A search asked for ``source_numbers`` must be given the sentences' numbers (the searches and sampling)."""
    if decode.source_numbers and numbers_from is None:
        raise ValueError("decode.source_numbers needs the source's numbers (numbers_from): decode through "
                         "decoding.decode_batch or a Translator, which read them from the source lines")


def _limits(src_lens: torch.Tensor, max_len_a: float, max_len_b: int,
            prefix_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Most output tokens (without </s>) per sentence; src_lens count the source's </s>; at least the prefix."""
    limits = (max_len_a * (src_lens - 1).float() + max_len_b).long().clamp(min=1)
    return limits if prefix_lens is None else torch.maximum(limits, prefix_lens.to(limits.device))


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=1)`` for a wide (A, N) tensor, in three cheap passes instead of one slow one.

    Cut each row into blocks of ``BLOCK`` values (the speed policy's ``topk_block``; the last block shorter when
    BLOCK does not divide N); the k largest values of a row lie in the k blocks with the largest maxima (those k
    maxima are k values at least as large as the k-th block maximum τ, and any value ≥ τ sits in a block whose
    maximum is ≥ τ). So: block maxima (one fast reduction), the k best blocks, then top-k among their values,
    gathered in index order. The same values and indices as ``topk`` (among exactly equal values neither promises
    an order; with fewer than k finite values in a row, the -inf ones returned may differ); faster than ``topk`` over beam search's (sentences, K·V)
    candidates (tests/bench/results/bench_kernels.txt, row "top 24 of (80, 12 · 7,897)"). Narrow rows go to
    ``topk``.
    """
    A, N = x.shape
    BLOCK = policy().topk_block
    nb = N // BLOCK
    if nb < 8 * k:
        return x.topk(k, dim=1)
    maxima = x[:, : nb * BLOCK].view(A, nb, BLOCK).amax(dim=2)  # (A, nb)
    if nb * BLOCK < N:  # the short last block
        maxima = torch.cat([maxima, x[:, nb * BLOCK:].amax(dim=1, keepdim=True)], dim=1)
    blocks = maxima.topk(k, dim=1, sorted=False).indices.sort(dim=1).values  # (A, k)
    cols = (blocks.unsqueeze(2) * BLOCK + torch.arange(BLOCK, device=x.device)).view(A, k * BLOCK)  # index order
    outside = cols >= N  # past the end of the short last block
    values = x.gather(1, cols.clamp_(max=N - 1)).masked_fill_(outside, -math.inf)  # (A, k·BLOCK)
    values, j = values.topk(k, dim=1)  # (A, k)
    return values, cols.gather(1, j)
