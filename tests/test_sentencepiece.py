"""SentencePiece as the third segmentation (nmt-prepare --spm-vocab-size / --spm-model), on real text end to end:
the prepared units against the sentencepiece package's own segmentation, words back from units, identical bytes
on reruns, one-line errors, and a trained model whose checkpoint carries the model so that nmt-translate segments
new input the same way."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections import Counter

import pytest
import sentencepiece

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.data.manifest import PreparedData
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.data.text import SPM_SPACE, Preprocessor, TextConfig, learn_bpe_codes, learn_spm_model, spm_words_of

from conftest import REPO, lines_of, pharaoh_links, train_tiny, wait_until
from nmtkit.translate.config import DecodeConfig

pytestmark = pytest.mark.slow
UNITS = 1200


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _snapshot(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


@pytest.fixture(scope="module")
def spm_data(data_dir, tmp_path_factory):
    """1,500 Multi30K pairs prepared with a joint SentencePiece model of 1,200 units; news-test-2014 as test."""
    root = tmp_path_factory.mktemp("spm")
    for lang in ("en", "fr"):
        _write(root / f"train.{lang}", lines_of(data_dir / "multi30k" / f"train.{lang}", 1500))
        _write(root / f"valid.{lang}", lines_of(data_dir / "multi30k" / f"val.{lang}", 50))
        _write(root / f"test.{lang}", lines_of(data_dir / "wmt14" / f"newstest2014.{lang}", 60))
    cfg = dict(train=[str(root / "train")], valid=str(root / "valid"), test=[str(root / "test")],
               src_vocab_size=1000, tgt_vocab_size=1000, max_len=40)
    prepare(PrepareConfig("en", "fr", dest=str(root / "data"), spm_vocab_size=UNITS, **cfg))
    return root, cfg


def test_prepared_units_are_sentencepiece_segmentation_of_the_words(spm_data):
    root, _ = spm_data
    data = PreparedData.open(root / "data")
    entry = data.manifest["sentencepiece"]
    assert entry["model_type"] == "unigram" and entry["learned_units"] == UNITS and entry["joint"]
    assert data.manifest["bpe"] is None
    sp = sentencepiece.SentencePieceProcessor(model_file=str(root / "data" / entry["model_file"]))
    assert sp.get_piece_size() == UNITS
    kept = [int(n) for n in lines_of(root / "data" / "train.kept")]
    for split, lines in (("train", kept), ("test", range(1, 61))):
        for lang in ("en", "fr"):
            vocab = data.vocab(lang)
            corpus = data.corpus(split, lang)
            words = lines_of(root / "data" / f"{split}.tok.{lang}")
            assert len(corpus) == len(lines)
            for k, line in enumerate(lines):
                # the package segments the whole line; nmtkit segments word by word: the same units
                expected = sp.encode(words[line - 1], out_type=str)
                assert vocab.decode(corpus[k]) == [u if u in vocab else "<unk>" for u in expected]
    assert data.manifest["splits"]["test"]["coverage"]["fr"] > 0.97  # units cover other-domain text too


def test_units_join_back_into_the_words_and_each_unit_into_its_word(spm_data, data_dir):
    root, _ = spm_data
    pre = Preprocessor(PreparedData.open(root / "data").text_config("fr"))
    lines = lines_of(data_dir / "wmt14" / "newstest2014.fr", 300) + ["un mot ▁ à part et ▁▁ x▁y ▁"]
    for line in lines:
        words = pre.words(line)
        units = pre.subwords(words)
        assert all(u and " " not in u for u in units)
        merged, owner = pre.words_of(units)
        assert merged == words and pre.merge_subwords(units) == words
        for w, word in enumerate(words):  # the units owned by word w spell it, ▁ marks removed
            spelled = "".join(u for u, o in zip(units, owner) if o == w).replace(SPM_SPACE, "")
            assert spelled.replace("\ue001", SPM_SPACE) == word
    words = pre.words(lines[0])  # units → running text is words → running text on the word-level path
    assert pre.detokenize(pre.subwords(words)) == Preprocessor(TextConfig("fr")).detokenize(words)
    assert pre.detokenize(pre.subwords(words)) == "Spectaculaire saut en \"wingsuit\" au-dessus de Bogota"


def test_words_from_model_output_that_does_not_start_a_word():
    # a model may generate any unit first, or a lone "▁" last: every unit still belongs to a word
    assert spm_words_of(["ont", "\u2581il", "s"]) == (["ont", "ils"], [0, 1, 1])
    assert spm_words_of(["\u2581", "\u2581a", "\u2581"]) == (["a"], [0, 0, 0])
    assert spm_words_of([]) == ([], [])


def test_same_bytes_with_more_workers_and_with_the_model_given(spm_data):
    root, cfg = spm_data
    prepare(PrepareConfig("en", "fr", dest=str(root / "again"), spm_vocab_size=UNITS, workers=2, **cfg))
    assert _snapshot(root / "again") == _snapshot(root / "data")
    prepare(PrepareConfig("en", "fr", dest=str(root / "given"), spm_model=str(root / "data" / "spm.model"), **cfg))
    given = _snapshot(root / "given")
    learned = _snapshot(root / "data")
    assert given.keys() == learned.keys()
    assert all(given[k] == learned[k] for k in given if k != "manifest.json")
    entry = PreparedData.open(root / "given").manifest["sentencepiece"]
    assert entry["given_model"] == str(root / "data" / "spm.model") and entry["learned_units"] is None
    sizes = ("src_vocab_size", "tgt_vocab_size")  # (--vocab-from brings its own)
    prepare(PrepareConfig("en", "fr", dest=str(root / "from"), vocab_from=str(root / "data"),
                          **{k: v for k, v in cfg.items() if k not in sizes}))
    assert _snapshot(root / "from")["train.fr.bin"] == learned["train.fr.bin"]


def test_spm_type_bpe(spm_data):
    root, cfg = spm_data
    prepare(PrepareConfig("en", "fr", dest=str(root / "spmbpe"), spm_vocab_size=800, spm_type="bpe", **cfg))
    data = PreparedData.open(root / "spmbpe")
    assert data.manifest["sentencepiece"]["model_type"] == "bpe"
    sp = sentencepiece.SentencePieceProcessor(model_file=str(root / "spmbpe" / "spm.model"))
    assert sp.get_piece_size() == 800
    words = lines_of(root / "spmbpe" / "test.tok.en")[0]
    assert data.vocab("en").decode(data.corpus("test", "en")[0]) == [
        u if u in data.vocab("en") else "<unk>" for u in sp.encode(words, out_type=str)]


def test_spm_split_digits_spells_every_number_digit_by_digit(spm_data, tmp_path):
    """--spm-split-digits: no unit holds two digits, in the vocabularies or in any segmented line, and the numbers
    of real news lines are spelt digit by digit (what lets a model copy a number it never saw)."""
    import re

    root, cfg = spm_data
    prepare(PrepareConfig("en", "fr", dest=str(tmp_path / "digits"), spm_vocab_size=800, spm_split_digits=True,
                          **cfg))
    data = PreparedData.open(tmp_path / "digits")
    assert data.manifest["sentencepiece"]["split_digits"] is True
    two_digits = re.compile(r"[0-9][0-9]")
    for lang in ("en", "fr"):
        assert not any(two_digits.search(u) for u in data.vocab(lang).tokens)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "digits" / "spm.model"))
    numbers = [w for line in lines_of(root / "data" / "test.tok.en") for w in line.split() if re.search(r"\d\d", w)]
    assert len(numbers) > 10  # (news-test-2014's lines have numbers)
    assert all(not two_digits.search(u) for w in numbers for u in sp.encode(w, out_type=str))
    with pytest.raises(InputError, match="--spm-split-digits is a setting of a SentencePiece model being learned"):
        PrepareConfig("en", "fr", train=["x"], dest=str(tmp_path / "d"), spm_split_digits=True).check()


def _prepare_cli(*args) -> tuple[int, str]:
    """(exit code, the one error line): log lines aside, a failed run must print exactly one line."""
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-prepare"), "-s", "en", "-t", "fr", "-q",
                           *map(str, args)], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, lines[0]


def test_bad_sentencepiece_settings_are_one_line_errors(spm_data, tmp_path):
    root, _ = spm_data
    train = root / "train"
    _, line = _prepare_cli("--train", train, "--dest", tmp_path / "d", "--spm-vocab-size", 500000)
    assert not (tmp_path / "d").exists()
    assert line.startswith(f"nmt-prepare: error: {train}.en: no SentencePiece model of 500000 units") \
        and "Vocabulary size too high" in line
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model\n" * 10)
    _, line = _prepare_cli("--train", train, "--dest", tmp_path / "d", "--spm-model", bad)
    assert line == f"nmt-prepare: error: {bad}: not a SentencePiece model (its bytes do not parse)"
    _, line = _prepare_cli("--train", train, "--dest", tmp_path / "d", "--spm-model", tmp_path / "missing.model")
    assert line == f"nmt-prepare: error: {tmp_path / 'missing.model'}: no such file (SentencePiece model)"
    for extra, needle in ((["--bpe-merges", 10], "--bpe-merges and --spm-vocab-size exclude each other"),
                          (["--spm-model", bad], "--spm-vocab-size and --spm-model exclude each other"),
                          (["--vocab-from", root / "data"], "--vocab-from brings its directory's subword")):
        _, line = _prepare_cli("--train", train, "--dest", tmp_path / "d", "--spm-vocab-size", 100, *extra)
        assert needle in line
    with pytest.raises(InputError, match="--spm-type"):
        PrepareConfig("en", "fr", train=[str(train)], dest=str(tmp_path / "d"), spm_vocab_size=10,
                      spm_type="char").check()
    with pytest.raises(ValueError, match="Vocabulary size too high"):
        learn_spm_model(["a b", "c"], 1000)


@pytest.fixture(scope="module")
def spm_model(spm_data):
    root, _ = spm_data
    return train_tiny(root / "data", root / "run", max_updates=60, valid_every=60, valid_bleu_sentences=20,
                      log_every=100)


def test_the_checkpoint_carries_the_model_and_translation_segments_with_it(spm_data, spm_model, tmp_path):
    root, _ = spm_data
    payload = checkpoint.load(spm_model)  # (torch.load(..., weights_only=True) inside)
    with open(root / "data" / "spm.model", "rb") as f:
        assert base64.b64decode(payload["preprocessing"]["src"]["spm_model"]) == f.read()
    from nmtkit.translate.translator import Translator

    src = lines_of(root / "test.en", 12)
    with Translator([spm_model], DecodeConfig(beam=3), workers=1, need_attention=True) as tr:
        sp = sentencepiece.SentencePieceProcessor(model_file=str(root / "data" / "spm.model"))
        for line in src:  # the source is segmented as nmt-prepare segmented it
            assert tr.src_pre.tokenize(line) == sp.encode(" ".join(tr.src_pre.words(line)), out_type=str)
    inp = tmp_path / "in.en"
    _write(inp, src)
    out, align = tmp_path / "out.fr", tmp_path / "align"
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", spm_model, "-i", str(inp),
                           "-o", str(out), "--beam", "3", "--alignments", str(align), "--tokenized",
                           "--replace-unk"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    hyps, links = lines_of(out), lines_of(align)
    assert len(hyps) == len(links) == len(src)
    for s, h, al in zip(src, hyps, links):  # word-level output: no unit marks, alignments index words
        assert SPM_SPACE not in h and "<unk>" not in h
        pairs = pharaoh_links(al)
        assert len(pairs) == len(h.split())
        assert all(0 <= i < len(s.split()) and 0 <= j < len(h.split()) for i, j in pairs)


def test_a_checkpoint_with_a_damaged_model_is_a_one_line_error(spm_model, tmp_path):
    payload = checkpoint.load(spm_model)
    for side, value, problem in (("src", "@@@", "is not base64 text"),
                                 ("tgt", base64.b64encode(b"x" * 50).decode(), "its bytes do not parse")):
        damaged = {k: v for k, v in payload.items() if k not in ("format", "format_version", "nmtkit_version")}
        damaged["preprocessing"] = {**payload["preprocessing"],
                                    side: {**payload["preprocessing"][side], "spm_model": value}}
        path = tmp_path / f"{side}.pt"
        checkpoint.save(damaged, path)
        with pytest.raises(InputError, match=f"malformed checkpoint: 'preprocessing.{side}.spm_model'.*{problem}"):
            checkpoint.load(str(path))


def test_text_config_round_trip_keeps_the_model(spm_data):
    root, _ = spm_data
    cfg = PreparedData.open(root / "data").text_config("en")
    again = TextConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.spm_model is not None and again.bpe_codes is None
    line = "Two young men ride their bicycles past the old harbour."
    assert Preprocessor(again).tokenize(line) == Preprocessor(cfg).tokenize(line)


# -- the text a user reads (issue 34: each SentencePiece translation came out as one word) ---------------------------

PREFIX = "Le très honorable Jean Chrétien est ici ."  # a Hansards line, as the issue gave it
PREFIX_TEXT = "Le très honorable Jean Chrétien est ici."  # ... and as a reader sees it
FR_WORDS = Preprocessor(TextConfig("fr"))  # the word-level path's detokeniser: the oracle for running text


@pytest.fixture(scope="module")
def hansards_spm(data_dir, tmp_path_factory):
    """1,500 Hansards pairs prepared with a joint SentencePiece model of 200 units (the issue's setting; most words
    are several units) and a tiny model trained on them for 150 updates: (root, checkpoint)."""
    import gzip

    root = tmp_path_factory.mktemp("hansards-spm")
    for lang in ("en", "fr"):
        with gzip.open(data_dir / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(3500), f)][2000:]  # (past the opening's headings)
        _write(root / f"train.{lang}", lines)
        _write(root / f"valid.{lang}", lines_of(data_dir / "hansards" / f"dev.{lang}", 30))
    prepare(PrepareConfig("en", "fr", train=[str(root / "train")], valid=str(root / "valid"), dest=str(root / "data"),
                          src_vocab_size=1000, tgt_vocab_size=1000, max_len=50, spm_vocab_size=200))
    return root, train_tiny(root / "data", root / "run", max_updates=150, valid_every=150, valid_bleu_sentences=0,
                            log_every=100)


def test_detokenize_takes_units_and_gives_the_moses_detokenised_sentence(hansards_spm, data_dir):
    """detokenize owns the merge: the units of a line (SentencePiece or BPE) give back the running text the
    word-level path gives for that line's words, spaces and all."""
    root, _ = hansards_spm
    lines = [line for line in lines_of(data_dir / "hansards" / "test.fr", 2000) if len(line.split()) >= 6][:60]
    spm = Preprocessor(PreparedData.open(root / "data").text_config("fr"))
    words = [FR_WORDS.words(line) for line in lines]
    bpe = Preprocessor(TextConfig("fr", bpe_codes=learn_bpe_codes(Counter(w for ws in words for w in ws), 200)))
    assert len(lines) == 60
    for pre in (spm, bpe):
        for line, ws in zip(lines, words):
            units = pre.subwords(ws)
            assert len(units) > len(ws)  # (200 units or merges: the line really is segmented)
            text = pre.detokenize(units)
            assert text == FR_WORDS.detokenize(ws) and " " in text, (line, units)
            assert pre.detokenize(units) == pre.detokenize(pre.tokenize(line))
    assert spm.detokenize(spm.tokenize(PREFIX)) == PREFIX_TEXT


