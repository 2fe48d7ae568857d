"""What a file must look like before the cache trusts it: the content checks of a download (an archive opens, reads
to its end and holds the catalogue's members; text is UTF-8, not an HTML or XML page) and of a dataset file made
from one. A checksum says *which* file it is; these say that it is *the kind of file* the catalogue describes, for
the many publishers' files whose checksum nmtkit does not know. Policy: see :mod:`nmtkit.datasets`."""

from __future__ import annotations

import codecs
import gzip
import os
import re
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from nmtkit.errors import InputError
from nmtkit.files import BOM, SGML_HEADERS

CHUNK = 1 << 20
_MAGIC = {"tgz": b"\x1f\x8b", "gz": b"\x1f\x8b", "zip": b"PK\x03\x04"}
# what an error page, a login form or a directory listing starts with (after white space and a byte-order mark)
_MARKUP = re.compile(rb"\s*<(?:(?:!doctype|html|head|body|title|meta|error)\b|\?xml|!--)", re.IGNORECASE)


def _head(data: bytes) -> str:
    """The start of a file as a message shows it: its first line, at most 60 bytes."""
    return repr(data.split(b"\n", 1)[0][:60])


# -- archives -----------------------------------------------------------------------------------------------------


def check_format(path: Path, kind: str, origin: str) -> None:
    """The download starts as the catalogue's ``kind`` does (its magic bytes), e.g. not as an HTML error page."""
    with open(path, "rb") as f:
        head = f.read(512)
    ok = head.startswith(_MAGIC[kind]) if kind in _MAGIC else True
    if kind == "tar":  # POSIX or GNU (the magic), old v7 headers (no magic: a valid header), or a gzipped tar
        ok = head[257:262] == b"ustar" or head.startswith(_MAGIC["gz"]) or _tar_header(head)
    if not ok:
        raise InputError(f"is not a {kind} file (it starts with {head[:16]!r})", origin)


