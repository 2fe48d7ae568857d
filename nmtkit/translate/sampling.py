"""Sampling translations instead of searching for the best one (``nmt-translate --sampling``): back-translation and
diverse outputs.

At every step the next token is drawn from the model's distribution ``p(y_i | y_<i, x)``, reshaped by
:class:`Sampling`: divided by a ``temperature`` T in the log domain (``p^(1/T)``, renormalised), then cut to the
``topk`` most probable tokens, or to the smallest set whose probability reaches ``topp`` (nucleus sampling, Holtzman
et al. 2020), and renormalised. ``<pad>`` and ``<s>`` are never drawn, ``<unk>`` not with ``no_unk``; a prefix is
forced and the length limit applies as in :mod:`nmtkit.translate.search`. With ``no_repeat_ngram`` n > 0 the tokens
that would repeat one of the sample's n-grams are removed before the reshaping (:mod:`nmtkit.translate.ngramblock`,
as in beam search): a sample is drawn from the model's distribution over the continuations that do not repeat.

**Reproducible**: the draws of sample s of a sentence are a function of that sentence's key (nmt-translate uses
the seed, the line number and the piece) and s only, through their own generator: the same seed gives the same
samples whatever the batch, window, number of worker processes or the other lines of the input.

A hypothesis' ``score`` is the model's own log-probability of the sample (not of the reshaped distribution), and
a sentence's samples come sorted by ``score / (|y| + 1) ** lenpen``, best first.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from nmtkit.translate.config import DecodeConfig, Sampling, parse_sampling  # noqa: F401  (re-exported)
from nmtkit.translate.search import Hypothesis, _limits, check_numbers_from, one_token_at_a_time


def _generator_seed(key, sample: int) -> int:
    """A 128-bit seed for (key, sample): numpy's PCG64 uses all of it (torch's CPU generator only 32 bits)."""
    return int.from_bytes(hashlib.blake2b(f"{key!r}/{sample}".encode(), digest_size=16).digest(), "little")


def uniforms(keys: list, n: int, steps: int) -> torch.Tensor:
    """(len(keys) * n, steps) float64 in [0, 1): row k·n + s is drawn by sample s of sentence ``keys[k]``'s own
    generator (a key is an int or a tuple of ints, e.g. (seed, line, piece)), so it depends on nothing else; the
    first values of a row are the same whatever ``steps``."""
    rows = [np.random.default_rng(_generator_seed(key, s)).random(steps) for key in keys for s in range(n)]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros((0, steps), dtype=torch.float64)


def reshape(logp: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """logp (N, V) (masked entries -inf) -> the probabilities to draw from (N, V) float64, rows summing to 1."""
    z = logp.double() / sampling.temperature
    if sampling.topk and sampling.topk < z.shape[1]:
        kept = z.topk(sampling.topk, dim=1).indices  # (N, k)
        z = torch.full_like(z, -math.inf).scatter_(1, kept, z.gather(1, kept))
    if sampling.topp < 1.0:
        sorted_z, order = z.sort(dim=1, descending=True)  # (N, V)
        p = torch.softmax(sorted_z, dim=1)
        before = p.cumsum(dim=1) - p  # mass of the more probable tokens
        sorted_z = sorted_z.masked_fill(before >= sampling.topp, -math.inf)  # the most probable token always stays
        z = torch.full_like(z, -math.inf).scatter_(1, order, sorted_z)
    return torch.softmax(z, dim=1)


@torch.no_grad()
def sample(models, src: torch.Tensor, src_lens: torch.Tensor, keys: list, decode: DecodeConfig,
           need_attention: bool = False, prefix: torch.Tensor | None = None,
           prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
           numbers_from=None) -> list[list[Hypothesis]]:
    """src (B, Tx) with ``</s>``, src_lens (B,), one key per sentence -> for each sentence ``decode.nbest`` samples
    drawn as ``decode.sampling`` says, sorted by their length-normalised log-probability (``decode``'s lenpen;
    its rules, with ``numbers`` free of the n-gram block and ``numbers_from``'s constraint, as in the
    search)."""
    n, sampling, lenpen = decode.nbest, decode.how, decode.lenpen
    check_numbers_from(decode, numbers_from)
    if sampling is None:
        raise ValueError("sample() needs decoding settings with a sampling spec (DecodeConfig(sampling=...))")
    if n < 1 or len(keys) != src.shape[0]:
        raise ValueError(f"need n >= 1 and one key per sentence (got n {n}, {len(keys)} keys, {src.shape[0]} sentences)")
    limits = _limits(src_lens, decode.max_len_a, decode.max_len_b, prefix_lens).repeat_interleave(n)  # (B·n,)
    u = uniforms(keys, n, int(limits.max()) + 1).to(src.device)  # (B·n, T)

    def draw(logp: torch.Tensor, t: int) -> torch.Tensor:
        cdf = reshape(logp, sampling).cumsum(dim=1)  # (B·n, V)
        # inverse CDF: the first token whose cumulative probability exceeds u·total (a token of probability 0 never)
        return torch.searchsorted(cdf, (u[:, t] * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1) \
            .clamp_(max=cdf.shape[1] - 1)

    tokens, scores, attn = one_token_at_a_time(models, src, src_lens, draw, decode, n, need_attention, prefix,
                                               prefix_lens, numbers, numbers_from)  # (B·n rows)
    lens = src_lens.tolist()
    results = []
    for b in range(len(lens)):
        hyps = []
        for r in range(b * n, (b + 1) * n):
            toks, score = tokens[r], scores[r]
            att = attn[r, : len(toks) + 1, : lens[b]].clone() if need_attention else None
            hyps.append(Hypothesis(toks, score, score / (len(toks) + 1) ** lenpen, att))
        hyps.sort(key=lambda h: -h.norm_score)
        results.append(hyps)
    return results
