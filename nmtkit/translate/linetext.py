"""One line's text into model tokens and back, for :mod:`nmtkit.translate.translator`.

- :func:`words`: a line as one side's words -- the side's preprocessing (normalisation, Moses tokenisation,
  lowercasing), or with ``--tokenized`` its whitespace-separated words;
- :func:`pieces`: a source line longer than ``--max-source-len`` model tokens, cut into pieces at word ends;
- :func:`render`: model tokens back into the text a user reads (subwords merged, Moses detokenisation), starting
  with a ``--prefix`` exactly as the user wrote it: the preprocessing does not read back what it was given
  (``</s> <s>`` is tokenised as ``< / s > < s >``), so the prefix's own rendering is replaced by its text.
"""

from __future__ import annotations

from nmtkit.data.text import Preprocessor


def words(pre: Preprocessor, line: str, tokenized: bool) -> list[str]:
    """A line as one side's words: the side's preprocessing, or with ``tokenized`` its whitespace-separated words
    (lowercased when the side is)."""
    if tokenized:
        found = line.split()
        return [w.lower() for w in found] if pre.config.lowercase else found
    return pre.words(line)


def pieces(pre: Preprocessor, tokens: list[str], limit: int) -> list[list[str]]:
    """Cut a long token sequence into pieces of at most ``limit`` tokens, at word ends where possible."""
    out, start = [], 0
    word_of = pre.words_of(tokens)[1] if len(tokens) > limit else None
    while len(tokens) - start > limit:
        cut = start + limit
        while cut > start + 1 and word_of[cut] == word_of[cut - 1]:  # (not inside a word)
            cut -= 1
        out.append(tokens[start:cut])
        start = cut
    out.append(tokens[start:])
    return out


def render(pre: Preprocessor, tokens: list[str], tokenized: bool, given: str = "", forced: int = 0) -> str:
    """Model tokens → the text the user reads; when the first ``forced`` tokens are a prefix's, the text starts
    with that prefix as it was written, ``given``.  The units are merged into words exactly once, here or inside
    :meth:`Preprocessor.detokenize`: merging words again glues a SentencePiece sentence into one word."""
    def text(toks: list[str]) -> str:
        return " ".join(pre.merge_subwords(toks)) if tokenized else pre.detokenize(toks)

    whole = text(tokens)
    if not forced:
        return whole
    head = text(tokens[:forced])  # (the prefix as the preprocessing reads it back)
    if whole.startswith(head):
        rest = whole[len(head):]
    else:  # (detokenisation joined the prefix's end to what follows: the rest on its own)
        rest = text(tokens[forced:])
        _, word_of = pre.words_of(list(tokens))
        if rest and word_of[forced] != word_of[forced - 1]:
            rest = " " + rest  # (after a space, unless the hypothesis went on with the prefix's last word, as a
            #   prefix that ends inside a word asks: "Le très hono" + "rable")
    return given + (rest.lstrip() if given[-1:].isspace() else rest)
