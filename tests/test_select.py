"""nmt-select on real data, and as a user runs it.

The real-data run: news (news-test 2010) is the in-domain corpus; the general corpus mixes a Hansards slice
(gzip), Tatoeba, Multi30K and news-test 2012, so the origin of every general pair is known. The selection must be
mostly the news pairs, the outputs must be the original lines in their order, the scores file must agree with
KenLM reading the ARPA files nmt-select wrote, and two workers must give the same bytes as one.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nmtkit.errors import InputError
from nmtkit.select.selection import SelectConfig, select
from nmtkit.select.scores import SCORES_HEADER, read_scores as library_read_scores

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "bin" / "nmt-select"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| nmtkit")
GENERAL = ["hansards", "tatoeba", "multi30k", "news"]  # corpus numbers 1..4 in the scores file
NEWS = 4
TOP = 1500


def read_lines(path) -> list[str]:
    """Lines split on \\n only (gzip or plain)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        text = f.read().decode("utf-8")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def write_lines(path: Path, lines) -> Path:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def read_scores(path):
    """(header comment lines, column names, rows as dicts) of a scores file."""
    lines = read_lines(path)
    comments = [line for line in lines if line.startswith("#")]
    cols = lines[len(comments)].split("\t")
    rows = [dict(zip(cols, line.split("\t"))) for line in lines[len(comments) + 1:]]
    return comments, cols, rows


@pytest.fixture(scope="module")
def mixture(data_dir, tmp_path_factory):
    """The general corpus: four prefixes in a temporary directory, and the in-domain prefix."""
    d = tmp_path_factory.mktemp("mixture")
    for lang in ("en", "fr"):
        parts = {"hansards": read_lines(data_dir / "hansards" / f"train.{lang}.gz")[200000:208000],
                 "tatoeba": read_lines(data_dir / "tatoeba" / f"fra-eng.{lang}.gz")[::37][:2000],
                 "multi30k": read_lines(data_dir / "multi30k" / f"train.{lang}")[:2000],
                 "news": read_lines(data_dir / "wmt14" / f"newstest2012.{lang}")}
        for name, lines in parts.items():
            write_lines(d / (f"{name}.{lang}.gz" if name == "hansards" else f"{name}.{lang}"), lines)
    return d, str(data_dir / "wmt-news-older" / "newstest2010")


def run_select(mixture, out: Path, **kw) -> dict:
    d, in_domain = mixture
    cfg = SelectConfig(source_lang="en", target_lang="fr", in_domain=[in_domain],
                       general=[str(d / name) for name in GENERAL], output=str(out), **kw)
    return select(cfg)


@pytest.fixture(scope="module")
def selected(mixture, tmp_path_factory):
    out = tmp_path_factory.mktemp("selected") / "sel"
    report = run_select(mixture, out, top_pairs=TOP, workers=2, write_arpa=True)
    return out, report


# -- real data -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_selects_mostly_the_news_pairs(selected):
    out, report = selected
    _, _, rows = read_scores(f"{out}.scores")
    origin = np.array([int(r["corpus"]) for r in rows])
    chosen = np.array([r["selected"] == "1" for r in rows])
    words = np.array([int(r["tokens_en"]) for r in rows])
    assert chosen.sum() == TOP == report["selected"]["pairs"]
    base = (origin == NEWS).mean()  # 3,003 news pairs of 15,003
    precision = (origin[chosen] == NEWS).mean()
    word_precision = words[chosen & (origin == NEWS)].sum() / words[chosen].sum()
    print(f"news: {base:.3f} of the general pairs, {precision:.3f} of the selected pairs, "
          f"{word_precision:.3f} of the selected words")
    assert precision > 0.6 and precision > 3 * base
    assert word_precision > 0.7
    # the in-domain model is the better model of held-out news, in both languages
    for lang in ("en", "fr"):
        m = report["models"][lang]
        assert all(m["in"]["heldout_perplexity"] < 0.75 * g["heldout_perplexity"] for g in m["gen"])