def _tar_header(block: bytes) -> bool:
    """``block`` is a tar header with a valid checksum (a tar older than POSIX.1-1988 has no ustar magic)."""
    try:
        tarfile.TarInfo.frombuf(block[:tarfile.BLOCKSIZE], "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return False
    return True


def check_archive(path: Path, kind: str, members: Iterable[str], origin: str, layout: str = "") -> dict:
    """A download of ``kind`` is whole and is what the catalogue says: its magic bytes, then every byte read to its
    end (a tar's end-of-archive blocks, a gzip stream's end and CRC, a zip's CRCs: a truncated file fails here) and
    every one of ``members`` present and read. A ``text`` download gets :func:`check_text` (as ``layout``)."""
    check_format(path, kind, origin)
    if kind == "text":
        return check_text(path, layout or path.name, origin)
    wanted = set(members)
    found: set[str] = set()
    try:
        if kind in ("tgz", "tar"):
            found = _read_tar(path, wanted, origin)
        elif kind == "zip":
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()  # reads every member and checks its CRC
                if bad is not None:
                    raise InputError(f"is a damaged zip archive: member {bad} fails its CRC check", origin)
                found = set(z.namelist())
        elif kind == "gz":
            with gzip.open(path, "rb") as stream:
                while stream.read(CHUNK):
                    pass
        else:
            raise ValueError(f"unknown download kind {kind!r}")
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
        raise InputError(f"is not a complete {kind} file: {e}", origin) from None
    missing = sorted(wanted - found)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InputError(f"the archive has no member {', '.join(missing[:5])}{more}: not the archive the catalogue "
                         "describes", origin)
    return {}


def _read_tar(path: Path, wanted: set[str], origin: str) -> set[str]:
    """Read a tar (gzipped or not) from start to end, the wanted members' data included; return its member names."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == _MAGIC["gz"]
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw  # gzip: a truncated stream is an error
        names = set()
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for info in tar:
                names.add(info.name)
                if info.name in wanted and info.isfile():
                    data = tar.extractfile(info)
                    while data.read(CHUNK):
                        pass
            end = tar.offset  # where the end-of-archive blocks begin (tarfile also stops quietly at a cut)
        while stream.read(CHUNK):  # the rest: end-of-archive blocks and padding (and gzip's end and CRC)
            pass
        total = stream.tell()
    if total < end + 2 * tarfile.BLOCKSIZE:
        raise InputError(f"is not a complete tar file: it ends at byte {total:,}, without the end-of-archive blocks "
                         f"due after its last member at byte {end:,} (a truncated download)", origin)
    return names


# -- text ---------------------------------------------------------------------------------------------------------


def check_text(path: Path, layout: str, origin: str) -> dict:
    """A dataset file (``layout``: its layout path, which says gzip, SGML or plain) holds what such a file holds:
    gzip that decompresses to its end when the name ends in ``.gz``; UTF-8 throughout, no NUL byte, at least one
    line; WMT SGML (its ``<srcset``-like header) for ``.sgm``, anything but an HTML or XML page otherwise. Returns
    ``{"lines": N}`` (``{"segments": N}`` for SGML), for comparing the two sides of a parallel corpus."""
    with open(path, "rb") as raw:
        return check_stream(raw, layout, origin)


def check_open_file(f, layout: str, origin: str) -> dict:
    """:func:`check_text` of the file being written through the open binary file ``f`` (a temporary made by
    :func:`nmtkit.files.atomic_file`, which opens it read-write), read from its start through a second descriptor."""
    f.flush()
    with open(os.dup(f.fileno()), "rb") as raw:
        raw.seek(0)
        return check_stream(raw, layout, origin)


def check_stream(raw, layout: str, origin: str) -> dict:
    """:func:`check_text` of an open binary stream, from its current position."""
    sgml = layout.removesuffix(".gz").endswith((".sgm", ".sgml"))
    if layout.endswith(".gz"):
        magic = raw.read(2)
        if magic != _MAGIC["gz"]:
            raise InputError(f"is not gzip-compressed text (it starts with {_head(magic + raw.read(58))})", origin)
        raw.seek(-2, os.SEEK_CUR)
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    else:
        stream = raw
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lines = segments = size = 0
    tail = last = b""
    try:
        while block := stream.read(CHUNK):
            if not size:
                _check_start(block, sgml, origin)
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                where = lines + e.object.count(b"\n", 0, e.start) + 1
                raise InputError(f"is not UTF-8 text (byte 0x{e.object[e.start]:02x})", origin, where) from None
            if b"\0" in block:
                where = lines + block.count(b"\n", 0, block.index(b"\0")) + 1
                raise InputError("holds a NUL byte: binary data, not text", origin, where)
            if sgml:  # (tail: a '<seg' cut by the block boundary)
                segments += (tail + block).lower().count(b"<seg")
                tail = block[-3:]
            lines += block.count(b"\n")
            size += len(block)
            last = block[-1:]
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text (it ends inside a character)", origin, lines + 1) from None
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot decompress: {e}", origin) from None
    if not size:
        raise InputError("is empty", origin)
    return {"segments": segments} if sgml else {"lines": lines + (last != b"\n")}


def _check_start(block: bytes, sgml: bool, origin: str) -> None:
    text = block.removeprefix(BOM)
    if sgml and not text.lstrip().lower().startswith(SGML_HEADERS):
        raise InputError(f"is not WMT SGML: no <srcset>, <refset> or <tstset> header (it starts with "
                         f"{_head(text.lstrip())})", origin)
    if not sgml and _MARKUP.match(text):
        raise InputError(f"is an HTML or XML page, not a corpus (it starts with {_head(text.lstrip())})", origin)


# -- language -----------------------------------------------------------------------------------------------------

# frequent words of one language that the other does not use (a handful is enough to tell English from French text)
FUNCTION_WORDS = {
    "en": frozenset("the of and to is that for with was this are have which from be it by not".split()),
    "fr": frozenset("le la les des et est une que qui dans pour pas du sur au sont avec ce".split()),
}
SAMPLE_LINES = 1000  # lines read from the start of a file
MIN_WORDS = 50  # function words of either language needed to judge (fewer: a file too short or too odd to tell)
_WORD = re.compile(r"[^\W\d_]+")


def function_words(path: Path, layout: str) -> dict[str, int]:
    """How many of each language's :data:`FUNCTION_WORDS` the first :data:`SAMPLE_LINES` lines of a dataset file
    (already checked by :func:`check_text`; gzip when ``layout`` ends in ``.gz``) hold, lowercased."""
    opener = gzip.open if layout.endswith(".gz") else open
    counts = dict.fromkeys(FUNCTION_WORDS, 0)
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for _, line in zip(range(SAMPLE_LINES), f):
            for word in _WORD.findall(line.lower()):
                for lang, words in FUNCTION_WORDS.items():
                    counts[lang] += word in words
    return counts


def reads_as_other_language(path: Path, layout: str, lang: str) -> str | None:
    """None when the file's start reads as ``lang`` ("en" or "fr") or cannot be judged; else what it reads as, for
    the message ("French: 12 English function words, 340 French in its first 1,000 lines")."""
    counts = function_words(path, layout)
    other = next(k for k in FUNCTION_WORDS if k != lang)
    if counts[lang] + counts[other] < MIN_WORDS or counts[lang] >= counts[other]:
        return None
    name = {"en": "English", "fr": "French"}
    return (f"reads as {name[other]} ({counts[lang]:,} {name[lang]} function words, {counts[other]:,} {name[other]} "
            f"in its first {SAMPLE_LINES:,} lines)")
