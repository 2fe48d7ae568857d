"""examples/one-hour.sh's WORKDIR knows what it was made of (#57): run again on another training corpus, with the
languages swapped, or with a --dev it was not made with, it stops with one line and a non-zero exit and leaves the
WORKDIR as it was, where it resumed the old data's model before; a prefix with no files, or two sides of different
lengths, is one line, not the traceback of the split step.  One real, tiny run of the recipe makes the WORKDIR (the
tiny RNNsearch, 2 updates); the refused runs stop before anything heavy starts."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, head_lines

ONE_HOUR = REPO / "examples" / "one-hour.sh"
WORKDIR_STEP = REPO / "examples" / "one_hour_workdir.py"
SETTINGS = ("SPM_UNITS", "MAX_LEN", "VALID_EVERY", "WORKERS", "SEED", "ARCH", "MAX_UPDATES", "PRECISION",
            "HOUR_UPDATES")
# the smallest run of the recipe: PRECISION named (auto asks torch), one worker, one thread
ENV = {**{k: v for k, v in os.environ.items() if k not in SETTINGS}, "SPM_UNITS": "150", "ARCH": "rnnsearch-tiny",
       "MAX_UPDATES": "2", "VALID_EVERY": "2", "WORKERS": "1", "PRECISION": "fp32", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}


def one_hour(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ONE_HOUR), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def refused(res: subprocess.CompletedProcess) -> str:
    """The one line of a run that stopped at once: exit 1, nothing else on stderr."""
    assert res.returncode == 1, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("one-hour.sh: ") and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def tree(directory: Path) -> dict:
    """Every file under ``directory``: (size, mtime in ns, bytes)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpora(data_dir, tmp_path_factory):
    """Two corpora of 200 real Multi30K pairs each: ``a`` (the WORKDIR's) and ``b`` (other lines)."""
    root = tmp_path_factory.mktemp("corpora")
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", root / f"a.{lang}", 200)
        head_lines(data_dir / "multi30k" / f"train.{lang}", root / f"b.{lang}", 400, start=200)
    return root


@pytest.fixture(scope="module")
def workdir(corpora, tmp_path_factory):
    work = tmp_path_factory.mktemp("recipe") / "work"
    res = one_hour(corpora / "a", work, "--seconds", "30", "--threads", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (work / "model" / "checkpoint_last.pt").is_file() and (work / "corpus.json").is_file()
    return work


@pytest.mark.parametrize("args, line", [
    (["{c}/b"], "{w}/corpus.json: {w} was prepared from the training corpus {c}/a.en, {c}/a.fr, not {c}/b.en, "
                "{c}/b.fr: resuming would go on training on the old data; give the corpus it was made from, or another "
                "WORKDIR (or delete this one to start over)"),
    (["{c}/a", "--src", "fr", "--tgt", "en"], "{w}/corpus.json: {w} was prepared for --src en --tgt fr, not --src fr "
                                              "--tgt en: give its languages, or another WORKDIR (or delete this one "
                                              "to start over)"),
    (["{c}/a", "--dev", "{c}/b"], "{w}/corpus.json: {w} was prepared from --dev none (pairs held out of the training "
                                  "corpus), not {c}/b.en, {c}/b.fr: resuming would go on training on the old data; "
                                  "give the corpus it was made from, or another WORKDIR (or delete this one to start "
                                  "over)"),
], ids=["another-corpus", "swapped-languages", "another-dev"])
def test_a_run_on_other_data_is_refused_and_changes_nothing(workdir, corpora, args, line):
    before = tree(workdir)
    res = one_hour(*(a.format(c=corpora) for a in args[:1]), workdir, *(a.format(c=corpora) for a in args[1:]),
                   "--seconds", "30", "--threads", "1")
    assert refused(res) == "one-hour.sh: " + line.format(w=workdir, c=corpora)
    assert tree(workdir) == before


def test_the_same_text_elsewhere_or_gzipped_is_the_same_corpus(workdir, corpora, tmp_path):
    """The record is of the text: the corpus moved and compressed passes the check (the step the recipe runs)."""
    for lang in ("en", "fr"):
        with gzip.open(tmp_path / f"moved.{lang}.gz", "wb") as f:
            f.write((corpora / f"a.{lang}").read_bytes())
    res = subprocess.run([sys.executable, str(WORKDIR_STEP), "check", str(workdir), str(tmp_path / "moved"), "", "en",
                          "fr"], capture_output=True, text=True, timeout=60, env=ENV)
    assert (res.returncode, res.stderr) == (0, "")
    (tmp_path / "moved.fr.gz").write_bytes(gzip.compress((corpora / "a.fr").read_bytes() + b"one line more\n"))
    res = subprocess.run([sys.executable, str(WORKDIR_STEP), "check", str(workdir), str(tmp_path / "moved"), "", "en",
                          "fr"], capture_output=True, text=True, timeout=60, env=ENV)
    assert refused(res).endswith(f"was prepared from the training corpus {corpora}/a.en, {corpora}/a.fr, not "
                                 f"{tmp_path}/moved.en.gz, {tmp_path}/moved.fr.gz: resuming would go on training on "
                                 "the old data; give the corpus it was made from, or another WORKDIR (or delete this "
                                 "one to start over)")


def test_a_workdir_prepared_before_records_is_checked_by_its_languages(workdir, corpora, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(workdir, old)
    (old / "corpus.json").unlink()
    before = tree(old)
    line = refused(one_hour(corpora / "a", old, "--src", "fr", "--tgt", "en"))
    assert line == (f"one-hour.sh: {old}/corpus.json: {old} was prepared for --src en --tgt fr, not --src fr --tgt "
                    "en: give its languages, or another WORKDIR (or delete this one to start over)")
    assert tree(old) == before


def test_a_prefix_with_no_files_is_one_line(tmp_path):
    line = refused(one_hour(tmp_path / "nothing", tmp_path / "work"))
    assert line == (f"one-hour.sh: {tmp_path}/nothing: no en file for corpus prefix (tried {tmp_path}/nothing.en, "
                    f"{tmp_path}/nothing.en.gz, {tmp_path}/nothing.en.sgm, {tmp_path}/nothing.en.sgm.gz)")
    assert not (tmp_path / "work").exists()


def test_two_sides_of_different_lengths_are_one_line(corpora, tmp_path):
    head_lines(corpora / "a.en", tmp_path / "u.en", 11)
    head_lines(corpora / "a.fr", tmp_path / "u.fr", 10)
    res = one_hour(tmp_path / "u", tmp_path / "work")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (f"one-hour.sh: {tmp_path}/u.fr: has 10 segments but its partner "
                                                   f"{tmp_path}/u.en has 11: the line counts must be equal")
    assert not (tmp_path / "work" / "corpus.json").exists() and not (tmp_path / "work" / "data").exists()
