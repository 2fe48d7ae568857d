"""Symmetrised alignments (nmtkit/symmetrize.py, ``nmt-align --reverse-model``): each heuristic on hand-worked
cases, their nesting on random link sets, and the command on the real Hansards trial set with an English→French
and a French→English model: the links it writes are the two directions' links (each read from a run of nmt-align
of that direction alone) combined, and its report holds every direction's and symmetrisation's AER, each the one
recomputed here from links and gold with plain code."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from nmtkit.symmetrize import HEURISTICS, METHODS, soft_links, symmetrize, transpose

from conftest import pharaoh_links
from test_align import independent_trial, random_trial_model, read_pharaoh_plain, run_align, trial_files


def test_each_heuristic_on_a_hand_worked_case():
    # source words 0-3, target words 0-6; both directions agree on (0,0) and (1,1)
    forward = {(0, 0), (1, 1), (2, 1), (3, 6)}  # 2-1 next to (1,1); 3-6 far from everything
    backward = {(0, 0), (1, 1), (1, 2), (1, 0), (2, 3)}  # 1-2 next to (1,1); 1-0 between two agreed links; 2-3 apart
    assert symmetrize(forward, backward, "intersection") == {(0, 0), (1, 1)}
    assert symmetrize(forward, backward, "union") == forward | backward
    # grow-diag: 2-1 (source 2 unaligned) and 1-2 (target 2 unaligned) are neighbours of 1-1; 1-0 is a neighbour but
    # both its words are aligned already; 2-3 becomes a neighbour of 1-2 once 1-2 is in, but source 2 is aligned by
    # then (2-1) and target 3 is not: it grows too; 3-6 touches nothing
    grown = {(0, 0), (1, 1), (2, 1), (1, 2), (2, 3)}
    assert symmetrize(forward, backward, "grow-diag") == grown
    assert symmetrize(forward, backward, "grow-diag-final") == grown | {(3, 6)}  # source 3, target 6 unaligned
    assert symmetrize(forward, backward, "grow-diag-final-and") == grown | {(3, 6)}  # both unaligned
    # final-and wants both words unaligned: a link whose target is aligned already is left out by it alone
    f2, b2 = {(0, 0), (1, 0)}, {(0, 0)}
    assert symmetrize(f2, b2, "grow-diag") == {(0, 0), (1, 0)}  # a neighbour with source 1 unaligned
    f3, b3 = {(0, 0), (2, 0)}, {(0, 0)}  # 2-0 is not a neighbour of 0-0
    assert symmetrize(f3, b3, "grow-diag") == {(0, 0)}
    assert symmetrize(f3, b3, "grow-diag-final") == {(0, 0), (2, 0)}  # source 2 unaligned
    assert symmetrize(f3, b3, "grow-diag-final-and") == {(0, 0)}  # target 0 is aligned
    assert transpose([(3, 1), (0, 2)]) == [(1, 3), (2, 0)]
    with pytest.raises(ValueError, match="unknown symmetrisation"):
        symmetrize(f2, b2, "grow")


def test_the_heuristics_nest_on_random_links():
    rng = random.Random(7)
    for _ in range(300):
        n, m = rng.randint(1, 9), rng.randint(1, 9)
        f = {(rng.randrange(n), rng.randrange(m)) for _ in range(rng.randint(0, 12))}
        b = {(rng.randrange(n), rng.randrange(m)) for _ in range(rng.randint(0, 12))}
        got = {h: symmetrize(f, b, h) for h in HEURISTICS}
        # (final-and is not within final: where final takes a link that aligns a word, a later link of that word
        # that final-and would take is no longer taken)
        assert got["intersection"] <= got["grow-diag"] <= got["grow-diag-final"] <= got["union"] == f | b
        assert got["grow-diag"] <= got["grow-diag-final-and"] <= got["union"]
        assert symmetrize(f, b, "grow-diag-final") == symmetrize(f, b, "grow-diag-final")  # the same every time


def test_soft_links_take_the_word_pair_both_models_attend_to():
    forward = np.array([[0.6, 0.4], [0.5, 0.5]])  # target word 0 leans to source 0, target 1 is undecided
    backward = np.array([[0.1, 0.9], [0.9, 0.1]])  # source 0 attends to target 1, source 1 to target 0
    assert soft_links(forward, backward, 2, 2) == [(1, 0), (0, 1)]  # the reverse model outvotes a weak preference
    with_eos = np.pad(forward, ((0, 1), (0, 1)), constant_values=0.7)  # a </s> row and column are left out
    assert soft_links(with_eos, np.pad(backward, ((0, 1), (0, 1)), constant_values=0.7), 2, 2) == [(1, 0), (0, 1)]
    sure = np.array([[0.9, 0.1], [0.2, 0.8]])  # where one model is sure and the other is flat, the sure one decides
    assert soft_links(sure, np.full((2, 2), 0.5), 2, 2) == [(0, 0), (1, 1)]
    assert soft_links(np.zeros((0, 3)), np.zeros((3, 0)), 3, 0) == []


@pytest.fixture(scope="module")
def models(data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("symmetrize")
    return random_trial_model(data_dir, d, "en", "fr"), random_trial_model(data_dir, d, "fr", "en")


def _aer(links, sure, possible):
    a_s = sum(len(h & s) for h, s in zip(links, sure))
    a_p = sum(len(h & p) for h, p in zip(links, possible))
    a, s = sum(map(len, links)), sum(map(len, sure))
    return 1 - (a_s + a_p) / (a + s), a_s / s, a


@pytest.mark.slow
def test_the_command_on_the_trial_set(models, data_dir, tmp_path):
    en_fr, fr_en = models
    t = trial_files(data_dir)
    _, _, sure, possible = independent_trial(data_dir)
    # each direction alone, as a user would run it (the reverse model reads the French side as its source)
    run_align("-m", en_fr, "-s", t["e"], "-t", t["f"], "--tokenized", "--pharaoh", tmp_path / "fwd.align", "-q")
    run_align("-m", fr_en, "-s", t["f"], "-t", t["e"], "--tokenized", "--pharaoh", tmp_path / "bwd.align", "-q")
    forward = read_pharaoh_plain(tmp_path / "fwd.align")
    backward = [set(transpose(links)) for links in read_pharaoh_plain(tmp_path / "bwd.align")]
    assert len(forward) == len(backward) == 37
    proc = run_align("-m", en_fr, "--reverse-model", fr_en, "-s", t["e"], "-t", t["f"], "--tokenized", "--gold",
                     t["align"], "--gold-order", "tgt-src", "--pharaoh", tmp_path / "sym.align", "--json")
    written = read_pharaoh_plain(tmp_path / "sym.align")
    assert written == [symmetrize(f, b, "grow-diag-final") for f, b in zip(forward, backward)]
    report = json.loads(proc.stdout)
    assert report["symmetrization"] == "grow-diag-final"
    assert list(report["by_method"]) == ["forward", "backward", *METHODS]
    links = {"forward": forward, "backward": backward,
             **{h: [symmetrize(f, b, h) for f, b in zip(forward, backward)] for h in HEURISTICS}}
    for name, scores in report["by_method"].items():
        if name not in links:  # (soft: from the attention itself, below)
            continue
        aer, recall, count = _aer(links[name], sure, possible)
        assert scores["aer"] == pytest.approx(aer) and scores["recall"] == pytest.approx(recall)
        assert scores["links"] == count
    assert report["aer"] == report["by_method"]["grow-diag-final"]["aer"]
    counts = [report["by_method"][h]["links"] for h in ("intersection", "grow-diag", "grow-diag-final", "union")]
    assert counts == sorted(counts) and counts[0] < counts[-1]  # the directions disagree, so the ways differ
    # another heuristic, and the plain report lists every way with the one written marked
    proc = run_align("-m", en_fr, "--reverse-model", fr_en, "-s", t["e"], "-t", t["f"], "--tokenized", "--gold",
                     t["align"], "--gold-order", "tgt-src", "--symmetrize", "intersection", "--pharaoh", "-")
    assert [set(pharaoh_links(line)) for line in proc.stdout.split("\n")[:-1]] == links["intersection"]
    marked = [line for line in proc.stderr.splitlines() if line.strip().startswith("intersection")]
    assert len(marked) == 1 and marked[0].endswith("<- written")
    # soft: one link per French word, the argmax of the product of the two models' attention (their matrices from
    # the library), and the AER the report gives is that of the links written
    proc = run_align("-m", en_fr, "--reverse-model", fr_en, "-s", t["e"], "-t", t["f"], "--tokenized", "--gold",
                     t["align"], "--gold-order", "tgt-src", "--symmetrize", "soft", "--pharaoh", tmp_path / "soft.align",
                     "--json")
    from nmtkit.align import Aligner, read_text

    soft = read_pharaoh_plain(tmp_path / "soft.align")
    french = [len(x.text.split()) for x in read_text(t["f"])]  # (the words inside each <s snum=...> ... </s>)
    assert [len(links) for links in soft] == french and all(len({j for _, j in ls}) == len(ls) for ls in soft)

    fwd, bwd = Aligner(en_fr, tokenized=True), Aligner(fr_en, tokenized=True)
    e = [fwd.words(x.text, "src") for x in read_text(t["e"])]
    f = [fwd.words(x.text, "tgt") for x in read_text(t["f"])]
    want = [set(soft_links(a.alpha, b.alpha, len(x), len(y)))
            for a, b, x, y in zip(fwd.align_words(e, f), bwd.align_words(f, e), e, f)]
    assert soft == want and want != links["forward"]
    report = json.loads(proc.stdout)
    aer, recall, count = _aer(soft, sure, possible)
    assert report["aer"] == pytest.approx(aer) == pytest.approx(report["by_method"]["soft"]["aer"])


def test_a_reverse_model_of_the_same_direction_or_without_targets_is_one_line(models, data_dir, tmp_path):
    en_fr, _ = models
    t = trial_files(data_dir)
    proc = run_align("-m", en_fr, "--reverse-model", en_fr, "-s", t["e"], "-t", t["f"], "--tokenized", check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert en_fr in proc.stderr and "translates en->fr; the reverse of the model's en->fr is fr->en" in proc.stderr
    proc = run_align("-m", en_fr, "--reverse-model", models[1], "-s", t["e"], check=False)
    assert proc.returncode == 1 and "--reverse-model aligns the target sentences to the source: give -t" in proc.stderr
