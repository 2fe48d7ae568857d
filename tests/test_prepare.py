"""nmtkit.prepare end to end: news-test-2014 (plain and SGML), checked against independent counts in the test.

The expected vocabularies, coverage figures and filtered line numbers are recomputed here from the tokenised text
with collections.Counter and plain Python, never with nmtkit's own counting, ranking or filtering functions.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from nmtkit import files
from nmtkit.errors import InputError
from nmtkit.data.manifest import PreparedData
from nmtkit.prepare import CHUNK, PrepareConfig, prepare
from nmtkit.data.text import Preprocessor

pytestmark = pytest.mark.slow

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
K = {"en": 3000, "fr": 3500}  # small shortlists, so that many tokens fall outside and the cut falls inside a tie
MAX_LEN = 50
N_2014 = 3003


# -- helpers that do not use nmtkit ------------------------------------------------------------------------------


def read_lines(path) -> list[str]:
    """Lines split on \\n only."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def read_tok(path) -> list[list[str]]:
    return [line.split(" ") if line else [] for line in read_lines(path)]


def read_vocab(path) -> tuple[list[str], list[int]]:
    lines = read_lines(path)
    assert lines[0] == "#nmtkit-vocab 1"
    pairs = [line.split("\t") for line in lines[1:]]
    return [p[0] for p in pairs], [int(p[1]) for p in pairs]


def top_k(counts: Counter, k: int) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda tc: (-tc[1], tc[0]))[:k]


def all_files(d) -> dict[str, bytes]:
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}


def independent_filter(src: list[list[str]], tgt: list[list[str]], max_len: int):
    kept, empty, too_long = [], 0, 0
    for n, (s, t) in enumerate(zip(src, tgt), start=1):
        if not s or not t:
            empty += 1
        elif len(s) > max_len or len(t) > max_len:
            too_long += 1
        else:
            kept.append(n)
    return kept, empty, too_long


# -- the runs, shared by the tests of this module ----------------------------------------------------------------


