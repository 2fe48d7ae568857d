"""The source's numbers as decoding rules (:mod:`nmtkit.translate.rules`): ``--source-numbers``' constraint
(:class:`SourceNumbersRule`, :mod:`nmtkit.translate.sourcenumbers`) and ``--all-numbers``' two passes
(:class:`AllNumbers` searches again, :class:`NumberBanks` shares the second pass' beam by numbers written:
:mod:`nmtkit.translate.numberbanks`)."""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import EOS
from nmtkit.translate import numberbanks
from nmtkit.translate.rules import Rule


class SourceNumbersRule(Rule):
    """``source_numbers``: a token holding a digit may only continue or begin one of the sentence's source numbers
    (:meth:`~nmtkit.translate.sourcenumbers.SourceNumbers.apply`)."""

    def __init__(self, numbers_from):
        self.nf = numbers_from

    @classmethod
    def build(cls, decode, search):
        return None if search.numbers_from is None else cls(search.numbers_from)

    def mask(self, logp, step):
        self.nf.apply(logp, step.tokens, step.sentences, step.ending, step.states)

    def banned(self, tokens, t, ending):
        return self.nf.banned(tokens, 0, ending)


class NumberBanks(Rule):
    """``--all-numbers``' second pass: no ``</s>`` before every number is begun (except at the length limit); a
    hypothesis that wrote them all finishes where ``</s>`` is its own best token; the beam is shared by digits
    written (Post & Vilar 2018); a hypothesis ended without them ranks behind (``unmet``)."""

    def __init__(self, numbers_from):
        self.nf = numbers_from

    @classmethod
    def build(cls, decode, search):
        return cls(search.numbers_from) if search.banks and search.numbers_from is not None else None

    def mask(self, logp, step):
        nf, sents, ending = self.nf, step.sentences, step.ending.tolist()
        begun = [None if s is None else numberbanks.begun(nf, s, k) for s, k in zip(step.states, sents)]
        step.shared[NumberBanks] = begun
        later = [r for r, b in enumerate(begun) if b is not None and not ending[r] and b < nf.required[sents[r]]]
        if later:
            logp[later, EOS] = -math.inf

    def ends(self, cand, step, ended):
        todo = [self.nf.required[s] > 0 for s in step.alive.tolist()]
        return numberbanks.ending(cand, step.K, {(a, b) for a, b, _ in ended}, todo)

    def finished(self, hyp, row, sentence, step):
        hyp.unmet = numberbanks.unmet(self.nf, hyp.tokens, sentence)

    def share(self, step, cand, top_scores, top_idx):
        last = step.tokens[:, -1].tolist() if step.t else None
        return numberbanks.choose(self.nf, step.states, step.shared[NumberBanks], step.alive.tolist(), step.K, cand,
                                  top_scores, top_idx, last)

    def banned(self, tokens, t, ending):
        if ending or not numberbanks.must_end_later(self.nf, self.nf.state(tokens, 0), 0):
            return set()
        return {EOS}


class AllNumbers(Rule):
    """``--all-numbers``' first pass: once the search is done, the sentences whose best hypothesis leaves out a
    number they must write are searched again with :class:`NumberBanks`; a sentence takes the second search's
    hypotheses when its best writes them all and ends before its length limit, and keeps the first's otherwise (a
    sentence whose numbers come through is never searched again, so it reads as without the option)."""

    def __init__(self, numbers_from):
        self.nf = numbers_from

    @classmethod
    def build(cls, decode, search):
        if not decode.all_numbers or search.numbers_from is None or search.banks or not search.beam:
            return None
        return cls(search.numbers_from)

    @torch.no_grad()
    def revise(self, search, hyps):
        todo = [k for k, h in enumerate(hyps) if h and numberbanks.unmet(self.nf, h[0].tokens, k) > 0]
        if not todo:
            return hyps
        again = search.again(todo)  # (a BeamCohort of those sentences, with NumberBanks)
        while not again.done:
            again.step()
        for k, h, limit in zip(todo, again.results(), again.limits.tolist()):
            if h and h[0].unmet == 0 and len(h[0].tokens) < limit:
                hyps[k] = h
        return hyps
