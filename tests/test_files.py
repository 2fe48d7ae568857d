"""nmtkit.files: plain/gzip/SGML reading, line discipline, parallel reading, prefixes and atomic outputs."""

from __future__ import annotations

import gc
import gzip
import os
import warnings

import pytest

from nmtkit.errors import InputError
from nmtkit.files import atomic_dir, atomic_file, is_sgml, read_parallel, read_segments, resolve_prefix

# Every character that str.splitlines() breaks on, apart from "\n" itself.
LINE_BREAKERS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]

SGML_EN = """<srcset setid="t" srclang="any">
<doc docid="d1" genre="news" origlang="en">
<seg id="1">First sentence.</seg>
<p>
<seg id=2>  Second, unquoted id.  </seg>
</p>
</doc>
<doc docid="d2" genre="news">
<seg id="1">Third one.</seg>
</doc>
</srcset>
"""
SGML_FR = SGML_EN.replace("srcset", "refset").replace("First sentence.", "Première phrase.")


def write(path, data: bytes | str):
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def texts(path):
    return [s.text for s in read_segments(path)]


# -- plain text and gzip -----------------------------------------------------------------------------------------


def test_plain_lines_numbers_and_keys(tmp_path):
    p = write(tmp_path / "x.en", "a b\nc\n\nd")  # no final newline: the last line still counts
    segs = list(read_segments(p))
    assert [s.text for s in segs] == ["a b", "c", "", "d"]
    assert [s.line for s in segs] == [1, 2, 3, 4]
    assert all(s.key is None for s in segs)


def test_final_newline_adds_no_line_and_empty_file_has_none(tmp_path):
    assert texts(write(tmp_path / "a", "x\ny\n")) == ["x", "y"]
    assert texts(write(tmp_path / "b", "x\ny\n\n")) == ["x", "y", ""]
    assert texts(write(tmp_path / "c", "")) == []


def test_gzip_is_detected_by_magic_bytes_not_by_name(tmp_path):
    content = "un\ndeux\ntrois\n"
    hidden = write(tmp_path / "plainname.txt", gzip.compress(content.encode()))  # gzip without .gz
    assert texts(hidden) == ["un", "deux", "trois"]
    liar = write(tmp_path / "liar.gz", content)  # named .gz, but plain text
    assert texts(liar) == ["un", "deux", "trois"]


@pytest.mark.parametrize("compress", [False, True])
def test_characters_that_splitlines_breaks_on_stay_inside_their_line(tmp_path, compress):
    lines = [f"left{c}right" for c in LINE_BREAKERS] + ["crlf\r", "", "end"]
    data = "\n".join(lines).encode("utf-8")
    assert len(data.decode().splitlines()) > len(lines)  # the hazard is real for this content
    p = write(tmp_path / "x.fr", gzip.compress(data) if compress else data)
    assert texts(p) == lines


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = write(tmp_path / "bad.fr", b"bon\nmauvais \xe9t\xe9\nbon\n")
    with pytest.raises(InputError) as e:
        list(read_segments(p))
    assert e.value.path == str(p) and e.value.line == 2
    assert str(e.value).startswith(f"{p}:2: ") and "invalid UTF-8" in str(e.value) and "0xe9" in str(e.value)


def test_invalid_utf8_inside_gzip_names_the_line(tmp_path):
    p = write(tmp_path / "bad.fr.gz", gzip.compress(b"a\nb\nc\xff\n"))
    with pytest.raises(InputError) as e:
        list(read_segments(p))
    assert e.value.line == 3 and "invalid UTF-8" in e.value.message


