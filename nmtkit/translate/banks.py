"""The beam shared among hypotheses by how far they are through their sentence's constraints -- the source's
numbers (``--all-numbers``) and a glossary's terms (``--terms``) -- Post & Vilar (2018)'s dynamic beam allocation
(the procedure: :mod:`nmtkit.translate.numberbanks`), over one or more constraints at once.

A **constraint** (:class:`NumberConstraint`, :class:`~nmtkit.translate.terms.SourceTerms`) reads a hypothesis'
state from its tokens and says, for a sentence: how many things it ``required``, its ``top`` level, the ``level``
a hypothesis reaches with a token, the tokens ``advancing`` it, whether ``</s>`` must wait (``open``) and how much
a finished hypothesis left ``unmet``.  Over several constraints a hypothesis' level is the sum of its levels, the
top the sum of the tops, its advancing tokens all of theirs, and ``</s>`` waits while any is open.
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import EOS, PAD
from nmtkit.translate import numberbanks
from nmtkit.translate.rules import Rule, Step
from nmtkit.translate.sourcenumbers import SourceNumbers


class NumberConstraint:
    """The source's numbers as a constraint of the shared beam (:mod:`nmtkit.translate.numberbanks`)."""

    def __init__(self, nf: SourceNumbers):
        self.nf = nf
        self.required = nf.required

    def states(self, step: Step) -> list:
        return step.states  # (shared with --source-numbers' mask)

    def state(self, tokens: list[int], sentence: int):
        return self.nf.state(tokens, sentence) if self.nf.numbers[sentence] else None

    def top(self, sentence: int) -> int:
        return numberbanks.top_level(self.nf, sentence)

    def level(self, s, sentence: int, token: int) -> int:
        return numberbanks.level(self.nf, s, sentence, numberbanks.written(self.nf, s, sentence), token)

    def open(self, s, sentence: int) -> bool:
        return numberbanks.must_end_later(self.nf, s, sentence)

    def advancing(self, s, sentence: int, last: int | None) -> list[int]:
        return numberbanks.advancing(self.nf, s, numberbanks.begun(self.nf, s, sentence), sentence, last)

    def unmet(self, tokens: list[int], sentence: int) -> int:
        return numberbanks.unmet(self.nf, tokens, sentence)


class TermConstraint:
    """A glossary's terms as a constraint of the shared beam (:mod:`nmtkit.translate.terms`)."""

    def __init__(self, terms):
        self.terms = terms
        self.required = terms.required

    def states(self, step: Step) -> list:
        if TermConstraint not in step.shared:
            step.shared[TermConstraint] = self.terms.states(step.tokens, step.sentences)
        return step.shared[TermConstraint]

    def state(self, tokens: list[int], sentence: int):
        return self.terms.state(tokens, sentence) if self.required[sentence] else None

    def top(self, sentence: int) -> int:
        return self.terms.top(sentence)

    def level(self, s, sentence: int, token: int) -> int:
        return self.terms.level(s, sentence, token)

    def open(self, s, sentence: int) -> bool:
        return self.terms.open(s, sentence)

    def advancing(self, s, sentence: int, last: int | None) -> list[int]:
        return self.terms.advancing(s, sentence, last)

    def unmet(self, tokens: list[int], sentence: int) -> int:
        return self.terms.unmet(tokens, sentence)


def constraints_of(decode, numbers_from, terms) -> list:
    """The constraints a shared beam holds: the source's numbers (``numbers_from``) with ``decode.all_numbers``,
    the glossary's ``terms`` where given."""
    out = []
    if decode.all_numbers and numbers_from is not None:
        out.append(NumberConstraint(numbers_from))
    if terms is not None:
        out.append(TermConstraint(terms))
    return out


