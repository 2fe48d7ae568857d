"""One batch of sentences in beam search, advanced a step at a time: :class:`BeamCohort`.

:func:`nmtkit.translate.search.beam_search` is one cohort stepped until it is done.  A step is split where the
model ends: :meth:`BeamCohort.step` computes the log-probabilities of the cohort's rows, and
:meth:`BeamCohort.advance` does the rest of the step as the module docstring of :mod:`nmtkit.translate.search`
describes it: the rules' masks (:mod:`nmtkit.translate.rules`), the top ``2K`` expansions, finished hypotheses, the
next beams, and the sentences that are done leaving the cohort.  Everything a decoding option adds is a rule's; the
cohort keeps only the beam's own logic.
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import BOS, EOS
from nmtkit.translate import stopping
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.rules import Search, Step
from nmtkit.translate.searchstep import Ensemble, Hypothesis, _limits, build_rules, check_numbers_from, top_k
from nmtkit.translate.sourcenumbers import SourceNumbers


class BeamCohort:
    """The search state of B sentences started together: K = ``decode.beam`` rows per sentence still decoding
    (``y``, ``states``: one (A·K, ·) tensor per model, ``encs``: the A sentences' encoder outputs), their tokens,
    scores and finished hypotheses.  src (B, Tx) with ``</s>``, src_lens (B,), prefix (B, P) / prefix_lens (B,) as
    ``beam_search`` takes them; ``terms``: each sentence's glossary terms (:class:`~nmtkit.translate.terms.SourceTerms`);
    ``banks``: the second search of ``--all-numbers`` and ``--terms`` (:mod:`nmtkit.translate.banks`)."""

    @torch.no_grad()
    def __init__(self, models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig,
                 need_attention: bool = False, prefix: torch.Tensor | None = None,
                 prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                 numbers_from: SourceNumbers | None = None, banks: bool = False, terms=None):
        check_numbers_from(decode, numbers_from)
        self.decode, self.need_attention, self.numbers_from, self.terms = decode, need_attention, numbers_from, terms
        # (kept for a second search of some sentences: again())
        self.src, self.src_lens, self.numbers, self.prefix, self.prefix_lens = src, src_lens, numbers, prefix, \
            prefix_lens
        self.ens = ens = Ensemble(models)
        self.dev = dev = src.device
        B, K = src.shape[0], decode.beam
        self.K = K
        self.limits = _limits(src_lens, decode.max_len_a, decode.max_len_b, prefix_lens).to(dev)  # (B,)
        self.rules = build_rules(decode, Search(src_lens, self.limits, K, dev, prefix, prefix_lens, numbers,
                                                numbers_from, src.shape[1], beam=True, banks=banks, terms=terms))
        self.encs = ens.encode(src, src_lens)  # one per sentence: the K hypotheses of a sentence share it
        self.states = [s.repeat_interleave(K, dim=0) for s in ens.init(self.encs)]  # (B*K, n): K rows a sentence
        self.alive = torch.arange(B, device=dev)  # original ids of the sentences still decoding
        self.scores = torch.full((B, K), -math.inf, device=dev)
        self.scores[:, 0] = 0.0  # one live hypothesis to start with, so the first step does not repeat it K times
        self.tokens = torch.zeros((B * K, 0), dtype=torch.long, device=dev)  # (A*K, t)
        self.attn = torch.zeros((B * K, 0, src.shape[1]), device=dev) if need_attention else None  # (A*K, t, Tx)
        self.y = torch.full((B * K,), BOS, dtype=torch.long, device=dev)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.count = [0] * B  # finished hypotheses per sentence (Python-side bookkeeping)
        self.lens_l = src_lens.tolist()
        self.t = 0  # the step about to be taken
        self.last = int(self.limits.max()) if B else 0  # the last step any sentence may take
        self.done = B == 0

    @property
    def rows(self) -> int:
        return self.y.shape[0]

    @torch.no_grad()
    def step(self) -> None:
        """One step: the models' log-probabilities of the rows, then :meth:`advance` (:class:`Cancelled` instead
        once the decoding's stop is set: :mod:`nmtkit.translate.stopping`)."""
        stopping.check()
        logp, states, alpha = self.ens.step(self.y, self.states, self.encs)  # (A*K, V), α (A*K, Tx)
        self.advance(logp, states, alpha)

    @torch.no_grad()
    def advance(self, logp: torch.Tensor, states: list[torch.Tensor], alpha: torch.Tensor | None) -> None:
        """The rest of step t from the rows' log-probabilities (A*K, V) float32 (consumed: changed in place), the
        models' new states and α (A*K, Tx) (or None)."""
        decode, K, dev, t, rules = self.decode, self.K, self.dev, self.t, self.rules
        alive = self.alive
        A = alive.numel()
        V = logp.shape[1]
        step = Step(t, self.tokens, alive, K, (t >= self.limits[alive]).repeat_interleave(K), self.numbers_from)
        for rule in rules:
            rule.before(logp, step)
        for rule in rules:
            rule.mask(logp, step)
        for rule in rules:
            rule.observe(alpha, step)
        cand = logp.view(A, K, V).add_(self.scores.unsqueeze(2)).view(A, K * V)  # (A, K*V)   in place
        top_scores, top_idx = top_k(cand, min(2 * K, K * V))  # (A, 2K)
        src_beam, tok = top_idx // V, top_idx % V  # (A, 2K)
        is_eos = (tok == EOS) & torch.isfinite(top_scores)
        attn = self.attn
        if self.need_attention:
            attn = torch.cat([attn, alpha.unsqueeze(1)], dim=1)  # (A*K, t+1, Tx)
        # finish the </s> expansions ranked among the first K (and those the rules add)
        alive_l = alive.tolist()
        ends = is_eos[:, :K].nonzero().tolist()  # → (sentence a, beam, score)
        if ends:
            beams_l, scores_l = src_beam[:, :K].tolist(), top_scores[:, :K].tolist()
            ends = [(a, beams_l[a][j], scores_l[a][j]) for a, j in ends]
        for rule in rules:
            ends += rule.ends(cand, step, ends)
        for a, b, score in ends:
            sent = alive_l[a]
            if self.count[sent] >= K:
                continue
            row = a * K + b
            toks = self.tokens[row].tolist()
            att = attn[row, :, : self.lens_l[sent]].clone() if self.need_attention else None
            hyp = Hypothesis(toks, score, score / (len(toks) + 1) ** decode.lenpen, att)
            for rule in rules:
                rule.finished(hyp, row, sent, step)
            self.finished[sent].append(hyp)
            self.count[sent] += 1
        # the first K expansions that are not </s> continue (unless a rule shares the beam out)
        positions = torch.arange(top_idx.shape[1], device=dev)
        key = (~(tok == EOS)).float() * (2 * K + 1) - positions  # (A, 2K): non-</s> first, in rank order
        sel = key.topk(K, dim=1).indices.sort(dim=1).values  # (A, K)
        scores = top_scores.gather(1, sel)  # (A, K)
        beams, y = src_beam.gather(1, sel), tok.gather(1, sel)  # (A, K)
        for rule in rules:
            for a, picks in rule.share(step, cand, top_scores, top_idx).items():
                scores[a] = torch.tensor([p[0] for p in picks], device=dev)
                beams[a] = torch.tensor([p[1] for p in picks], device=dev)
                y[a] = torch.tensor([p[2] for p in picks], device=dev)
        rows = (torch.arange(A, device=dev).unsqueeze(1) * K + beams).view(-1)  # (A*K,)
        y = y.view(-1)  # (A*K,)
        tokens = torch.cat([self.tokens.index_select(0, rows), y.unsqueeze(1)], dim=1)
        if self.need_attention:
            attn = attn.index_select(0, rows)
        states = [s.index_select(0, rows) for s in states]
        for rule in rules:
            rule.select(rows)
        done = (torch.tensor([self.count[i] for i in alive_l], device=dev) >= K) | (t >= self.limits[alive])  # (A,)
        self.t = t + 1
        if bool(done.all()) or self.t > self.last:
            self.done = True
            self.y, self.states, self.tokens, self.attn = y[:0], [s[:0] for s in states], tokens[:0], None
            self.alive = alive[:0]
            return
        if bool(done.any()):  # drop finished sentences from the batch
            keep = (~done).nonzero().squeeze(1)  # (A',)
            keep_rows = (keep.unsqueeze(1) * K + torch.arange(K, device=dev)).view(-1)
            alive, scores, y, tokens = alive[keep], scores[keep], y[keep_rows], tokens[keep_rows]
            if self.need_attention:
                attn = attn[keep_rows]
            states = [s.index_select(0, keep_rows) for s in states]
            for rule in rules:
                rule.select(keep_rows)
            self.encs = [m.reorder_encoder_out(e, keep) for m, e in zip(self.ens.models, self.encs)]
        # (the K rows of a sentence share its encoder output, so reordering beams leaves ``encs`` as it is)
        self.alive, self.scores, self.y, self.tokens, self.attn, self.states = alive, scores, y, tokens, attn, states

    def again(self, sentences: list[int]) -> BeamCohort:
        """A new search of some of the batch's sentences (ids, in that order) with the beam shared by numbers and
        terms written (the second search of ``--all-numbers`` and ``--terms``, ``decode.constrained_beam`` wide)."""
        idx = torch.tensor(sentences, device=self.src.device)
        prefix = prefix_lens = None
        if self.prefix is not None:
            prefix = self.prefix.index_select(0, idx.to(self.prefix.device))
            prefix_lens = self.prefix_lens.index_select(0, idx.to(self.prefix.device))
        return BeamCohort(self.ens.models, self.src.index_select(0, idx), self.src_lens.index_select(0, idx),
                          self.decode.second, self.need_attention, prefix, prefix_lens, self.numbers,
                          None if self.numbers_from is None else self.numbers_from.subset(sentences), banks=True,
                          terms=None if self.terms is None else self.terms.subset(sentences))

    def results(self) -> list[list[Hypothesis]]:
        """For each sentence its ``decode.nbest`` best finished hypotheses, best first (with what the rules revise
        once the search is done: ``--all-numbers``' second search)."""
        results = []
        for hyps in self.finished:
            hyps.sort(key=Hypothesis.rank)  # stable: equal scores keep the order they finished in
            results.append(hyps[: self.decode.nbest])
        for rule in self.rules:
            results = rule.revise(self, results)
        return results
