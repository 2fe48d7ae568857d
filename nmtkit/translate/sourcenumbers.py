"""Numbers come from the source (``nmt-translate --source-numbers``): a digit is written only as part of one of the
source's numbers.

A model trained for an hour changes numbers ("63%" → "23 p. 100"), runs them on ("1,975,500" → "1 975 500 500")
and writes numbers the source does not have (a year out of nowhere); an n-gram block cannot help, since a number
legitimately repeats its digits.  Numbers are the one thing a translation must copy, so this constraint holds them
to the source while the model keeps choosing everything else -- how a number is grouped or punctuated in the target
language, where it goes, and the words around it:

- the source's numbers (:func:`source_numbers`) are read as digit strings: "1,975,500" and "3.5" are "1975500" and
  "35" (separators differ between English and French, digits do not); "10:30" and "6.15 p.m." are two numbers
  (French writes "18 h 15"); each "%" in the source also allows one "100", for the French "p. 100" (per cent);
- a hypothesis writes a number as a run of target tokens holding digits, possibly joined by the tokens that group
  digits (:data:`~nmtkit.translate.ngramblock.NUMBER_GLUE`: a bare ``▁``, ``,`` or ``.``; "1 975 500" is
  ``▁ 1 ▁ 9 7 5 ▁ 5 0 0`` with SentencePiece's split digits).  Each source number may be written as often as the
  source has it: a token with digits x may follow when the run's digits so far followed by x begin one of the
  numbers still to write (the number goes on), or, where a new number may start (after a token apart, or with a
  token that starts a word) and the run is whole, when x alone begins one still to write after it; every other
  token holding a digit is −inf before the top-k;
- a number is written whole: while the run begins a number still to write but is none ("199" of 1995), only its
  next digits (or one grouping token) may follow -- no word, no ``</s>`` -- unless the vocabulary has no token to go
  on with, or the hypothesis is at its length limit.

Outside a number other tokens are never constrained, nor is a forced prefix.  The same rule for one hypothesis, in
plain Python (:meth:`SourceNumbers.banned`), is the reference search's yardstick; :meth:`SourceNumbers.apply` does it
for a batch of hypotheses, by sentence and run, with a cache.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import NamedTuple

import torch

from nmtkit.data.vocab import EOS
from nmtkit.translate.ngramblock import NUMBER_GLUE

# a number in running text: digit groups joined by a point or comma, or by a space before exactly three digits
# ("1 000", French or SI grouping); a colon separates (10:30 is two numbers)
_NUMBER = re.compile(r"[0-9]+(?:(?:[.,]|[ \u00a0\u202f](?=[0-9]{3}(?![0-9])))[0-9]+)*")
# a clock time with a point: "5.30am", "6.15 p.m." are two numbers, as "10:30" is (French writes "5 h 30")
_TIME = re.compile(r"\b([0-9]{1,2})\.([0-5][0-9])(?=\s?[ap]\.?m\b)", re.IGNORECASE)
# a 12-hour clock time ("2 p.m.", "7.43 pm", "12:05am"), read on the 24-hour clock for a target language that
# writes it ("14 heures", "19 h 43"), as nmt-score's numbers check reads it
_TIME_12H = re.compile(r"(?<![0-9.,])([0-9]{1,2})(?:[.:]([0-5][0-9]))?[ \u00a0\u202f]?([ap])\.?m\b", re.IGNORECASE)
PERCENT = "100"  # what a source "%" allows: the French "p. 100" (pour cent)


def source_numbers(text: str, clock24: bool = False) -> list[str]:
    """The digit strings of a source line's numbers, in order, then a :data:`PERCENT` for each "%": "1,975,500 and
    3.5%" → ["1975500", "35", "100"]; "at 5.30pm" → ["5", "30"]; with ``clock24`` (a target language that writes
    the 24-hour clock, as French does) "at 5.30pm" → ["17", "30"] and "2 p.m." → ["14"] (minutes 00 are left out:
    "17 heures")."""
    if clock24:
        text = _TIME_12H.sub(lambda m: _clock24(m[1], m[2], m[3].lower() == "p"), text)
    text = _TIME.sub(r"\1:\2", text)
    out = [re.sub(r"[^0-9]", "", m.group(0)) for m in _NUMBER.finditer(text)]
    return out + [PERCENT] * text.count("%")


def _clock24(hour: str, minutes: str | None, pm: bool) -> str:
    h = int(hour)
    h = h + 12 if pm and h < 12 else 0 if not pm and h == 12 else h
    return f" {h}:{minutes} " if minutes and minutes != "00" else f" {h} "


class DigitTable:
    """A target vocabulary (token strings in id order) read as parts of numbers: ``digits`` {id: the digits 0-9 it
    holds} for every token with one, ``glue`` the ids of the tokens that group digits (:data:`NUMBER_GLUE`), and what
    separates two tokens: SentencePiece's ``▁`` starts a word (a digit token without it continues the one before);
    in a vocabulary without ``▁`` (words, BPE) a token continues the one before only after a ``@@`` ending."""

    def __init__(self, tokens: list[str]):
        self.size = len(tokens)
        digits = {i: "".join(c for c in tok if "0" <= c <= "9") for i, tok in enumerate(tokens)}
        self.digits = {i: d for i, d in digits.items() if d}
        self.glue = frozenset(i for i, tok in enumerate(tokens) if tok in NUMBER_GLUE)
        self.sentencepiece = any(tok.startswith("\u2581") for tok in tokens)
        self.starts_word = frozenset(i for i in self.digits if tokens[i].startswith("\u2581"))
        self.joins_next = frozenset(i for i in self.digits if tokens[i].endswith("@@"))
        # SentencePiece's bare word start, before the first digit of a number ("▁ 1 9 9 5"), or None
        self.space = tokens.index("\u2581") if self.sentencepiece and "\u2581" in tokens else None

    def subset(self, ids) -> DigitTable:
        """The table of a part of the vocabulary (:mod:`nmtkit.translate.candidates`): token ``ids[c]`` is ``c``;
        what holds digits, groups them or starts a word is read as before."""
        column = {int(i): c for c, i in enumerate(ids)}
        sub = object.__new__(DigitTable)
        sub.size, sub.sentencepiece = len(column), self.sentencepiece
        sub.digits = {column[i]: d for i, d in self.digits.items() if i in column}
        sub.glue, sub.starts_word, sub.joins_next = (frozenset(column[i] for i in ids_ if i in column)
                                                     for ids_ in (self.glue, self.starts_word, self.joins_next))
        sub.space = column.get(self.space) if self.space is not None else None
        return sub


class State(NamedTuple):
    """Where a hypothesis stands with its sentence's numbers: ``left`` the numbers not yet written (digit string,
    how many times) as a sorted tuple, not counting ``run``, the digits of the number it is writing ('' when
    its last token is no part of one); ``apart``: whether the next token is apart from the last, so that it may start
    a new number; ``glued``: whether the last token is glue (``▁``, ``,``, ``.``) after digits."""
    left: tuple
    run: str
    apart: bool
    glued: bool


def _take(left: dict, number: str) -> None:
    """In place: one ``number`` written (if it is one still to write)."""
    if left.get(number):
        left[number] -= 1


class SourceNumbers:
    """The constraint for a batch of sentences: the target vocabulary's :class:`DigitTable` and each sentence's
    source numbers (:func:`source_numbers`); ``whole`` (default: all True): whether a sentence is a whole line, whose
    translation must write all its numbers under ``decode.all_numbers`` (a piece of a line cut at --max-source-len
    may write the line's numbers, and need not)."""

    def __init__(self, table: DigitTable, numbers: list[list[str]], whole: list[bool] | None = None):
        if whole is not None and len(whole) != len(numbers):
            raise ValueError("SourceNumbers: one 'whole' flag per sentence")
        self.table = table
        self._given = [list(ns) for ns in numbers], list(whole) if whole is not None else None
        self.ids = sorted(table.digits)  # the target ids holding digits
        self._x = [table.digits[i] for i in self.ids]
        self._word = [i in table.starts_word for i in self.ids]
        self.numbers = [Counter(ns) for ns in numbers]  # per sentence: {digit string: how many times}
        self.percents = [_percents(ns) for ns in numbers]  # per sentence: the PERCENT entries its "%" signs made
        # per sentence: how many numbers its translation must write under decode.all_numbers (not a "%"'s 100)
        self.required = [len(ns) - p if (whole is None or w) else 0
                         for ns, p, w in zip(numbers, self.percents, whole or [True] * len(numbers))]
        self.required_digits = [sum(len(n) for n in ns[: len(ns) - p]) if r else 0
                                for ns, p, r in zip(numbers, self.percents, self.required)]
        self._allowed: dict[tuple[tuple, str, bool], torch.Tensor] = {}  # (left, run, apart) -> (len(ids),)
        self._in_number: torch.Tensor | None = None  # bool (V,): the digit and glue tokens, made at the first apply

    def subset(self, sentences: list[int]) -> "SourceNumbers":
        """The constraint for some of the batch's sentences, in the order given."""
        numbers, whole = self._given
        return SourceNumbers(self.table, [numbers[k] for k in sentences],
                             [whole[k] for k in sentences] if whole is not None else None)

    def joined(self, other: "SourceNumbers") -> "SourceNumbers":
        """The constraint for this batch's sentences followed by ``other``'s (the same vocabulary)."""
        (mine, my_whole), (theirs, their_whole) = self._given, other._given
        whole = None if my_whole is None and their_whole is None else \
            (my_whole or [True] * len(mine)) + (their_whole or [True] * len(theirs))
        return SourceNumbers(self.table, mine + theirs, whole)

    def state(self, tokens: list[int], sentence: int) -> State:
        """The :class:`State` after ``tokens``: each digit token continues the run when the run and its digits begin
        a number still to write, else ends it (a whole number is then taken from those to write) and starts a new
        one; glue keeps a run open, any other token ends it."""
        digits, glue = self.table.digits, self.table.glue
        left, run = dict(self.numbers[sentence]), ""
        for tok in tokens:
            x = digits.get(tok)
            if x is not None:
                if run and _begins(left, run + x):
                    run += x
                    continue
                if run:
                    _take(left, run)
                run = x
            elif run and tok not in glue:
                _take(left, run)
                run = ""
        last = tokens[-1] if tokens else None
        glued = bool(run) and last in glue
        apart = not run or glued or (not self.table.sentencepiece and last not in self.table.joins_next)
        return State(tuple(sorted((k, v) for k, v in left.items() if v)), run, apart, glued)

    def missing(self, tokens: list[int], sentence: int) -> int:
        """How many of the sentence's source numbers a finished hypothesis (``tokens``, without ``</s>``) leaves out:
        those still to write once its last run is taken, not counting the "100" each "%" allows (a translation that
        writes "%" has left nothing out)."""
        s = self.state(tokens, sentence)
        left = dict(s.left)
        if s.run:
            _take(left, s.run)
        percents = self.percents[sentence]
        return sum(count - (min(count, percents) if number == PERCENT else 0) for number, count in left.items())

    def allowed(self, s: State) -> torch.Tensor:
        """bool (len(ids),): which digit tokens may follow a hypothesis in state ``s``: those that continue the run
        into the beginning of a number still to write, and, where a new number may start (apart, or a token that
        starts a word) and the run is whole, those that begin one still to write after the run's."""
        key = (s.left, s.run, s.apart)
        if key not in self._allowed:
            left = dict(s.left)
            after = None
            if not s.run or _whole(left, s.run):
                after = dict(left)
                if s.run:
                    _take(after, s.run)
            self._allowed[key] = torch.tensor(
                [(s.run != "" and _begins(left, s.run + x)) or
                 (after is not None and (s.apart or word) and _begins(after, x))
                 for x, word in zip(self._x, self._word)], dtype=torch.bool)
        return self._allowed[key]

    def must_go_on(self, s: State) -> bool:
        """Whether the run of a hypothesis in state ``s`` must go on: it begins a number still to write but is none,
        and some digit token may continue it (then neither ``</s>`` nor a word may follow)."""
        return bool(s.run) and not _whole(dict(s.left), s.run) and bool(self.allowed(s).any())

    def banned(self, tokens: list[int], sentence: int = 0, ending: bool = False) -> set[int]:
        """The tokens that may not follow ``tokens`` (one hypothesis); ``ending``: at its length limit, where
        ``</s>`` is never banned."""
        s = self.state(tokens, sentence)
        ok = self.allowed(s).tolist()
        out = {i for i, good in zip(self.ids, ok) if not good}
        if self.must_go_on(s):
            out |= set(range(self.table.size)) - set(self.table.digits) - (set() if s.glued else self.table.glue)
        if ending:
            out.discard(EOS)
        return out

    def states(self, tokens: torch.Tensor, sentences: list[int]) -> list[State | None]:
        """The :class:`State` of each of R hypotheses (``tokens`` (R, t), row r of sentence ``sentences[r]``); None
        for the rows of a sentence without numbers."""
        rows = [r for r, k in enumerate(sentences) if self.numbers[k]]
        out: list[State | None] = [None] * len(sentences)
        for r, row in zip(rows, tokens[rows].tolist() if rows else []):
            out[r] = self.state(row, sentences[r])
        return out

    def apply(self, logp: torch.Tensor, tokens: torch.Tensor, sentences: list[int],
              ending: torch.Tensor | None = None, states: list[State | None] | None = None) -> None:
        """In place: logp (R, V) of R hypotheses whose tokens so far are ``tokens`` (R, t), row r of sentence
        ``sentences[r]`` → the tokens that may not follow set to −inf (``ending``, bool (R,): the rows at their
        length limit, whose ``</s>`` is never banned; ``states``: the rows' :meth:`states`, if already read).
        Rows of a sentence without numbers may write no digit; the others are read token by token."""
        if not self.ids:
            return
        if self._in_number is None:
            self._in_number = torch.zeros(self.table.size, dtype=torch.bool)
            self._in_number[sorted(self.table.digits)] = True
        allowed = torch.zeros((logp.shape[0], len(self.ids)), dtype=torch.bool)
        ending_l = ending.tolist() if ending is not None else [False] * logp.shape[0]
        go_on = []
        for r, s in enumerate(states if states is not None else self.states(tokens, sentences)):
            if s is None:
                continue
            allowed[r] = self.allowed(s)
            if self.must_go_on(s):
                go_on.append((r, s.glued))
        ids = torch.tensor(self.ids, device=logp.device)
        logp[:, ids] = logp[:, ids].masked_fill(~allowed.to(logp.device), -math.inf)
        for r, glued in go_on:  # only digits (already masked) and, once, glue
            keep = self._in_number.clone()
            if not glued:
                keep[sorted(self.table.glue)] = True
            if ending_l[r]:
                keep[EOS] = True
            logp[r].masked_fill_(~keep.to(logp.device), -math.inf)


def _percents(numbers: list[str]) -> int:
    """The :data:`PERCENT` entries :func:`source_numbers` appended for "%" signs: the trailing run of them (where
    the source's last number is itself 100, it counts among them, so a missing 100 may go uncounted, never the
    reverse)."""
    k = len(numbers)
    while k and numbers[k - 1] == PERCENT:
        k -= 1
    return len(numbers) - k


def _begins(left: dict, digits: str) -> bool:
    """Whether ``digits`` begin a number still to write."""
    return any(n.startswith(digits) for n, count in left.items() if count)


def _whole(left: dict, digits: str) -> bool:
    """Whether ``digits`` are a number still to write."""
    return bool(left.get(digits))
