"""The source's numbers as a decoding rule (:mod:`nmtkit.translate.rules`): ``--source-numbers``' constraint
(:class:`SourceNumbersRule`, :mod:`nmtkit.translate.sourcenumbers`).  ``--all-numbers``' two passes are
:mod:`nmtkit.translate.banks`' (the numbers one of the constraints the shared beam holds)."""

from __future__ import annotations

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
