"""A glossary the translation obeys (``nmt-translate --terms FILE``): reading the file, finding its source terms in
a line, and the target variants as the model's tokens.

The file is UTF-8 text, one entry a line: a source term, a tab, and one or more target variants separated by tabs
(``the Standing Committee on Finance<TAB>le Comité permanent des finances``); a source term on several lines has
the variants of all of them.  Blank lines and lines whose first non-blank character is ``#`` are skipped.  A line
that is not such an entry is one error naming the file and line.

A line's **required terms** (:meth:`CompiledGlossary.find`) are found on its words as the model's preprocessing
makes them (Moses tokenisation, and the checkpoint's lowercasing), so "Finance," matches "Finance"; with
``ignore_case`` words compare case-folded.  Where terms overlap, the longest wins, then the leftmost ("Committee on
Finance" inside "the Standing Committee on Finance" is not a second term); a term found twice in a line is required
once.  A variant is required as the target side's tokens of its words (:meth:`Preprocessor.subwords` segments word
by word, so a variant's tokens are what the model writes for those words anywhere in a sentence).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

from nmtkit.errors import InputError


@dataclass(frozen=True)
class Entry:
    """One source term and its target variants as the file gives them (``line``: where the term first appears)."""

    source: str
    targets: tuple[str, ...]
    line: int


def bad_text(text: str) -> str | None:
    """What makes a term unusable as text, or None."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\t":
            return f"a control character (U+{ord(ch):04X})" if unicodedata.category(ch) == "Cc" \
                else f"a lone surrogate (U+{ord(ch):04X})"
    return None


def parse(text: str, name: str = "<terms>") -> list[Entry]:
    """The entries of a glossary's text (``name``: the file, for messages), in the order their source terms first
    appear; a malformed line is an :class:`~nmtkit.errors.InputError` naming ``name`` and the line."""
    by_source: dict[str, tuple[list[str], int]] = {}
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        problem = bad_text(line)
        if problem is not None:
            raise InputError(f"holds {problem}", name, lineno)
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) < 2:
            raise InputError("is not 'source term<TAB>target term' (no tab)", name, lineno)
        if not fields[0]:
            raise InputError("has an empty source term", name, lineno)
        if not all(fields[1:]):
            raise InputError("has an empty target term", name, lineno)
        targets, first = by_source.setdefault(fields[0], ([], lineno))
        targets += [t for t in fields[1:] if t not in targets]
    return [Entry(source, tuple(targets), first) for source, (targets, first) in by_source.items()]


def read(path: str | Path) -> list[Entry]:
    """The entries of the glossary file ``path`` (:func:`parse`); a file that is not UTF-8 is one error naming the
    line of its first bad byte."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or e})", str(path)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("is not UTF-8 text", str(path), data[: e.start].count(b"\n") + 1) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse(text, str(path))


@dataclass(frozen=True)
class Term:
    """A term as the search requires it: ``variants``, each the target token ids of one target variant (any one
    written meets the term), with the texts for reports."""

    source: str
    targets: tuple[str, ...]
    variants: tuple[tuple[int, ...], ...]  # (target words, without a vocabulary: CompiledGlossary's index None)


class CompiledGlossary:
    """A glossary ready for one model: the source terms as the source side's words, the variants as target ids.

    ``src_words(text)`` and ``tgt_tokens(text)`` are the model's preprocessing (source words; target words then
    units), ``index`` the target vocabulary's {token: id}; ``unk``, the id of ``<unk>``, for the check that every
    variant can be written (a word vocabulary that lacks one of its words is an error naming the glossary's line).
    Without ``index`` the variants are ``tgt_tokens``' strings (``nmt-score --terms`` reads outputs as words)."""

    def __init__(self, entries: list[Entry], src_words, tgt_tokens, index: dict[str, int] | None = None,
                 unk: int | None = None, ignore_case: bool = False, name: str = "<terms>"):
        self.ignore_case = ignore_case
        self.terms: list[Term] = []
        self.table: dict[tuple[str, ...], int] = {}  # the source term's words (case-folded) → its term index
        for e in entries:
            words = tuple(self._fold(w) for w in src_words(e.source))
            if not words:
                raise InputError(f"its source term {e.source!r} has no words once tokenised", name, e.line)
            variants = []
            for target in e.targets:
                tokens = tgt_tokens(target)
                if not tokens:
                    raise InputError(f"its target term {target!r} has no words once tokenised", name, e.line)
                if index is None:
                    variants += [tuple(tokens)] if tuple(tokens) not in variants else []
                    continue
                missing = [t for t in tokens if t not in index]
                if missing:
                    raise InputError(f"its target term {target!r} cannot be written: {', '.join(missing)} not in the "
                                     "model's target vocabulary", name, e.line)
                ids = tuple(index[t] for t in tokens)
                if unk in ids:
                    raise InputError(f"its target term {target!r} cannot be written (<unk>)", name, e.line)
                if ids not in variants:
                    variants.append(ids)
            if words in self.table:  # (two source spellings the same once tokenised / folded: one term)
                t = self.terms[self.table[words]]
                self.terms[self.table[words]] = Term(t.source, t.targets + tuple(x for x in e.targets
                                                                                if x not in t.targets),
                                                     t.variants + tuple(v for v in variants if v not in t.variants))
                continue
            self.table[words] = len(self.terms)
            self.terms.append(Term(e.source, e.targets, tuple(variants)))
        self.longest = max((len(w) for w in self.table), default=0)

    def _fold(self, word: str) -> str:
        return word.casefold() if self.ignore_case else word

    def __len__(self) -> int:
        return len(self.terms)

    def find(self, words: list[str]) -> list[int]:
        """The terms a line of source ``words`` requires (indices into :attr:`terms`), in the order they appear:
        longest match first, then leftmost; overlapping matches are dropped; each term once."""
        folded = [self._fold(w) for w in words]
        spans = []  # (-length, start, term)
        for i in range(len(folded)):
            for n in range(min(self.longest, len(folded) - i), 0, -1):
                term = self.table.get(tuple(folded[i: i + n]))
                if term is not None:
                    spans.append((-n, i, term))
        taken = [False] * len(folded)
        found: dict[int, int] = {}  # term → where it starts
        for neg, i, term in sorted(spans):
            if any(taken[i: i - neg]):
                continue
            taken[i: i - neg] = [True] * -neg
            found.setdefault(term, i)
        return sorted(found, key=found.get)


def report(glossary: CompiledGlossary, parts, n: int) -> tuple[list[str], list[str], list[int]]:
    """What a line's translation says of its terms, from its pieces' (piece, hypotheses) ``parts``: the source
    terms required, those its best translation missed, and how many each of its ``n`` n-best entries missed."""
    terms, missed, counts = [], [], [0] * n
    for piece, hyps in parts:
        names = [glossary.terms[i].source for i in piece.terms]
        terms += names
        if not names or not hyps:
            continue
        missed += [names[j] for j in (hyps[0].missed or [])]
        for k in range(n):
            counts[k] += len(hyps[min(k, len(hyps) - 1)].missed or [])
    return terms, missed, counts