def _translate_cli(ckpt, inp, prefix, out, nbest, *extra) -> list[str]:
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", ckpt, "-i", str(inp),
                           "--prefix", str(prefix), "-o", str(out), "--nbest-file", str(nbest), "--workers", "1",
                           "-q", *extra], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return lines_of(out)


def _nbest_texts(path, n_lines) -> list[list[str]]:
    texts: list[list[str]] = [[] for _ in range(n_lines)]
    for entry in lines_of(path):
        i, text, _, _ = entry.split(" ||| ")
        texts[int(i)].append(text)
    return texts


@pytest.mark.parametrize("how", [["--beam", "3", "--nbest", "3"], ["--sampling", "topk:20", "--nbest", "2"]],
                         ids=["beam-nbest", "sampling"])
def test_translations_of_a_sentencepiece_model_read_as_words(hansards_spm, data_dir, tmp_path, how):
    """Through nmt-translate: plain output, a --prefix, every n-best entry, samples.  The same hypotheses come out
    of a --tokenized run fed the same words; the plain run must read as those words detokenised (the word-level
    path's Moses detokeniser: spaces kept), and a prefixed line must start with the prefix exactly as written, the
    rest as detokenised after it."""
    root, ckpt = hansards_spm
    src = [line for line in lines_of(data_dir / "hansards" / "test.en", 2000) if len(line.split()) >= 8][:6]
    assert len(src) == 6
    src = src[:3] + [""] + src[3:]  # (an empty line with a prefix gives the prefix itself)
    prefixes = [PREFIX, "", "", PREFIX, "", PREFIX, ""]
    en = Preprocessor(PreparedData.open(root / "data").text_config("en"))
    runs = {}
    for tokenized in (False, True):
        d = tmp_path / ("tok" if tokenized else "plain")
        d.mkdir()
        _write(d / "in.en", [" ".join(en.words(s)) for s in src] if tokenized else src)
        _write(d / "prefix.fr", [" ".join(FR_WORDS.words(p)) for p in prefixes] if tokenized else prefixes)
        out = _translate_cli(ckpt, d / "in.en", d / "prefix.fr", d / "out.fr", d / "nbest",
                             *how, *(["--tokenized"] if tokenized else []))
        assert len(out) == len(src)
        runs[tokenized] = out, _nbest_texts(d / "nbest", len(src))
    (plain, plain_nbest), (tok, tok_nbest) = runs[False], runs[True]
    assert all(SPM_SPACE not in h for h in plain + tok)
    n = int(how[-1])
    assert [len(e) for e in plain_nbest] == [len(e) for e in tok_nbest] == [n, n, n, 1, n, n, n]
    for k, prefix in enumerate(prefixes):
        assert plain_nbest[k][0] == plain[k] and tok_nbest[k][0] == tok[k]
        for p, t in zip(plain_nbest[k], tok_nbest[k]):  # the best, and every other entry
            words = FR_WORDS.detokenize(t.split())
            if prefix:  # (the prefix as written, "ici .", not as detokenised, "ici.")
                assert t.startswith(PREFIX) and p.startswith(PREFIX), (k, t, p)
                if words.startswith(PREFIX_TEXT):
                    words = PREFIX + words[len(PREFIX_TEXT):]
                else:  # the hypothesis went on with the prefix's last word ("ici ." then "s": "ici .s"): the rest
                    assert not t[len(PREFIX):].startswith(" "), (k, t)  # follows the prefix, without a space
                    words = PREFIX + FR_WORDS.detokenize(t[len(PREFIX):].split())
            assert p == words, (k, p, t)
    assert plain[3] == PREFIX and tok[3] == PREFIX
    # running text, not one glued word: the prefixed lines have the prefix's seven words, and an unprefixed line
    # of two or more words (the oracle above holds each line to its exact text)
    assert all(len(plain[k].split()) >= 7 for k, prefix in enumerate(prefixes) if prefix)
    assert any(len(plain[k].split()) >= 2 for k, prefix in enumerate(prefixes) if not prefix), plain