@pytest.fixture(scope="module")
def news(data_dir):
    w = data_dir / "wmt14"
    return {
        "plain": str(w / "newstest2014"),
        "sgml": f"{w / 'sgm' / 'newstest2014-fren-src.en.sgm'},{w / 'sgm' / 'newstest2014-fren-ref.fr.sgm'}",
        "2013": str(w / "newstest2013"),
        "raw_en": str(w / "newstest2014.en"),
        "raw_fr": str(w / "newstest2014.fr"),
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")

    def _run(name, **kw):
        kw.setdefault("src_vocab_size", K["en"])
        kw.setdefault("tgt_vocab_size", K["fr"])
        dest = str(root / name)
        manifest = prepare(PrepareConfig("en", "fr", dest=dest, **kw))
        return dest, manifest

    return _run


@pytest.fixture(scope="module")
def plain(run, news):
    return run("plain", train=[news["plain"]], test=[news["plain"]])


# -- plain vs SGML, determinism, workers -------------------------------------------------------------------------


def test_plain_and_sgml_give_identical_files(run, news, plain):
    sgml_dir, sgml_manifest = run("sgml", train=[news["sgml"]], test=[news["sgml"]])
    a, b = all_files(plain[0]), all_files(sgml_dir)
    assert sorted(a) == sorted(b)
    binarized = [n for n in a if n.endswith((".bin", ".idx")) or n.startswith("vocab.")]
    assert len(binarized) == 2 * 2 * 2 + 2
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    # The manifests differ only in the input file names.
    m1, m2 = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    for m in (m1, m2):
        for s in m["splits"].values():
            s.pop("inputs")
    assert m1 == m2
    assert sgml_manifest["splits"]["test"]["inputs"] == [news["sgml"].split(",")]


def test_second_run_with_two_workers_gives_identical_bytes(run, news, plain):
    # A second run of the same settings, with --workers 2: the same bytes, manifest included. This proves both
    # run-to-run determinism and independence from the number of workers on the full news-test-2014.
    two, _ = run("plain-j2", train=[news["plain"]], test=[news["plain"]], workers=2)
    assert N_2014 > 2 * CHUNK  # more chunks than workers, so results really come back from both processes
    assert all_files(two) == all_files(plain[0])


def test_running_twice_gives_identical_bytes_with_learned_bpe(run, news, tmp_path):
    # The BPE-learning path (word counts, subword-nmt's merge ranking) run twice, on the first 600 pairs.
    for lang in ("en", "fr"):
        (tmp_path / f"head.{lang}").write_text("".join(line + "\n" for line in read_lines(news[f"raw_{lang}"])[:600]),
                                               encoding="utf-8")
    kw = dict(train=[str(tmp_path / "head")], bpe_merges=300)
    first, _ = run("bpe-head-1", **kw)
    second, _ = run("bpe-head-2", **kw)
    files = all_files(first)
    assert "bpe.codes" in files and len(files["bpe.codes"].splitlines()) > 100
    assert all_files(second) == files


# -- counts, tokens, ids -----------------------------------------------------------------------------------------


def test_line_counts(news, plain):
    dest, manifest = plain
    for lang in ("en", "fr"):
        raw = open(news[f"raw_{lang}"], "rb").read()
        assert raw.count(b"\n") == N_2014 and raw.endswith(b"\n")
    train, test = manifest["splits"]["train"], manifest["splits"]["test"]
    assert train["lines_in"] == test["lines_in"] == test["lines_out"] == N_2014
    data = PreparedData.open(dest)
    assert sorted(data.splits) == ["test", "train"]
    for lang in ("en", "fr"):
        assert len(read_lines(os.path.join(dest, f"test.tok.{lang}"))) == N_2014
        assert len(read_lines(os.path.join(dest, f"train.tok.{lang}"))) == N_2014  # unfiltered
        assert len(data.corpus("test", lang)) == N_2014
        assert len(data.corpus("train", lang)) == train["lines_out"]


def test_tok_files_are_the_moses_tokens_of_each_input_line(news, plain):
    dest = plain[0]
    for lang in ("en", "fr"):
        norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
        expected = [tok.tokenize(norm.normalize(line), escape=False) for line in read_lines(news[f"raw_{lang}"])]
        assert read_tok(os.path.join(dest, f"test.tok.{lang}")) == expected
        assert read_tok(os.path.join(dest, f"train.tok.{lang}")) == expected


def test_filtering_and_train_kept(plain):
    dest, manifest = plain
    src, tgt = read_tok(os.path.join(dest, "train.tok.en")), read_tok(os.path.join(dest, "train.tok.fr"))
    kept = [int(x) for x in read_lines(os.path.join(dest, "train.kept"))]
    train = manifest["splits"]["train"]
    removed = train["removed"]
    assert removed["empty"] + removed["too_long"] == train["lines_in"] - train["lines_out"]
    assert len(kept) == train["lines_out"]
    assert kept == sorted(set(kept)) and 1 <= kept[0] and kept[-1] <= N_2014
    exp_kept, exp_empty, exp_long = independent_filter(src, tgt, MAX_LEN)
    assert (kept, removed["empty"], removed["too_long"]) == (exp_kept, exp_empty, exp_long)
    assert exp_long > 100  # news-test-2014 has many long sentences: the filter really worked
    # A few lines by hand: every kept pair fits, every line not kept has a side over the limit.
    dropped = sorted(set(range(1, N_2014 + 1)) - set(kept))
    for n in kept[:5] + kept[-5:]:
        assert 0 < len(src[n - 1]) <= MAX_LEN and 0 < len(tgt[n - 1]) <= MAX_LEN
    for n in dropped[:5] + dropped[-5:]:
        assert max(len(src[n - 1]), len(tgt[n - 1])) > MAX_LEN
    # Training sentence j is input line kept[j], token for token.
    data = PreparedData.open(dest)
    for lang, toks in (("en", src), ("fr", tgt)):
        corpus = data.corpus("train", lang)
        assert corpus.sizes.tolist() == [len(toks[n - 1]) for n in kept]


def test_vocabularies_are_the_top_k_of_the_filtered_training_side(plain):
    dest, manifest = plain
    kept = [int(x) for x in read_lines(os.path.join(dest, "train.kept"))]
    for lang in ("en", "fr"):
        toks = read_tok(os.path.join(dest, f"train.tok.{lang}"))
        counts = Counter(t for n in kept for t in toks[n - 1])
        ranked = sorted(counts.items(), key=lambda tc: (-tc[1], tc[0]))
        k = K[lang]
        assert ranked[k - 1][1] == ranked[k][1]  # the cut falls inside a tie: tie-breaking decides who is in
        expected = top_k(counts, k)
        tokens, tcounts = read_vocab(os.path.join(dest, f"vocab.{lang}"))
        assert tokens == SPECIALS + [t for t, _ in expected]
        assert tcounts == [0, 0, 0, 0] + [c for _, c in expected]
        v = manifest["vocab"][lang]
        assert (v["size"], v["shortlist"], v["types_in_training"]) == (k + 4, k, len(counts))
        assert v["dtype"] == "uint16"


def test_coverage_and_token_counts_match_an_independent_count(plain):
    dest, manifest = plain
    kept = [int(x) for x in read_lines(os.path.join(dest, "train.kept"))]
    for lang in ("en", "fr"):
        toks = read_tok(os.path.join(dest, f"train.tok.{lang}"))
        train_counts = Counter(t for n in kept for t in toks[n - 1])
        shortlist = {t for t, _ in top_k(train_counts, K[lang])}
        test_counts = Counter(t for line in read_tok(os.path.join(dest, f"test.tok.{lang}")) for t in line)
        for split, counts in (("train", train_counts), ("test", test_counts)):
            total = sum(counts.values())
            inside = sum(c for t, c in counts.items() if t in shortlist)
            s = manifest["splits"][split]
            assert s["coverage"][lang] == pytest.approx(inside / total, abs=1e-6), (split, lang)
            assert s["tokens"][lang] == total
        assert 0.5 < manifest["splits"]["train"]["coverage"][lang] < 1.0
        # Test is the same text unfiltered: its long sentences bring tokens outside the shortlist of the short ones.
        assert manifest["splits"]["test"]["coverage"][lang] < manifest["splits"]["train"]["coverage"][lang]
    on_disk = json.load(open(os.path.join(dest, "manifest.json"), encoding="utf-8"))
    assert on_disk == manifest


def test_ids_round_trip_to_tokens(plain):
    dest, _ = plain
    data = PreparedData.open(dest)
    kept = [int(x) for x in read_lines(os.path.join(dest, "train.kept"))]
    for lang in ("en", "fr"):
        tokens, _ = read_vocab(os.path.join(dest, f"vocab.{lang}"))
        inside = set(tokens[4:])
        toks = read_tok(os.path.join(dest, f"test.tok.{lang}"))
        test = data.corpus("test", lang)
        unk = 0
        for i in range(N_2014):
            got = [tokens[j] for j in test[i]]
            assert got == [t if t in inside else "<unk>" for t in toks[i]], i
            unk += got.count("<unk>")
        assert unk > 0
        train = data.corpus("train", lang)
        train_toks = read_tok(os.path.join(dest, f"train.tok.{lang}"))
        for j in (0, 1, len(kept) // 2, len(kept) - 1):
            assert [tokens[i] for i in train[j]] == [t if t in inside else "<unk>" for t in train_toks[kept[j] - 1]]
        # The library's own decoder agrees.
        vocab = data.vocab(lang)
        assert vocab.decode(test[5]) == [tokens[j] for j in test[5]]


# -- several training corpora, BPE, splits -----------------------------------------------------------------------


def test_several_train_prefixes_are_concatenated(run, news, plain, tmp_path):
    n_head = 400  # the first lines of news-test-2013, then all of news-test-2014
    for lang in ("en", "fr"):
        (tmp_path / f"nt13.{lang}").write_text(
            "".join(line + "\n" for line in read_lines(news["2013"] + f".{lang}")[:n_head]), encoding="utf-8")
    head = str(tmp_path / "nt13")
    dest, manifest = run("concat", train=[head, news["plain"]])
    train = manifest["splits"]["train"]
    assert train["lines_in"] == n_head + N_2014
    assert train["inputs"] == [[head + ".en", head + ".fr"], [news["plain"] + ".en", news["plain"] + ".fr"]]
    kept = [int(x) for x in read_lines(os.path.join(dest, "train.kept"))]
    base_kept = [int(x) for x in read_lines(os.path.join(plain[0], "train.kept"))]
    assert [n - n_head for n in kept if n > n_head] == base_kept  # line numbers run on across the files
    assert any(n <= n_head for n in kept)
    for lang in ("en", "fr"):
        lines = read_lines(os.path.join(dest, f"train.tok.{lang}"))
        assert len(lines) == n_head + N_2014
        assert lines[n_head:] == read_lines(os.path.join(plain[0], f"train.tok.{lang}"))
    assert list(manifest["splits"]) == ["train"]


def test_bpe_learned_then_given_codes_give_the_same_files(run, news, plain):
    learned, m1 = run("bpe", train=[news["plain"]], bpe_merges=500,
                      src_vocab_size=30000, tgt_vocab_size=30000)
    codes = os.path.join(learned, "bpe.codes")
    code_lines = read_lines(codes)
    assert code_lines[0].startswith("#version") and 0 < len(code_lines) - 1 <= 500
    assert m1["bpe"]["learned_merges"] == 500 and m1["bpe"]["codes_file"] == "bpe.codes"
    # BPE changes the model tokens, never the word-level .tok files.
    for lang in ("en", "fr"):
        name = f"train.tok.{lang}"
        assert open(os.path.join(learned, name), "rb").read() == open(os.path.join(plain[0], name), "rb").read()
    # Training model tokens merge back into the words of their line (the 30,000 shortlist holds every training
    # unit, so there is no <unk> in train).
    data = PreparedData.open(learned)
    pre = Preprocessor(data.text_config("en"))
    assert pre.config.bpe_codes == open(codes, encoding="utf-8").read()
    tokens, _ = read_vocab(os.path.join(learned, "vocab.en"))
    assert len(tokens) < 30004
    words = read_tok(os.path.join(learned, "train.tok.en"))
    kept = [int(x) for x in read_lines(os.path.join(learned, "train.kept"))]
    train = data.corpus("train", "en")
    split_words = 0
    for j in range(0, len(kept), 5):
        units = [tokens[i] for i in train[j]]
        assert "<unk>" not in units
        assert pre.merge_subwords(units) == words[kept[j] - 1]
        split_words += sum(u.endswith("@@") for u in units)
    assert split_words > 100
    assert m1["splits"]["train"]["lines_out"] != plain[1]["splits"]["train"]["lines_out"]  # max-len counts units

    # Given codes, and two workers (the subword pass then runs in the pool too): the same files again.
    given, m2 = run("bpe-given", train=[news["plain"]], bpe_codes=codes, workers=2,
                    src_vocab_size=30000, tgt_vocab_size=30000)
    a, b = all_files(learned), all_files(given)
    assert sorted(a) == sorted(b)
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    assert m2["bpe"]["given_codes"] == codes and m2["splits"] == m1["splits"]
    assert m2["preprocessing"] == m1["preprocessing"] and m2["vocab"] == m1["vocab"]


# -- tiny synthetic corpora (no shared data needed) --------------------------------------------------------------

TRICKY = ["one\rtwo", "a\u2028b", "c\x85d", "e\x0cf", "g\x1ch", "", "i\u2029j\x1dk\x1el", "last line"]


def _write(path, lines):
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))


