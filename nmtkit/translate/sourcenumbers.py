"""Numbers come from the source (``nmt-translate --source-numbers``): a digit is written only as part of one of the
source's numbers.

A model trained for an hour changes numbers ("63%" → "23 p. 100"), runs them on ("1,975,500" → "1 975 500 500")
and writes numbers the source does not have (a year out of nowhere); an n-gram block cannot help, since a number
legitimately repeats its digits.  Numbers are the one thing a translation must copy, so this constraint holds them
to the source while the model keeps choosing everything else -- how a number is grouped or punctuated in the target
language, where it goes, and the words around it:

- the source's numbers (:func:`source_numbers`) are read as digit strings: "1,975,500" and "3.5" are "1975500" and
  "35" (separators differ between English and French, digits do not); "10:30" is two numbers; a "%" in the source
  also allows "100", for the French "p. 100" (per cent);
- a hypothesis writes a number as a run of target tokens holding digits, possibly joined by the tokens that group
  digits (:data:`~nmtkit.translate.ngramblock.NUMBER_GLUE`: a bare ``▁``, ``,`` or ``.``; "1 975 500" is
  ``▁ 1 ▁ 9 7 5 ▁ 5 0 0`` with SentencePiece's split digits).  A token with digits x may follow when the run's
  digits so far followed by x begin one of the source's numbers (the number goes on), or when x alone begins one (a
  new number); every other token holding a digit is −inf before the top-k.  A number may stop early: the constraint
  only keeps digits from going wrong, the model decides where a number ends.

Other tokens, a forced prefix's and ``</s>`` are never constrained.  The same rule for one hypothesis, in plain
Python (:meth:`SourceNumbers.banned`), is the reference search's yardstick; :meth:`SourceNumbers.apply` does it
for a batch of hypotheses, by sentence and run, with a cache.
"""

from __future__ import annotations

import math
import re

import torch

from nmtkit.translate.ngramblock import NUMBER_GLUE

# a number in running text: digit groups joined by a point or comma, or by a space before exactly three digits
# ("1 000", French or SI grouping); a colon separates (10:30 is two numbers)
_NUMBER = re.compile(r"[0-9]+(?:(?:[.,]|[ \u00a0\u202f](?=[0-9]{3}(?![0-9])))[0-9]+)*")
PERCENT = "100"  # what a source "%" allows: the French "p. 100" (pour cent)


def source_numbers(text: str) -> list[str]:
    """The digit strings of a source line's numbers, in order ("1,975,500 and 3.5%" → ["1975500", "35", "100"])."""
    out = [re.sub(r"[^0-9]", "", m.group(0)) for m in _NUMBER.finditer(text)]
    return out + [PERCENT] if "%" in text else out


class DigitTable:
    """A target vocabulary (token strings in id order) read as parts of numbers: ``digits`` {id: the digits 0-9 it
    holds} for every token with one, ``glue`` the ids of the tokens that group digits (:data:`NUMBER_GLUE`), and what
    separates two tokens: SentencePiece's ``▁`` starts a word (a digit token without it continues the one before);
    in a vocabulary without ``▁`` (words, BPE) a token continues the one before only after a ``@@`` ending."""

    def __init__(self, tokens: list[str]):
        digits = {i: "".join(c for c in tok if "0" <= c <= "9") for i, tok in enumerate(tokens)}
        self.digits = {i: d for i, d in digits.items() if d}
        self.glue = frozenset(i for i, tok in enumerate(tokens) if tok in NUMBER_GLUE)
        self.sentencepiece = any(tok.startswith("\u2581") for tok in tokens)
        self.starts_word = frozenset(i for i in self.digits if tokens[i].startswith("\u2581"))
        self.joins_next = frozenset(i for i in self.digits if tokens[i].endswith("@@"))


def _prefixes(numbers: list[str]) -> frozenset[str]:
    return frozenset(n[:k] for n in numbers for k in range(1, len(n) + 1))