def test_nmt_serve_models_names_the_sentencepiece_model_by_digest_not_by_its_bytes(spm_data, spm_model):
    """A real server's /models says what is loaded: the SentencePiece model by the SHA-256 of its file, a few
    kilobytes in all, not the base64 of the model (#57: 382 kB before)."""
    import hashlib
    import json
    import re
    import urllib.error
    import urllib.request

    root, _ = spm_data
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-serve"), "-m", str(spm_model), "--port", "0",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+/)", proc.stderr.readline()).group(1)

        def healthy():
            assert proc.poll() is None, "nmt-serve ended"
            try:
                with urllib.request.urlopen(url + "health", timeout=10) as response:
                    return response.status == 200
            except urllib.error.HTTPError:  # (503 while it loads)
                return False

        wait_until(healthy, 180, "nmt-serve's /health to answer 200")
        with urllib.request.urlopen(url + "models", timeout=60) as response:
            body = response.read()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    (model,) = json.loads(body)["models"]
    digest = hashlib.sha256((root / "data" / "spm.model").read_bytes()).hexdigest()
    for side in ("src", "tgt"):
        assert model["preprocessing"][side]["spm_model_sha256"] == digest
        assert "spm_model" not in model["preprocessing"][side]
    assert len(body) < 10_000, len(body)
