"""The README's first command, end to end at a tiny size (QUICKSTART_TINY=1: 2,000 pairs, 40 updates)."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import REPO


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
    splits = json.loads((work / "data" / "manifest.json").read_text(encoding="utf-8"))["splits"]
    tests = [v for k, v in splits.items() if k.startswith("test")]
    assert [(t["lines_in"], t["lines_out"]) for t in tests] == [(20, 20), (20, 20)]  # never filtered
    plots = sorted(p.name for p in (work / "alignments").iterdir() if p.suffix == ".png")
    assert len(plots) == 3
    # of sentences of 10 to 25 words, as the paper's Figure 3 (not two-word lines such as "Bill C-71.")
    drawn = [int(row.split("\t")[0]) for row in
             (work / "alignments" / "index.tsv").read_text(encoding="utf-8").split("\n")[1:] if row]
    assert len(drawn) == 3 and all(10 <= len(sample[i - 1].split()) <= 25 for i in drawn), drawn
    # it keeps what the user needs: one numbered checkpoint (best and last are links), not every one
    assert [p.name for p in (work / "model").glob("checkpoint[0-9]*.pt")] == ["checkpoint40.pt"]
    # it trains a number of updates, not a wall-clock time, and says how many it made
    assert "trained for 40 updates" in proc.stderr and "undertrained" not in proc.stderr
    for name in ("prepared corpus", "translations", "attention plots", "BLEU", "reference"):
        assert name in proc.stderr  # the closing summary: the scores, example translations, where each output is
