"""nmt-translate --prefix with a file of CRLF line ends (#57 item 8): the "\\r" is the line end, not the prefix's last
character, so it never reaches the translations -- as an input line's "\\r" never did."""

from __future__ import annotations

from conftest import run_tool

SOURCE = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl in a red coat."]
PREFIXES = ["Un homme", "", "Une fille"]


def test_a_prefix_file_with_crlf_line_ends_translates_as_with_lf(small_model, tmp_path):
    outputs = {}
    for name, end in (("lf", "\n"), ("crlf", "\r\n")):
        (tmp_path / f"in.{name}").write_bytes("".join(s + end for s in SOURCE).encode())
        (tmp_path / f"prefix.{name}").write_bytes("".join(p + end for p in PREFIXES).encode())
        res = run_tool("nmt-translate", "-m", small_model, "-q", "--beam", "2", "--max-len-a", "0", "--max-len-b",
                       "5", "-i", tmp_path / f"in.{name}", "--prefix", tmp_path / f"prefix.{name}")
        assert res.returncode == 0, res.stderr
        outputs[name] = res.stdout
    assert "\r" not in outputs["crlf"]
    assert outputs["crlf"] == outputs["lf"]
    lines = outputs["lf"].split("\n")
    assert len(lines) == 4 and lines[0].startswith("Un homme") and lines[2].startswith("Une fille")