class Constraints:
    """Several constraints read as one, for one hypothesis at a time (states: one per constraint, None where the
    sentence has nothing of that kind)."""

    def __init__(self, constraints: list):
        self.cs = constraints

    def required(self, sentence: int) -> int:
        return sum(c.required[sentence] for c in self.cs)

    def state(self, tokens: list[int], sentence: int) -> tuple:
        return tuple(c.state(tokens, sentence) for c in self.cs)

    def top(self, sentence: int) -> int:
        return sum(c.top(sentence) for c in self.cs if c.required[sentence])

    def level(self, states: tuple, sentence: int, token: int) -> int:
        return sum(c.level(s, sentence, token) for c, s in zip(self.cs, states) if s is not None)

    def open(self, states: tuple, sentence: int) -> bool:
        return any(c.open(s, sentence) for c, s in zip(self.cs, states) if s is not None)

    def advancing(self, states: tuple, sentence: int, last: int | None) -> list[int]:
        out = []
        for c, s in zip(self.cs, states):
            if s is not None:
                out += c.advancing(s, sentence, last)
        return out

    def unmet(self, tokens: list[int], sentence: int) -> int:
        return sum(c.unmet(tokens, sentence) for c in self.cs if c.required[sentence])


class Banks(Rule):
    """The second search's shared beam: no ``</s>`` while a constraint is open (except at the length limit); a
    hypothesis that met them all finishes where ``</s>`` is its own best token; the beam is shared by level
    (:func:`choose`); a hypothesis ended without them ranks behind (``unmet``)."""

    def __init__(self, constraints: list):
        self.all = Constraints(constraints)

    @classmethod
    def build(cls, decode, search):
        if not search.banks:
            return None
        cs = constraints_of(decode, search.numbers_from, search.terms)
        return cls(cs) if cs else None

    def row_states(self, step: Step) -> list[tuple]:
        """(R,) each row's states, one per constraint."""
        if Banks not in step.shared:
            per = [c.states(step) for c in self.all.cs]
            step.shared[Banks] = list(zip(*per)) if per else []
        return step.shared[Banks]

    def mask(self, logp, step):
        states, sents, ending = self.row_states(step), step.sentences, step.ending.tolist()
        later = [r for r, s in enumerate(states) if not ending[r] and self.all.open(s, sents[r])]
        if later:
            logp[later, EOS] = -math.inf

    def ends(self, cand, step, ended):
        todo = [self.all.required(s) > 0 for s in step.alive.tolist()]
        return numberbanks.ending(cand, step.K, {(a, b) for a, b, _ in ended}, todo)

    def finished(self, hyp, row, sentence, step):
        hyp.unmet = self.all.unmet(hyp.tokens, sentence)

    def share(self, step, cand, top_scores, top_idx):
        last = step.tokens[:, -1].tolist() if step.t else None
        return choose(self.all, self.row_states(step), step.alive.tolist(), step.K, cand, top_scores, top_idx, last)

    def banned(self, tokens, t, ending):
        return {EOS} if not ending and self.all.open(self.all.state(tokens, 0), 0) else set()


