"""nmtkit.files under faults: a plain text file named .sgm is an error, not an empty input; --force replaces an
output in one step, through a symlink; an output caught between the two renames of a replacement by a kill is put
back by the next run.  (nmtkit.files as it should work: tests/test_files.py.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nmtkit.errors import InputError

from conftest import hidden_files as _hidden


def test_a_plain_text_file_named_sgm_is_an_error(tmp_path):
    from nmtkit.files import read_segments

    plain = tmp_path / "news.en.sgm"
    plain.write_text("A plain line .\nAnother one .\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"news.en.sgm: read as WMT SGML \(by its name or header\) but none of its "
                                         r"2 line\(s\) holds a <seg> element"):
        list(read_segments(plain))


# -- leftovers of kills ----------------------------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_force_replaces_in_one_step_and_keeps_a_symlink(small, tmp_path):
    from nmtkit.files import atomic_dir

    target = tmp_path / "real"
    target.mkdir()
    (target / "marker").write_text("old", encoding="utf-8")
    (tmp_path / "link").symlink_to(target)
    with atomic_dir(tmp_path / "link", force=True, marker="marker") as d:
        Path(d, "marker").write_text("new", encoding="utf-8")
    assert (tmp_path / "link").is_symlink() and (target / "marker").read_text(encoding="utf-8") == "new"
    assert _hidden(tmp_path) == []


def test_an_output_caught_between_two_renames_is_restored(tmp_path):
    """What a kill between the two renames of a replacement leaves (where no RENAME_EXCHANGE exists): the old
    output under .NAME.XXXX.PID.old and no NAME.  The next run puts it back before anything else."""
    from nmtkit.files import atomic_dir

    old = tmp_path / f".out.k3j2.{_dead_pid()}.old"
    old.mkdir()
    (old / "marker").write_text("old", encoding="utf-8")
    with pytest.raises(InputError, match="already holds an earlier output; use --force"):
        with atomic_dir(tmp_path / "out", marker="marker"):
            pass
    assert (tmp_path / "out" / "marker").read_text(encoding="utf-8") == "old" and _hidden(tmp_path) == []