def test_truncated_gzip_is_an_input_error(tmp_path):
    data = gzip.compress("".join(f"line {i}\n" for i in range(5000)).encode())
    p = write(tmp_path / "t.en.gz", data[: len(data) // 2])
    with pytest.raises(InputError) as e:
        list(read_segments(p))
    assert e.value.path == str(p) and "\n" not in str(e.value)


def test_corrupt_gzip_is_an_input_error(tmp_path):
    data = bytearray(gzip.compress(("hello world\n" * 2000).encode()))
    data[20] ^= 0xFF  # damage the deflate stream: zlib.error, which is not an OSError
    data[30] ^= 0xFF
    p = write(tmp_path / "c.en.gz", bytes(data))
    with pytest.raises(InputError) as e:
        list(read_segments(p))
    assert e.value.path == str(p) and "\n" not in str(e.value)


def test_reading_gzip_closes_the_file(tmp_path):
    p = write(tmp_path / "x.gz", gzip.compress(b"a\nb\n"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert texts(p) == ["a", "b"]
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file") as e:
        list(read_segments(tmp_path / "nope.en"))
    assert e.value.path == str(tmp_path / "nope.en")
    with pytest.raises(InputError, match="directory"):
        list(read_segments(tmp_path))


# -- SGML ----------------------------------------------------------------------------------------------------------


def test_sgml_segments_docs_ids_and_physical_lines(tmp_path):
    p = write(tmp_path / "x.en.sgm", SGML_EN)
    segs = list(read_segments(p))
    assert [s.text for s in segs] == ["First sentence.", "Second, unquoted id.", "Third one."]
    assert [s.key for s in segs] == [("d1", "1"), ("d1", "2"), ("d2", "1")]
    assert [s.line for s in segs] == [3, 5, 9]


def test_sgml_detected_by_header_and_inside_gzip(tmp_path):
    by_header = write(tmp_path / "noext.en", SGML_EN)
    assert is_sgml(by_header)
    assert [s.key for s in read_segments(by_header)][0] == ("d1", "1")
    gz = write(tmp_path / "x.en.sgm.gz", gzip.compress(SGML_EN.encode()))
    assert texts(gz) == ["First sentence.", "Second, unquoted id.", "Third one."]
    gz_noext = write(tmp_path / "y", gzip.compress(SGML_FR.encode()))
    assert is_sgml(gz_noext) and texts(gz_noext)[0] == "Première phrase."
    assert not is_sgml(write(tmp_path / "plain.en", "<b>not sgml</b>\n"))


@pytest.mark.parametrize("sgml", [False, True])
def test_a_pipe_is_read_once_from_its_start(sgml):
    """A pipe (bash's <(...), /dev/stdin) cannot be opened again from its start: the format is peeked at on the one
    open stream, and no line is lost (reading the header first used to swallow the first 4 KiB)."""
    import subprocess
    import sys

    lines = [f"line {i} " + "x" * 40 for i in range(3000)]
    body = ("<refset>\n<doc docid=\"d\">\n" + "".join(f"<seg id=\"{i + 1}\">{t}</seg>\n" for i, t in enumerate(lines))
            + "</doc>\n</refset>\n") if sgml else "".join(t + "\n" for t in lines)
    code = ("import sys; from nmtkit.files import read_segments; "
            "print('\\n'.join(s.text for s in read_segments('/dev/stdin')))")
    done = subprocess.run([sys.executable, "-c", code], input=body, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == lines


def test_byte_order_mark_is_dropped_from_line_1_only(tmp_path):
    bom = "\ufeff"
    assert texts(write(tmp_path / "x.en", bom + "Hello world\n" + bom + "kept\n")) == ["Hello world", bom + "kept"]
    assert texts(write(tmp_path / "y.en", gzip.compress((bom + "Bonjour\n").encode()))) == ["Bonjour"]
    sgml = write(tmp_path / "noext", bom + SGML_EN)  # detected by its header behind the mark
    assert is_sgml(sgml) and texts(sgml) == texts(write(tmp_path / "x.en.sgm", SGML_EN))


def test_sgml_segment_keeps_line_break_characters(tmp_path):
    p = write(tmp_path / "x.sgm", '<refset>\n<doc docid="d">\n<seg id="1">a\u2028b\x85c\rd</seg>\n</doc>\n</refset>\n')
    assert texts(p) == ["a\u2028b\x85c\rd"]


def test_malformed_seg_names_the_line(tmp_path):
    p = write(tmp_path / "x.sgm", '<srcset>\n<doc docid="d">\n<seg id="1">unterminated\n</doc>\n')
    with pytest.raises(InputError, match="malformed <seg>") as e:
        list(read_segments(p))
    assert e.value.line == 3


def test_invalid_utf8_in_sgml_names_the_line(tmp_path):
    p = write(tmp_path / "x.sgm", b'<srcset>\n<doc docid="d">\n<seg id="1">ok</seg>\n<seg id="2">\xc3(</seg>\n')
    with pytest.raises(InputError, match="invalid UTF-8") as e:
        list(read_segments(p))
    assert e.value.line == 4


# -- parallel reading --------------------------------------------------------------------------------------------


def test_read_parallel_pairs_lines(tmp_path):
    s = write(tmp_path / "x.en", "a\u2028b\nc\n")
    t = write(tmp_path / "x.fr", "A\nC\x85D\n")
    assert [(a.text, b.text) for a, b in read_parallel(s, t)] == [("a\u2028b", "A"), ("c", "C\x85D")]


@pytest.mark.parametrize("longer", ["src", "tgt"])
def test_read_parallel_unequal_counts_says_who_has_how_many(tmp_path, longer):
    s = write(tmp_path / "x.en", "1\n2\n3\n4\n5\n" if longer == "src" else "1\n2\n3\n")
    t = write(tmp_path / "x.fr", "1\n2\n3\n" if longer == "src" else "1\n2\n3\n4\n5\n")
    with pytest.raises(InputError) as e:
        list(read_parallel(s, t))
    msg = str(e.value)
    short, long_ = (t, s) if longer == "src" else (s, t)
    assert msg.startswith(f"{short}: has 3 ")
    assert f"{long_} has 5" in msg


def test_read_parallel_sgml_pairs_and_mismatched_ids(tmp_path):
    s = write(tmp_path / "s.en.sgm", SGML_EN)
    t = write(tmp_path / "r.fr.sgm", SGML_FR)
    assert [b.text for _, b in read_parallel(s, t)] == ["Première phrase.", "Second, unquoted id.", "Third one."]
    bad = write(tmp_path / "bad.fr.sgm", SGML_FR.replace("<seg id=2>", '<seg id="7">'))
    with pytest.raises(InputError) as e:
        list(read_parallel(s, bad))
    assert e.value.path == str(bad) and e.value.line == 5
    assert '"7"' in e.value.message and '"2"' in e.value.message
    wrong_doc = write(tmp_path / "doc.fr.sgm", SGML_FR.replace('docid="d2"', 'docid="other"'))
    with pytest.raises(InputError, match='"other"'):
        list(read_parallel(s, wrong_doc))


def test_read_parallel_sgml_against_plain_is_refused(tmp_path):
    s = write(tmp_path / "s.en.sgm", SGML_EN)
    t = write(tmp_path / "t.fr", "a\nb\nc\n")
    with pytest.raises(InputError, match="plain-text line"):
        list(read_parallel(s, t))


# -- prefixes --------------------------------------------------------------------------------------------------------


def test_resolve_prefix_finds_plain_gzip_and_sgml(tmp_path):
    write(tmp_path / "a.en", "x\n")
    write(tmp_path / "a.fr.gz", gzip.compress(b"x\n"))
    assert resolve_prefix(str(tmp_path / "a"), "en", "fr") == (str(tmp_path / "a.en"), str(tmp_path / "a.fr.gz"))
    write(tmp_path / "b.en.sgm", SGML_EN)
    write(tmp_path / "b.fr.sgm.gz", gzip.compress(SGML_FR.encode()))
    assert resolve_prefix(str(tmp_path / "b"), "en", "fr") == (str(tmp_path / "b.en.sgm"),
                                                              str(tmp_path / "b.fr.sgm.gz"))


def test_resolve_prefix_explicit_pair_and_missing_files(tmp_path):
    s, t = write(tmp_path / "src-x.sgm", SGML_EN), write(tmp_path / "ref-y.sgm", SGML_FR)
    assert resolve_prefix(f"{s},{t}", "en", "fr") == (str(s), str(t))
    with pytest.raises(InputError, match="no such file") as e:
        resolve_prefix(f"{s},{tmp_path / 'missing'}", "en", "fr")
    assert e.value.path == str(tmp_path / "missing")
    write(tmp_path / "c.en", "x\n")
    with pytest.raises(InputError, match="no fr file") as e:
        resolve_prefix(str(tmp_path / "c"), "en", "fr")
    assert e.value.path == str(tmp_path / "c")
    with pytest.raises(InputError):
        resolve_prefix(f"{s},{t},{s}", "en", "fr")


# -- atomic outputs ----------------------------------------------------------------------------------------------


def test_atomic_file_writes_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "out.txt"
    with atomic_file(p) as f:
        f.write("a\u2028b\n")
    assert p.read_bytes() == "a\u2028b\n".encode()
    assert os.listdir(tmp_path) == ["out.txt"]


def test_atomic_file_failure_keeps_the_old_file(tmp_path):
    p = write(tmp_path / "out.txt", "old\n")
    with pytest.raises(RuntimeError):
        with atomic_file(p) as f:
            f.write("new, half written")
            raise RuntimeError("boom")
    assert p.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.txt"]


def _fill(d, name="manifest.json", text="{}"):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


def test_atomic_dir_creates_dest_only_on_success(tmp_path):
    dest = tmp_path / "dest"
    with atomic_dir(dest, marker="manifest.json", kind="a prepared corpus") as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and not dest.exists()
        _fill(tmp)
    assert os.listdir(dest) == ["manifest.json"]
    assert os.listdir(tmp_path) == ["dest"]


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_atomic_dir_failure_leaves_nothing(tmp_path, exc):
    dest = tmp_path / "a" / "b" / "dest"  # missing parents are removed again too
    with pytest.raises(exc):
        with atomic_dir(dest, marker="manifest.json", kind="a prepared corpus") as tmp:
            _fill(tmp)
            raise exc()
    assert os.listdir(tmp_path) == []


def test_atomic_dir_failure_leaves_existing_dest_unchanged(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    _fill(dest, text="old")
    with pytest.raises(RuntimeError):
        with atomic_dir(dest, force=True, marker="manifest.json", kind="a prepared corpus") as tmp:
            _fill(tmp, text="new")
            raise RuntimeError()
    assert (dest / "manifest.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["dest"]


def test_atomic_dir_refuses_a_prepared_dest_unless_forced(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    _fill(dest, text="old")
    _fill(dest, "stale.bin", "x")
    with pytest.raises(InputError, match="already holds a prepared corpus; use --force"):
        with atomic_dir(dest, marker="manifest.json", kind="a prepared corpus"):
            pytest.fail("must not start")
    with atomic_dir(dest, force=True, marker="manifest.json", kind="a prepared corpus") as tmp:
        _fill(tmp, text="new")
    assert sorted(os.listdir(dest)) == ["manifest.json"]  # replaced, not merged
    assert (dest / "manifest.json").read_text() == "new"
    assert os.listdir(tmp_path) == ["dest"]


def test_atomic_dir_never_replaces_a_directory_of_other_files(tmp_path):
    dest = tmp_path / "home"
    dest.mkdir()
    _fill(dest, "thesis.tex", "precious")
    for force in (False, True):
        with pytest.raises(InputError, match="no manifest.json, so it is not a prepared corpus"):
            with atomic_dir(dest, force=force, marker="manifest.json", kind="a prepared corpus"):
                pytest.fail("must not start")
    assert os.listdir(dest) == ["thesis.tex"]


def test_atomic_dir_accepts_an_existing_empty_dest_and_refuses_a_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with atomic_dir(tmp_path / "empty", marker="manifest.json", kind="a prepared corpus") as tmp:
        _fill(tmp)
    assert os.listdir(tmp_path / "empty") == ["manifest.json"]
    write(tmp_path / "file", "x")
    with pytest.raises(InputError, match="not a directory"):
        with atomic_dir(tmp_path / "file"):
            pass
