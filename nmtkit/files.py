"""Reading corpus files and writing outputs safely.

Reading: plain UTF-8 text, gzip (detected by its magic bytes, whatever the name) and WMT SGML (``<seg id=…>``
inside ``<doc>``; detected by the ``.sgm``/``.sgml`` extension or by its ``<srcset``/``<refset``/``<tstset``
header). Lines are split on ``\\n`` only: ``\\r``, U+2028, U+0085, form feed and the other characters that
``str.splitlines()`` treats as line breaks stay inside their line, so line *i* of a source file always meets line
*i* of its translation. Every line is decoded strictly; invalid UTF-8 is an :class:`~nmtkit.errors.InputError`
naming the file and line. A UTF-8 byte-order mark at the very start of a file (Windows editors write one) is an
encoding signature, not text: it is dropped from line 1 (``without_bom``), so that it does not glue itself to the
first word as an unknown token (nmt-prepare drops it from a given BPE codes file too); a U+FEFF anywhere else is
text and stays.

Writing: :func:`atomic_file` and :func:`atomic_dir` build an output under a temporary sibling name and rename it
into place only when it is complete, so a crash, Ctrl-C or bad input never leaves a half-written output behind.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from nmtkit.errors import InputError

SGML_HEADERS = (b"<srcset", b"<refset", b"<tstset", b"<mteval")
BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark (U+FEFF encoded)
_SEG = re.compile(rb'^\s*<seg\b[^>]*?\bid\s*=\s*"?([^"\s>]+)"?[^>]*>(.*)</seg>\s*$', re.IGNORECASE | re.DOTALL)
_DOC = re.compile(rb'<doc\b[^>]*?\bdocid\s*=\s*"?([^"\s>]+)"?', re.IGNORECASE)


@dataclass(frozen=True)
class Segment:
    """One segment of a corpus file: its text (without the line end), where it is, and for SGML its ids."""

    text: str
    line: int  # 1-based physical line in the file
    key: tuple[str, str] | None = None  # (docid, seg id) for SGML, None for plain text


WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def open_binary(path: str | os.PathLike):
    """Open ``path`` for reading bytes, transparently decompressing gzip; a missing file is an InputError."""
    path = os.fspath(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path) from None
    except PermissionError:
        raise InputError("permission denied", path) from None
    if f.peek(2)[:2] == b"\x1f\x8b":
        gz = gzip.GzipFile(fileobj=f, mode="rb")
        gz.myfileobj = f  # so that closing the gzip stream closes the file too (as gzip.open does)
        return gz
    return f


def is_sgml(path: str | os.PathLike, stream=None) -> bool:
    """True when ``path`` is WMT SGML: by extension (``.sgm``, ``.sgml``, optionally ``.gz``) or by its header.
    Given the open ``stream`` of ``path``, its header is peeked at, not read: a pipe (``<(...)``, ``/dev/stdin``)
    cannot be opened a second time from its start."""
    name = os.fspath(path).lower().removesuffix(".gz")
    if name.endswith((".sgm", ".sgml")):
        return True
    try:
        if stream is not None:
            head = stream.peek(4096)[:4096]
        else:
            with open_binary(path) as f:
                head = f.read(4096)
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read: {e}", path) from None
    return head.removeprefix(BOM).lstrip()[:7].lower() in SGML_HEADERS


def without_bom(raw: bytes, line: int) -> bytes:
    """The bytes of physical line ``line`` (1-based) without a leading UTF-8 byte-order mark when it is line 1."""
    return raw[len(BOM):] if line == 1 and raw.startswith(BOM) else raw


def decode_line(raw: bytes, path: str, line: int) -> str:
    """Decode one line strictly as UTF-8, naming file, line and column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})", path, line) from None


