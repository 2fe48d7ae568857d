"""nmtkit.data.vocab: shortlist building, encode/decode, coverage and the vocabulary file format."""

from __future__ import annotations

from collections import Counter

import pytest

from nmtkit.errors import InputError
from nmtkit.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary, count_tokens

SPECIALS_LIST = ["<pad>", "<unk>", "<s>", "</s>"]


def test_specials_come_first_with_fixed_ids():
    assert list(SPECIALS) == SPECIALS_LIST
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)


def test_build_frequency_order_and_code_point_ties():
    counts = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 3}
    v = Vocabulary.build(counts, 3)
    # c (5) first; a, b and e tie at 3 and are ordered by code point, so e falls outside a shortlist of 3.
    assert v.tokens == SPECIALS_LIST + ["c", "a", "b"]
    assert v.counts == [0, 0, 0, 0, 5, 3, 3]
    assert len(v) == 3 + 4


def test_tie_break_is_by_code_point_not_by_locale_or_insertion_order():
    counts = {"é": 2, "z": 2, "Z": 2, "ä": 2, "a": 2, "\u4e2d": 2}
    expected = ["Z", "a", "z", "ä", "é", "\u4e2d"]  # U+005A < U+0061 < U+007A < U+00E4 < U+00E9 < U+4E2D
    assert Vocabulary.build(counts, 10).tokens[4:] == expected
    assert Vocabulary.build(dict(reversed(list(counts.items()))), 10).tokens[4:] == expected
    assert Vocabulary.build(counts, 2).tokens[4:] == ["Z", "a"]


def test_build_size_limits_and_exclusions():
    counts = Counter({"x": 4, "y": 2, "<unk>": 100, "</s>": 50, "zero": 0})
    v = Vocabulary.build(counts, 100)
    assert v.tokens == SPECIALS_LIST + ["x", "y"]  # specials are not duplicated, zero counts are left out
    assert Vocabulary.build(counts, 0).tokens == SPECIALS_LIST
    with pytest.raises(ValueError):
        Vocabulary.build(counts, -1)


def test_encode_decode():
    v = Vocabulary.build({"le": 3, "chat": 2, "dort": 1}, 2)
    ids = v.encode(["le", "chat", "dort", "le"])
    assert ids.tolist() == [4, 5, UNK, 4]
    assert v.decode(ids) == ["le", "chat", "<unk>", "le"]
    assert v["dort"] == UNK and "dort" not in v and "chat" in v
    assert v.decode([BOS, 4, PAD, 5, EOS, 4]) == ["le", "chat"]
    assert v.decode([BOS, 4, EOS, 5], strip_specials=False) == ["<s>", "le", "</s>", "chat"]
    assert v.encode([]).tolist() == []


def test_coverage_arithmetic():
    v = Vocabulary.build({"a": 10, "b": 5, "c": 1}, 2)
    # Running tokens: 6 a + 3 b + 1 z = 10, of which 9 are in the shortlist.
    assert v.coverage({"a": 6, "b": 3, "z": 1}) == pytest.approx(0.9)
    assert v.coverage({"c": 4}) == 0.0
    assert v.coverage({}) == 1.0
    assert v.coverage({"<unk>": 1, "a": 1}) == pytest.approx(0.5)  # a literal special is not a covered word


def test_count_tokens():
    assert count_tokens([["a", "b"], [], ["a"]]) == Counter({"a": 2, "b": 1})


def test_constructor_checks():
    with pytest.raises(ValueError, match="specials"):
        Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match="whitespace"):
        Vocabulary(SPECIALS_LIST + ["a b"])
    with pytest.raises(ValueError, match="twice"):
        Vocabulary(SPECIALS_LIST + ["a", "a"])
    with pytest.raises(ValueError):
        Vocabulary(SPECIALS_LIST + ["a"], [0, 0, 0, 0])


# -- the file format -----------------------------------------------------------------------------------------


def test_save_load_round_trip_and_exact_format(tmp_path):
    v = Vocabulary.build({"école": 3, "l'": 3, "€": 1, "\u00ad": 2}, 10)
    path = tmp_path / "vocab.fr"
    v.save(path)
    expected = "#nmtkit-vocab 1\n<pad>\t0\n<unk>\t0\n<s>\t0\n</s>\t0\nl'\t3\nécole\t3\n\u00ad\t2\n€\t1\n"
    assert path.read_bytes() == expected.encode("utf-8")
    w = Vocabulary.load(path)
    assert w == v and w.tokens == v.tokens and w.counts == v.counts
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.fr"]


@pytest.mark.parametrize("text,match,line", [
    ("", "not an nmtkit vocabulary", 1),
    ("<pad>\t0\n<unk>\t0\n", "not an nmtkit vocabulary", 1),
    ("#nmtkit-vocab 2\n<pad>\t0\n", "version '2'", 1),
    ("#nmtkit-vocab\n<pad>\t0\n", "version", 1),
    ("#nmtkit-vocab 1\n<pad>\t0\n<unk>\t0\n<s>\t0\n</s>\t0\nword 5\n", "token<TAB>count", 6),
    ("#nmtkit-vocab 1\n<pad>\t0\n<unk>\t0\n<s>\t0\n</s>\t0\nword\tmany\n", "token<TAB>count", 6),
])
def test_load_errors_name_file_and_line(tmp_path, text, match, line):
    path = tmp_path / "vocab.en"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=match) as e:
        Vocabulary.load(path)
    assert e.value.path == str(path) and e.value.line == line


def test_load_content_errors(tmp_path):
    path = tmp_path / "vocab.en"
    path.write_text("#nmtkit-vocab 1\n<pad>\t0\n<unk>\t0\n</s>\t0\n<s>\t0\n", encoding="utf-8")
    with pytest.raises(InputError, match="specials"):
        Vocabulary.load(path)
    path.write_text("#nmtkit-vocab 1\n<pad>\t0\n<unk>\t0\n<s>\t0\n</s>\t0\nx\t1\nx\t1\n", encoding="utf-8")
    with pytest.raises(InputError, match="twice"):
        Vocabulary.load(path)
    path.write_bytes(b"#nmtkit-vocab 1\n\xff\n")
    with pytest.raises(InputError, match="UTF-8"):
        Vocabulary.load(path)
    with pytest.raises(InputError, match="no such file"):
        Vocabulary.load(tmp_path / "missing")
