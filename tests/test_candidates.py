"""Candidate lists (``nmt-translate --candidates``; nmtkit/data/candidates.py, nmtkit/translate/candidates.py): IBM
Model 1 finds a word's translation; a table round-trips and every damaged or foreign one is one error naming the
file; a list that holds the whole vocabulary decodes exactly as without one (beam search with the hour's options,
prefixes, numbers, n-best, sampling); a batch's output never leaves its list, which still holds its prefixes and
numbers; and on the command line, nmt-prepare's table translates the same lines with the same line count."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nmtkit.data import candidates as C
from nmtkit.data.corpus import Corpus, CorpusWriter
from nmtkit.errors import InputError
from nmtkit.models import set_backend
from nmtkit.translate.candidates import restricted
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import DecodeSetup, SourceBatch, decode_batch
from nmtkit.translate.ngramblock import number_tokens
from nmtkit.translate.sourcenumbers import DigitTable

from conftest import REPO, V_SRC, V_TGT, randomize_, tiny

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SRC_TOKENS = ["<pad>", "<unk>", "<s>", "</s>"] + [f"s{i}" for i in range(V_SRC - 4)]
# the tiny model's target words: half of them digits and what groups them, for the numbers' rules
TGT_TOKENS = ["<pad>", "<unk>", "<s>", "</s>", "▁", ",", *"0123456789", *[f"▁{d}" for d in "0123456789"],
              "▁a", "▁b", "▁c"][:V_TGT]


def _corpus(path, sentences) -> Corpus:
    with CorpusWriter(path, np.int32) as w:
        for s in sentences:
            w.add(np.asarray(s, dtype=np.int64))
    return Corpus(path)


def _toy(tmp_path):
    """A corpus where source word 10 always comes with target word 20 and 11 with 21, among common words."""
    rng = np.random.default_rng(0)
    src, tgt = [], []
    for k in range(400):
        common_s, common_t = list(rng.integers(4, 8, size=3)), list(rng.integers(4, 8, size=3))
        word = 10 + k % 2
        src.append(common_s + [word])
        tgt.append([word + 10] + common_t)
    return _corpus(tmp_path / "train.en", src), _corpus(tmp_path / "train.fr", tgt)


def test_model1_finds_the_translation_and_the_table_round_trips(tmp_path):
    s, t = _toy(tmp_path)
    src_tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"e{i}" for i in range(4, 12)]
    tgt_tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"f{i}" for i in range(4, 22)]
    table = C.build(s, t, src_tokens, tgt_tokens)
    assert table.translations[10, 0] == 20 and table.translations[11, 0] == 21
    assert set(table.common_ids[:4]) == {4, 5, 6, 7}  # the most frequent target words first, never a special
    assert not set(table.common_ids) & {0, 1, 2, 3}
    assert (table.translations[4:8] >= 0).any() and (table.translations[:4] == -1).all()
    C.save(table.sized(3, 2), tmp_path / "c.npz")
    back = C.load(str(tmp_path / "c.npz"), src_tokens, tgt_tokens)
    assert (back.common, back.per_word) == (3, 2)  # (the sizes its lists take, saved with it)
    assert np.array_equal(back.translations, table.translations) and np.array_equal(back.common_ids, table.common_ids)
    vocab = back.sized(2, 1).batch_vocab([np.array([10, 4])], must=np.array([9]))
    assert list(vocab[:4]) == [0, 1, 2, 3] and {20, 9} <= set(vocab) and list(vocab) == sorted(set(vocab))
    assert 21 not in vocab  # (source word 11 is not in the batch)
    with pytest.raises(ValueError, match="asked for"):
        back.sized(10_000, 1)


def test_a_corpus_too_large_for_memory_is_sampled(tmp_path):
    """At most about max_links source × target token pairs: an evenly spread sample, still finding 10 → 20."""
    s, t = _toy(tmp_path)
    e, f, p = C.model1(s, t, 12, 22, max_links=16 * 100)
    assert len(e) and np.bincount(e, weights=p)[np.unique(e)] == pytest.approx(1.0)  # p(· | e) sums to 1
    best = {int(a): int(f[np.flatnonzero(e == a)[np.argmax(p[e == a])]]) for a in (10, 11)}
    assert best == {10: 20, 11: 21}


@pytest.mark.parametrize("damage, message", [
    ("missing", "no such file"),
    ("garbage", "not a candidate table"),
    ("truncated", "not a candidate table"),
    ("other_format", "not an nmtkit candidate table"),
    ("version", "version 99"),
    ("other_vocab", "other vocabularies"),
    ("out_of_range", "outside"),
    ("wrong_shape", "wrong shapes"),
    ("sizes", "sizes do not fit"),
])
def test_a_damaged_or_foreign_table_is_one_error_naming_the_file(tmp_path, damage, message):
    s, t = _toy(tmp_path)
    src_tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"e{i}" for i in range(4, 12)]
    tgt_tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"f{i}" for i in range(4, 22)]
    table = C.build(s, t, src_tokens, tgt_tokens)
    path = tmp_path / "c.npz"
    C.save(table, path)
    fields = dict(np.load(path))
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"not a zip file at all\n")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        if damage == "other_format":
            fields["format"] = np.array("something-else")
        elif damage == "version":
            fields["version"] = np.array(99)
        elif damage == "other_vocab":
            tgt_tokens = tgt_tokens[:-1] + ["f99"]
        elif damage == "out_of_range":
            fields["translations"][5, 0] = 4000
        elif damage == "wrong_shape":
            fields["translations"] = fields["translations"][:-1]
        elif damage == "sizes":
            fields["sizes"] = np.array([10, 10_000])
        np.savez(path, **fields)
    with pytest.raises(InputError, match=message) as e:
        C.load(str(path), src_tokens, tgt_tokens)
    assert str(path) in str(e.value)


def _model():
    m = set_backend(randomize_(tiny("rnnsearch")).eval(), "reference")  # (exact: the logits' columns picked)
    return m


def _whole_table():
    """A table whose lists hold the whole target vocabulary."""
    common = np.arange(4, V_TGT, dtype=np.int32)
    return C.CandidateTable(common, np.full((V_SRC, 3), -1, np.int32), C.digest(SRC_TOKENS), C.digest(TGT_TOKENS),
                            V_TGT).sized(len(common), 3)


SOURCES = [np.array(s) for s in ([5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 5], [17, 18])]
NUMBERS = [["1975", "35"], [], ["2014"], ["7"]]


@pytest.mark.parametrize("options", [
    dict(beam=5, nbest=3, no_repeat_ngram=2, source_numbers=True, all_numbers=True, max_len_a=2.0, max_len_b=6),
    dict(beam=1, source_numbers=True, max_len_a=1.5, max_len_b=4),
    dict(beam=3, nbest=2, sampling="topk:5", seed=3, max_len_a=1.5, max_len_b=4),
])
def test_the_whole_vocabulary_as_list_decodes_as_without_one(options):
    m = _model()
    decode = DecodeConfig(**options)
    prefixes = [None, np.array([24, 25]), None, np.array([4])]
    batch = SourceBatch(SOURCES, prefixes, numbers=NUMBERS if decode.source_numbers else None)
    setup = DecodeSetup(decode, numbers=number_tokens(TGT_TOKENS).numpy(), digit_table=DigitTable(TGT_TOKENS))
    plain = decode_batch([m], batch, "cpu", setup)
    listed = decode_batch([m], batch, "cpu", dataclasses.replace(setup, candidates=_whole_table()))
    for a, b in zip(plain, listed):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
        assert [h.unmet for h in a] == [h.unmet for h in b]


def test_the_output_stays_in_the_list_which_keeps_prefixes_and_numbers():
    """A list of the specials, one common word and the batch's translations: every token written is in it, a
    prefix is written though no list names its word, and with --source-numbers every token a number is written
    with is in it."""
    m = _model()
    translations = np.full((V_SRC, 2), -1, np.int32)
    translations[5] = [26, -1]  # (▁a)
    table = C.CandidateTable(np.array([28], np.int32), translations, C.digest(SRC_TOKENS), C.digest(TGT_TOKENS),
                             V_TGT).sized(1, 2)
    decode = DecodeConfig(beam=4, nbest=4, no_repeat_ngram=2, max_len_a=2.0, max_len_b=8)
    digits = DigitTable(TGT_TOKENS)
    batch = SourceBatch(SOURCES, [None, np.array([27]), None, None])
    hyps = decode_batch([m], batch, "cpu", DecodeSetup(decode, numbers=number_tokens(TGT_TOKENS).numpy(),
                                                       candidates=table))
    allowed = {0, 1, 2, 3, 26, 27, 28}
    assert all(sentence for sentence in hyps)
    for sentence in hyps:
        for h in sentence:
            assert set(h.tokens) <= allowed, h.tokens
    assert hyps[1][0].tokens[0] == 27
    # with --source-numbers the list holds every token a number is written with, renumbered in the digit table
    vocab, _, _, _, sub, _ = restricted(table, [m], SOURCES, "cpu", None, None, digits, source_numbers=True)
    column = {int(i): c for c, i in enumerate(vocab)}
    assert set(digits.digits) | set(digits.glue) | {digits.space} <= set(column)
    assert sub.digits == {column[i]: d for i, d in digits.digits.items()} and sub.space == column[digits.space]
    assert sub.glue == {column[i] for i in digits.glue} and sub.size == len(vocab)
    assert sub.starts_word == {column[i] for i in digits.starts_word}
    assert not set(digits.digits) <= set(restricted(table, [m], SOURCES, "cpu", None, None, digits)[0])
    plain = decode_batch([m], batch, "cpu", DecodeSetup(decode, numbers=number_tokens(TGT_TOKENS).numpy()))
    assert any(not set(h.tokens) <= allowed for sentence in plain for h in sentence)  # (the list did restrict)


def _translate(args, stdin: bytes):
    return subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)


def test_nmt_prepare_writes_the_table_and_nmt_translate_reads_it(trained, tmp_path):
    """What the user runs: the prepared directory's candidates.npz with the model trained on it -- every line
    translated, one out per line in; the same text as without the list for most lines (this tiny model's
    table is from 1,500 pairs); and a table of another corpus is one line naming it, nothing written."""
    root, ckpt = trained
    table = root / "data" / "candidates.npz"
    assert table.is_file()
    lines = (root / "valid.en").read_text(encoding="utf-8").splitlines()[:40]
    stdin = ("\n".join(lines) + "\n").encode()
    plain = _translate(["-m", ckpt, "-q", "--beam", "4"], stdin)
    listed = _translate(["-m", ckpt, "-q", "--beam", "4", "--candidates", str(table)], stdin)
    assert plain.returncode == 0 and listed.returncode == 0, listed.stderr.decode()
    a, b = plain.stdout.decode().splitlines(), listed.stdout.decode().splitlines()
    assert len(b) == len(lines) and all(b)
    assert sum(x == y for x, y in zip(a, b)) >= 0.75 * len(lines)
    other = tmp_path / "other.npz"
    fields = dict(np.load(table))
    fields["tgt_digest"] = np.array("0" * 64)
    np.savez(other, **fields)
    out = tmp_path / "out.fr"
    bad = _translate(["-m", ckpt, "-q", "--candidates", str(other), "-o", str(out)], stdin)
    assert bad.returncode != 0 and not out.exists()
    err = bad.stderr.decode().strip().splitlines()
    assert len(err) == 1 and str(other) in err[0] and "other vocabularies" in err[0]


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("grad", [False, True])
def test_a_step_over_a_list_gives_those_columns_of_the_whole_step(backend, grad):
    """decode_step's ``vocab``: the logits of those words, in that order (the fast backend multiplies only their
    rows of W_o, from its step weights without autograd, from the parameters with it), the same state and α."""
    m = set_backend(randomize_(tiny("rnnsearch")).eval(), backend)
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    lens = torch.tensor([4, 3])
    vocab = torch.tensor([0, 3, 17, 5, 28, 4])  # (any order)
    with torch.set_grad_enabled(grad):
        enc = m.prepare_decoding(m.encode(src, lens))
        state = m.init_decoder(enc).repeat_interleave(2, dim=0)
        y = torch.tensor([2, 2, 2, 2])
        for _ in range(3):
            whole, s_whole, a_whole = m.decode_step(y, state, enc)
            part, s_part, a_part = m.decode_step(y, state, enc, vocab=vocab)
            assert part.shape == (4, len(vocab))
            assert torch.allclose(part, whole[:, vocab], atol=1e-5)
            assert torch.equal(s_part, s_whole) and torch.equal(a_part, a_whole)
            y, state = whole.argmax(dim=1), s_whole