def read_segments(path: str | os.PathLike) -> Iterator[Segment]:
    """Yield the segments of a plain, gzip or SGML corpus file, in file order."""
    path = os.fspath(path)
    with open_binary(path) as f:
        sgml = is_sgml(path, f)
        lineno = 0
        doc = ""
        segments = 0
        try:
            for raw in f:  # a binary file iterates on b"\n" only
                lineno += 1
                raw = without_bom(raw[:-1] if raw.endswith(b"\n") else raw, lineno)
                if not sgml:
                    yield Segment(decode_line(raw, path, lineno), lineno)
                    continue
                m = _DOC.search(raw)
                if m:
                    doc = decode_line(m.group(1), path, lineno)
                if b"<seg" not in raw.lower():
                    continue
                m = _SEG.match(raw)
                if m is None:
                    raise InputError("malformed <seg> element (expected <seg id=N>text</seg> on one line)",
                                     path, lineno)
                segid = decode_line(m.group(1), path, lineno)
                segments += 1
                yield Segment(decode_line(m.group(2), path, lineno).strip(), lineno, (doc, segid))
        except (OSError, EOFError, zlib.error) as e:  # a truncated (EOFError) or corrupt (zlib.error) gzip stream
            raise InputError(f"cannot read past line {lineno}: {e}", path, lineno + 1) from None
        if sgml and segments == 0 and lineno > 0:  # (a plain-text file named *.sgm would become 0 segments)
            raise InputError(f"read as WMT SGML (by its name or header) but none of its {lineno} line(s) holds a "
                             "<seg> element; a plain-text file must not be named .sgm/.sgml", path)


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Iterator[tuple[Segment, Segment]]:
    """Yield aligned (source, target) segments; unequal counts or mismatched SGML ids are InputErrors."""
    src_path, tgt_path = os.fspath(src_path), os.fspath(tgt_path)
    src_it, tgt_it = read_segments(src_path), read_segments(tgt_path)
    n = 0
    while True:
        s = next(src_it, None)
        t = next(tgt_it, None)
        if s is None or t is None:
            if s is None and t is None:
                return
            longer_path, longer_it = (src_path, src_it) if t is None else (tgt_path, tgt_it)
            shorter_path = tgt_path if t is None else src_path
            total = n + 1 + sum(1 for _ in longer_it)
            raise InputError(
                f"has {n} segments but its partner {longer_path} has {total}: the line counts must be equal",
                shorter_path,
            )
        n += 1
        if s.key != t.key:
            raise InputError(
                f"segment {n} is {_describe(t.key)} but segment {n} of {src_path} is {_describe(s.key)}",
                tgt_path,
                t.line,
            )
        yield s, t


def _describe(key: tuple[str, str] | None) -> str:
    return "a plain-text line" if key is None else f'<seg id="{key[1]}"> of doc "{key[0]}"'


def resolve_prefix(prefix: str, src_lang: str, tgt_lang: str) -> tuple[str, str]:
    """Find the file pair for a corpus prefix.

    ``PREFIX`` names ``PREFIX.<lang>``, ``PREFIX.<lang>.gz``, ``PREFIX.<lang>.sgm`` or ``PREFIX.<lang>.sgm.gz``;
    two explicit paths separated by a comma (``SRC_FILE,TGT_FILE``) name the files directly, for corpora such as
    WMT's ``newstest2014-fren-src.en.sgm`` / ``newstest2014-fren-ref.fr.sgm`` whose names differ by more than
    the language.
    """
    if "," in prefix:
        parts = prefix.split(",")
        if len(parts) != 2 or not all(parts):
            raise InputError(f"'{prefix}': expected PREFIX or SRC_FILE,TGT_FILE")
        for p in parts:
            if not os.path.isfile(p):
                raise InputError("no such file", p)
        return parts[0], parts[1]
    pair = []
    for lang in (src_lang, tgt_lang):
        tried = [f"{prefix}.{lang}{ext}" for ext in ("", ".gz", ".sgm", ".sgm.gz")]
        found = next((p for p in tried if os.path.isfile(p)), None)
        if found is None:
            raise InputError(f"no {lang} file for corpus prefix (tried {', '.join(tried)})", prefix)
        pair.append(found)
    return pair[0], pair[1]


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Write ``path`` through a temporary sibling that is fsynced and renamed into place on success only."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError("is a directory; cannot write a file there", path)
    try:
        remove_stale(directory, os.path.basename(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=tmp_suffix())
    except OSError as e:
        reason = "no such directory" if e.errno == errno.ENOENT else e.strerror
        raise InputError(f"cannot write: {reason}", path) from None
    try:
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding, newline=None if binary else "\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if e.errno in WRITE_ERRORS:  # (the disk filled up, a quota, an I/O error: nothing half-written stays)
            raise InputError(f"cannot write: {os.strerror(e.errno).lower()}; nothing was written", path) from None
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_distinct(outputs: dict[str, str | os.PathLike | None],
                   inputs: dict[str, str | os.PathLike | None] | None = None) -> None:
    """Refuse two outputs of one command (``{"--output": path, ...}``; ``"-"`` is stdout) that name the same file,
    and an output that is one of the inputs: one would overwrite the other."""
    def key(path: str) -> str:
        return "<stdout>" if path == "-" else os.path.realpath(path)

    seen: dict[str, str] = {}
    for option, path in (inputs or {}).items():
        if path is not None and path != "-":
            seen.setdefault(key(os.fspath(path)), f"the input {option}")
    for option, path in outputs.items():
        if path is None:
            continue
        path = os.fspath(path)
        other = seen.get(key(path))
        if other is None and path != "-" and os.path.exists(path):
            other = next((what for k, what in seen.items() if k != "<stdout>" and os.path.exists(k)
                          and os.path.samefile(k, path)), None)
        if other is not None:
            raise InputError(f"{option} names the same file as {other}; give each output its own file",
                             "standard output" if path == "-" else path)
        seen[key(path)] = f"the output {option}"


def check_output_dir(dest: str | os.PathLike, force: bool = False, marker: str | None = None,
                     kind: str = "an earlier output") -> None:
    """Refuse an output directory that :func:`atomic_dir` would not replace (call it early, before any work).

    An existing non-empty ``dest`` is refused unless ``force``. ``marker``, when given, is the file that marks an
    earlier output of the same ``kind``: ``force`` then replaces only a ``dest`` that holds it, never a directory
    of other files (a mistyped ``--dest ~ --force`` must not delete a home directory).
    """
    dest = os.fspath(dest)
    if not os.path.exists(dest):
        return
    if not os.path.isdir(dest):
        raise InputError("exists and is not a directory", dest)
    if os.listdir(dest):
        if marker is not None and not os.path.exists(os.path.join(dest, marker)):
            raise InputError(f"already holds files and no {marker}, so it is not {kind}; refusing to replace it "
                             "(choose another destination)", dest)
        if not force:
            raise InputError(f"already holds {'files' if marker is None else kind}; use --force to replace it", dest)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike, force: bool = False, marker: str | None = None,
               kind: str = "an earlier output"):
    """Build a directory under a temporary sibling name and rename it to ``dest`` when the block succeeds.

    ``dest`` is checked first by :func:`check_output_dir`. On any exception, Ctrl-C included, the temporary
    directory is removed and ``dest`` is left exactly as it was.
    """
    dest = os.path.abspath(os.fspath(dest))
    if os.path.islink(dest):  # (replace the directory it names, and keep the user's link)
        dest = os.path.realpath(dest)
    remove_stale(os.path.dirname(dest), os.path.basename(dest), recover=dest)
    check_output_dir(dest, force, marker, kind)
    parent = os.path.dirname(dest)
    made = []  # missing parents created here, deepest first: removed again (if still empty) when the block fails
    p = parent
    while not os.path.exists(p):
        made.append(p)
        p = os.path.dirname(p)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(dest)}.", suffix=tmp_suffix())
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        if os.path.exists(dest) and _exchange(tmp, dest):  # one atomic step: dest is never missing
            shutil.rmtree(tmp, ignore_errors=True)  # (the old output, now under the temporary name)
            return
        if os.path.exists(dest):  # (no RENAME_EXCHANGE here: two renames; a kill between them is recovered from
            old = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(dest)}.",  # the .old by the next run)
                                   suffix=tmp_suffix(".old"))
            os.rmdir(old)
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if old is not None and os.path.exists(old) and not os.path.exists(dest):  # interrupted between renames
            os.replace(old, dest)
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise


def tmp_suffix(kind: str = ".tmp") -> str:
    """The end of this process's temporary names, ``.PID.tmp``: a later run tells a dead run's leftovers from a live
    one's by it (:func:`remove_stale`)."""
    return f".{os.getpid()}{kind}"


_STALE = r"\.{base}\.[A-Za-z0-9_]+\.(?P<pid>\d+)\.(?P<kind>tmp|old)"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's live process)
        return True
    return True


def remove_stale(directory: str | os.PathLike, base: str | None = None, recover: str | None = None,
                 pattern: re.Pattern | None = None) -> list[str]:
    """Remove the temporaries ``.BASE.XXXX.PID.tmp`` (files or directories) that a killed run left in ``directory``,
    never a live process's.  A ``.BASE.XXXX.PID.old`` is an output a kill caught between the two renames of a
    replacement: put back as ``recover`` when that is missing, else removed.  ``pattern`` (with a ``pid`` group)
    replaces the names of ``base``.  Returns what it removed or restored."""
    import logging

    directory = os.fspath(directory) or "."
    pattern = pattern or re.compile(_STALE.format(base=re.escape(base)))
    done = []
    try:
        names = os.listdir(directory)
    except OSError:
        return done
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or _alive(int(m.group("pid"))):
            continue
        path = os.path.join(directory, name)
        if m.groupdict().get("kind") == "old" and recover is not None and not os.path.lexists(recover):
            os.replace(path, recover)
            logging.getLogger("nmtkit").warning("%s: restored from %s, left by a run killed while replacing it "
                                                "(pid %s)", recover, name, m.group("pid"))
        else:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            logging.getLogger("nmtkit").warning("removed %s, a temporary left by a killed run (pid %s)", path,
                                                m.group("pid"))
        done.append(path)
    return done


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the OS or the file
    system cannot (the caller falls back to two renames)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    return False