def test_each_general_sample_comes_from_the_other_fold():
    from nmtkit.select.config import fold_of
    from nmtkit.select.selection import _draw_samples

    folds = np.array([fold_of(i) for i in range(10001)], dtype=np.int8)
    assert 4500 < (folds == 0).sum() < 5500  # the hash splits the pairs about evenly
    take = _draw_samples(folds, [60000, 61000], in_raw=12000, seed=3)
    for k in (0, 1):
        picked = np.flatnonzero(take == k)
        assert len(picked) and (folds[picked] != k).all()  # model k (scoring fold k) never sees a pair of fold k
        other = (folds != k).sum()
        assert len(picked) == round(other * 12000 / [61000, 60000][k])  # about the in-domain size in raw words
    assert (_draw_samples(folds, [60000, 61000], 12000, seed=3) == take).all()
    # a pair's fold is its position's, whatever its text: copies of a line fall in both folds
    assert [fold_of(i) for i in range(6)] == [int(f) for f in folds[:6]] and len(set(folds[:40].tolist())) == 2


@pytest.mark.slow
def test_a_general_models_own_sentences_are_never_scored_by_it(selected, mixture):
    """The pairs drawn into a general model's sample get the same H_gen as the pairs that were not (their fold's
    model never saw them); when one model scored its own sample, those pairs looked far more "general" (a median
    H_gen of ~3.4 bits per token against ~7.2 under the in-domain model, bench_select_enrichment.txt) and were
    never selected."""
    from nmtkit.select.config import fold_of
    from nmtkit.select.selection import _draw_samples, _general_sizes, _read, _resolve

    out, report = selected
    d, _ = mixture
    files = [_resolve(str(d / name), ["en", "fr"]) for name in GENERAL]
    _, raw, folds = _general_sizes(files, [0, 1])
    take = _draw_samples(folds, raw, report["in_domain"]["raw_words"], seed=1)
    assert [int((take == k).sum()) for k in (0, 1)] == [m["pairs"] for m in report["general"]["sample"]["models"]]
    _, _, rows = read_scores(f"{out}.scores")
    assert [int(r["fold"]) for r in rows] == [fold_of(i) for i, _ in enumerate(_read(files))] == folds.tolist()
    origin = np.array([int(r["corpus"]) for r in rows])
    for lang in ("en", "fr"):
        h_gen = np.array([float(r[f"h_gen_{lang}"]) for r in rows])
        for corpus in range(1, len(GENERAL) + 1):
            ok = (origin == corpus) & np.isfinite(h_gen)
            sampled, unsampled = np.median(h_gen[ok & (take >= 0)]), np.median(h_gen[ok & (take < 0)])
            assert abs(sampled - unsampled) < 0.1 * unsampled, (lang, GENERAL[corpus - 1], sampled, unsampled)


@pytest.mark.slow
def test_outputs_are_the_original_lines_in_order(selected, mixture):
    out, report = selected
    d, _ = mixture
    _, _, rows = read_scores(f"{out}.scores")
    for lang in ("en", "fr"):
        originals = {k: read_lines(d / (f"{name}.{lang}.gz" if name == "hansards" else f"{name}.{lang}"))
                     for k, name in enumerate(GENERAL, start=1)}
        expected = [originals[int(r["corpus"])][int(r["line"]) - 1] for r in rows if r["selected"] == "1"]
        assert read_lines(f"{out}.{lang}") == expected
    assert len(rows) == 15003 == sum(report["general"]["pairs"])
    assert [int(r["line"]) for r in rows if r["corpus"] == "2"] == list(range(1, 2001))


