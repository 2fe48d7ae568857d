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
- With ``all_numbers`` besides (``--all-numbers``), a sentence whose best hypothesis leaves out one of its source
  numbers is searched again with the beam shared by the numbers' digits written, Post & Vilar (2018)'s dynamic
  beam allocation (:mod:`nmtkit.translate.numberbanks`, :func:`numbers_again`).
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
from nmtkit.translate import numberbanks
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
    return results(cohort)


def results(cohort: BeamCohort) -> list[list[Hypothesis]]:
    """A finished cohort's hypotheses per sentence (:meth:`BeamCohort.results`), with ``decode.all_numbers``'
    second pass made (:func:`numbers_again`)."""
    hyps = cohort.results()
    if cohort.decode.all_numbers and cohort.numbers_from is not None and not cohort.banks:
        hyps = numbers_again(cohort, hyps)
    return hyps


@torch.no_grad()
def numbers_again(first: BeamCohort, hyps: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
    """``--all-numbers``: the sentences whose best hypothesis leaves out a number they must write are searched
    again with the beam shared by numbers written (:mod:`nmtkit.translate.numberbanks`); a sentence takes the
    second search's hypotheses when its best writes them all and ends before its length limit, and keeps the
    first's otherwise (a sentence whose numbers come through is never searched again, so it reads as without the
    option)."""
    nf = first.numbers_from
    todo = [k for k, h in enumerate(hyps) if h and numberbanks.unmet(nf, h[0].tokens, k) > 0]
    if not todo:
        return hyps
    idx = torch.tensor(todo, device=first.src.device)
    prefix = first.prefix.index_select(0, idx.to(first.prefix.device)) if first.prefix is not None else None
    prefix_lens = first.prefix_lens.index_select(0, idx.to(first.prefix.device)) if prefix is not None else None
    again = BeamCohort(first.ens.models, first.src.index_select(0, idx), first.src_lens.index_select(0, idx),
                       first.decode, first.need_attention, prefix, prefix_lens, first.numbers, nf.subset(todo),
                       banks=True)
    while not again.done:
        again.step()
    limits = again.limits.tolist()
    for k, h, limit in zip(todo, again.results(), limits):
        if h and h[0].unmet == 0 and len(h[0].tokens) < limit:
            hyps[k] = h
    return hyps


@torch.no_grad()
def beam_search_reference(models, src_ids: list[int], decode: DecodeConfig = DEFAULT,
                          prefix: list[int] | None = None, numbers: torch.Tensor | None = None,
                          numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """The same search for one sentence (ids without ``</s>``), hypothesis by hypothesis with Python lists
    (``numbers_from``: the source-numbers constraint of a batch of this one sentence), with ``decode.all_numbers``'
    second pass as :func:`numbers_again` makes it."""
    hyps = _reference(models, src_ids, decode, prefix, numbers, numbers_from, banks=False)
    if decode.all_numbers and numbers_from is not None and hyps and numberbanks.unmet(numbers_from, hyps[0].tokens, 0):
        again = _reference(models, src_ids, decode, prefix, numbers, numbers_from, banks=True)
        limit = max(int(_limits(torch.tensor([len(src_ids) + 1]), decode.max_len_a, decode.max_len_b)[0]),
                    len(prefix or []))
        if again and again[0].unmet == 0 and len(again[0].tokens) < limit:
            return again
    return hyps


@torch.no_grad()
def _reference(models, src_ids: list[int], decode: DecodeConfig, prefix: list[int] | None,
               numbers: torch.Tensor | None, numbers_from: SourceNumbers | None, banks: bool) -> list[Hypothesis]:
    """One pass of :func:`beam_search_reference`; ``banks``: the beam shared by numbers written."""
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
    banks = banks and numbers_from is not None and numbers_from.required[0] > 0
    for t in range(limit + 1):
        expansions = []  # (score, order, tokens, token, states, coverage)
        extra = []  # with banks: each hypothesis' best token and best advancing token, as expansions
        ending = []  # with banks: the expansions by </s> that are their hypothesis' best
        for h, (toks, score, states, cov) in enumerate(live):
            y = torch.tensor([toks[-1] if toks else BOS])
            logp, new_states, alpha = ens.step(y, states, encs)
            raw = logp.clone()
            _mask(logp, no_unk)
            new_cov = cov if alpha is None else [c + float(a) for c, a in zip(cov, alpha[0])]
            banned = banned_after(toks, no_repeat_ngram, free)  # (the prefix counts as history; its tokens are forced)
            state = numbers_from.state(toks, 0) if banks else None
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
                if v == EOS and banks and t < limit and numberbanks.must_end_later(numbers_from, state, 0):
                    lp = -math.inf
                expansions.append((score + lp, h * logp.shape[1] + v, toks, v, new_states, new_cov))
            if banks:
                mine = expansions[-logp.shape[1]:]
                best = max((e for e in mine if e[3] != EOS), key=lambda e: (e[0], -e[1]))
                b = numberbanks.begun(numbers_from, state, 0)
                ahead = [mine[v] for v in numberbanks.advancing(numbers_from, state, b, 0, toks[-1] if toks else None)]
                extra += [e for e in [best] + ([max(ahead, key=lambda e: (e[0], -e[1]))] if ahead else [])
                          if math.isfinite(e[0])]
                top = max(mine, key=lambda e: (e[0], -e[1]))
                if top[3] == EOS and math.isfinite(top[0]):
                    ending.append(top)
        expansions.sort(key=lambda e: (-e[0], e[1]))
        expansions = expansions[: 2 * beam]
        next_live = []

        def finish(score, toks, cov):
            cp = coverage_penalty * sum(math.log(min(max(c, 1e-12), 1.0)) for c in cov)
            if decode.missing_numbers:
                cp -= decode.missing_numbers * numbers_from.missing(toks, 0)
            unmet = numberbanks.unmet(numbers_from, toks, 0) if banks else 0
            finished.append(Hypothesis(toks, score, score / (len(toks) + 1) ** lenpen + cp, unmet=unmet))

        ended = set()
        for rank, (score, order, toks, v, states, cov) in enumerate(expansions):
            if v == EOS:
                if rank < beam and math.isfinite(score):
                    ended.add(order)
                    if len(finished) < beam:
                        finish(score, toks, cov)
            elif len(next_live) < beam and not banks:
                next_live.append((toks + [v], score, states, cov))
        for score, order, toks, _, _, cov in ending:  # (banks: ended where </s> is the hypothesis' best)
            if order not in ended and len(finished) < beam:
                finish(score, toks, cov)
        if banks:  # the beam shared by numbers written (numberbanks)
            cands = {e[1]: e for e in expansions if e[3] != EOS and math.isfinite(e[0])}
            for e in extra:
                cands.setdefault(e[1], e)
            cands = list(cands.values())
            before = [numbers_from.state(e[2], 0) for e in cands]
            levels = [numberbanks.level(numbers_from, s, 0, numberbanks.written(numbers_from, s, 0), e[3])
                      for s, e in zip(before, cands)]
            picked = numberbanks.allocate([(e[0], e[1]) for e in cands], levels, beam,
                                          numberbanks.top_level(numbers_from, 0))
            next_live = [(cands[i][2] + [cands[i][3]], cands[i][0], cands[i][4], cands[i][5]) for i in picked]
        live = next_live
        if len(finished) >= beam:
            break
    finished.sort(key=Hypothesis.rank)
    return finished[:nbest]
