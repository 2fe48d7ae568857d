"""The README's first command, end to end at a tiny size (QUICKSTART_TINY=1: 2,000 pairs, 20 s of training)."""

from __future__ import annotations

import os
import subprocess

from conftest import REPO


def test_quickstart_pipeline_runs_end_to_end(data_dir, tmp_path):
    work = tmp_path / "qs"
    env = {**os.environ, "QUICKSTART_TINY": "1", "NMTKIT_DATA": str(data_dir), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), str(work)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    test_lines = (work / "raw" / "test.en").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(test_lines) == 20
    hyps = (work / "test.hyp.fr").read_text(encoding="utf-8").split("\n")[:-1]
    aligns = (work / "test.align").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(aligns) == 20
    manifest = (work / "data" / "manifest.json").read_text(encoding="utf-8")
    assert '"lines_in": 20' in manifest  # the test split: never filtered
    scores = (work / "scores.txt").read_text(encoding="utf-8")
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in scores and "20 sentences" in scores
    png = (work / "bleu-by-length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    plots = sorted(p.name for p in (work / "alignments").iterdir() if p.suffix == ".png")
    assert len(plots) == 3
    for name in ("prepared corpus", "translations", "attention plots"):
        assert name in proc.stderr  # the closing summary says where each output is