@pytest.mark.slow
def test_scores_file_and_report(selected):
    out, report = selected
    comments, cols, rows = read_scores(f"{out}.scores")
    assert comments[0] == SCORES_HEADER
    assert cols == ["corpus", "line", "fold", "score", "h_in_en", "h_gen_en", "tokens_en", "h_in_fr", "h_gen_fr",
                    "tokens_fr", "selected"]
    assert {r["fold"] for r in rows} == {"0", "1"}  # (each row's fold against its text: the test below)
    score = np.array([float(r["score"]) for r in rows])
    diff = sum(np.array([float(r[f"h_in_{x}"]) - float(r[f"h_gen_{x}"]) for r in rows]) for x in ("en", "fr"))
    ok = ~np.isnan(score)
    assert np.allclose(score[ok], diff[ok], atol=1e-5)
    empty = np.array([r["tokens_en"] == "0" or r["tokens_fr"] == "0" for r in rows])
    assert (np.isnan(score) == empty).all()
    chosen = np.array([r["selected"] == "1" for r in rows])
    assert score[chosen].max() <= score[ok & ~chosen].min()  # the lowest scores, and nothing unscored
    assert score[chosen].max() == pytest.approx(report["selected"]["last_score"], abs=1e-6)
    assert report["selected"]["tokens"]["en"] == sum(int(r["tokens_en"]) for r in rows if r["selected"] == "1")
    lib = library_read_scores(f"{out}.scores")  # the library's reader agrees with the parsing here
    assert lib.corpora[NEWS - 1][0].endswith("news.en") and len(lib.corpora) == 4
    assert (lib.columns["selected"] == chosen).all() and np.allclose(lib.columns["score"], score, equal_nan=True)
    # each general LM's sample is a random sample of about the in-domain size, from the other fold
    sample, in_domain = report["general"]["sample"], report["in_domain"]
    assert [m["scores_fold"] for m in sample["models"]] == [0, 1]
    for m in sample["models"]:
        assert 0.8 < m["tokens"]["en"] / in_domain["tokens"]["en"] < 1.25
    assert in_domain["heldout_pairs"] == in_domain["pairs"] // 10
    saved = json.loads(Path(f"{out}.report.json").read_text(encoding="utf-8"))
    assert saved["selected"] == report["selected"] and saved["settings"]["top_pairs"] == TOP


@pytest.mark.slow
def test_kenlm_agrees_with_the_scores(selected, mixture, kenlm):
    from nmtkit.data.text import Preprocessor, TextConfig

    out, _ = selected
    d, _ = mixture
    _, _, rows = read_scores(f"{out}.scores")
    worst = 0.0
    for lang in ("en", "fr"):
        pre = Preprocessor(TextConfig(lang))
        lines = {k: read_lines(d / (f"{name}.{lang}.gz" if name == "hansards" else f"{name}.{lang}"))
                 for k, name in enumerate(GENERAL, start=1)}
        sample = [r for i, r in enumerate(rows) if i % 25 == 0 and r[f"tokens_{lang}"] != "0"]  # 600 pairs
        for m in ("in", "gen0", "gen1"):
            model = kenlm.Model(f"{out}.{m}.{lang}.arpa")
            for r in sample:
                if m != "in" and r["fold"] != m[-1]:
                    continue  # H_gen comes from the general model of the pair's fold
                words = pre.words(lines[int(r["corpus"])][int(r["line"]) - 1])
                assert len(words) == int(r[f"tokens_{lang}"])
                h = -model.score(" ".join(words), bos=True, eos=True) * math.log2(10) / (len(words) + 1)
                worst = max(worst, abs(h - float(r[f"h_{m.rstrip('01')}_{lang}"])))
    print(f"largest difference from KenLM: {worst:.2e} bits per token")
    assert worst < 1e-4


@pytest.mark.slow
def test_one_worker_gives_the_same_bytes(selected, mixture, tmp_path):
    out2, _ = selected
    out1 = tmp_path / "sel"
    run_select(mixture, out1, top_pairs=TOP, workers=1, write_arpa=True)
    for suffix in ("en", "fr", "scores", "in.en.arpa", "gen0.fr.arpa", "gen1.en.arpa"):
        assert Path(f"{out1}.{suffix}").read_bytes() == Path(f"{out2}.{suffix}").read_bytes(), suffix


# -- small corpora: modes, monolingual selection, bad input ------------------------------------------------------


@pytest.fixture
def small(data_dir, tmp_path):
    """Small real corpora: in-domain news, general = Hansards and news lines, plus odd lines."""
    d = tmp_path / "in"
    d.mkdir()
    for lang in ("en", "fr"):
        news = read_lines(data_dir / "wmt-news-older" / f"newstest2011.{lang}")
        write_lines(d / f"news.{lang}", news[:600])
        hans = read_lines(data_dir / "hansards" / f"dev.{lang}")[:150]
        odd = ["  spaces  and\ttab ", "line\rwith CR", "U+2028\u2028inside", "", "x"] if lang == "en" else \
              ["  espaces  et\ttab ", "ligne\ravec CR", "U+2028\u2028dedans", "vide de l'autre côté", ""]
        write_lines(d / f"general.{lang}", hans + news[600:750] + odd)
    return d


