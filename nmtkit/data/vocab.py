"""The vocabulary shortlist: specials, the K most frequent tokens, str <-> id; owns the vocabulary file format.

As in the paper, each language keeps a shortlist of its K most frequent training tokens (K = 30,000 there) and
maps every other token to one unknown-word token. Four specials come first, so the vocabulary holds K + 4 entries::

    0 <pad>   padding, never a real token
    1 <unk>   any token outside the shortlist
    2 <s>     beginning of sentence (the decoder's first input)
    3 </s>    end of sentence

Ties in frequency are broken by the token's code points, so the same counts always give the same vocabulary.

File format (UTF-8, ``\\n`` line ends): a header line ``#nmtkit-vocab 1``, then one entry per line in id order,
``token<TAB>count``, specials included (count 0). Tokens never contain whitespace (the tokenizer splits on it).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

from nmtkit.errors import InputError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
_SPACE = re.compile(r"\s")  # (the characters str.isspace() calls whitespace)
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
FORMAT_HEADER = "#nmtkit-vocab"
FORMAT_VERSION = 1


class Vocabulary:
    """An ordered token list with counts; ids are positions. Build with :meth:`build` or :meth:`load`."""

    def __init__(self, tokens: Iterable[str], counts: Iterable[int] | None = None):
        self.tokens: list[str] = list(tokens)
        if tuple(self.tokens[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"does not start with the specials {' '.join(SPECIALS)} (it starts with "
                             f"{' '.join(self.tokens[: len(SPECIALS)]) or 'nothing'})")
        self.counts: list[int] = [0] * len(self.tokens) if counts is None else list(counts)
        if len(self.counts) != len(self.tokens):
            raise ValueError("tokens and counts differ in length")
        self.index: dict[str, int] = {}
        for i, tok in enumerate(self.tokens):
            if not tok or _SPACE.search(tok):
                raise ValueError(f"token {tok!r} (id {i}) is empty or contains whitespace")
            if tok in self.index:
                raise ValueError(f"has the token {tok!r} twice (ids {self.index[tok]} and {i})")
            self.index[tok] = i

    @classmethod
    def build(cls, counts: Mapping[str, int], size: int) -> Vocabulary:
        """The shortlist of the ``size`` most frequent tokens of ``counts`` after the specials.

        Ties are broken by code point order; tokens spelled like a special are left out (they cannot be told
        apart from it).
        """
        if size < 0:
            raise ValueError("vocabulary size must be >= 0")
        ranked = sorted((c, t) for t, c in counts.items() if t not in SPECIALS and c > 0)
        ranked.sort(key=lambda ct: -ct[0])  # stable: equal counts stay in code point order
        chosen = ranked[:size]
        return cls(list(SPECIALS) + [t for _, t in chosen], [0] * len(SPECIALS) + [c for c, _ in chosen])

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.tokens == other.tokens

    def __getitem__(self, token: str) -> int:
        return self.index.get(token, UNK)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Token ids (out-of-shortlist tokens become ``<unk>``); no ``<s>``/``</s>`` are added."""
        get = self.index.get
        return np.fromiter((get(t, UNK) for t in tokens), dtype=np.int64)

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        """Tokens for ids; with ``strip_specials`` stops at ``</s>`` and drops ``<pad>`` and ``<s>``."""
        out = []
        for i in ids:
            i = int(i)
            if strip_specials:
                if i == EOS:
                    break
                if i in (PAD, BOS):
                    continue
            out.append(self.tokens[i])
        return out

    def coverage(self, counts: Mapping[str, int]) -> float:
        """Share of the running tokens counted in ``counts`` that are in the shortlist (1.0 when empty)."""
        total = sum(counts.values())
        inside = sum(c for t, c in counts.items() if t in self.index and t not in SPECIALS)
        return inside / total if total else 1.0

    # -- the file format -------------------------------------------------------------------------------------

    def to_text(self) -> str:
        lines = [f"{FORMAT_HEADER} {FORMAT_VERSION}\n"]
        lines += [f"{t}\t{c}\n" for t, c in zip(self.tokens, self.counts)]
        return "".join(lines)

    @classmethod
    def from_text(cls, text: str, path: str = "<vocabulary>") -> Vocabulary:
        lines = text.split("\n")  # "\n" only: tokens may hold characters that str.splitlines() breaks on
        if lines and lines[-1] == "":
            lines.pop()
        if not lines or not lines[0].startswith(FORMAT_HEADER):
            raise InputError(f"not an nmtkit vocabulary (first line should be '{FORMAT_HEADER} {FORMAT_VERSION}')",
                             path, 1)
        version = lines[0][len(FORMAT_HEADER):].strip()
        if version != str(FORMAT_VERSION):
            raise InputError(f"vocabulary format version {version!r} is not understood "
                             f"(this nmtkit reads version {FORMAT_VERSION})", path, 1)
        tokens, counts = [], []
        for n, line in enumerate(lines[1:], start=2):
            tok, tab, count = line.partition("\t")
            if not tab or not count.isdigit():
                raise InputError("expected 'token<TAB>count'", path, n)
            tokens.append(tok)
            counts.append(int(count))
        try:
            return cls(tokens, counts)
        except ValueError as e:
            raise InputError(str(e), path) from None

    def save(self, path: str | os.PathLike) -> None:
        from nmtkit.files import atomic_file

        with atomic_file(path) as f:
            f.write(self.to_text())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
        except FileNotFoundError:
            raise InputError("no such file", path) from None
        except UnicodeDecodeError as e:
            raise InputError(f"invalid UTF-8 at byte {e.start}", path) from None
        return cls.from_text(text, path)


def count_tokens(sentences: Iterable[Iterable[str]]) -> Counter:
    """Token frequencies over tokenised sentences."""
    counts: Counter = Counter()
    for tokens in sentences:
        counts.update(tokens)
    return counts