class SourceNumbers:
    """The constraint for a batch of sentences: the target vocabulary's :class:`DigitTable` and each sentence's
    source numbers (:func:`source_numbers`)."""

    def __init__(self, table: DigitTable, numbers: list[list[str]]):
        self.table = table
        self.ids = sorted(table.digits)  # the target ids holding digits
        self._x = [table.digits[i] for i in self.ids]
        self._word = [i in table.starts_word for i in self.ids]
        self.prefixes = [_prefixes(n) for n in numbers]  # per sentence: every prefix of its numbers' digits
        self._allowed: dict[tuple[int, str, bool], torch.Tensor] = {}  # (sentence, run, apart) -> (len(ids),)
        # (what a hypothesis outside a number may write, per sentence: (sentences, len(ids)))
        self._starts = torch.stack([self.allowed(k, "", True) for k in range(len(numbers))]) if numbers else None
        self._in_number: torch.Tensor | None = None  # bool (V,): the digit and glue tokens, made at the first apply

    def state(self, tokens: list[int], sentence: int) -> tuple[str, bool]:
        """Where a hypothesis (its tokens) is in a number: (the digits of the number it is writing, '' when its last
        token is no part of one; whether the next token is apart from the last, so that it may start a new
        number).  Each digit token continues the run when the run and its digits begin a source number, else
        starts a new one."""
        digits, glue = self.table.digits, self.table.glue
        k = len(tokens)
        while k and (tokens[k - 1] in digits or tokens[k - 1] in glue):
            k -= 1
        d, prefixes = "", self.prefixes[sentence]
        for tok in tokens[k:]:
            x = digits.get(tok)
            if x is not None:
                d = d + x if d + x in prefixes else x
        if not d or tokens[-1] in glue:
            return d, True
        return d, not self.table.sentencepiece and tokens[-1] not in self.table.joins_next

    def allowed(self, sentence: int, run: str, apart: bool) -> torch.Tensor:
        """bool (len(ids),): which digit tokens may follow a hypothesis of ``sentence`` in state (run, apart): those
        that continue the run into a prefix of a source number, and those that begin one where a new number may
        start (apart, or a token that starts a word)."""
        key = (sentence, run, apart)
        if key not in self._allowed:
            prefixes = self.prefixes[sentence]
            self._allowed[key] = torch.tensor(
                [(run != "" and run + x in prefixes) or ((apart or word) and x in prefixes)
                 for x, word in zip(self._x, self._word)], dtype=torch.bool)
        return self._allowed[key]

    def banned(self, tokens: list[int], sentence: int = 0) -> set[int]:
        """The digit tokens that may not follow ``tokens`` (one hypothesis)."""
        ok = self.allowed(sentence, *self.state(tokens, sentence)).tolist()
        return {i for i, good in zip(self.ids, ok) if not good}

    def apply(self, logp: torch.Tensor, tokens: torch.Tensor, sentences: list[int]) -> None:
        """In place: logp (R, V) of R hypotheses whose tokens so far are ``tokens`` (R, t), row r of sentence
        ``sentences[r]`` → the digit tokens that may not follow set to −inf.  A row whose last token is no part of a
        number takes its sentence's row of the start masks; only the rows inside a number are read token by token."""
        if not self.ids:
            return
        allowed = self._starts[torch.as_tensor(sentences)]  # (R, len(ids))
        if tokens.shape[1]:
            if self._in_number is None:
                self._in_number = torch.zeros(logp.shape[1], dtype=torch.bool)
                self._in_number[sorted(set(self.table.digits) | self.table.glue)] = True
            rows = self._in_number[tokens[:, -1].cpu()].nonzero().squeeze(1).tolist()
            for r, row in zip(rows, tokens[rows].tolist() if rows else []):
                allowed[r] = self.allowed(sentences[r], *self.state(row, sentences[r]))
        ids = torch.tensor(self.ids, device=logp.device)
        logp[:, ids] = logp[:, ids].masked_fill(~allowed.to(logp.device), -math.inf)
