"""The README's first command, end to end at a tiny size (QUICKSTART_TINY=1: 2,000 pairs, 40 updates), through
examples/one-hour.sh's recipe."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, lines_of


@pytest.mark.slow
def test_quickstart_pipeline_runs_end_to_end(data_dir, tmp_path):
    work = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_TINY": "1", "NMTKIT_DATA": str(data_dir), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), str(work)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for test in ("hansards-test", "news-test"):
        test_lines = (work / "raw" / f"{test}.en").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(test_lines) == 20
        hyps = (work / f"{test}.hyp.fr").read_text(encoding="utf-8").split("\n")[:-1]
        aligns = (work / f"{test}.align").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(hyps) == len(aligns) == 20
        scores = (work / f"{test}.scores.txt").read_text(encoding="utf-8")
        assert "nrefs:1|case:mixed|eff:no|tok:13a" in scores and "20 sentences" in scores
        png = (work / f"{test}.bleu-by-length.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # the in-domain test: sentences of the Hansards test sittings (drawn at random, in file order)
    hansards_test = (data_dir / "hansards" / "test.en").read_text(encoding="utf-8").split("\n")
    sample = (work / "raw" / "hansards-test.en").read_text(encoding="utf-8").split("\n")[:-1]
    assert all(line in hansards_test for line in sample)
    # the one-hour recipe's data: a joint SentencePiece model that spells numbers digit by digit, the pairs
    # drawn from the Hansards training sittings
    manifest = json.loads((work / "recipe" / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["sentencepiece"]["split_digits"] is True and manifest["sentencepiece"]["learned_units"] == 1000
    assert manifest["splits"]["train"]["lines_in"] == 2000
    import gzip

    with gzip.open(data_dir / "hansards" / "train.en.gz", "rt", encoding="utf-8") as f:
        hansards_train = set(line.rstrip("\n") for line in f)
    trained = lines_of(work / "raw" / "train.en")
    assert len(trained) == 2000 and all(line in hansards_train for line in trained)
    plots = sorted(p.name for p in (work / "alignments").iterdir() if p.suffix == ".png")
    assert len(plots) == 3
    # of sentences of 10 to 25 words, as the paper's Figure 3 (not two-word lines such as "Bill C-71.")
    drawn = [int(row.split("\t")[0]) for row in
             (work / "alignments" / "index.tsv").read_text(encoding="utf-8").split("\n")[1:] if row]
    assert len(drawn) == 3 and all(10 <= len(sample[i - 1].split()) <= 25 for i in drawn), drawn
    # it keeps what the user needs: one numbered checkpoint (best and last are links), not every one
    assert [p.name for p in (work / "recipe" / "model").glob("checkpoint[0-9]*.pt")] == ["checkpoint40.pt"]
    # the tiny run stops at 40 updates (annealed there) within its time budget, and says how many it made, with
    # which checkpoint it scored
    assert "trained for 40 updates in" in proc.stderr and "undertrained" not in proc.stderr
    assert f"scored: {work / 'recipe' / 'model' / 'checkpoint_last.pt'}" in proc.stderr
    # decoded with the options the recipe left, which block repeated 4-grams
    assert "--no-repeat-ngram 4" in (work / "recipe" / "translate.options").read_text()
    for name in ("prepared corpus", "translations", "attention plots", "BLEU", "reference"):
        assert name in proc.stderr  # the closing summary: the scores, example translations, where each output is


@pytest.mark.slow
def test_quickstart_warns_when_its_time_runs_out_before_the_updates(data_dir, tmp_path):
    """A machine too slow for the budget (here: a budget of half a second for the tiny run's 40 updates) still
    finishes every step, and says that the model is undertrained and how many updates it made."""
    work = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_TINY": "1", "QUICKSTART_TIME": "0.5", "NMTKIT_DATA": str(data_dir),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), str(work)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = max(json.loads(line)["update"] for line in open(work / "recipe" / "model" / "train.jsonl"))
    assert 1 <= made < 40
    assert f"WARNING: only {made:,} updates in 0.5 s, where this run plans 40" in proc.stderr
    assert "undertrained" in proc.stderr
    # one-hour.sh's own line: under 80% of what the committed hour made in the same time (12,741 an hour)
    assert ("one-hour.sh: WARNING: " in proc.stderr) == (made < 0.8 * 12741 * 0.5 / 3600)
    assert len(lines_of(work / "hansards-test.hyp.fr")) == 20  # every step still ran
