"""nmt-translate's faults, one test each: bad options and settings refused in one line before anything is written
(and a CUDA device asked for on a machine without one, of nmt-train too), a pipeline that waits for each translation
gets it (the input read in windows that go as soon as it stalls), a full disk or a full standard output, a killed
run's temporary output removed by the next run, and a reader that closes the pipe.  (A checkpoint that is malformed
or whose weights diverged: tests/test_checkpoint_faults.py.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.errors import InputError

from conftest import hidden_files as _hidden
from conftest import one_line_error as _one_line_error
from conftest import run_tool as _nmt
from conftest import run_tool_on_a_full_disk as _nmt_limited
from conftest import wait_until

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(small_model):
    """A checkpoint of 2 updates of the tiny RNNsearch on ``small`` (``small_model``: tests/conftest.py)."""
    return small_model


# -- options and outputs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["-o", "{t}/x.fr", "--scores", "{t}/x.fr"], "--scores names the same file as the output --output"),
    (["-o", "{t}/x.fr", "--alignments", "{t}/./x.fr"], "--alignments names the same file as the output --output"),
    (["-i", "{t}/in.en", "-o", "{t}/in.en"], "--output names the same file as the input --input"),
    (["--nbest", "2", "--beam", "2", "--nbest-file", "-", "--scores", "-"],
     "standard output: --scores names the same file as the output --nbest-file"),
    (["-o", "{t}/missing/dir/x.fr"], "{t}/missing/dir/x.fr"),
    (["--window", "-3"], "--window must be at least 1 line (got -3"),
])
def test_translate_refuses_bad_options_in_one_line(model, tmp_path, args, fragment):
    (tmp_path / "in.en").write_text("a man .\n", encoding="utf-8")
    args = [a.replace("{t}", str(tmp_path)) for a in args]
    if "-i" not in args:
        args += ["-i", str(tmp_path / "in.en")]
    res = _nmt("nmt-translate", "-m", model, *args)
    _one_line_error(res, "nmt-translate", fragment.replace("{t}", str(tmp_path)))
    assert (tmp_path / "in.en").read_text(encoding="utf-8") == "a man .\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en"]


@pytest.mark.parametrize("options, fragment", [
    (dict(window=-3), "--window must be at least 1 line (got -3"),
    (dict(device="bogus"), "--device 'bogus' is not a device"),
    (dict(device="cuda:7"), "--device cuda:7: "),
    (dict(decode=dict(lenpen=float("nan"))), "--lenpen must be a finite number of at least 0 (got nan)"),
    (dict(decode=dict(max_len_a=-1.0)), "--max-len-a must be a finite number of at least 0 (got -1.0)"),
    (dict(decode=dict(beam=2, nbest=3)), "need beam >= 1 and 1 <= nbest <= beam (got beam 2, nbest 3)"),
])
def test_translator_refuses_bad_settings(model, options, fragment):
    """Bad settings of the translator, and of its decoding (checked as the DecodeConfig is built)."""
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.translator import Translator

    options = dict(options)
    with pytest.raises(InputError, match=re.escape(fragment)):
        decode = DecodeConfig(**options.pop("decode", {}))
        Translator([str(model)], decode, workers=1, **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the error is for machines without it")
def test_cuda_on_a_machine_without_cuda_is_one_line(model, small, tmp_path):
    _one_line_error(_nmt("nmt-translate", "-m", model, "--device", "cuda", stdin="a man .\n"), "nmt-translate",
                    "--device cuda: this machine has no usable CUDA device")
    _one_line_error(_nmt("nmt-train", small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "r", "--device",
                         "cuda"), "nmt-train", "--device cuda: this machine has no usable CUDA device")
    assert not (tmp_path / "r").exists()


# -- streaming: a pipeline that waits for each translation gets it ---------------------------------------------------

def test_windows_give_what_has_arrived_when_the_input_stalls():
    import time

    from nmtkit.streaming import windows

    def slow():  # 3 lines at once, a pause, 2 lines, a pause, 1 line
        # (the pauses are the stalls under test, not waits for something: ten times windows' 50 ms, STALL_S)
        yield from (1, 2, 3)
        time.sleep(0.5)
        yield from (4, 5)
        time.sleep(0.5)
        yield 6

    assert list(windows(slow(), 10)) == [([1, 2, 3], True), ([4, 5], True), ([6], True)]
    assert list(windows(range(7), 3)) == [([0, 1, 2], False), ([3, 4, 5], False), ([6], True)]
    assert list(windows([], 3)) == []


def test_windows_raise_an_input_error_in_order():
    from nmtkit.streaming import windows

    def bad():
        yield from (1, 2)
        raise InputError("bad line", "in.txt", 3)

    got = []
    with pytest.raises(InputError, match="in.txt:3: bad line"):
        for window, _ in windows(bad(), 2):
            got.extend(window)
    assert got == [1, 2]


@pytest.mark.parametrize("options", [[], ["--workers", "2", "--window", "1"], ["--workers", "1"]],
                         ids=["defaults", "two-workers-window-1", "one-worker"])
def test_each_translation_comes_out_before_the_next_line_is_written(model, options):
    """A slow writer: one line, then nothing until its translation has been read.  Today's default reads a whole
    window (or waits for the next line) before translating anything: the first read times out."""
    import select

    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model), "--threads", "2",
                             *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        got = []
        for line in (b"a man is walking .\n", b"two dogs play in the snow .\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)  # (start-up included: workers load torch)
            assert ready, f"no translation of line {len(got) + 1} within 120 s while the writer waits for it"
            got.append(proc.stdout.readline())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert rest == b"" and len(got) == 2 and all(x.endswith(b"\n") for x in got)


# -- a full disk, a closed pipe --------------------------------------------------------------------------------------

def test_a_full_disk_in_translate_is_one_line_and_leaves_nothing(model, tmp_path):
    text = "".join(f"a man is walking number {i} .\n" for i in range(60))
    res = _nmt_limited("nmt-translate", 200, "-m", model, "-o", tmp_path / "out.fr", stdin=text)
    _one_line_error(res, "nmt-translate", f"{tmp_path / 'out.fr'}: cannot write: file too large; nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_stdout_to_dev_full_is_one_line(model):
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model)],
                             input="a man .\n", stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    _one_line_error(res, "nmt-translate", "standard output: cannot write: no space left on device")


def test_a_reader_that_closes_stdout_ends_translation_quietly(model, tmp_path):
    """``nmt-translate ... | head -1``: the closed pipe is a normal end (exit 0, nothing on stderr)."""
    source = tmp_path / "in.en"
    source.write_text("".join(f"a man is walking number {i} .\n" for i in range(3000)), encoding="utf-8")
    res = subprocess.run(f"'{sys.executable}' '{REPO / 'bin' / 'nmt-translate'}' -m '{model}' -i '{source}' "
                         "| head -1; exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    assert (res.returncode, res.stderr, len(res.stdout.splitlines())) == (0, "", 1), res.stderr


# -- leftovers of kills ----------------------------------------------------------------------------------------------

def test_a_killed_translation_leaves_a_temporary_that_the_next_run_removes(model, tmp_path):
    out = tmp_path / "out.fr"
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", str(model), "-o", str(out),
                             "--workers", "1"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    proc.stdin.write(b"a man .\n")
    proc.stdin.flush()
    wait_until(lambda: _hidden(tmp_path) or proc.poll() is not None, 120,
               "nmt-translate to open its temporary output (or to end)")
    proc.kill()
    proc.wait()
    left = _hidden(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.fr.") and left[0].endswith(f".{proc.pid}.tmp"), left
    # a live process's temporary of the same output is never touched
    live = subprocess.Popen(["sleep", "60"])
    (tmp_path / f".out.fr.abcd1234.{live.pid}.tmp").write_text("a live run's", encoding="utf-8")
    try:
        res = _nmt("nmt-translate", "-m", model, "-o", out, stdin="a man .\n")
        assert res.returncode == 0, res.stderr
        assert f"removed {tmp_path / left[0]}, a temporary left by a killed run (pid {proc.pid})" in res.stderr
        assert _hidden(tmp_path) == [f".out.fr.abcd1234.{live.pid}.tmp"]
    finally:
        live.kill()
        live.wait()
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1
