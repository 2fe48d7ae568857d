"""nmt-score's inputs: the reference, the hypothesis files and the source, read whole and checked to have one
line per reference line."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence


from nmtkit.errors import InputError


def read_lines(path: str | os.PathLike) -> list[str]:
    """The segments of a text file (plain, gzip or WMT SGML; ``-`` = stdin), split on ``\\n`` only, strictly
    UTF-8."""
    from nmtkit.files import decode_line, read_segments, without_bom

    if path == "-":
        import sys

        if sys.stdin is None:  # (started with stdin closed: nmt-score ... - <&-)
            raise InputError("is closed: give the file's name instead of '-', or pipe the text in", "standard input")
        data = sys.stdin.buffer.read().split(b"\n")
        if data[-1] == b"":
            data.pop()
        return [decode_line(without_bom(raw, n), "<stdin>", n) for n, raw in enumerate(data, start=1)]
    return [s.text for s in read_segments(path)]


def guess_lang(path: str | os.PathLike | None) -> str | None:
    """The two-letter language code that ends a file name (``newstest2014.fr``, ``x.en.sgm``, ``y.de.gz``)."""
    if path is None:
        return None
    m = re.search(r"\.([A-Za-z]{2})(?:\.sgml?)?(?:\.gz)?$", os.path.basename(os.fspath(path)))
    return m.group(1).lower() if m else None


def system_names(paths: Sequence[str]) -> list[str]:
    """Short names for hypothesis files: their base names, or the paths as given where base names repeat (and
    ``#k`` after a path given twice)."""
    names = ["stdin" if p == "-" else os.path.basename(p) for p in paths]
    if len(set(names)) < len(names):
        names = list(paths) if len(set(paths)) == len(paths) else [f"{p}#{k + 1}" for k, p in enumerate(paths)]
    return names


def read_inputs(reference: str, hypotheses: Sequence[str], source: str | None = None
                ) -> tuple[list[str], list[list[str]], list[str] | None]:
    """(reference lines, each hypothesis file's lines, source lines or None), all of one length.

    A file whose line count differs from the reference's is an InputError naming both files and both counts.
    """
    refs = read_lines(reference)
    if not refs:
        raise InputError("is empty: there is nothing to score against", reference)
    files = ([("source", source)] if source is not None else []) + [("hypothesis", h) for h in hypotheses]
    read = []
    for role, path in files:
        lines = read_lines(path)
        if len(lines) != len(refs):
            raise InputError(f"{role} file has {len(lines)} lines but the reference {reference} has {len(refs)}: "
                             "line i of every file must belong to line i of the reference", path)
        read.append(lines)
    src = read.pop(0) if source is not None else None
    return refs, read, src
