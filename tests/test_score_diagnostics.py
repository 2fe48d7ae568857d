"""nmt-score's reader's figures (nmtkit/score/diagnostics.py): numbers carried, repeated n-grams, ``<unk>``.

Hand-made lines pin every reading rule (separators by each language's convention, percent signs, ordinals, times,
magnitudes) and every count (multisets, the reference's excuse for a repeat); then the real ``nmt-score`` command on
news-test-2014 and Edinburgh's Moses output, and on copies of that output damaged in known ways, must report what
the damage did.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from nmtkit.score.diagnostics import UNK, Diagnostics, compare_numbers, excess_repeats, numbers, summary

from conftest import REPO, lines_of

SCORE = [sys.executable, str(REPO / "bin" / "nmt-score")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# -- reading numbers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("english, french", [
    ("1,234.5", "1 234,5"),  # thousands and decimals, each by its own convention
    ("1,234.5", "1.234,5"),
    ("1,234.5", "1\u00a0234,5"),
    ("1,234.5", "1\u202f234,5"),
    ("1,234,567.5", "1 234 567,5"),
    ("1,234,567.5", "1.234.567,5"),
    ("3.5", "3,5"),
    ("3.50", "3,5"),  # no trailing decimal zeros
    ("1234", "1234"),
    ("a 1,000 mile trip", "un voyage de1 000 miles"),  # glued to a word, as in news-test-2014's reference
    ("£38 000 million", "38 milliards de livres"),  # an English space group; magnitudes
    ("63%", "63 p. 100"),  # the Hansards' percent
    ("63%", "63 %"),
    ("63 per cent", "63 pour 100"),
    ("the 1st of May", "le 1er mai"),  # ordinals: the digits count
    ("the 2nd", "le 2e"),
    ("at 9.30pm", "à 21h30"),  # times: the 24-hour hour and the minutes
    ("at 5am", "à 5h00"),
    ("at 10:00", "à 10 h"),
    ("the 19th century", "le XIXe siècle"),
    ("CAD 1,360 million", "1,36 milliard"),
    ("$32.6 billion", "32,6 Md$"),
    ("£1.5million", "1,5 M£"),
    ("$5.3tn", "5,3 billions de dollars"),  # French "billion" is English "trillion"
    ("the 2001-2002 session", "la session 2001-2002"),  # a range is one number
    ("the 2010-11 season", "la saison 2010-2011"),  # its short end is the year it abbreviates
    ("$4-5 million", "de 4 à 5 millions de dollars"),  # its ends written apart, in its order
    ("a 5-4 vote", "5 voix contre 4"),
    ("on 30 March 2013", "le 30 mars 2013"),  # a date's month is a number
    ("on March 30, 2013", "le 30 mars 2013"),
    ("from 4 to 10 May", "du 4 au 10 mai"),
    ("in March 2013", "en mars 2013"),
    ("on 30/03/2013", "le 30/03/2013"),
])
def test_an_english_number_and_its_french_writing_are_the_same(english, french):
    src, fr = numbers(english, "en"), numbers(french, "fr")
    assert src and compare_numbers(src, fr) == (len(src), [], []), (src, fr)


def test_each_side_reads_the_ambiguous_separator_by_its_own_language():
    assert numbers("1,234 people", "en") == ["1234"]  # English: a thousands comma
    assert numbers("1,234 personnes", "fr") == ["1.234"]  # French: a decimal comma
    assert numbers("1.234 personnes", "fr") == ["1234"]  # French: a thousands dot
    assert numbers("1.234 people", "en") == ["1.234"]
    assert numbers("1,5 million", "fr") == ["1.5e6"] and numbers("1.5 million", "fr") == ["1.5e6"]  # unambiguous
    # so a French translation that keeps the English comma does not carry the number (news-test-2014 line 1888)
    assert compare_numbers(numbers("120,296 people have died", "en"),
                           numbers("120,296 personnes ont trouvé la mort", "fr")) == (0, ["120296"], ["120.296"])


def test_grouping_needs_groups_of_three_after_a_short_lead():
    assert numbers("en 1999 300 personnes", "fr") == ["1999", "300"]
    assert numbers("entre 10 et 12 000", "fr") == ["10", "12000"]
    assert numbers("le 17 12 mai", "fr") == ["17", "12", "month 5"]  # (a date's month is a number: below)
    assert numbers("in 2008, 1,073 people", "en") == ["2008", "1073"]
    assert numbers("09 and 007", "en") == ["9", "7"]


def test_magnitudes_are_amounts_but_a_bare_number_keeps_its_digits():
    assert numbers("a $90-million project", "en") == ["90e6"]
    assert numbers("50m high", "en") == ["50"] and numbers("£38m", "en") == ["38e6"]  # "m" only after a currency
    assert numbers("15 M d'habitants", "fr") == ["15"] and numbers("15 M$", "fr") == ["15e6"]
    # "$325 million and $340 million" → "entre 325 et 340 M$": the range writes the magnitude once
    assert compare_numbers(numbers("$325 million and $340 million", "en"),
                           numbers("entre 325 et 340 M$", "fr")) == (2, [], [])
    # the false friend: a billion is a milliard, a French billion is 1,000 times more
    assert compare_numbers(numbers("2.2 billion", "en"), numbers("2,2 billions", "fr")) == (0, ["2.2e9"], ["2.2e12"])


def test_numbers_are_compared_as_multisets():
    src = numbers("In 2008 and 2008 again, 63% voted; 12 abstained.", "en")
    assert src == ["2008", "2008", "63", "12"]
    assert compare_numbers(src, numbers("En 2008 et de nouveau en 2008, 63 % ont voté ; 12 se sont abstenus.", "fr")) \
        == (4, [], [])
    # a missing number, a duplicated one carried once, an invented one
    assert compare_numbers(src, numbers("En 2008, 63 % ont voté ; 12 se sont abstenus.", "fr")) == (3, ["2008"], [])
    assert compare_numbers(src, numbers("En 2008 et 2008, 23 % ont voté ; 12 se sont abstenus.", "fr")) \
        == (3, ["63"], ["23"])
    assert compare_numbers(["5"], numbers("5 et 5", "fr")) == (1, [], ["5"])  # said twice: the second is beyond


def test_number_figures_over_lines_with_the_reference_as_the_ceiling():
    source = ["Revenue rose 63% to 1,234.5 million.", "No number here.", "Sales fell 8% in 2013.", "Twice: 7, 7."]
    reference = ["Le chiffre d'affaires a augmenté de 63 p. 100, à 1 234,5 millions.", "Pas de chiffre.",
                 "Les ventes ont baissé de 8 %.", "Deux fois : 7, 7."]
    hypothesis = ["Le chiffre d'affaires a augmenté de 63 % à 1.234,5 millions.", "Pas de chiffre en 1999.",
                  "Les ventes ont baissé de 3 % en 2013.", "Deux fois : 7."]
    diag = Diagnostics(reference, source, "en", "fr")
    ref = diag.reference["numbers"]
    assert (ref["carried"], ref["of"], ref["invented_lines"]) == (5, 6, 0)
    assert ref["lines"] == [{"line": 3, "missing": ["2013"], "invented": []}]
    got = diag.of(hypothesis)["numbers"]
    assert (got["carried"], got["of"], got["share"], got["invented_lines"]) == (4, 6, 4 / 6, 2)
    assert got["lines"] == [{"line": 2, "missing": [], "invented": ["1999"]},
                            {"line": 3, "missing": ["8"], "invented": ["3"]},
                            {"line": 4, "missing": ["7"], "invented": []}]
    assert "numbers 66.7% carried (4 of 6; reference 83.3%), 2 lines invent one" in summary(diag.of(hypothesis),
                                                                                           diag.reference)
    without = Diagnostics(reference, None, "en", "fr")
    assert without.reference["numbers"] is None and without.of(hypothesis)["numbers"] is None
    assert "numbers" not in summary(without.of(hypothesis), without.reference)


def test_a_number_is_carried_only_as_a_whole():
    """#57 item 9: a range written backwards, a month changed and a "page 30" were "numbers 100% carried"."""
    source = numbers("The 2001-2002 report was tabled on 30 March at 9.30pm.", "en")
    assert source == ["2001-2002", "30", "month 3", "21:30"]
    hypothesis = numbers("Le rapport 2002-2001 a été déposé le 30 avril à 21 h, page 30.", "fr")
    assert hypothesis == ["2002-2001", "30", "month 4", "21", "30"]
    assert compare_numbers(source, hypothesis) == (1, ["2001-2002", "21:30", "month 3"],
                                                   ["2002-2001", "21", "30", "month 4"])
    # a range's ends in the other order, apart or joined, do not carry it; nor do its pieces as another range's
    assert compare_numbers(["2001-2002"], numbers("de 2002 à 2001", "fr")) == (0, ["2001-2002"], ["2001", "2002"])
    assert compare_numbers(["2001-2002"], numbers("2001-2002-2003", "fr"))[0] == 0
    assert compare_numbers(numbers("from 2001 to 2002", "en"), numbers("2001-2002", "fr")) == (2, [], [])
    # a month's name is a number only in a date; Theresa May is none, nor is a date's month without both languages
    assert numbers("Mrs May met 5 ministers in May.", "en") == ["5"]
    assert numbers("on 30 March", "en", dates=False) == ["30"]
    german = Diagnostics(["am 30. März"], ["on 30 March"], "en", "de")
    assert german.source_numbers == [["30"]] and german.reference["numbers"]["carried"] == 1


