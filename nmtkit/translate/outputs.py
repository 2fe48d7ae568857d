"""The per-line output formats of ``nmt-translate``, as text: one call per
:class:`nmtkit.translate.translator.Translation`, each ending in a newline, so that line i of every output file belongs
to input line i.

- :func:`nbest_entries`: Moses' n-best list, ``i ||| text ||| logprob= L length= N ||| score`` per hypothesis, with
  i the 0-based input line, L the log-probability, N the output tokens and ``</s>``, and the score the search
  ranked by (length-normalised);
- :func:`alignment_line`: the word alignment in Pharaoh format (``i-j``, source-target, 0-based);
- :func:`attention_line`: the attention as one JSON object (``line``, ``source``, ``target``, ``alpha`` rows);
- :func:`score_line`: the translation's log-probability.
"""

from __future__ import annotations

import json

from nmtkit.translate.wordalign import pharaoh


def nbest_entries(t) -> str:
    """The Moses n-best entries of a translation (one line per hypothesis)."""
    return "".join(f"{t.line - 1} ||| {text} ||| logprob= {logprob:.6f} length= {length} ||| {norm:.6f}\n"
                   for text, logprob, norm, length in t.nbest)


def alignment_line(t) -> str:
    return pharaoh(t.alignment) + "\n"


def attention_line(t) -> str:
    return json.dumps({"line": t.line, **t.attention}, ensure_ascii=False) + "\n"


def score_line(t) -> str:
    return f"{t.score:.6f}\n"