def test_line_breaking_characters_end_to_end_and_split_names(tmp_path):
    for name in ("train", "valid", "a", "b", "c"):
        _write(tmp_path / f"{name}.en", TRICKY)
        _write(tmp_path / f"{name}.fr", [t.upper() for t in TRICKY])
    dest = tmp_path / "out"
    manifest = prepare(PrepareConfig("en", "fr", train=[str(tmp_path / "train")], valid=str(tmp_path / "valid"),
                                     test=[str(tmp_path / n) for n in "abc"], dest=str(dest)))
    assert list(manifest["splits"]) == ["train", "valid", "test", "test1", "test2"]
    data = PreparedData.open(dest)
    for split in ("valid", "test", "test1", "test2"):
        s = manifest["splits"][split]
        assert s["lines_in"] == s["lines_out"] == len(TRICKY)
        for lang in ("en", "fr"):
            assert len(data.corpus(split, lang)) == len(TRICKY)
            toks = read_tok(dest / f"{split}.tok.{lang}")
            assert len(toks) == len(TRICKY)
            assert toks[1] == (["a", "b"] if lang == "en" else ["A", "B"])
            assert toks[5] == [] and len(data.corpus(split, lang)[5]) == 0
            assert toks[6] == (["i", "j", "k", "l"] if lang == "en" else ["I", "J", "K", "L"])
    train = manifest["splits"]["train"]
    assert train["lines_in"] == len(TRICKY) and train["removed"] == {"empty": 1, "too_long": 0}
    assert read_lines(dest / "train.kept") == ["1", "2", "3", "4", "5", "7", "8"]
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []


def test_bpe_codes_file_with_a_byte_order_mark(tmp_path):
    """A codes file saved with a UTF-8 byte-order mark (as some editors do) gives the same preparation as without:
    the mark would otherwise glue itself to the version line, which then passes for a merge, or to the first
    merge's first symbol, which then never matches."""
    words = ["lower", "lowest", "newer", "newest", "wider", "widest", "low", "new"]
    _write(tmp_path / "t.en", [" ".join(words[i:] + words[:i]) for i in range(len(words))])
    _write(tmp_path / "t.fr", [" ".join(reversed(words[i:] + words[:i])) for i in range(len(words))])
    prepare(PrepareConfig("en", "fr", train=[str(tmp_path / "t")], dest=str(tmp_path / "learned"), bpe_merges=12))
    codes = (tmp_path / "learned" / "bpe.codes").read_bytes()
    assert codes.startswith(b"#version")
    for variant, text in (("version", codes), ("no-version", codes.split(b"\n", 1)[1])):
        out = {}
        for bom in (b"", files.BOM):
            name = f"{variant}{'-bom' if bom else ''}"
            (tmp_path / f"{name}.codes").write_bytes(bom + text)
            prepare(PrepareConfig("en", "fr", train=[str(tmp_path / "t")], dest=str(tmp_path / name),
                                  bpe_codes=str(tmp_path / f"{name}.codes")))
            data = PreparedData.open(tmp_path / name)
            out[bom] = ([data.text_config(lang).bpe_codes for lang in ("en", "fr")],
                        {f: (tmp_path / name / f).read_bytes() for f in os.listdir(tmp_path / name)
                         if f.startswith(("vocab.", "train."))})
        assert out[files.BOM] == out[b""], variant
        assert out[b""][0][0] == text.decode("utf-8")  # the codes as given, without a mark
    assert any(t.endswith("@@") for t in read_vocab(tmp_path / "version" / "vocab.en")[0])  # codes applied