def test_the_lines_that_change_a_number_are_named():
    source = ["The 2001-2002 report was tabled on 30 March.", "No number.", "In 2008, 12 voted.", "Page 7."] * 3
    reference = ["Le rapport 2001-2002 a été déposé le 30 mars.", "Rien.", "En 2008, 12 ont voté.", "Page 7."] * 3
    again = ["Le rapport 2001-2002 a été déposé le 30 mars.", "Rien.", "En 2008, 13 ont voté.", "Page."]
    hypothesis = ["Le rapport 2002-2001 a été déposé le 30 avril, page 30.", "Rien en 1999.",
                  "En 2008, 12 ont voté.", "Page 7."] + again * 2
    diag = Diagnostics(reference, source, "en", "fr")
    assert diag.reference["numbers"]["changed_lines"] == [] and diag.reference["numbers"]["share"] == 1
    got = diag.of(hypothesis)["numbers"]
    # line 2 invents a number but changes none; lines 8 and 12 lose one and invent none
    assert got["changed_lines"] == [1, 7, 11] and got["invented_lines"] == 4
    assert (got["carried"], got["of"]) == (12, 18)
    line = summary(diag.of(hypothesis), diag.reference)
    assert "numbers 66.7% carried (12 of 18; reference 100.0%), 4 lines invent one, 3 lines change one " \
           "(lines 1, 7, 11) · " in line, line
    many = Diagnostics(["x"] * 12, ["in 2001"] * 12, "en", "fr")
    assert "12 lines change one (lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …)" in summary(many.of(["en 2002"] * 12),
                                                                                     many.reference)
    one = Diagnostics(["x"], ["in 2001"], "en", "fr")
    assert "1 line invents one, 1 line changes one (line 1)" in summary(one.of(["en 2002"]), one.reference)


