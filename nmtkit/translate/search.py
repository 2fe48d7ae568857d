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
  those tokens are never blocked.
- With ``source_numbers`` (a :class:`~nmtkit.translate.sourcenumbers.SourceNumbers` for the batch: the decoding's
  ``source_numbers`` setting) a token holding a digit may only continue or begin one of the sentence's source
  numbers; the others get −inf before the top-k, after the n-gram block (:mod:`nmtkit.translate.sourcenumbers`).
- With ``all_numbers`` besides (``--all-numbers``), a sentence whose best hypothesis leaves out one of its source
  numbers is searched again with the beam shared by the numbers' digits written, Post & Vilar (2018)'s dynamic
  beam allocation (:mod:`nmtkit.translate.numberbanks`, :mod:`nmtkit.translate.banks`); with ``terms``, the same for a
  glossary's terms (:mod:`nmtkit.translate.terms`).
- With ``min_length_ratio`` r > 0, ``</s>`` may not follow before ⌈r · source words⌉ tokens (nor past the length
  limit's).
- Each of these is a rule on the step (:mod:`nmtkit.translate.rules`), as are the masks of ``<pad>``, ``<s>``,
  ``<unk>``, the forced prefix, the length limit and the coverage penalty.
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
from nmtkit.translate import banks, numberbanks, stopping
from nmtkit.translate.cohort import BeamCohort
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.rules import CoveragePenalty, Prefix, Search, Step
from nmtkit.translate.searchstep import (Ensemble, Hypothesis, _limits, build_rules, check_numbers_from,  # noqa: F401
                                         top_k)
from nmtkit.translate.sourcenumbers import SourceNumbers

DEFAULT = DecodeConfig()  # (nmt-translate's defaults: beam 12, ...)


@torch.no_grad()
def one_token_at_a_time(models, src: torch.Tensor, src_lens: torch.Tensor, choose, decode: DecodeConfig, n: int = 1,
                        need_attention: bool = False, prefix: torch.Tensor | None = None,
                        prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                        numbers_from: SourceNumbers | None = None
                        ) -> tuple[list[list[int]], list[float], torch.Tensor | None]:
    """The left-to-right loop of greedy decoding and of sampling: ``n`` rows per sentence of src (B, Tx) with
    ``</s>``, each extended by one token a step, ``choose(logp (B·n, V), t) -> y (B·n,)`` picking it from the
    log-probabilities masked by ``decode``'s rules (:mod:`nmtkit.translate.rules`: ``numbers`` the tokens the
    n-gram block leaves free, ``numbers_from`` the source-numbers constraint, a prefix's token t where it is longer
    than t, only ``</s>`` at the length limit), until every row has ended.  -> each row's tokens (without
    ``</s>``), its log-probability, and with ``need_attention`` α (B·n, T, Tx)."""
    ens = Ensemble(models)
    dev = src.device
    B = src.shape[0]
    limits = _limits(src_lens, decode.max_len_a, decode.max_len_b, prefix_lens).to(dev)  # (B,)
    rules = build_rules(decode, Search(src_lens, limits, n, dev, prefix, prefix_lens, numbers, numbers_from,
                                       src.shape[1], beam=False))
    limits = limits.repeat_interleave(n)  # (B·n,)
    encs = ens.encode(src, src_lens)  # (the n rows of a sentence share its encoder output)
    states = [s.repeat_interleave(n, dim=0) for s in ens.init(encs)]  # (B·n, n')
    sentences = torch.arange(B, device=dev)
    y = torch.full((B * n,), BOS, dtype=torch.long, device=dev)
    done = torch.zeros(B * n, dtype=torch.bool, device=dev)
    scores = torch.zeros(B * n, dtype=torch.float64, device=dev)
    out, alphas = [], []
    T = int(limits.max()) + 1 if B else 0
    # each row's tokens so far, (B·n, T), filled a column a step (rows do not move here)
    history = torch.zeros((B * n, T), dtype=torch.long, device=dev)
    for t in range(T):
        stopping.check()  # (Cancelled once the decoding's stop is set)
        logp, states, alpha = ens.step(y, states, encs)  # (B·n, V), α (B·n, Tx)
        step = Step(t, history[:, :t], sentences, n, t >= limits, numbers_from)
        for rule in rules:
            rule.before(logp, step)
        for rule in rules:
            rule.mask(logp, step)
        y = choose(logp, t)  # (B·n,)
        step_lp = logp.gather(1, y[:, None]).squeeze(1).double()
        scores += torch.where(done, torch.zeros_like(step_lp), step_lp)
        out.append(torch.where(done, torch.full_like(y, EOS), y))
        history[:, t] = out[-1]
        if need_attention:
            alphas.append(alpha.float())
        done |= y == EOS
        if bool(done.all()):
            break
    ids = torch.stack(out, dim=1).tolist() if out else [[] for _ in range(B * n)]  # (B·n, T)
    tokens = [row[: row.index(EOS)] if EOS in row else row for row in ids]
    return tokens, scores.tolist(), (torch.stack(alphas, dim=1) if need_attention else None)


def greedy(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
           numbers: torch.Tensor | None = None, numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """Batched greedy decoding: src (B, Tx) with ``</s>``, src_lens (B,) → one hypothesis per sentence, in order
    (``decode``'s rules, as in beam search; ``numbers`` the tokens the n-gram block leaves free, ``numbers_from`` the
    source-numbers constraint; its beam is not read)."""
    check_numbers_from(decode, numbers_from)
    tokens, scores, _ = one_token_at_a_time(models, src, src_lens, lambda logp, t: logp.argmax(dim=-1), decode,
                                            numbers=numbers, numbers_from=numbers_from)
    return [Hypothesis(toks, score, score) for toks, score in zip(tokens, scores)]


@torch.no_grad()
def beam_search(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
                need_attention: bool = False, prefix: torch.Tensor | None = None,
                prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                numbers_from: SourceNumbers | None = None, terms=None) -> list[list[Hypothesis]]:
    """Batched beam search: src (B, Tx) with ``</s>``, src_lens (B,), optionally prefix (B, P) target ids padded
    with ``<pad>`` and prefix_lens (B,) → for each sentence its ``decode.nbest`` best hypotheses, best first (see the
    module docstring for the exact procedure; ``decode``: beam, nbest, lenpen, max_len_a/b, no_unk, coverage_penalty,
    no_repeat_ngram, min_length_ratio, ...; ``numbers``: the tokens the block leaves free; ``numbers_from``: the
    source-numbers constraint; ``terms``: the glossary's, :class:`~nmtkit.translate.terms.SourceTerms`), with their
    attention when ``need_attention``."""
    cohort = BeamCohort(models, src, src_lens, decode, need_attention, prefix, prefix_lens, numbers, numbers_from,
                        terms=terms)
    while not cohort.done:
        cohort.step()
    return cohort.results()


@torch.no_grad()
def beam_search_reference(models, src_ids: list[int], decode: DecodeConfig = DEFAULT,
                          prefix: list[int] | None = None, numbers: torch.Tensor | None = None,
                          numbers_from: SourceNumbers | None = None, terms=None) -> list[Hypothesis]:
    """The same search for one sentence (ids without ``</s>``), hypothesis by hypothesis with Python lists
    (``numbers_from``: the source-numbers constraint of a batch of this one sentence, ``terms`` its glossary terms),
    with the second search of ``decode.all_numbers`` and ``terms`` as :class:`~nmtkit.translate.banks.SearchAgain`
    makes it.  Each rule acts through its one-hypothesis form (:meth:`~nmtkit.translate.rules.Rule.banned`)."""
    hyps = _reference(models, src_ids, decode, prefix, numbers, numbers_from, False, terms)
    first = banks.Constraints(banks.constraints_of(decode, numbers_from, terms))
    if hyps and first.cs and first.unmet(hyps[0].tokens, 0):
        again = _reference(models, src_ids, decode.second, prefix, numbers, numbers_from, True, terms)
        limit = max(int(_limits(torch.tensor([len(src_ids) + 1]), decode.max_len_a, decode.max_len_b)[0]),
                    len(prefix or []))
        if again and again[0].unmet == 0 and len(again[0].tokens) < limit:
            return again
    return hyps


@torch.no_grad()
def _reference(models, src_ids: list[int], decode: DecodeConfig, prefix: list[int] | None,
               numbers: torch.Tensor | None, numbers_from: SourceNumbers | None, shared: bool, terms=None
               ) -> list[Hypothesis]:
    """One pass of :func:`beam_search_reference`; ``shared``: the beam shared by numbers and terms written."""
    beam, nbest, lenpen = decode.beam, decode.nbest, decode.lenpen
    ens = Ensemble(models)
    src = torch.tensor([list(src_ids) + [EOS]])
    src_lens = torch.tensor([len(src_ids) + 1])
    prefix = list(prefix or [])
    encs = ens.encode(src, src_lens)
    limit = max(int(_limits(src_lens, decode.max_len_a, decode.max_len_b)[0]), len(prefix))
    forced = torch.tensor([prefix]) if prefix else None
    rules = build_rules(decode, Search(src_lens, torch.tensor([limit]), beam, torch.device("cpu"), forced,
                                       torch.tensor([len(prefix)]) if prefix else None, numbers, numbers_from,
                                       src.shape[1], beam=True, banks=shared, terms=terms))
    by_kind = {type(r): r for r in rules}
    prefix_rule, coverage_rule = by_kind.get(Prefix), by_kind.get(CoveragePenalty)
    masks = [r for r in rules if not isinstance(r, (Prefix, CoveragePenalty))]
    cs = banks.Constraints(banks.constraints_of(decode, numbers_from, terms))
    shared = shared and cs.required(0) > 0
    live = [([], 0.0, ens.init(encs), [0.0] * len(src_ids))]  # (tokens, score, states, Σ_i α_ij per source word)
    finished: list[Hypothesis] = []
    for t in range(limit + 1):
        expansions = []  # (score, order, tokens, token, states, coverage)
        extra = []  # with banks: each hypothesis' best token and best advancing token, as expansions
        ending = []  # with banks: the expansions by </s> that are their hypothesis' best
        for h, (toks, score, states, cov) in enumerate(live):
            y = torch.tensor([toks[-1] if toks else BOS])
            logp, new_states, alpha = ens.step(y, states, encs)
            new_cov = cov if alpha is None else [c + float(a) for c, a in zip(cov, alpha[0])]
            bans = [r.banned(toks, t, t >= limit) for r in masks]
            state = cs.state(toks, 0) if shared else None
            must = prefix_rule.forced(t) if prefix_rule is not None else None  # (at its own log-probability)
            for v in range(logp.shape[1]):
                if must is not None:
                    lp = float(logp[0, v]) if v == must else -math.inf
                else:
                    lp = -math.inf if any(v in b for b in bans) else float(logp[0, v])
                # exact ties (which real log-probabilities practically never have) go to the lower index here;
                # torch.topk promises no order among equal values
                expansions.append((score + lp, h * logp.shape[1] + v, toks, v, new_states, new_cov))
            if shared:
                mine = expansions[-logp.shape[1]:]
                best = max((e for e in mine if e[3] != EOS), key=lambda e: (e[0], -e[1]))
                ahead = [mine[v] for v in cs.advancing(state, 0, toks[-1] if toks else None)]
                extra += [e for e in [best] + ([max(ahead, key=lambda e: (e[0], -e[1]))] if ahead else [])
                          if math.isfinite(e[0])]
                top = max(mine, key=lambda e: (e[0], -e[1]))
                if top[3] == EOS and math.isfinite(top[0]):
                    ending.append(top)
        expansions.sort(key=lambda e: (-e[0], e[1]))
        expansions = expansions[: 2 * beam]
        next_live = []

        def finish(score, toks, cov):
            norm = score / (len(toks) + 1) ** lenpen
            if coverage_rule is not None:
                norm += coverage_rule.one(cov)
            unmet = cs.unmet(toks, 0) if shared else 0
            missed = terms.missed(toks, 0) if terms is not None else None
            finished.append(Hypothesis(toks, score, norm, unmet=unmet, missed=missed))

        ended = set()
        for rank, (score, order, toks, v, states, cov) in enumerate(expansions):
            if v == EOS:
                if rank < beam and math.isfinite(score):
                    ended.add(order)
                    if len(finished) < beam:
                        finish(score, toks, cov)
            elif len(next_live) < beam and not shared:
                next_live.append((toks + [v], score, states, cov))
        for score, order, toks, _, _, cov in ending:  # (shared: ended where </s> is the hypothesis' best)
            if order not in ended and len(finished) < beam:
                finish(score, toks, cov)
        if shared:  # the beam shared by numbers and terms written (banks)
            cands = {e[1]: e for e in expansions if e[3] != EOS and math.isfinite(e[0])}
            for e in extra:
                cands.setdefault(e[1], e)
            cands = list(cands.values())
            levels = [cs.level(cs.state(e[2], 0), 0, e[3]) for e in cands]
            picked = numberbanks.allocate([(e[0], e[1]) for e in cands], levels, beam, cs.top(0))
            next_live = [(cands[i][2] + [cands[i][3]], cands[i][0], cands[i][4], cands[i][5]) for i in picked]
        live = next_live
        if len(finished) >= beam:
            break
    finished.sort(key=Hypothesis.rank)
    return finished[:nbest]
