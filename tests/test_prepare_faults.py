"""nmt-prepare's faults: a full disk is one error line naming the destination, and leaves nothing; a killed run
leaves a temporary directory, which the next run removes (saying so) before it writes its own; a killed --force run
leaves the prepared directory it was replacing byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import head_lines
from conftest import hidden_files as _hidden
from conftest import one_line_error as _one_line_error
from conftest import run_tool_on_a_full_disk as _nmt_limited
from conftest import wait_until

REPO = Path(__file__).resolve().parents[1]


def test_a_full_disk_in_prepare_is_one_line_and_leaves_nothing(data_dir, tmp_path):
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"train.{lang}", 300)
    res = _nmt_limited("nmt-prepare", 4000, "-s", "en", "-t", "fr", "--train", tmp_path / "train", "--quiet",
                       "--dest", tmp_path / "out" / "data", "--src-vocab-size", "100", "--tgt-vocab-size", "100")
    # (the destination the user named, not "standard output": a write error of a file carries no name)
    assert _one_line_error(res, "nmt-prepare") == (f"nmt-prepare: error: {tmp_path / 'out' / 'data'}: cannot write: "
                                                   "file too large; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.en", "train.fr"]


def test_a_killed_prepare_leaves_a_directory_that_the_next_run_removes(data_dir, tmp_path):
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"train.{lang}", 3000)
    args = [sys.executable, str(REPO / "bin" / "nmt-prepare"), "-s", "en", "-t", "fr", "--train",
            str(tmp_path / "train"), "--dest", str(tmp_path / "data"), "--src-vocab-size", "100",
            "--tgt-vocab-size", "100", "--bpe-merges", "400"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, env=env)
    wait_until(lambda: any(n.startswith(".data.") for n in _hidden(tmp_path)) or proc.poll() is not None, 120,
               "nmt-prepare to create its temporary directory (or to end)", interval=0.01)
    proc.kill()
    proc.wait()
    left = [n for n in _hidden(tmp_path) if n.startswith(".data.")]
    assert left and left[0].endswith(f".{proc.pid}.tmp"), left
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"removed {tmp_path / left[0]}, a temporary left by a killed run (pid {proc.pid})" in res.stderr
    assert _hidden(tmp_path) == [] and (tmp_path / "data" / "manifest.json").is_file()


def test_a_force_run_killed_mid_build_leaves_the_old_corpus_byte_identical(data_dir, tmp_path):
    """``nmt-prepare --force`` over a prepared directory, killed (SIGKILL) while it builds: the old directory is as
    it was, byte for byte (the new one is built beside it and swapped in only at the end); the next --force run
    removes the killed run's temporary, saying so, and replaces the old corpus."""
    import hashlib

    def tree(d):
        return {str(p.relative_to(d)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in sorted(d.rglob("*")) if p.is_file()}

    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"old.{lang}", 200)
        head_lines(data_dir / "multi30k" / f"train.{lang}", tmp_path / f"new.{lang}", 3000)
    dest = tmp_path / "data"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    prepare = [sys.executable, str(REPO / "bin" / "nmt-prepare"), "-s", "en", "-t", "fr", "--dest", str(dest),
               "--src-vocab-size", "100", "--tgt-vocab-size", "100"]
    res = subprocess.run([*prepare, "--train", str(tmp_path / "old")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    old = tree(dest)
    new = [*prepare, "--train", str(tmp_path / "new"), "--bpe-merges", "400", "--force"]
    proc = subprocess.Popen(new, stderr=subprocess.PIPE, env=env)

    def building():  # (its temporary directory holds a file: it is writing the new corpus)
        assert proc.poll() is None, "nmt-prepare --force ended before it was killed"
        return any(p.is_file() for p in tmp_path.glob(".data.*.tmp/*"))

    try:
        wait_until(building, 120, "nmt-prepare --force to write into its temporary directory", interval=0.01)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    assert tree(dest) == old  # (the old corpus, untouched)
    left = _hidden(tmp_path)
    assert len(left) == 1 and left[0].endswith(f".{proc.pid}.tmp"), left
    res = subprocess.run(new, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"removed {tmp_path / left[0]}, a temporary left by a killed run (pid {proc.pid})" in res.stderr
    assert _hidden(tmp_path) == []
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["splits"]["train"]["lines_in"] == 3000 and manifest["bpe"]["learned_merges"] == 400
