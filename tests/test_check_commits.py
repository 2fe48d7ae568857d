"""examples/cpu-scale/check_commits.sh: a training resumed under several commits, compared bit for bit.

A run that spans sessions may go on under newer code; this script says whether that code trains as the old did.
Here a real clone of this repository gets two commits on top of its HEAD, one that leaves training alone (a
README line) and one that changes it (gradient clipping halved), and a real checkpoint is resumed under all three.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path("examples") / "cpu-scale" / "check_commits.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.org",
                           *args], check=True, capture_output=True, text=True).stdout


def test_same_training_is_told_from_changed_training(tmp_path, small, finished_run):
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    with open(clone / "README.rst", "a", encoding="utf-8") as f:
        f.write("\nA line that changes no training.\n")
    git(clone, "commit", "--quiet", "-am", "docs only")
    trainer = clone / "nmtkit" / "train" / "trainer.py"
    text = trainer.read_text(encoding="utf-8")
    line = "max_norm = self.cfg.clip_norm or math.inf"
    assert text.count(line) == 1, "the trainer's clipping line moved: point this test at another training change"
    trainer.write_text(text.replace(line, "max_norm = (self.cfg.clip_norm or math.inf) * 0.5"), encoding="utf-8")
    git(clone, "commit", "--quiet", "-am", "training changed")

    ckpt = finished_run / "checkpoint_last.pt"
    before = ckpt.read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(clone / SCRIPT), str(ckpt), "2", "HEAD~2", "HEAD~1", "HEAD", "--", str(small),
                        "--arch", "rnnsearch-tiny", "--batch-size", "16", "--pool-batches", "2", "--valid-every",
                        "100", "--valid-bleu-sentences", "0", "--log-every", "1", "--threads", "1",
                        "--max-updates", "4", "--save-dir", str(tmp_path / "ignored")],
                       capture_output=True, text=True, env=env, timeout=600)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "update 4; 2 more under each of HEAD~2 HEAD~1 HEAD" in lines[0], r.stdout
    assert lines[1].startswith("HEAD~2: update 6,"), r.stdout
    assert lines[2] == "HEAD~1: bit-identical to HEAD~2 (weights and optimizer state)", r.stdout
    assert lines[3].startswith("HEAD: DIFFERENT from HEAD~2 in "), r.stdout
    # the checkpoint read, not written; no worktree, save directory or temporary file left behind
    assert ckpt.read_bytes() == before
    assert len(git(clone, "worktree", "list").splitlines()) == 1
    assert not (tmp_path / "ignored").exists()
    assert git(clone, "status", "--porcelain") == ""

    # only the two that train alike: exit 0
    r = subprocess.run([str(clone / SCRIPT), str(ckpt), "1", "HEAD~2", "HEAD~1", "--", str(small), "--arch",
                        "rnnsearch-tiny", "--batch-size", "16", "--pool-batches", "2", "--valid-every", "100",
                        "--valid-bleu-sentences", "0", "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "HEAD~1: bit-identical to HEAD~2 (weights and optimizer state)"


def test_bad_arguments_are_refused_in_one_line(tmp_path, finished_run):
    script = REPO / SCRIPT
    ckpt = finished_run / "checkpoint_last.pt"
    for args, message in [
        ([str(tmp_path / "none.pt"), "2", "HEAD", "--", "data"], "none.pt: no such checkpoint"),
        ([str(ckpt), "two", "HEAD", "--", "data"], "UPDATES must be a positive integer, not 'two'"),
        ([str(ckpt), "2", "no-such-commit", "--", str(tmp_path)], "no-such-commit: not a commit here"),
        ([str(ckpt), "2", "HEAD", "data"], "usage:"),
    ]:
        r = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert message in r.stderr, (args, r.stderr)
