"""One batch of sentences in beam search, advanced a step at a time: :class:`BeamCohort`.

:func:`nmtkit.translate.search.beam_search` is one cohort stepped until it is done; a server steps several cohorts
together, each started when its sentences arrived (:mod:`nmtkit.translate.continuous`).  A step is split where the
model ends: the caller computes the log-probabilities of the cohort's rows (``y``, ``states``, ``encs``; several
cohorts' rows in one product), and :meth:`BeamCohort.advance` does the rest of the step as the module docstring of
:mod:`nmtkit.translate.search` describes it: masks, the top ``2K`` expansions, finished hypotheses, the next beams,
and the sentences that are done leaving the cohort.
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import BOS, EOS, PAD
from nmtkit.models.backend import EncoderOut
from nmtkit.translate import numberbanks
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.searchstep import (Ensemble, Hypothesis, _limits, _mask_step, _only_eos, check_numbers_from,
                                         coverage, free_tokens, top_k)
from nmtkit.translate.sourcenumbers import SourceNumbers


_ALONG_SOURCE = ("annotations", "keys", "src_mask")  # EncoderOut fields (B, Tx, ...); "proj" too where attentive


def stack_encoder_out(encs: list[EncoderOut]) -> EncoderOut:
    """Several batches' encoder outputs as one: each (B_k, Tx_k, ...) field padded along Tx to the largest Tx (zeros;
    ``src_mask`` False) and stacked along the batch, the others stacked as they are."""
    if len(encs) == 1:
        return encs[0]
    Tx = max(e.src_mask.shape[1] for e in encs)
    attentive = encs[0].context is None

    def padded(t: torch.Tensor) -> torch.Tensor:
        if t.shape[1] == Tx:
            return t
        shape = (t.shape[0], Tx - t.shape[1], *t.shape[2:])
        return torch.cat([t, t.new_zeros(shape)], dim=1)  # (False for the bool mask)

    fields = {}
    for name in EncoderOut._fields:
        ts = [getattr(e, name) for e in encs]
        if any(t is None for t in ts):
            if not all(t is None for t in ts):
                raise ValueError(f"encoder outputs to stack differ in {name}: some have it, some do not")
            fields[name] = None
            continue
        along = name in _ALONG_SOURCE or (name == "proj" and attentive)
        fields[name] = torch.cat([padded(t) for t in ts] if along else ts, dim=0)
    return EncoderOut(**fields)


def narrow_encoder_out(enc: EncoderOut, Tx: int) -> EncoderOut:
    """An encoder output cut to its first ``Tx`` source positions (the others padding of every sentence left)."""
    attentive = enc.context is None
    return EncoderOut(**{name: (t[:, :Tx] if t is not None and (name in _ALONG_SOURCE or (name == "proj" and attentive))
                                else t) for name, t in zip(EncoderOut._fields, enc)})


class BeamCohort:
    """The search state of B sentences started together: K = ``decode.beam`` rows per sentence still decoding
    (``y``, ``states``: one (A·K, ·) tensor per model, ``encs``: the A sentences' encoder outputs), their tokens,
    scores and finished hypotheses.  src (B, Tx) with ``</s>``, src_lens (B,), prefix (B, P) / prefix_lens (B,) as
    ``beam_search`` takes them."""

    @torch.no_grad()
    def __init__(self, models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig,
                 need_attention: bool = False, prefix: torch.Tensor | None = None,
                 prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                 numbers_from: SourceNumbers | None = None, banks: bool = False):
        check_numbers_from(decode, numbers_from)
        self.decode, self.need_attention, self.numbers_from = decode, need_attention, numbers_from
        # the beam shared by numbers written (numberbanks): --all-numbers' second pass
        self.banks = banks and numbers_from is not None
        # (kept for that second pass: see nmtkit.translate.search.numbers_again)
        self.src, self.src_lens, self.numbers = src, src_lens, numbers
        self.ens = ens = Ensemble(models)
        self.dev = dev = src.device
        self.free = free_tokens(decode, numbers, dev)
        B, K = src.shape[0], decode.beam
        self.K = K
        if prefix is not None:
            prefix, prefix_lens = prefix.to(dev), prefix_lens.to(dev)
        self.prefix, self.prefix_lens = prefix, prefix_lens
        self.encs = ens.encode(src, src_lens)  # one per sentence: the K hypotheses of a sentence share it
        self.states = [s.repeat_interleave(K, dim=0) for s in ens.init(self.encs)]  # (B*K, n): K rows a sentence
        self.limits = _limits(src_lens, decode.max_len_a, decode.max_len_b, prefix_lens).to(dev)  # (B,)
        self.words = None  # with a coverage penalty: (A*K, Tx) which positions are source words, Σ_i α_ij so far
        if decode.coverage_penalty > 0:
            positions = torch.arange(src.shape[1], device=dev)
            self.words = (positions < (src_lens.to(dev) - 1).unsqueeze(1)).repeat_interleave(K, dim=0)
            self.cov = torch.zeros((B * K, src.shape[1]), device=dev)
        self.alive = torch.arange(B, device=dev)  # original ids of the sentences still decoding
        self.scores = torch.full((B, K), -math.inf, device=dev)
        self.scores[:, 0] = 0.0  # one live hypothesis to start with, so the first step does not repeat it K times
        self.tokens = torch.zeros((B * K, 0), dtype=torch.long, device=dev)  # (A*K, t)
        self.attn = torch.zeros((B * K, 0, src.shape[1]), device=dev) if need_attention else None  # (A*K, t, Tx)
        self.y = torch.full((B * K,), BOS, dtype=torch.long, device=dev)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.count = [0] * B  # finished hypotheses per sentence (Python-side bookkeeping)
        self.lens_l = src_lens.tolist()
        self.start = [0] * B  # per sentence: the step at which it joined (absorb); its history is padded before it
        self.absorbed = False  # whether other cohorts joined this one (absorb): then its past is dropped (_compact)
        self.Tx = src.shape[1]
        self.t = 0  # the step about to be taken
        self.last = int(self.limits.max())  # the last step any sentence may take
        self.done = B == 0

    @property
    def rows(self) -> int:
        return self.y.shape[0]

    @torch.no_grad()
    def step(self) -> None:
        """One step of this cohort alone."""
        logp, states, alpha = self.ens.step(self.y, self.states, self.encs)  # (A*K, V), α (A*K, Tx)
        self.advance(logp, states, alpha)

    @torch.no_grad()
    def advance(self, logp: torch.Tensor, states: list[torch.Tensor], alpha: torch.Tensor | None) -> None:
        """The rest of step t from the rows' log-probabilities (A*K, V) float32 (consumed: changed in place), the
        models' new states and α (A*K, Tx) (or None)."""
        decode, K, dev, t = self.decode, self.K, self.dev, self.t
        alive = self.alive
        A = alive.numel()
        V = logp.shape[1]
        at_limit = (t >= self.limits[alive]).repeat_interleave(K)  # (A*K,)
        nf, states_n = self.numbers_from, None
        if nf is not None:
            states_n = nf.states(self.tokens, alive.repeat_interleave(K).tolist())  # (A*K,) State | None
        _mask_step(logp, decode.no_unk, t, self.prefix, self.prefix_lens, alive, K, self.tokens,
                   decode.no_repeat_ngram, self.free, nf, at_limit, states_n)  # tokens (A*K, t)
        banks, begun_n = self.banks, None
        if banks:  # no </s> before every number is written (numberbanks)
            sents, ending = alive.repeat_interleave(K).tolist(), at_limit.tolist()
            begun_n = [None if s is None else numberbanks.begun(nf, s, k) for s, k in zip(states_n, sents)]
            later = [r for r, b in enumerate(begun_n) if b is not None and not ending[r] and b < nf.required[sents[r]]]
            if later:
                logp[later, EOS] = -math.inf
        words = self.words
        if words is not None:
            if alpha is None:
                raise ValueError("the coverage penalty needs an attention model (rnnsearch)")
            self.cov = self.cov + alpha  # (A*K, Tx) Σ_i α_ij including this step
        _only_eos(logp, at_limit)  # at the limit only </s> may follow
        cand = logp.view(A, K, V).add_(self.scores.unsqueeze(2)).view(A, K * V)  # (A, K*V)   in place
        top_scores, top_idx = top_k(cand, min(2 * K, K * V))  # (A, 2K)
        src_beam, tok = top_idx // V, top_idx % V  # (A, 2K)
        is_eos = (tok == EOS) & torch.isfinite(top_scores)
        attn = self.attn
        if self.need_attention:
            attn = torch.cat([attn, alpha.unsqueeze(1)], dim=1)  # (A*K, t+1, Tx)
        # finish the </s> expansions ranked among the first K
        alive_l = alive.tolist()
        ends = is_eos[:, :K].nonzero().tolist()  # → (sentence a, beam, score)
        if ends:
            beams_l, scores_l = src_beam[:, :K].tolist(), top_scores[:, :K].tolist()
            ends = [(a, beams_l[a][j], scores_l[a][j]) for a, j in ends]
        if banks:  # and those of the rows that wrote every number and would end there (numberbanks)
            ends += numberbanks.ending(cand, K, {(a, b) for a, b, _ in ends}, [nf.required[s] > 0 for s in alive_l])
        if ends:
            penalty = coverage(self.cov, words, decode.coverage_penalty).tolist() if words is not None else None
            for a, b, score in ends:
                sent = alive_l[a]
                if self.count[sent] >= K:
                    continue
                row, start = a * K + b, self.start[sent]
                toks = self.tokens[row, start:].tolist()
                att = attn[row, start:, : self.lens_l[sent]].clone() if self.need_attention else None
                norm = score / (len(toks) + 1) ** decode.lenpen + (penalty[row] if penalty is not None else 0.0)
                if decode.missing_numbers:
                    norm -= decode.missing_numbers * self.numbers_from.missing(toks, sent)
                unmet = numberbanks.unmet(self.numbers_from, toks, sent) if banks else 0
                self.finished[sent].append(Hypothesis(toks, score, norm, att, unmet))
                self.count[sent] += 1
        # the first K expansions that are not </s> continue
        positions = torch.arange(top_idx.shape[1], device=dev)
        key = (~(tok == EOS)).float() * (2 * K + 1) - positions  # (A, 2K): non-</s> first, in rank order
        sel = key.topk(K, dim=1).indices.sort(dim=1).values  # (A, K)
        scores = top_scores.gather(1, sel)  # (A, K)
        beams, y = src_beam.gather(1, sel), tok.gather(1, sel)  # (A, K)
        if banks:  # the sentences with numbers to write share their beams by numbers written
            last = self.tokens[:, -1].tolist() if t else None
            chosen = numberbanks.choose(nf, states_n, begun_n, alive_l, K, cand, top_scores, top_idx, last)
            for a, picks in chosen.items():
                scores[a] = torch.tensor([p[0] for p in picks], device=dev)
                beams[a] = torch.tensor([p[1] for p in picks], device=dev)
                y[a] = torch.tensor([p[2] for p in picks], device=dev)
        rows = (torch.arange(A, device=dev).unsqueeze(1) * K + beams).view(-1)  # (A*K,)
        y = y.view(-1)  # (A*K,)
        tokens = torch.cat([self.tokens.index_select(0, rows), y.unsqueeze(1)], dim=1)
        if self.need_attention:
            attn = attn.index_select(0, rows)
        states = [s.index_select(0, rows) for s in states]
        if words is not None:
            self.cov, words = self.cov.index_select(0, rows), words.index_select(0, rows)
        done = (torch.tensor([self.count[i] for i in alive_l], device=dev) >= K) | (t >= self.limits[alive])  # (A,)
        self.t = t + 1
        if bool(done.all()) or self.t > self.last:
            self.done = True
            self.y, self.states, self.tokens, self.attn, self.words = y[:0], [s[:0] for s in states], tokens[:0], \
                None, None
            self.alive = alive[:0]
            return
        if bool(done.any()):  # drop finished sentences from the batch
            keep = (~done).nonzero().squeeze(1)  # (A',)
            keep_rows = (keep.unsqueeze(1) * K + torch.arange(K, device=dev)).view(-1)
            alive, scores, y, tokens = alive[keep], scores[keep], y[keep_rows], tokens[keep_rows]
            if self.need_attention:
                attn = attn[keep_rows]
            states = [s.index_select(0, keep_rows) for s in states]
            if words is not None:
                self.cov, words = self.cov[keep_rows], words[keep_rows]
            self.encs = [m.reorder_encoder_out(e, keep) for m, e in zip(self.ens.models, self.encs)]
        # (the K rows of a sentence share its encoder output, so reordering beams leaves ``encs`` as it is)
        self.alive, self.scores, self.y, self.tokens, self.attn, self.states, self.words = \
            alive, scores, y, tokens, attn, states, words
        if self.absorbed and bool(done.any()):
            self._compact()

    def _compact(self) -> None:
        """(a search that absorbed cohorts, when sentences have left) Drop the history columns that only sentences
        gone had (the first min(start) of every row: padding now) and the source positions beyond the longest
        source still decoding, so that a search that never ends, under a server's steady load, costs a step what
        its sentences do, not what its whole past did."""
        alive_l = self.alive.tolist()
        m = min(self.start[s] for s in alive_l)
        if m > 0:
            self.tokens = self.tokens[:, m:]
            if self.attn is not None:
                self.attn = self.attn[:, m:]
            if self.prefix is not None:
                self.prefix = self.prefix[:, m:]
                self.prefix_lens = torch.where(self.prefix_lens > m, self.prefix_lens - m,
                                               torch.zeros_like(self.prefix_lens))
            self.limits = self.limits - m
            self.start = [x - m for x in self.start]
            self.t, self.last = self.t - m, self.last - m
        Tx = max(self.lens_l[s] for s in alive_l)
        if Tx < self.Tx:
            self.encs = [narrow_encoder_out(e, Tx) for e in self.encs]
            if self.attn is not None:
                self.attn = self.attn[:, :, :Tx]
            if self.words is not None:
                self.words, self.cov = self.words[:, :Tx], self.cov[:, :Tx]
            self.Tx = Tx

    @torch.no_grad()
    def absorb(self, other: "BeamCohort") -> None:
        """``other`` (begun, not yet stepped; the same models and settings) joins this cohort's search at its next
        step t: its sentences become this cohort's last ones, their token and attention histories padded on the
        left with t columns (``<pad>``, zeros: stripped when they finish), their length limits and prefixes moved t
        steps on, their encoder outputs stacked with this cohort's (padded along the source).  Its hypotheses go on
        being appended to ``other.finished``'s lists (shared), so ``other.results()`` reads them once
        none of its sentences is still decoding (:class:`~nmtkit.translate.continuous.ContinuousSearch` says when).
        One cohort stepping every sentence costs one :meth:`advance` a step, where cohorts stepped side by side cost
        one each."""
        if other.t or other.done:
            raise ValueError("a cohort joins another before its first step, with sentences to decode")
        t, B0, dev = self.t, len(self.finished), self.dev
        pad_t = lambda x, fill: torch.cat([x.new_full((x.shape[0], t, *x.shape[2:]), fill), x], dim=1)  # noqa: E731
        Tx = max(self.Tx, other.Tx)

        def wide(x, fill=0):  # (N, ..., Tx_k) -> (N, ..., Tx) along the last dimension
            if x.shape[-1] == Tx:
                return x
            return torch.cat([x, x.new_full((*x.shape[:-1], Tx - x.shape[-1]), fill)], dim=-1)

        if self.prefix is not None or other.prefix is not None:
            mine = self.prefix if self.prefix is not None else torch.full((B0, 0), PAD, dtype=torch.long, device=dev)
            mine_lens = self.prefix_lens if self.prefix is not None else torch.zeros(B0, dtype=torch.long, device=dev)
            theirs = other.prefix if other.prefix is not None else \
                torch.full((len(other.finished), 0), PAD, dtype=torch.long, device=dev)
            theirs = pad_t(theirs, PAD)
            theirs_lens = other.prefix_lens + t if other.prefix is not None else \
                torch.zeros(len(other.finished), dtype=torch.long, device=dev)
            theirs_lens = torch.where(theirs_lens > t, theirs_lens, torch.zeros_like(theirs_lens))  # (none stays none)
            P = max(mine.shape[1], theirs.shape[1])
            self.prefix = torch.cat([torch.cat([p, p.new_full((p.shape[0], P - p.shape[1]), PAD)], dim=1)
                                     for p in (mine, theirs)])
            self.prefix_lens = torch.cat([mine_lens, theirs_lens])
        if self.numbers_from is not None:
            self.numbers_from = self.numbers_from.joined(other.numbers_from)
        self.encs = [stack_encoder_out([a, b]) for a, b in zip(self.encs, other.encs)]
        self.states = [torch.cat([a, b]) for a, b in zip(self.states, other.states)]
        self.limits = torch.cat([self.limits, other.limits + t])
        if self.words is not None:
            self.words = torch.cat([wide(self.words, False), wide(other.words, False)])
            self.cov = torch.cat([wide(self.cov), wide(other.cov)])
        self.alive = torch.cat([self.alive, other.alive + B0])
        self.scores = torch.cat([self.scores, other.scores])
        self.tokens = torch.cat([self.tokens, pad_t(other.tokens, PAD)])
        if self.need_attention:
            self.attn = torch.cat([wide(self.attn), wide(pad_t(other.attn, 0.0))])
        self.y = torch.cat([self.y, other.y])
        self.finished = self.finished + other.finished  # (the same lists: other's hypotheses land in its own)
        self.count = self.count + other.count
        self.start = self.start + [t] * len(other.finished)
        self.lens_l = self.lens_l + other.lens_l
        self.Tx = Tx
        self.last = max(self.last, other.last + t)
        self.absorbed = True

    def results(self) -> list[list[Hypothesis]]:
        """For each sentence its ``decode.nbest`` best finished hypotheses, best first."""
        results = []
        for hyps in self.finished:
            hyps.sort(key=Hypothesis.rank)  # stable: equal scores keep the order they finished in
            results.append(hyps[: self.decode.nbest])
        return results