def choose(cs: Constraints, states: list[tuple], sentences: list[int], K: int, cand: torch.Tensor,
           top_scores: torch.Tensor, top_idx: torch.Tensor, last: list[int] | None
           ) -> dict[int, list[tuple[float, int, int]]]:
    """The batched search's allocation at one step: ``states`` of the A·K rows (one per constraint), ``sentences``
    the A sentences' ids, cand (A, K·V) the expansions' scores (masked, ``</s>`` banned while a row is open),
    top_scores/top_idx (A, 2K) its ``2K`` best, ``last`` the rows' last tokens (None at the first step) → for each
    row a of a sentence with something to write, its K continuations (score, beam, token), best first, padded with
    (−inf, 0, ``<pad>``).  The candidates: the 2K best, and each live hypothesis' best token and its best token
    that advances it (:func:`numberbanks.allocate` shares them out)."""
    A, KV = cand.shape
    V = KV // K
    todo = [a for a in range(A) if cs.required(sentences[a]) > 0]
    if not todo:
        return {}
    # per live row: its best token other than </s>, and the tokens that advance (gathered in one index)
    sub = cand[todo].view(len(todo), K, V).clone()
    sub[:, :, EOS] = -math.inf
    best_val, best_tok = (x.tolist() for x in sub.max(dim=2))
    asks, flat = [], []  # (a, j, token), the flat index into cand
    live = set()
    for n, a in enumerate(todo):
        sent = sentences[a]
        for j in range(K):
            s = states[a * K + j]
            if all(x is None for x in s) or not math.isfinite(best_val[n][j]):  # (a dead row, or one that may only end)
                continue
            live.add((a, j))
            for tok in cs.advancing(s, sent, None if last is None else last[a * K + j]):
                asks.append((a, j, tok))
                flat.append(a * KV + j * V + tok)
    adv = cand.view(-1)[torch.tensor(flat, dtype=torch.long, device=cand.device)].tolist() if flat else []
    best_adv: dict[tuple[int, int], tuple[float, int]] = {}
    for (a, j, tok), score in zip(asks, adv):
        if math.isfinite(score) and ((a, j) not in best_adv or score > best_adv[(a, j)][0]):
            best_adv[(a, j)] = (score, tok)
    ts, ti = top_scores.tolist(), top_idx.tolist()
    out = {}
    for n, a in enumerate(todo):
        sent = sentences[a]
        seen: dict[int, float] = {}  # order (j·V + token) → score
        for score, idx in zip(ts[a], ti[a]):
            if idx % V != EOS and math.isfinite(score):
                seen[idx] = score
        for j in range(K):
            if (a, j) not in live:
                continue
            if math.isfinite(best_val[n][j]):
                seen.setdefault(j * V + best_tok[n][j], best_val[n][j])
            if (a, j) in best_adv:
                score, tok = best_adv[(a, j)]
                seen.setdefault(j * V + tok, score)
        orders = list(seen)
        keys = [(seen[o], o) for o in orders]
        levels = [cs.level(states[a * K + o // V], sent, o % V) for o in orders]
        picked = numberbanks.allocate(keys, levels, K, cs.top(sent))
        chosen = [(keys[i][0], orders[i] // V, orders[i] % V) for i in picked]
        out[a] = chosen + [(-math.inf, 0, PAD)] * (K - len(chosen))
    return out


class SearchAgain(Rule):
    """The first search of ``--all-numbers`` and ``--terms``: once it is done, the sentences whose best hypothesis
    leaves out a number it must write (with ``--all-numbers``) or a term are searched again with :class:`Banks`; a
    sentence takes the second search's hypotheses when its best meets every constraint and ends before its length
    limit, and keeps the first's otherwise (a sentence whose constraints are met is never searched again, so it
    reads as without the options)."""

    def __init__(self, constraints: list):
        self.all = Constraints(constraints)

    @classmethod
    def build(cls, decode, search):
        if search.banks or not search.beam:
            return None
        cs = constraints_of(decode, search.numbers_from, search.terms)
        return cls(cs) if cs else None

    @torch.no_grad()
    def revise(self, search, hyps):
        todo = [k for k, h in enumerate(hyps) if h and self.all.unmet(h[0].tokens, k) > 0]
        if not todo:
            return hyps
        again = search.again(todo)  # (a BeamCohort of those sentences, with Banks)
        while not again.done:
            again.step()
        for k, h, limit in zip(todo, again.results(), again.limits.tolist()):
            if h and h[0].unmet == 0 and len(h[0].tokens) < limit:
                hyps[k] = h
        return hyps


class TermsMissed(Rule):
    """Each finished hypothesis says which of its sentence's terms it did not write (:attr:`Hypothesis.missed`)."""

    def __init__(self, terms):
        self.terms = terms

    @classmethod
    def build(cls, decode, search):
        return cls(search.terms) if search.terms is not None else None

    def finished(self, hyp, row, sentence, step):
        hyp.missed = self.terms.missed(hyp.tokens, sentence)