def test_the_command_names_the_lines_that_change_a_number(tmp_path):
    src = write(tmp_path / "src.en", ["The 2001-2002 report was tabled on 30 March.", "In 2008, 12 voted."])
    ref = write(tmp_path / "ref.fr", ["Le rapport 2001-2002 a été déposé le 30 mars.", "En 2008, 12 ont voté."])
    hyp = write(tmp_path / "hyp.fr", ["Le rapport 2002-2001 a été déposé le 30 avril, page 30.",
                                      "En 2008, 12 ont voté."])
    out = run_score("-r", ref, "-s", src, "--metrics", "BLEU", hyp).stdout
    assert "numbers 60.0% carried (3 of 5; reference 100.0%), 1 line invents one, 1 line changes one (line 1)" in out
    report = json.loads(run_score("-r", ref, "-s", src, "--metrics", "BLEU", "--json", hyp).stdout)
    numbers_ = report["systems"][0]["diagnostics"]["numbers"]
    assert numbers_["changed_lines"] == [1] and numbers_["lines"] == [
        {"line": 1, "missing": ["2001-2002", "month 3"], "invented": ["2002-2001", "30", "month 4"]}]


# -- repeats and <unk> -----------------------------------------------------------------------------------------


def test_a_repeat_counts_only_beyond_the_references_own():
    ref = "Il a parlé de la paix et de la guerre."
    assert excess_repeats("Il parle à Ottawa, à Ottawa, à Ottawa.", ref, 3) == ["à Ottawa, à"]  # ("Ottawa." ends)
    assert excess_repeats("Il a parlé de la paix et de la guerre.", ref, 2) == []  # as often as the reference
    assert excess_repeats("de la paix, de la guerre, de la faim", ref, 2) == ["de la"]  # more often than it
    assert excess_repeats("le Le le", None, 1) == ["le"]  # case-sensitive; without a reference, every repeat
    diag = Diagnostics([ref, "Oui.", "Non, non."], None, "en", "fr", n=2)
    rep = diag.of(["Il parle à Ottawa, à Ottawa, hier.", "Oui oui oui oui oui.", "Non, non."])["repeats"]
    assert (rep["n"], rep["lines"], rep["any_lines"]) == (2, 2, 2)
    assert rep["where"] == [{"line": 1, "ngrams": ["à Ottawa,"]}, {"line": 2, "ngrams": ["oui oui"]}]
    assert diag.reference["repeats"] == {"lines": 1, "share": 1 / 3}  # "de la" twice
    with pytest.raises(ValueError, match="n >= 1"):
        Diagnostics([ref], None, "en", "fr", n=0)