def test_threshold_and_raw_lines(small):
    report = select(SelectConfig("en", [str(small / "news")], [str(small / "general")], str(small / "t"),
                                 target_lang="fr", threshold=1e6, order=3))
    assert report["selected"]["pairs"] == 303 and report["general"]["unscored_pairs"] == 2  # the empty sides
    for lang in ("en", "fr"):
        general = read_lines(small / f"general.{lang}")
        kept = [line for i, line in enumerate(general) if i not in (303, 304)]
        assert (small / f"t.{lang}").read_bytes() == ("\n".join(kept) + "\n").encode("utf-8")
    _, _, rows = read_scores(small / "t.scores")
    cut = sorted(float(r["score"]) for r in rows if r["score"] != "nan")[100]
    report = select(SelectConfig("en", [str(small / "news")], [str(small / "general")], str(small / "t"),
                                 target_lang="fr", threshold=cut, order=3))
    assert report["selected"]["pairs"] == 100


@pytest.mark.parametrize("side", ["source", "target"])
def test_one_side_only(small, side):
    report = select(SelectConfig("en", [str(small / "news")], [str(small / "general")], str(small / "m"),
                                 target_lang="fr", side=side, top_words=1000, order=3))
    lang = "en" if side == "source" else "fr"
    assert list(report["models"]) == [lang]
    _, cols, rows = read_scores(small / "m.scores")
    assert cols == ["corpus", "line", "fold", "score", f"h_in_{lang}", f"h_gen_{lang}", f"tokens_{lang}", "selected"]
    picked = sorted((float(r["score"]), int(r[f"tokens_{lang}"])) for r in rows if r["selected"] == "1")
    words = [n for _, n in picked]
    assert sum(words[:-1]) < 1000 <= sum(words)  # the fewest best pairs that hold 1,000 words
    unpicked = [float(r["score"]) for r in rows if r["selected"] == "0" and r["score"] != "nan"]
    assert picked[-1][0] <= min(unpicked)
    assert len(read_lines(small / "m.en")) == len(read_lines(small / "m.fr")) == len(picked)


def test_monolingual_corpora(small):
    for name in ("news", "general"):
        (small / f"{name}.fr").unlink()
    report = select(SelectConfig("en", [str(small / "news")], [str(small / "general")], str(small / "mono"),
                                 side="source", top_pairs=50, order=3))
    assert report["selected"]["pairs"] == 50 and (small / "mono.en").is_file() and not (small / "mono.fr").exists()
    with pytest.raises(InputError, match="only --side source"):
        select(SelectConfig("en", [str(small / "news")], [str(small / "general")], str(small / "x"), top_pairs=1))


def test_seed_changes_the_sample_only(small):
    for lang in ("en", "fr"):  # in-domain data of a third of the general corpus's size
        write_lines(small / f"few.{lang}", read_lines(small / f"news.{lang}")[:80])
    reports = [select(SelectConfig("en", [str(small / "few")], [str(small / "general")], str(small / f"s{seed}"),
                                   target_lang="fr", top_pairs=20, order=3, seed=seed)) for seed in (1, 2, 1)]
    for m in reports[0]["general"]["sample"]["models"]:  # each about the in-domain size, from its half
        assert 60 < m["pairs"] < 160
    tokens = [[m["tokens"] for m in r["general"]["sample"]["models"]] for r in reports]
    assert tokens[0][0] != tokens[1][0] and tokens[0][1] != tokens[1][1]
    assert (small / "s1.scores").read_bytes() != (small / "s2.scores").read_bytes()
    assert reports[0]["general"]["sample"] == reports[2]["general"]["sample"]


