"""Decoding over the model's step function (``encode`` / ``init_decoder`` / ``decode_step``).

Every search takes its settings as one :class:`nmtkit.translate.config.DecodeConfig` (defaults: ``nmt-translate``'s).

- :func:`beam_search`: batched beam search over many sentences at once (the paper decoded with beam search). Each sentence keeps ``beam`` hypotheses; at every step the best
  ``2 × beam`` expansions are ranked, ``</s>`` expansions ranked within the first ``beam`` are finished, and the
  first ``beam`` others continue. A sentence is done when it has ``beam`` finished hypotheses or reaches its length
  limit (``max_len_a × source words + max_len_b`` tokens, after which ``</s>`` is forced); done sentences leave
  the batch, so the work shrinks as sentences finish. Finished hypotheses are ranked by
  ``log p(y, </s> | x) / (|y| + 1) ** lenpen`` (``lenpen = 0``: raw log-probability), plus, with
  ``coverage_penalty`` β > 0, Wu et al. (2016)'s coverage penalty ``β Σ_j log min(Σ_i α_ij, 1)`` over the source
  words j (not the source's ``</s>``; the sum over i includes the ``</s>`` step): a hypothesis that left source words
  unattended ranks lower. As OpenNMT-py's non-stepwise coverage penalty does, it ranks finished hypotheses; it
  does not change which expansions stay in the beam.
- A target **prefix** per sentence (``prefix``, ``prefix_lens``; post-editing, interactive MT) is forced: while
  ``t < prefix_len`` the only expansion is the prefix's token, scored with the model's own log-probability (also
  when ``no_unk`` would forbid it), so every hypothesis starts with the prefix and the rest is the search continued
  from the state the prefix leads to. The length limit is at least the prefix's length.
- With ``no_repeat_ngram`` n > 0 (fairseq's ``--no-repeat-ngram-size``) no hypothesis produces an n-gram of target
  tokens twice: where its last n−1 tokens equal an earlier (n−1)-gram of it, the tokens that followed that earlier
  one get −inf before the top-k (:mod:`nmtkit.translate.ngramblock`); a forced prefix counts as history but is never
  blocked, ``</s>`` never is. The history is the hypothesis' own token row, reordered with it after each top-k.
  Given ``numbers`` (bool (V,): the target tokens holding a digit, :func:`~nmtkit.translate.ngramblock.number_tokens`),
  those tokens are never blocked, unless ``block_numbers``.
- With ``source_numbers`` (a :class:`~nmtkit.translate.sourcenumbers.SourceNumbers` for the batch: the decoding's
  ``source_numbers`` setting) a token holding a digit may only continue or begin one of the sentence's source
  numbers; the others get −inf before the top-k, after the n-gram block (:mod:`nmtkit.translate.sourcenumbers`).
  With ``missing_numbers`` γ > 0 besides, a finished hypothesis ranks with γ subtracted for each source number it
  leaves out (:meth:`~nmtkit.translate.sourcenumbers.SourceNumbers.missing`): it ranks, it does not steer the beam.
- :func:`greedy`: the plain batched greedy decoder (validation during training; equal to ``beam = 1``).
- :func:`beam_search_reference`: one sentence at a time with Python lists — slow, obviously right, and the yardstick
  the batched search is tested against.

Several models with the same vocabularies decode as an ensemble (:class:`Ensemble`): their log-probabilities are
averaged at every step. ``<pad>`` and ``<s>`` are never generated; ``no_unk`` also forbids ``<unk>`` (Table 1's
"no unknown words" setting). Scores are the models' own log-probabilities (never renormalised after masking).
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import BOS, EOS
from nmtkit.translate.cohort import BeamCohort
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.ngramblock import banned_after
from nmtkit.translate.searchstep import (Ensemble, Hypothesis, _limits, _mask, _mask_step, _only_eos,  # noqa: F401
                                         check_numbers_from, coverage, free_tokens, top_k)
from nmtkit.translate.sourcenumbers import SourceNumbers

DEFAULT = DecodeConfig()  # (nmt-translate's defaults: beam 12, ...)


@torch.no_grad()
def one_token_at_a_time(models, src: torch.Tensor, src_lens: torch.Tensor, choose, n: int = 1,
                        max_len_a: float = 2.0, max_len_b: int = 10, no_unk: bool = False,
                        need_attention: bool = False, prefix: torch.Tensor | None = None,
                        prefix_lens: torch.Tensor | None = None,
                        no_repeat_ngram: int = 0, free: torch.Tensor | None = None,
                        numbers_from: SourceNumbers | None = None
                        ) -> tuple[list[list[int]], list[float], torch.Tensor | None]:
    """The left-to-right loop of greedy decoding and of sampling: ``n`` rows per sentence of src (B, Tx) with
    ``</s>``, each extended by one token a step, ``choose(logp (B·n, V), t) -> y (B·n,)`` picking it from the masked
    log-probabilities (``<pad>``, ``<s>``, with ``no_unk`` ``<unk>``; with ``no_repeat_ngram`` the tokens that would
    repeat an n-gram of the row, never a ``free`` token; with ``numbers_from`` digits that are no part of a source
    number; a prefix's token t where it is longer than t; only ``</s>`` at the length limit),
    until every row has ended.  -> each row's tokens (without ``</s>``), its log-probability, and with
    ``need_attention`` α (B·n, T, Tx)."""
    if no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be at least 0 (got {no_repeat_ngram})")
    ens = Ensemble(models)
    dev = src.device
    B = src.shape[0]
    if prefix is not None:
        prefix, prefix_lens = prefix.to(dev), prefix_lens.to(dev)
    encs = ens.encode(src, src_lens)  # (the n rows of a sentence share its encoder output)
    states = [s.repeat_interleave(n, dim=0) for s in ens.init(encs)]  # (B·n, n')
    limits = _limits(src_lens, max_len_a, max_len_b, prefix_lens).to(dev).repeat_interleave(n)  # (B·n,)
    sentences = torch.arange(B, device=dev)
    y = torch.full((B * n,), BOS, dtype=torch.long, device=dev)
    done = torch.zeros(B * n, dtype=torch.bool, device=dev)
    scores = torch.zeros(B * n, dtype=torch.float64, device=dev)
    out, alphas = [], []
    T = int(limits.max()) + 1
    # with the block or the numbers' constraint: each row's tokens so far, (B·n, T), filled a column a step (rows do
    # not move here)
    history = torch.zeros((B * n, T), dtype=torch.long, device=dev) if no_repeat_ngram or numbers_from else None
    for t in range(T):
        logp, states, alpha = ens.step(y, states, encs)  # (B·n, V), α (B·n, Tx)
        at_limit = t >= limits
        _mask_step(logp, no_unk, t, prefix, prefix_lens, sentences, n,
                   history[:, :t] if history is not None else None, no_repeat_ngram, free, numbers_from, at_limit)
        _only_eos(logp, at_limit)  # (at the limit only </s> may follow)
        y = choose(logp, t)  # (B·n,)
        step = logp.gather(1, y[:, None]).squeeze(1).double()
        scores += torch.where(done, torch.zeros_like(step), step)
        out.append(torch.where(done, torch.full_like(y, EOS), y))
        if history is not None:
            history[:, t] = out[-1]
        if need_attention:
            alphas.append(alpha.float())
        done |= y == EOS
        if bool(done.all()):
            break
    ids = torch.stack(out, dim=1).tolist()  # (B·n, T)
    tokens = [row[: row.index(EOS)] if EOS in row else row for row in ids]
    return tokens, scores.tolist(), (torch.stack(alphas, dim=1) if need_attention else None)


def greedy(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
           numbers: torch.Tensor | None = None, numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """Batched greedy decoding: src (B, Tx) with ``</s>``, src_lens (B,) → one hypothesis per sentence, in order
    (``decode``'s max_len_a/b, no_unk and no_repeat_ngram with ``numbers`` free, ``numbers_from`` the source-numbers
    constraint; its beam is not read)."""
    check_numbers_from(decode, numbers_from)
    tokens, scores, _ = one_token_at_a_time(models, src, src_lens, lambda logp, t: logp.argmax(dim=-1),
                                            max_len_a=decode.max_len_a, max_len_b=decode.max_len_b,
                                            no_unk=decode.no_unk, no_repeat_ngram=decode.no_repeat_ngram,
                                            free=free_tokens(decode, numbers, src.device), numbers_from=numbers_from)
    return [Hypothesis(toks, score, score) for toks, score in zip(tokens, scores)]


@torch.no_grad()
def beam_search(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
                need_attention: bool = False, prefix: torch.Tensor | None = None,
                prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                numbers_from: SourceNumbers | None = None) -> list[list[Hypothesis]]:
    """Batched beam search: src (B, Tx) with ``</s>``, src_lens (B,), optionally prefix (B, P) target ids padded
    with ``<pad>`` and prefix_lens (B,) → for each sentence its ``decode.nbest`` best hypotheses, best first (see the
    module docstring for the exact procedure; ``decode``: beam, nbest, lenpen, max_len_a/b, no_unk, coverage_penalty,
    no_repeat_ngram, block_numbers; ``numbers``: the tokens the block leaves free; ``numbers_from``: the
    source-numbers constraint), with their attention when ``need_attention``."""
    cohort = BeamCohort(models, src, src_lens, decode, need_attention, prefix, prefix_lens, numbers, numbers_from)
    while not cohort.done:
        cohort.step()
    return cohort.results()


@torch.no_grad()
def beam_search_reference(models, src_ids: list[int], decode: DecodeConfig = DEFAULT,
                          prefix: list[int] | None = None, numbers: torch.Tensor | None = None,
                          numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """The same search for one sentence (ids without ``</s>``), hypothesis by hypothesis with Python lists
    (``numbers_from``: the source-numbers constraint of a batch of this one sentence)."""
    free = free_tokens(decode, numbers, "cpu")
    free = frozenset() if free is None else frozenset(free.nonzero().flatten().tolist())
    beam, nbest, lenpen, no_unk = decode.beam, decode.nbest, decode.lenpen, decode.no_unk
    coverage_penalty, no_repeat_ngram = decode.coverage_penalty, decode.no_repeat_ngram
    ens = Ensemble(models)
    src = torch.tensor([list(src_ids) + [EOS]])
    src_lens = torch.tensor([len(src_ids) + 1])
    prefix = list(prefix or [])
    encs = ens.encode(src, src_lens)
    limit = max(int(_limits(src_lens, decode.max_len_a, decode.max_len_b)[0]), len(prefix))
    live = [([], 0.0, ens.init(encs), [0.0] * len(src_ids))]  # (tokens, score, states, Σ_i α_ij per source word)
    finished: list[Hypothesis] = []
    for t in range(limit + 1):
        expansions = []  # (score, order, tokens, token, states, coverage)
        for h, (toks, score, states, cov) in enumerate(live):
            y = torch.tensor([toks[-1] if toks else BOS])
            logp, new_states, alpha = ens.step(y, states, encs)
            raw = logp.clone()
            _mask(logp, no_unk)
            new_cov = cov if alpha is None else [c + float(a) for c, a in zip(cov, alpha[0])]
            banned = banned_after(toks, no_repeat_ngram, free)  # (the prefix counts as history; its tokens are forced)
            if numbers_from is not None:
                banned |= numbers_from.banned(toks, ending=t >= limit)
            for v in range(logp.shape[1]):
                lp = -math.inf if v in banned else float(logp[0, v])
                if t < len(prefix):
                    lp = float(raw[0, v]) if v == prefix[t] else -math.inf
                if t >= limit and v != EOS:
                    lp = -math.inf
                # exact ties (which real log-probabilities practically never have) go to the lower index here;
                # torch.topk promises no order among equal values
                expansions.append((score + lp, h * logp.shape[1] + v, toks, v, new_states, new_cov))
        expansions.sort(key=lambda e: (-e[0], e[1]))
        expansions = expansions[: 2 * beam]
        next_live = []
        for rank, (score, _, toks, v, states, cov) in enumerate(expansions):
            if v == EOS:
                if rank < beam and math.isfinite(score) and len(finished) < beam:
                    cp = coverage_penalty * sum(math.log(min(max(c, 1e-12), 1.0)) for c in cov)
                    if decode.missing_numbers:
                        cp -= decode.missing_numbers * numbers_from.missing(toks, 0)
                    finished.append(Hypothesis(toks, score, score / (len(toks) + 1) ** lenpen + cp))
            elif len(next_live) < beam:
                next_live.append((toks + [v], score, states, cov))
        live = next_live
        if len(finished) >= beam:
            break
    finished.sort(key=lambda h: -h.norm_score)
    return finished[:nbest]