def test_max_len_boundary_and_lowercase(tmp_path):
    _write(tmp_path / "t.en", ["A b c", "A b c d", "x", ""])
    _write(tmp_path / "t.fr", ["A b c", "x", "A B C D", "y"])
    dest = tmp_path / "out"
    manifest = prepare(PrepareConfig("en", "fr", train=[str(tmp_path / "t")], dest=str(dest), max_len=3,
                                     lowercase=True))
    assert read_lines(dest / "train.kept") == ["1"]  # exactly max_len is kept, one more is not
    assert manifest["splits"]["train"]["removed"] == {"empty": 1, "too_long": 2}
    assert read_vocab(dest / "vocab.en")[0] == SPECIALS + ["a", "b", "c"]
    assert read_lines(dest / "train.tok.fr")[2] == "a b c d"
    assert manifest["preprocessing"]["en"]["lowercase"] is True


def test_nothing_left_after_filtering_is_an_error(tmp_path):
    _write(tmp_path / "t.en", ["a b c d", ""])
    _write(tmp_path / "t.fr", ["a b c d", "x"])
    with pytest.raises(InputError, match="no training pair is left"):
        prepare(PrepareConfig("en", "fr", train=[str(tmp_path / "t")], dest=str(tmp_path / "out"), max_len=3))
    assert sorted(os.listdir(tmp_path)) == ["t.en", "t.fr"]