def test_unk_per_line_counts_glued_ones():
    assert UNK == "<unk>"
    from nmtkit.data.vocab import SPECIALS

    assert SPECIALS[1] == UNK
    unk = Diagnostics(["a", "b", "c", "d"], None, "en", "fr").of(
        ["David <unk>, un <unk> de Londres", "d'<unk>", "rien", "<unk><unk> <unk>"])["unk"]
    assert unk == {"total": 6, "per_line": 1.5, "lines": 3, "share": 0.75}


# -- the command on real files ---------------------------------------------------------------------------------


def run_score(*args, check=True):
    proc = subprocess.run(SCORE + [str(a) for a in args], capture_output=True, text=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def write(path, rows) -> str:
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def newstest(data_dir, tmp_path_factory):
    """news-test-2014 (source, reference), Edinburgh's Moses output, the same without a digit, and the same with a
    3-gram of its own said again at the end of 10 lines that said none twice (nor does their reference)."""
    d = data_dir / "wmt14"
    moses = lines_of(d / "system-outputs" / "uedin-wmt14.3023.fr")
    refs = lines_of(d / "newstest2014.fr")
    tmp = tmp_path_factory.mktemp("diagnostics")
    looped, chosen = list(moses), []
    for k, (h, r) in enumerate(zip(moses, refs)):
        words = h.split()
        grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
        if len(words) >= 6 and len(set(grams)) == len(grams) and r.count(" ".join(words[:3])) < 2:
            looped[k] = h + " " + " ".join(words[:3])
            chosen.append(k + 1)
            if len(chosen) == 10:
                break
    return {"src": str(d / "newstest2014.en"), "ref": str(d / "newstest2014.fr"),
            "moses": str(d / "system-outputs" / "uedin-wmt14.3023.fr"),
            "nodigits": write(tmp / "nodigits.fr", [re.sub(r"[0-9]", "", h) for h in moses]),
            "looped": write(tmp / "looped.fr", looped), "chosen": chosen}


def test_command_on_news_test_2014_and_damaged_moses_output(newstest):
    report = json.loads(run_score("-r", newstest["ref"], "-s", newstest["src"], "--metrics", "BLEU", "--json",
                                  newstest["moses"], newstest["nodigits"], newstest["looped"]).stdout)
    moses, nodigits, looped = (s["diagnostics"] for s in report["systems"])
    ref = report["diagnostics"]["reference"]["numbers"]
    # Moses carries most of the source's numbers, about as many as the reference does
    nums = moses["numbers"]
    assert 900 < nums["of"] < 1100 and nums["share"] > 0.93 and nums["carried"] == round(nums["share"] * nums["of"])
    assert ref["of"] == nums["of"] and 0.93 < ref["share"] < 1 and abs(ref["share"] - nums["share"]) < 0.03
    assert nums["of"] - nums["carried"] == sum(len(x["missing"]) for x in nums["lines"])
    assert 0 < nums["invented_lines"] < 60
    line_1888 = next(x for x in nums["lines"] if x["line"] == 1888)  # "120,296 personnes": the English comma kept
    assert line_1888 == {"line": 1888, "missing": ["120296"], "invented": ["120.296"]}
    # without its digits, almost nothing is carried (only the French centuries in Roman numerals)
    assert nodigits["numbers"]["share"] < 0.02 and nodigits["numbers"]["invented_lines"] < 10
    # the looped copy repeats in exactly 10 more lines, those chosen, and nothing else changes
    rep, rep_looped = moses["repeats"], looped["repeats"]
    assert 0 < rep["share"] < 0.05 and rep["lines"] >= 10
    assert rep_looped["lines"] == rep["lines"] + 10 and rep_looped["any_lines"] == rep["any_lines"] + 10
    assert sorted({w["line"] for w in rep_looped["where"]} - {w["line"] for w in rep["where"]}) == newstest["chosen"]
    assert moses["unk"] == {"total": 0, "per_line": 0.0, "lines": 0, "share": 0.0}
    assert report["diagnostics"]["repeat_ngram"] == 3 and report["diagnostics"]["note"] is None


def test_command_text_report_and_its_options(newstest, tmp_path):
    src, ref, moses = (lines_of(newstest[k], 400) for k in ("src", "ref", "moses"))
    files = {k: write(tmp_path / name, rows) for k, name, rows in
             (("src", "src.en", src), ("ref", "ref.fr", ref), ("moses", "moses.fr", moses))}
    files["unk"] = write(tmp_path / "unk.fr", [re.sub(r"\b[A-Z]\w+", UNK, h, count=1) for h in moses])
    out = run_score("-r", files["ref"], "-s", files["src"], "--metrics", "BLEU,chrF", "--repeat-ngram", 2,
                    files["moses"], files["unk"]).stdout.split("\n")
    assert next(line for line in out if line.startswith("system")).split() == ["system", "BLEU", "chrF"]
    heading = out.index(next(line for line in out if line.startswith("What a reader notices")))
    assert "en source's, read in the fr translations" in out[heading] and "word 2-gram" in out[heading]
    moses_line, unk_line = out[heading + 1], out[heading + 2]
    assert re.match(r"  moses\.fr  numbers 9\d\.\d% carried \(\d+ of \d+; reference 9\d\.\d%\), \d+ lines? invents? "
                    r"one, \d+ lines? changes? one \(lines? \d+(, \d+)*(, …)?\) · repeats \d+\.\d% of lines "
                    r"\(any \d+\.\d%, reference any \d+\.\d%\) · <unk> 0\.00/line "
                    r"\(0\.0% of lines\)$", moses_line), moses_line
    n_unk = sum(h.count(UNK) for h in lines_of(files["unk"]))
    assert 300 < n_unk <= 400 and f"<unk> {n_unk / 400:.2f}/line" in unk_line
    # without the source: no numbers, one note, no error
    proc = run_score("-r", files["ref"], "--metrics", "BLEU", files["moses"])
    notice = next(line for line in proc.stdout.split("\n") if line.startswith("What a reader notices"))
    assert "numbers not checked: give the source (-s SRC)" in notice
    assert "numbers" not in proc.stdout.split("\n")[proc.stdout.split("\n").index(notice) + 1]
    bad = run_score("-r", files["ref"], "--repeat-ngram", 0, files["moses"], check=False)
    err = bad.stderr.strip().split("\n")
    assert bad.returncode == 1 and len(err) == 1 and "--repeat-ngram must be >= 1 (got 0)" in err[0], bad.stderr


def test_the_hansards_reference_carries_its_sources_percentages(data_dir):
    """The Hansards write "63 p. 100" and "50 pour 100": read as percent signs, their own reference invents few
    numbers and carries most of the source's (without the rule, each percent line would invent a 100)."""
    src, ref = lines_of(data_dir / "hansards" / "test.en"), lines_of(data_dir / "hansards" / "test.fr")
    figures = Diagnostics(ref, src, "en", "fr").reference["numbers"]
    percent = sum(1 for r in ref if re.search(r"[0-9] (p\.|pour) 100", r))
    assert percent > 40 and figures["share"] > 0.9 and figures["invented_lines"] < percent
    assert not any("100" in x["invented"] for x in figures["lines"]
                   if re.search(r"[0-9] (p\.|pour) 100", ref[x["line"] - 1]))
