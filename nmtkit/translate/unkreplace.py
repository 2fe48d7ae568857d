"""Unknown-word replacement (``nmt-translate --replace-unk``, after Luong et al., 2015): each ``<unk>`` the model
writes becomes the most attended source word (as fairseq and OpenNMT-py choose it), or that word's entry in a
dictionary.  (The source word of the largest alignment posterior at the ``<unk>`` was tried too, and lost on every
set: tests/bench/results/bench_replace_unk.txt.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nmtkit.data.vocab import UNK
from nmtkit.errors import InputError


def load_unk_dict(path: str) -> dict[str, str]:
    """A replacement dictionary for --replace-unk: ``source_word target_word`` per line (first entry wins)."""
    from nmtkit.files import read_segments

    out: dict[str, str] = {}
    for seg in read_segments(path):
        parts = seg.text.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise InputError("expected 'source_word target_word'", path, seg.line)
        out.setdefault(parts[0], parts[1])
    return out


def replace_unks(tokens: list[str], ids: Sequence[int], attention, src_tokens: list[str],
                 words_of: Callable, unk_dict: dict[str, str], start: int = 0) -> list[str]:
    """``tokens`` (the decoded ``ids``) with every ``<unk>`` from position ``start`` on replaced: ``attention``
    (Ty, ≥ Tx), the hypothesis's attention over ``src_tokens``, picks the source token (its largest weight);
    ``words_of`` maps source tokens to words (subwords to the word they make up), and ``unk_dict`` that word to its
    translation (else the word itself)."""
    src_words, src_word_of = words_of(src_tokens)
    out = list(tokens)
    for i, tid in enumerate(ids[start:], start=start):
        if tid == UNK:
            j = int(attention[i, : len(src_tokens)].argmax())
            word = src_words[src_word_of[j]]
            out[i] = unk_dict.get(word, word)
    return out
