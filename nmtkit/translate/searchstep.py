"""What every search does at a step, whatever loop runs it (:mod:`nmtkit.translate.search`'s beam search, greedy
decoding and sampling, :mod:`nmtkit.translate.cohort`'s cohorts): the models' step as one ensemble
(:class:`Ensemble`), the finished :class:`Hypothesis`, the length limits, the masks of a step (``<pad>``, ``<s>``,
``<unk>``, the n-gram block, the source-numbers constraint, a forced prefix, only ``</s>`` at the limit), Wu et
al.'s coverage penalty and a fast top-k.  The procedure they make is described in :mod:`nmtkit.translate.search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nmtkit.data.vocab import BOS, EOS, PAD, UNK
from nmtkit.models.fast.policy import policy
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.ngramblock import ban_repeats
from nmtkit.translate.sourcenumbers import SourceNumbers


@dataclass
class Hypothesis:
    tokens: list[int]  # ids, without </s>
    score: float  # log p(tokens, </s> | source): the model's own log-probability
    norm_score: float  # score / (len(tokens) + 1) ** lenpen, what ranks hypotheses
    attention: torch.Tensor | None = None  # (len(tokens) + 1, Tx) α for each output token and </s>, or None
    unmet: int = 0  # with decode.all_numbers: the numbers it was to write and did not (ended at its length limit)
    posterior: np.ndarray | None = None  # (len(tokens) + 1, len(source) + 1) alignment posterior (add_posteriors)
    unk_posterior: np.ndarray | None = None  # the same shape: the posterior at its <unk>s, else α (add_unk_posteriors)

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


def free_tokens(decode: DecodeConfig, numbers: torch.Tensor | None, device) -> torch.Tensor | None:
    """The tokens the n-gram block leaves free (bool (V,) on ``device``), or None: ``numbers`` unless
    ``decode.block_numbers`` (or no block)."""
    if numbers is None or not decode.no_repeat_ngram or decode.block_numbers:
        return None
    return torch.as_tensor(numbers, dtype=torch.bool).to(device)


def _limits(src_lens: torch.Tensor, max_len_a: float, max_len_b: int,
            prefix_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Most output tokens (without </s>) per sentence; src_lens count the source's </s>; at least the prefix."""
    limits = (max_len_a * (src_lens - 1).float() + max_len_b).long().clamp(min=1)
    return limits if prefix_lens is None else torch.maximum(limits, prefix_lens.to(limits.device))


def _mask_step(logp: torch.Tensor, no_unk: bool, t: int, prefix: torch.Tensor | None = None,
               prefix_lens: torch.Tensor | None = None, sentences: torch.Tensor | None = None, K: int = 1,
               history: torch.Tensor | None = None, no_repeat_ngram: int = 0,
               free: torch.Tensor | None = None, numbers_from: SourceNumbers | None = None,
               ending: torch.Tensor | None = None, number_states: list | None = None) -> None:
    """In place, at step t: :func:`_mask`, with ``no_repeat_ngram`` the n-gram block over the rows' tokens so
    far, history (rows, t), with ``numbers_from`` the source-numbers constraint over the same (``ending``: the rows
    at their length limit; ``number_states``: the rows' states, if read); then rows (K per
    sentence, ``sentences`` (A,) their batch ids) whose prefix is longer than t may only continue with its token t,
    at its log-probability before the masking (so never blocked)."""
    forcing = None
    if prefix is not None and t < prefix.shape[1]:
        rows = (t < prefix_lens[sentences]).repeat_interleave(K).nonzero().squeeze(1)  # (R,)
        if rows.numel():
            tok = prefix[sentences, t].repeat_interleave(K)[rows]  # (R,)
            forcing = rows, tok, logp[rows, tok]  # (a copy of R values, taken before the masking)
    _mask(logp, no_unk)
    if no_repeat_ngram:
        ban_repeats(logp, history, no_repeat_ngram, free)
    if numbers_from is not None:
        numbers_from.apply(logp, history, sentences.repeat_interleave(K).tolist(), ending, number_states)
    if forcing is not None:
        rows, tok, kept = forcing
        logp[rows] = -math.inf
        logp[rows, tok] = kept


def _only_eos(logp: torch.Tensor, forced: torch.Tensor) -> None:
    """In place: the rows ``forced`` (bool (N,)), at their length limit, may only end (``</s>``)."""
    if bool(forced.any()):
        eos = torch.arange(logp.shape[1], device=logp.device) == EOS
        logp[forced] = torch.where(eos, logp[forced], -math.inf)


def coverage(cov: torch.Tensor, words: torch.Tensor, beta: float) -> torch.Tensor:
    """Wu et al. (2016)'s coverage penalty: cov (N, Tx) Σ_i α_ij so far, words (N, Tx) bool, the source words (not
    </s>, not padding) -> β Σ_j log min(cov_j, 1) (N,), at most 0 (a word never attended counts log 10⁻¹²)."""
    return beta * (cov.clamp(min=1e-12, max=1.0).log() * words).sum(dim=1)


def _mask(logp: torch.Tensor, no_unk: bool) -> None:
    logp[:, PAD] = -math.inf
    logp[:, BOS] = -math.inf
    if no_unk:
        logp[:, UNK] = -math.inf


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
