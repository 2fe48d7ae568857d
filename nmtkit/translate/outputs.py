"""What ``nmt-translate`` gives back for one input line (:class:`Translation`) and its per-line output formats, as
text: one call per translation, each ending in a newline, so that line i of every output file belongs to input line
i.

- :func:`nbest_entries`: Moses' n-best list, ``i ||| text ||| logprob= L length= N ||| score`` per hypothesis, with
  i the 0-based input line, L the log-probability, N the output tokens and ``</s>``, and the score the search
  ranked by (length-normalised);
- :func:`alignment_line`: the word alignment in Pharaoh format (``i-j``, source-target, 0-based);
- :func:`attention_line`: the attention as one JSON object (``line``, ``source``, ``target``, ``alpha`` rows);
- :func:`score_line`: the translation's log-probability.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from nmtkit.translate.wordalign import pharaoh


@dataclass
class Translation:
    """The result for one input line."""

    line: int  # 1-based input line number
    text: str  # the translation (detokenised unless tokenized=True)
    source_words: list[str]  # Moses-tokenised source words
    target_words: list[str]  # output words (BPE merged, not detokenised)
    score: float  # log-probability of the output under the model(s), summed over pieces
    nbest: list[tuple[str, float, float, int]] = field(default_factory=list)  # (text, logprob, ranking score, length)
    alignment: list[tuple[int, int]] | None = None  # word links (source i, target j)
    attention: dict | None = None  # {"source": tokens + </s>, "target": tokens + </s>, "alpha": rows}
    word_attention: dict | None = None  # the same over words (subwords merged: source columns summed, target rows
    #   averaged), from which ``alignment`` is drawn
    pieces: int = 1
    terms: list[str] | None = None  # with a glossary: the source terms the line required, in order
    missed: list[str] = field(default_factory=list)  # ... and those the translation did not write
    nbest_missed: list[int] | None = None  # with a glossary: how many each n-best entry missed


def nbest_entries(t: Translation) -> str:
    """The Moses n-best entries of a translation (one line per hypothesis; with a glossary, a ``terms-missed=``
    feature: how many of the line's terms the entry did not write)."""
    missed = t.nbest_missed or [None] * len(t.nbest)
    return "".join(f"{t.line - 1} ||| {text} ||| logprob= {logprob:.6f} length= {length}"
                   f"{'' if m is None else f' terms-missed= {m}'} ||| {norm:.6f}\n"
                   for (text, logprob, norm, length), m in zip(t.nbest, missed))


def alignment_line(t: Translation) -> str:
    return pharaoh(t.alignment) + "\n"


def attention_line(t: Translation) -> str:
    return json.dumps({"line": t.line, **t.attention}, ensure_ascii=False) + "\n"


def score_line(t: Translation) -> str:
    """The log-probability; with a glossary, then a tab, the terms written of those required (``2/3``), and a tab
    before each source term missed."""
    if t.terms is None:
        return f"{t.score:.6f}\n"
    return "\t".join([f"{t.score:.6f}", f"{len(t.terms) - len(t.missed)}/{len(t.terms)}", *t.missed]) + "\n"
