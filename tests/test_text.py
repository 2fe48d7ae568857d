"""nmtkit.data.text: Moses normalisation/tokenisation/detokenisation, lowercasing and BPE (learn, apply, merge)."""

from __future__ import annotations

from collections import Counter

import pytest

from nmtkit.data.text import Preprocessor, TextConfig, learn_bpe_codes

EN = Preprocessor(TextConfig("en"))
FR = Preprocessor(TextConfig("fr"))

ORDINARY_EN = [
    "Hello, world!",
    "I don't know what he said.",
    "The cat sat on the mat, and it was happy.",
    "Is this the 3rd time (really)?",
    "She paid $5.50 for 2 apples.",
]
ORDINARY_FR = [
    "L'école est fermée aujourd'hui.",
    "Je ne sais pas, dit-il.",
    "Où est la gare, monsieur ?",
    "Le chat dort sur le tapis, et il est content.",
]


def test_moses_tokenisation_conventions():
    # What tokenizer.perl does: punctuation split off, English clitics start the token, French ones end it.
    assert EN.words("Hello, world!") == ["Hello", ",", "world", "!"]
    assert EN.words("I don't know.") == ["I", "don", "'t", "know", "."]
    assert FR.words("L'école est fermée.") == ["L'", "école", "est", "fermée", "."]
    assert EN.words("She paid $5.50.") == ["She", "paid", "$", "5.50", "."]


@pytest.mark.parametrize("pre,sentence", [(EN, s) for s in ORDINARY_EN] + [(FR, s) for s in ORDINARY_FR])
def test_detokenize_undoes_tokenize_on_ordinary_sentences(pre, sentence):
    words = pre.words(sentence)
    assert len(words) > sentence.count(" ") + 1  # punctuation really was split off
    assert pre.detokenize(words) == sentence


def test_no_moses_escaping():
    assert EN.words("AT&T [x] | <b>") == ["AT", "&", "T", "[", "x", "]", "|", "<", "b", ">"]


def test_punctuation_normalisation_can_be_switched_off():
    # normalize-punctuation.perl maps the low and high double quotes to '"'.
    assert EN.words("\u201equoted\u201c") == ['"', "quoted", '"']
    raw = Preprocessor(TextConfig("en", normalize_punctuation=False))
    assert raw.words("\u201equoted\u201c") == ["\u201e", "quoted", "\u201c"]


def test_aggressive_dash_splits():
    assert EN.words("an e-mail") == ["an", "e-mail"]
    assert Preprocessor(TextConfig("en", aggressive_dash_splits=True)).words("an e-mail") == ["an", "e", "@-@", "mail"]


def test_lowercase():
    low = Preprocessor(TextConfig("fr", lowercase=True))
    assert low.words("École FERMÉE, Paris.") == ["école", "fermée", ",", "paris", "."]
    assert FR.words("École FERMÉE") == ["École", "FERMÉE"]


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e"])
def test_tokens_never_hold_line_breaks_or_whitespace(brk):
    words = EN.words(f"one{brk}two three")
    assert words == ["one", "two", "three"]
    assert not any(c.isspace() for w in words for c in w)


def test_carriage_return_is_removed_not_split_on():
    # normalize-punctuation.perl deletes \r (s/\r//g); it never splits the line.
    assert EN.words("a\rb c\r") == ["ab", "c"]


def test_empty_and_blank_lines_give_no_tokens():
    assert EN.words("") == [] and EN.words(" \t\u2028 ") == []


def test_textconfig_dict_round_trip_and_unknown_key():
    cfg = TextConfig("fr", normalize_punctuation=False, lowercase=True, bpe_codes="#version: 0.2\na b\n")
    assert TextConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="frobnicate"):
        TextConfig.from_dict({**cfg.to_dict(), "frobnicate": True})


# -- BPE ---------------------------------------------------------------------------------------------------------

WORDS = {"lower": 5, "low": 7, "newest": 6, "widest": 3}


def test_learn_bpe_first_merges_and_order_independence():
    codes = learn_bpe_codes(WORDS, 10)
    lines = codes.splitlines()
    assert lines[0].startswith("#version")
    merges = lines[1:]
    assert 0 < len(merges) <= 10
    # By hand: "l o" occurs 5 + 7 = 12 times, more than any other pair; after it, "w e" (lower 5 + newest 6 = 11).
    assert merges[:2] == ["l o", "w e"]
    reordered = Counter(dict(reversed(list(WORDS.items()))))
    assert learn_bpe_codes(reordered, 10) == codes


def test_bpe_apply_and_merge_round_trip():
    codes = learn_bpe_codes(WORDS, 10)
    bpe = Preprocessor(TextConfig("en", bpe_codes=codes))
    words = ["low", "lowest", "newer", "wider", "unseen", ",", "x"]
    units = bpe.subwords(words)
    assert len(units) > len(words)  # unseen words really were split
    assert "low" in units  # a frequent training word ends up as a single unit
    assert all(u and u != "@@" for u in units)
    assert bpe.merge_subwords(units) == words
    # The units of each word: all but the last end with the separator.
    glued = " ".join(units).replace("@@ ", "")
    assert glued.split(" ") == words
    assert bpe.tokenize("Lowest, newer.") == bpe.subwords(bpe.words("Lowest, newer."))


def test_detokenize_merges_subwords_first():
    codes = learn_bpe_codes(WORDS, 10)
    bpe = Preprocessor(TextConfig("en", bpe_codes=codes))
    assert bpe.detokenize(["un@@", "believ@@", "able", "!"]) == "unbelievable!"
    assert bpe.detokenize(bpe.tokenize("The lowest, newest one.")) == "The lowest, newest one."


def test_word_level_path_is_the_identity_on_subwords():
    words = ["un@@", "changed"]
    assert EN.subwords(words) == words and EN.merge_subwords(words) == words


def test_the_unknown_word_token_stays_one_token_through_tokenisation():
    fr = Preprocessor(TextConfig("fr"))
    words = fr.words("Le <unk> est là, <unk>. Un<unk>mot.")
    assert words == ["Le", "<unk>", "est", "là", ",", "<unk>", ".", "Un", "<unk>", "mot", "."]
    assert fr.detokenize(words[:7]) == "Le <unk> est là, <unk>."
    assert fr.words("Pas de jeton <b> ici.") == ["Pas", "de", "jeton", "<", "b", ">", "ici", "."]
