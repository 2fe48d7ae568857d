"""Every source number written (``nmt-translate --all-numbers``): Post & Vilar (2018)'s dynamic beam allocation,
with the source's numbers as the constraints.

``--source-numbers`` keeps a translation from changing a number, but not from leaving one out: a model trained for
an hour drops a clause with its number ("$180 in July 1999 and $170 in July 2000" → "… 170 en juillet 2000"), and
once every hypothesis in the beam has passed the place where the number belonged, no ranking of the finished ones
can bring it back (a penalty on finished hypotheses, the retired ``--missing-numbers``, changed no line).
Lexically constrained decoding steers: the beam of each sentence is shared among *banks* of hypotheses by how far
they are through the constraints, so that hypotheses that have written the numbers are kept beside the more probable
ones that have not, and ``</s>`` may follow only once all are written (Post & Vilar, "Fast lexically constrained
decoding with dynamic beam allocation", NAACL 2018; Hokamp & Liu 2017's grid beam search is the slower original).

Forcing numbers into every sentence costs where the model carries them by itself (half the beam goes to
hypotheses that wrote a number early, in the wrong place), so ``--all-numbers`` searches **twice**
(:class:`~nmtkit.translate.banks.SearchAgain`): first as without it; then only the sentences whose best
hypothesis leaves out a number they must write are searched again with the shared beam, and take its result when
its best writes every number and ends by itself before its length limit (a search that could only place the numbers
by running on to the limit is worse than the number left out).  Measured on the development sets' lines with
numbers (tests/bench/results/bench_recipe.txt, "Every number"), against one pass with the shared beam.

The shared beam:

- a hypothesis' **level** is the number of digits of the source's numbers it has written (Post & Vilar's banks
  count constraint tokens; with SentencePiece's split digits a digit is a token), at most the digits of the
  numbers it must write -- a "%" sign's "100" is never required (the French "p. 100" or "%" are both right);
- the **candidates** of a sentence are its ``2K`` best expansions (as in plain beam search) and, for each live
  hypothesis, its best token and its best token towards a number still to write (the bare ``▁`` where the
  vocabulary writes one first, else the digits that begin one);
- the **allocation**: level 0 (no digit written) keeps ``K − K // 2`` places; the other ``K // 2`` are shared
  among levels 1 … D (D the digits to write), one each from the top down, round again while places remain; from
  the top down, a level with fewer candidates than places passes the rest to the level below; places still free
  go to the best remaining candidates; within a level, by score;
- ``</s>`` is banned while a hypothesis has begun fewer numbers than it must write, except at its length limit; a
  hypothesis that ended there without them ranks behind every one that wrote them (:attr:`Hypothesis.unmet`); a
  hypothesis that has written them all finishes when ``</s>`` is its own best next token, even if that expansion is
  not among the sentence's best K (it paid for numbers the others have not written).

A sentence without numbers, or whose best hypothesis writes them, reads exactly as without the option.  A piece of a
line cut at ``--max-source-len`` is not made to write the line's numbers
(:class:`~nmtkit.translate.sourcenumbers.SourceNumbers`' ``whole``).
:func:`~nmtkit.translate.search.beam_search_reference` applies the same rules hypothesis by hypothesis.  The
batched search's allocation at a step is :func:`nmtkit.translate.banks.choose`, over the numbers and a glossary's
terms alike (the numbers' functions here are what it asks of them).
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import EOS
from nmtkit.translate.sourcenumbers import PERCENT, SourceNumbers, State


def begun(nf: SourceNumbers, s: State, sentence: int) -> int:
    """How many of the numbers the sentence must write a hypothesis in state ``s`` has begun (at most
    ``nf.required[sentence]``): those written, not counting a "%" sign's "100", and the one it is writing."""
    numbers, left = nf.numbers[sentence], dict(s.left)
    real_hundreds = numbers.get(PERCENT, 0) - nf.percents[sentence]
    n = 0
    for number, count in numbers.items():
        written = count - left.get(number, 0)
        n += min(written, real_hundreds) if number == PERCENT else written
    if s.run and any(number.startswith(s.run) and number != PERCENT for number in left):
        n += 1
    elif s.run and PERCENT.startswith(s.run) and numbers.get(PERCENT, 0) - left.get(PERCENT, 0) < real_hundreds:
        n += 1
    return min(n, nf.required[sentence])