def test_length_ratio_and_duplicate_filters_against_an_independent_count(data_dir, tmp_path):
    """Moses' cleaning on 3,000 real Hansards pairs (which repeat short sittings formulas): --max-ratio drops the
    pairs one side of which has more than R times the other's tokens, --dedup exact repeats of an earlier pair;
    both counted in the manifest, the rest of the filtering unchanged."""
    import gzip
    import itertools

    for lang in ("en", "fr"):
        with gzip.open(data_dir / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            (tmp_path / f"h.{lang}").write_text("".join(itertools.islice(f, 3000)), encoding="utf-8")
    plain = prepare(PrepareConfig("en", "fr", [str(tmp_path / "h")], str(tmp_path / "plain"), max_len=40,
                                  src_vocab_size=500, tgt_vocab_size=500))
    cleaned = prepare(PrepareConfig("en", "fr", [str(tmp_path / "h")], str(tmp_path / "clean"), max_len=40,
                                    src_vocab_size=500, tgt_vocab_size=500, max_ratio=2.0, dedup=True))
    src = read_tok(str(tmp_path / "plain" / "train.tok.en"))
    tgt = read_tok(str(tmp_path / "plain" / "train.tok.fr"))
    kept, empty, too_long = independent_filter(src, tgt, 40)
    expected, ratio, duplicate, seen = [], 0, 0, set()
    for n in kept:
        s, t = src[n - 1], tgt[n - 1]
        if max(len(s), len(t)) > 2.0 * min(len(s), len(t)):
            ratio += 1
        elif (tuple(s), tuple(t)) in seen:
            duplicate += 1
        else:
            seen.add((tuple(s), tuple(t)))
            expected.append(n)
    removed = cleaned["splits"]["train"]["removed"]
    assert removed == {"empty": empty, "too_long": too_long, "ratio": ratio, "duplicate": duplicate}
    assert ratio > 10 and duplicate > 10  # (the Hansards has both)
    assert [int(x) for x in read_lines(str(tmp_path / "clean" / "train.kept"))] == expected
    assert plain["splits"]["train"]["removed"] == {"empty": empty, "too_long": too_long}
    assert cleaned["filters"]["max_ratio"] == 2.0 and cleaned["filters"]["dedup"] is True
    with pytest.raises(InputError, match=r"--max-ratio must be a finite number of at least 1 \(got 0.5\)"):
        prepare(PrepareConfig("en", "fr", [str(tmp_path / "h")], str(tmp_path / "x"), max_ratio=0.5))
