"""Conventions shared by the six tools: a bad command line is reported as one line, like any bad input, and so is
an option that was removed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from nmtkit.cli import _flat
from nmtkit.models import list_presets

REPO = Path(__file__).resolve().parents[1]
TOOLS = ["nmt-prepare", "nmt-select", "nmt-train", "nmt-translate", "nmt-score", "nmt-align"]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bin" / tool), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_bad_command_line_is_one_line_with_exit_code_2(tool):
    r = _run(tool, "--no-such-option")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr  # one line, no usage block
    assert r.stderr.startswith(f"{tool}: error: No such option '--no-such-option'")
    assert r.stderr.rstrip().endswith(f"(see '{tool} --help')")
    r = _run(tool)  # every tool needs something: an argument or a required option
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"{tool}: error: Missing "), r.stderr


def test_the_datasets_command_follows_the_same_convention():
    """``python -m nmtkit.datasets`` (not one of the six tools, but a command users type) reports its usage errors
    on one line too, and its own usage error (no dataset named) the same way."""
    for args, start in ((["--no-such-option"], "No such option '--no-such-option'"),
                        ([], "name at least one dataset"), (["--retries", "x"], "Invalid value for '--retries'")):
        r = subprocess.run([sys.executable, "-m", "nmtkit.datasets", *args], capture_output=True, text=True,
                           timeout=120, cwd=REPO)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"python -m nmtkit.datasets: error: {start}"), r.stderr


def test_a_bad_value_is_one_line_too():
    r = _run("nmt-translate", "-m", "model.pt", "--beam", "many")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("nmt-translate: error: Invalid value for '--beam'") and "'many'" in r.stderr


@pytest.mark.parametrize("tool, args", [
    ("nmt-translate", ["--block-numbers"]), ("nmt-translate", ["--missing-numbers", "10"]),
    ("nmt-translate", ["--replace-unk-by", "posterior"]), ("nmt-translate", ["--replace-unk-by=attention"]),
    ("nmt-serve", ["--batching", "continuous"]), ("nmt-serve", ["--join-wait-ms", "50"]),
])
def test_a_removed_option_is_one_line_saying_what_replaced_it(tool, args):
    """An option that was removed (nmtkit.cli.retired) is refused before anything else is read -- here even before
    the missing -m -- in one line, its own message (no pointer to --help, which no longer lists it), exit code 2."""
    from nmtkit.translate.retired import RETIRED

    flag = args[0].split("=")[0]
    r = _run(tool, *args)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"{tool}: error: {flag}: removed: ") and "--help" not in r.stderr, r.stderr
    if tool == "nmt-translate":
        assert r.stderr.rstrip().endswith(RETIRED[flag[2:].replace("-", "_")])
    else:
        assert "retired/continuous-batching" in r.stderr
    assert flag not in _run(tool, "--help").stdout


def test_a_removed_option_is_still_a_usage_error_for_callers():
    from nmtkit.cli.translate import main

    with pytest.raises(click.UsageError, match="--block-numbers: removed: "):
        main(["-m", "model.pt", "--block-numbers"], prog_name="nmt-translate", standalone_mode=False)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_still_prints_the_usage(tool):
    r = _run(tool, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"Usage: {tool} ") and r.stderr == ""


def test_a_usage_error_is_still_a_click_usage_error_for_callers():
    """A library caller running a tool's command without click's standalone mode can still catch it as such."""
    from nmtkit.cli.train import main

    with pytest.raises(click.UsageError, match="No such option '--nope'"):
        main(["--nope"], prog_name="nmt-train", standalone_mode=False)


def test_messages_are_put_on_one_line_without_touching_their_spaces():
    assert _flat("bad value for 'a  b'\n   see the manual\n") == "bad value for 'a  b' see the manual"


def test_list_archs():
    r = _run("nmt-train", "--list-archs")  # no DATA, no --arch: it answers and exits, as --help does
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert "rnnsearch-50\trnnsearch: emb_dim=620 hidden_dim=1000 maxout_dim=500 attn_dim=1000 max_len=50" in lines
    assert [ln.split("\t")[0] for ln in lines] == ["rnnencdec", "rnnsearch"] + list_presets()
