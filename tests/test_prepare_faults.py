"""nmt-prepare's faults: a full disk is one error line naming the destination, and leaves nothing; a killed run
leaves a temporary directory, which the next run removes (saying so) before it writes its own.
"""

from __future__ import annotations

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
    res = _nmt_limited("nmt-prepare", 4000, "-s", "en", "-t", "fr", "--train", tmp_path / "train",
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