def written(nf: SourceNumbers, s: State, sentence: int) -> int:
    """How many digits of the source's numbers a hypothesis in state ``s`` has written (the run's included)."""
    left = dict(s.left)
    return sum(len(number) * (count - left.get(number, 0)) for number, count in nf.numbers[sentence].items()) + \
        len(s.run)


def level(nf: SourceNumbers, s: State, sentence: int, digits: int, token: int) -> int:
    """The bank of a hypothesis in state ``s`` (``digits`` = :func:`written`) once it writes ``token``: the digits
    of the source's numbers it has then written, at most :func:`top_level`."""
    return min(digits + len(nf.table.digits.get(token, "")), nf.required_digits[sentence])


def top_level(nf: SourceNumbers, sentence: int) -> int:
    """The highest bank of a sentence: the digits of the numbers it must write."""
    return nf.required_digits[sentence]


def advancing(nf: SourceNumbers, s: State, b: int, sentence: int, last: int | None) -> list[int]:
    """The tokens that take a hypothesis in state ``s`` (``b`` numbers begun, ``last`` its last token) towards a
    number still to write: SentencePiece's bare ``▁`` and the digit tokens that start a word, unless it has just
    written the ``▁``; the digit tokens that begin a number (the constraint's) otherwise."""
    if b >= nf.required[sentence] or s.run:
        return []
    ok = nf.allowed(s).tolist()
    space = nf.table.space
    if space is not None and last != space:
        return [space] + [i for i, good in zip(nf.ids, ok) if good and i in nf.table.starts_word]
    return [i for i, good in zip(nf.ids, ok) if good]


def must_end_later(nf: SourceNumbers, s: State | None, sentence: int) -> bool:
    """Whether ``</s>`` may not follow yet: the hypothesis has begun fewer numbers than its sentence must write."""
    return s is not None and begun(nf, s, sentence) < nf.required[sentence]


def unmet(nf: SourceNumbers, tokens: list[int], sentence: int) -> int:
    """How many of the numbers its sentence must write a finished hypothesis (``tokens``) has not: those it
    ranks behind every hypothesis that wrote them all (only one cut off at its length limit has any)."""
    return nf.required[sentence] - begun(nf, nf.state(tokens, sentence), sentence)


def allocate(keys: list[tuple[float, int]], levels: list[int], K: int, top: int) -> list[int]:
    """Which of the candidates continue: ``keys`` (score, order) and ``levels`` (0 … ``top``) of each → up to K
    indices into them, best first by (score, then lower order).  Level 0 (no digit written) keeps K − K // 2 places,
    the other K // 2 go one to a level from ``top`` down, round again while places remain; from the top down,
    a level with fewer candidates than places passes the rest to the level below; places still free go to the best
    remaining candidates."""
    rank = sorted(range(len(keys)), key=lambda i: (-keys[i][0], keys[i][1]))
    sizes = [K - K // 2] + [0] * top
    for k in range(K // 2):
        sizes[top - k % top if top else 0] += 1
    by_level: dict[int, list[int]] = {}
    for i in rank:
        by_level.setdefault(levels[i], []).append(i)
    chosen, spare = [], 0
    for lv in range(top, -1, -1):
        there = by_level.get(lv, [])
        take = min(sizes[lv] + spare, len(there))
        chosen += there[:take]
        spare = sizes[lv] + spare - take
    if spare:
        taken = set(chosen)
        chosen += [i for i in rank if i not in taken][:spare]
    return sorted(chosen, key=lambda i: (-keys[i][0], keys[i][1]))


def ending(cand: torch.Tensor, K: int, already: set[tuple[int, int]], todo: list[bool]
           ) -> list[tuple[int, int, float]]:
    """The rows of the sentences ``todo`` (A,) whose best expansion in cand (A, K·V) is ``</s>`` (which only a
    hypothesis that wrote every number may have), other than ``already`` (sentence, beam) → (sentence, beam,
    score), in row order: they finish, though their score ranks below the beam's best (which have numbers to
    write)."""
    A, KV = cand.shape
    rows = [a for a in range(A) if todo[a]]
    if not rows:
        return []
    V = KV // K
    best, tok = cand[rows].view(len(rows), K, V).max(dim=2)  # (R, K)
    out = []
    for a, b_row, t_row in zip(rows, best.tolist(), tok.tolist()):
        out += [(a, j, score) for j, (score, t) in enumerate(zip(b_row, t_row))
                if t == EOS and math.isfinite(score) and (a, j) not in already]
    return out