def nmt_select(*args, timeout=120):
    return subprocess.run([sys.executable, str(BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def run_bad(directory: Path, *args) -> str:
    """Run with a bad input: one error line, exit code 1, nothing written (no temporary files either)."""
    before = snapshot(directory)
    r = nmt_select(*args)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    others = [line for line in r.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(others) == 1 and others[0].startswith("nmt-select: error: "), r.stderr
    assert snapshot(directory) == before and sorted(os.listdir(directory)) == sorted(before)
    return others[0][len("nmt-select: error: "):]


def test_bad_input(small):
    d = small
    base = ["-s", "en", "-t", "fr", "--order", "3", "-o", d / "out"]
    ok = ["--in-domain", d / "news", "--general", d / "general"]
    write_lines(d / "short.en", read_lines(d / "general.en"))
    write_lines(d / "short.fr", read_lines(d / "general.fr")[:-3])
    msg = run_bad(d, *base, "--in-domain", d / "news", "--general", d / "short", "--top-pairs", "5")
    assert f"{d / 'short.fr'}: has 302 segments but its partner {d / 'short.en'} has 305" in msg
    msg = run_bad(d, *base, "--in-domain", d / "short", "--general", d / "general", "--top-pairs", "5")
    assert "short.fr" in msg and "short.en" in msg
    write_lines(d / "empty.en", ["", ""])
    write_lines(d / "empty.fr", ["", ""])
    msg = run_bad(d, *base, "--in-domain", d / "empty", "--general", d / "general", "--top-pairs", "5")
    assert "in-domain data has no en words" in msg and "empty.en" in msg
    (d / "none.en").write_bytes(b"")
    (d / "none.fr").write_bytes(b"")
    assert "no en words" in run_bad(d, *base, "--in-domain", d / "none", "--general", d / "general",
                                    "--top-pairs", "5")
    assert "the general corpus is empty" in run_bad(d, *base, "--in-domain", d / "news", "--general", d / "none",
                                                    "--top-pairs", "5")
    write_lines(d / "one.en", ["The House rose."])
    write_lines(d / "one.fr", ["La séance est levée."])
    msg = run_bad(d, *base, "--in-domain", d / "news", "--general", d / "one", "--top-pairs", "1")
    assert "one.en: the general corpus's 1 pair(s) all fall in one fold" in msg
    msg = run_bad(d, *base, *ok, "--top-pairs", "400")
    assert "--top-pairs 400 asks for more pairs than the general corpus has (303 scored pairs of 305)" in msg
    assert "asks for more source words" in run_bad(d, *base, *ok, "--top-words", "10000000")
    assert "exactly one of" in run_bad(d, *base, *ok, "--top-pairs", "5", "--threshold", "0")
    assert "exactly one of" in run_bad(d, *base, *ok)
    assert "--order must be at least 2" in run_bad(d, *base, *ok, "--top-pairs", "5", "--order", "1")
    assert "no such directory" in run_bad(d, *base[:-1], d / "nowhere" / "out", *ok, "--top-pairs", "5")
    assert "is an input" in run_bad(d, *base[:-1], d / "general", *ok, "--top-pairs", "5")
    assert "no en file" in run_bad(d, *base, "--in-domain", d / "news", "--general", d / "nothing",
                                   "--top-pairs", "5")
    (d / "bad.en").write_bytes(b"fine\nbad \xe9 byte\n")
    (d / "bad.fr").write_bytes(b"bien\nmauvais\n")
    assert run_bad(d, *base, "--in-domain", d / "news", "--general", d / "bad", "--top-pairs", "1") \
        .startswith(f"{d / 'bad.en'}:2: invalid UTF-8")


def test_cli_runs_and_reports(small):
    r = nmt_select("-s", "en", "-t", "fr", "--in-domain", small / "news", "--general", small / "general",
                   "--top-pairs", "10", "--order", "3", "-o", small / "cli", "--scores", small / "cli.tsv",
                   "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "held-out in-domain perplexity" in r.stderr and "selected 10 of 305 pairs" in r.stderr
    assert len(read_lines(small / "cli.en")) == 10 and (small / "cli.tsv").is_file()
    assert not (small / "cli.scores").exists()
    assert not [p for p in os.listdir(small) if p.startswith(".")]  # no temporary leftovers
    r = nmt_select("--help")
    assert r.returncode == 0 and "--top-words" in r.stdout
