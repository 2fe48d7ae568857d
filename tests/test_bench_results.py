"""Every results file in tests/bench/results/ starts with what makes its figures re-runnable: the script that printed
it, the exact command, the commit (clean) and the machine -- the header tests/bench/peers.py's ``start_report``
writes.  A file that cannot meet it (written before the rule, or by hand) says so in its first line, naming what it
lacks, so that nobody takes it for evidence (issue #55, "Evidence")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "tests" / "bench"
RESULTS = BENCH / "results"
HEAD = 20  # the header is within a report's first lines
LACKS = "HEADER LACKS:"  # the first line of a report that cannot meet the rule: "HEADER LACKS: the command, ..."
DIRTY = "DIRTY TREE"  # start_report's first line for a trial on a tree with uncommitted changes


def _reports() -> list[Path]:
    """The text reports: the files in results/, and the index of a folder of figures (the figures are named by it)."""
    out = []
    for entry in sorted(RESULTS.iterdir()):
        if entry.is_dir():
            index = [p for p in entry.iterdir() if p.suffix in (".tsv", ".txt")]
            assert len(index) == 1, f"{entry}: a folder of results holds one index naming its files"
            out += index
        elif entry.suffix in (".txt", ".tsv"):
            out.append(entry)
        else:
            raise AssertionError(f"{entry}: not a report (.txt), a table (.tsv) or a folder of figures")
    return out


def missing(text: str) -> list[str]:
    """What a report's header lacks, of: the script, the command, the commit, a clean commit, the machine."""
    head = "\n".join(text.splitlines()[:HEAD])
    command = re.search(r"^command: .*?(tests/bench/[\w-]+\.py)", head, re.M)
    script = re.search(r"^script: (tests/bench/[\w-]+\.py)\s*$", head, re.M)
    named = script.group(1) if script else command.group(1) if command else None
    commit = re.search(r"^(?:nmtkit|commit): ([0-9a-f]{7,40})(-dirty)?\b", head, re.M)
    out = []
    if named is None or not (REPO / named).is_file():
        out.append("the script")
    if command is None:
        out.append("the command")
    if commit is None:
        out.append("the commit")
    elif commit.group(2):
        out.append("a clean commit")
    if not re.search(r"^(?:CPU|device): \S", head, re.M):
        out.append("the machine")
    return out


@pytest.mark.parametrize("path", _reports(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_results_file_starts_with_script_command_commit_and_machine_or_says_what_it_lacks(path):
    text = path.read_text(encoding="utf-8")
    first = text.split("\n", 1)[0]
    if path.suffix == ".tsv" and not first.startswith(LACKS):
        # a table a report uses: it names the script that wrote it, and the report of that script beside it names it
        written = re.match(r"# written by (tests/bench/[\w-]+\.py)\b", first)
        assert written and (REPO / written.group(1)).is_file(), f"{path}: its first line names no script of tests/bench"
        report = RESULTS / (path.name.split("-")[0] + ".txt")
        assert report.is_file() and path.name in report.read_text(encoding="utf-8"), \
            f"{path}: no report {report.name} that names it"
        return
    lacks = missing(text)
    if not lacks:
        return
    if lacks == ["a clean commit"] and first.startswith(DIRTY):
        return
    assert first.startswith(LACKS), f"{path}: its header lacks {', '.join(lacks)}, and its first line does not say so"
    said = first[len(LACKS):]
    assert all(part in said for part in lacks), f"{path}: its first line does not name all it lacks ({lacks})"


@pytest.mark.parametrize("text, lacks", [
    ("title\n=====\nscript: tests/bench/bench_terms.py\nCPU: AMD EPYC\nnmtkit: 094986c (/work/main)\n"
     "command: python tests/bench/bench_terms.py --model m.pt\n", []),
    ("title\nCPU: AMD EPYC\nnmtkit: da2ceb4-dirty (/work/main)\ncommand: python tests/bench/bench_ab_train.py\n",
     ["a clean commit"]),
    ("title\ndevice: NVIDIA H200\ncommand: python tests/bench/no_such_script.py\n", ["the script", "the commit"]),
    ("a table of figures\n\nsetting  BLEU\n", ["the script", "the command", "the commit", "the machine"]),
])
def test_the_header_rule_itself(text, lacks):
    assert missing(text) == lacks


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py") if p.name != "peers.py"))
def test_every_bench_script_starts_its_report_with_start_report(script):
    # a new script that writes figures without the header (and without refusing a dirty tree) fails here
    assert "start_report(" in (BENCH / script).read_text(encoding="utf-8"), \
        f"tests/bench/{script} does not call peers.start_report: its report would lack the header (issue #55)"


def test_a_report_outside_a_git_checkout_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A bench script run from an exported tree (no .git) has no commit to name: start_report refuses it with one
    line, or with --allow-dirty marks the report as no evidence; before, git's failure was a traceback."""
    import os

    monkeypatch.syspath_prepend(str(BENCH))  # (sys.path as it was after the test, and PYTHONPATH, which peers sets)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # (git looks no higher than tmp_path)
    import peers

    monkeypatch.setattr(peers, "REPO", tmp_path)
    assert peers.clean_tree() is None
    assert peers.start_report("bench_x.py", "title", ["--flag"], allow_dirty=False) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path} is no git checkout" in err[0] and "--allow-dirty" in err[0], err
    out = peers.start_report("bench_x.py", "title", ["--flag"], allow_dirty=True)
    assert out[0].startswith("NO COMMIT:") and missing("\n".join(out)) == ["the script", "the commit"]
