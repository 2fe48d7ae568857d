"""A glossary's terms as a constraint of the search (``nmt-translate --terms``): which terms a hypothesis has
written, how far it is into one, and what takes it further -- what the shared beam
(:mod:`nmtkit.translate.banks`) reads, as it reads the source's numbers.

A term of a sentence is a set of **variants**, each a sequence of target tokens (:mod:`nmtkit.translate.glossary`);
a hypothesis **meets** the term where one variant stands in its tokens as whole words: the token before it (if any)
and the variant's first token are apart, and so are its last token and the one after (if any) --
SentencePiece's tokens without ``▁`` and BPE's after a ``@@`` ending continue a word (:class:`WordBounds`), so
"finance" is not met inside "finances".  A variant's last token may still be followed by a token that glues to it;
the state is read again from the tokens at every step, so a term met can be unmet one token later.

The **level** of a hypothesis (the bank it is in) is, summed over its sentence's terms, the shortest variant's
length for a term met and, for one not met, the tokens of a variant it has begun (its longest suffix that is a
proper prefix of a variant, after a word boundary), below that length; the **top** level is the sum of the shortest
variants' lengths.  The tokens that take a hypothesis further are the next token of each variant it has begun and
the first token of each variant of each term not met.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nmtkit.data.vocab import SPECIALS

SPACE = "\u2581"


class WordBounds:
    """Where a target vocabulary's words end (token strings in id order): ``joins_prev`` the ids that continue the
    word before them (SentencePiece's tokens without ``▁``), ``joins_next`` those the next token continues (BPE's
    ``@@`` endings)."""

    def __init__(self, tokens: list[str]):
        self.size = len(tokens)
        spm = any(t.startswith(SPACE) for t in tokens)
        specials = set(range(len(SPECIALS)))
        self.joins_prev = frozenset(i for i, t in enumerate(tokens)
                                    if spm and not t.startswith(SPACE) and i not in specials)
        self.joins_next = frozenset(i for i, t in enumerate(tokens) if t.endswith("@@") and i not in specials)

    def apart(self, before: int, after: int) -> bool:
        """Whether token ``after`` starts a new word after token ``before``."""
        return before not in self.joins_next and after not in self.joins_prev

    def subset(self, ids) -> WordBounds:
        """The bounds of a part of the vocabulary (:mod:`nmtkit.translate.candidates`): token ``ids[c]`` is ``c``."""
        column = {int(i): c for c, i in enumerate(ids)}
        sub = object.__new__(WordBounds)
        sub.size = len(column)
        sub.joins_prev = frozenset(column[i] for i in self.joins_prev if i in column)
        sub.joins_next = frozenset(column[i] for i in self.joins_next if i in column)
        return sub


class TermState(NamedTuple):
    """Where a hypothesis stands with its sentence's terms: ``met`` per term, ``begun`` per term the tokens of a
    variant it has begun (0 for a term met), ``ahead`` the tokens that take it further, and its ``tokens``."""

    met: tuple[bool, ...]
    begun: tuple[int, ...]
    ahead: tuple[int, ...]
    tokens: tuple[int, ...]


class SourceTerms:
    """The constraint for a batch of sentences: ``terms[k]`` the terms sentence k must write, each a tuple of
    variants (tuples of target ids), and the vocabulary's :class:`WordBounds`."""

    def __init__(self, bounds: WordBounds, terms: list[list[tuple[tuple[int, ...], ...]]]):
        self.bounds = bounds
        self.terms = [[tuple(tuple(v) for v in term) for term in ts] for ts in terms]
        self.required = [len(ts) for ts in self.terms]  # per sentence: how many terms it must write
        self.sizes = [[min(len(v) for v in term) for term in ts] for ts in self.terms]
        self.tops = [sum(s) for s in self.sizes]

    def subset(self, sentences: list[int]) -> SourceTerms:
        """The constraint for some of the batch's sentences, in the order given."""
        return SourceTerms(self.bounds, [self.terms[k] for k in sentences])

    def over(self, ids) -> SourceTerms:
        """The same terms over a part of the vocabulary (:mod:`nmtkit.translate.candidates`): token ``ids[c]`` is
        ``c``; every variant's tokens must be among ``ids``."""
        column = {int(i): c for c, i in enumerate(ids)}
        return SourceTerms(self.bounds.subset(ids), [[tuple(tuple(column[i] for i in v) for v in term) for term in ts]
                                                     for ts in self.terms])

    def _apart(self, tokens, p: int) -> bool:
        """Whether a word may start at position p of ``tokens``."""
        return p == 0 or self.bounds.apart(tokens[p - 1], tokens[p])

    def _ends_there(self, tokens, p: int) -> bool:
        """Whether a word may end before position p of ``tokens`` (p == len(tokens): it has so far)."""
        return p == len(tokens) or self.bounds.apart(tokens[p - 1], tokens[p])

    def met(self, tokens, variants) -> bool:
        """Whether one of a term's ``variants`` stands in ``tokens`` as whole words."""
        n_tok = len(tokens)
        for v in variants:
            n = len(v)
            first = v[0]
            for p in range(n_tok - n + 1):
                if tokens[p] == first and tuple(tokens[p: p + n]) == v and self._apart(tokens, p) \
                        and self._ends_there(tokens, p + n):
                    return True
        return False

    def state(self, tokens: list[int], sentence: int) -> TermState:
        """The :class:`TermState` of a hypothesis that wrote ``tokens``."""
        tokens = tuple(tokens)
        met, begun, ahead = [], [], []
        for term, size in zip(self.terms[sentence], self.sizes[sentence]):
            if self.met(tokens, term):
                met.append(True)
                begun.append(0)
                continue
            met.append(False)
            most = 0
            for v in term:
                for k in range(min(len(v) - 1, len(tokens)), 0, -1):
                    if tokens[len(tokens) - k:] == v[:k] and self._apart(tokens, len(tokens) - k):
                        most = max(most, k)
                        ahead.append(v[k])
                        break  # (the longest begun part of this variant; a shorter one is on the same path)
                ahead.append(v[0])
            begun.append(min(most, size - 1))
        return TermState(tuple(met), tuple(begun), tuple(dict.fromkeys(ahead)), tokens)

    def states(self, tokens: torch.Tensor, sentences: list[int]) -> list[TermState | None]:
        """The :class:`TermState` of each of R hypotheses (``tokens`` (R, t), row r of sentence ``sentences[r]``);
        None for the rows of a sentence without terms."""
        rows = [r for r, k in enumerate(sentences) if self.required[k]]
        out: list[TermState | None] = [None] * len(sentences)
        for r, row in zip(rows, tokens[rows].tolist() if rows else []):
            out[r] = self.state(row, sentences[r])
        return out

    def level_of(self, s: TermState, sentence: int) -> int:
        """The bank of a hypothesis in state ``s``."""
        return sum(size if m else b for m, b, size in zip(s.met, s.begun, self.sizes[sentence]))

    def level(self, s: TermState, sentence: int, token: int) -> int:
        """The bank of a hypothesis in state ``s`` once it writes ``token``."""
        return self.level_of(self.state(list(s.tokens) + [token], sentence), sentence)

    def top(self, sentence: int) -> int:
        return self.tops[sentence]

    def open(self, s: TermState, sentence: int) -> bool:
        """Whether ``</s>`` may not follow yet: a term is not met."""
        return not all(s.met)

    def advancing(self, s: TermState, sentence: int, last: int | None) -> list[int]:
        """The tokens that take a hypothesis in state ``s`` further into a term not met."""
        return list(s.ahead)

    def missed(self, tokens: list[int], sentence: int) -> list[int]:
        """The terms (indices into the sentence's) that a finished hypothesis (``tokens``) has not written."""
        return [k for k, term in enumerate(self.terms[sentence]) if not self.met(tuple(tokens), term)]

    def unmet(self, tokens: list[int], sentence: int) -> int:
        return len(self.missed(tokens, sentence))
