"""Resolving catalogue files to paths: format checks, extraction and conversion, the :class:`Fetcher`, and
:func:`get`, :func:`link`, :func:`describe`. Policy: see :mod:`nmtkit.datasets`."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import logging
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from nmtkit.datasets import hansards
from nmtkit.datasets.catalogue import CATALOGUE, CONVERSIONS, DataFile, Dataset, Download, Resolved, lookup
from nmtkit.datasets.content import check_archive, check_format, check_open_file, check_text, reads_as_other_language
from nmtkit.datasets.download import (
    CHUNK,
    _lock,
    _Manifest,
    _now,
    _remove,
    _sha256_cached,
    default_data_dir,
    default_mirror_url,
    download,
    sha256sum,
)
from nmtkit.runtime import default_cache_dir
from nmtkit.errors import InputError
from nmtkit.files import atomic_file

log = logging.getLogger("nmtkit.datasets")

# the end of a message about a publisher's address that cannot be reached (no internet, a firewall)
OFFLINE_HINT = ("; without internet, point $NMTKIT_DATA (or --data) at a copy of the shared data, such as "
                "../shared/data beside a checkout, or $NMTKIT_MIRROR_URL (or --mirror-url) at an HTTP mirror of it")


# -- extraction ---------------------------------------------------------------------------------------------------


def _wanted(f: DataFile) -> list[str]:
    """The archive members a file is made from: its member, or (``hansards``) its sittings' files."""
    if f.convert == "hansards":
        return [member for member, _ in hansards.members(f.path)]
    return [] if f.member is None else [f.member]


def _members(download: Download, archive: Path, wanted: Iterable[str]) -> dict[str, Path]:
    """Extract archive members into temporary files beside the archive (one pass); member -> temporary path."""
    wanted = set(wanted)
    out: dict[str, Path] = {}

    def sink(member: str, stream) -> None:
        fd, tmp = tempfile.mkstemp(dir=archive.parent, prefix=".member.", suffix=".tmp")
        out[member] = Path(tmp)  # (before the copy: a copy that fails is removed with the others)
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(stream, f, CHUNK)

    try:
        if download.kind in ("tgz", "tar"):
            with tarfile.open(archive, mode="r|*") as tar:  # streaming: one pass even over a 2.6 GB archive
                for info in tar:
                    if info.name in wanted and info.isfile():
                        sink(info.name, tar.extractfile(info))
                        if len(out) == len(wanted):
                            break
        elif download.kind == "zip":
            with zipfile.ZipFile(archive) as z:
                for member in wanted & set(z.namelist()):
                    with z.open(member) as stream:
                        sink(member, stream)
        else:
            raise ValueError(f"{download.name}: a {download.kind} download has no members")
    except BaseException as e:  # (Ctrl-C and SIGTERM too: no temporary file is left behind)
        for p in out.values():
            _remove(p)
        if isinstance(e, (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error)):
            raise InputError(f"cannot read the archive: {e}", archive) from None
        raise
    missing = sorted(wanted - set(out))
    if missing:
        for p in out.values():
            _remove(p)
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InputError(f"the archive has no member {', '.join(missing[:5])}{more}", archive)
    return out


def _convert(source: Path, convert: str, f, origin: str) -> None:
    """Write the converted content of ``source`` to the binary file ``f``."""
    if convert == "copy":
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, CHUNK)
    elif convert == "gunzip":
        try:
            with gzip.open(source, "rb") as src:
                shutil.copyfileobj(src, f, CHUNK)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"cannot decompress: {e}", origin) from None
    elif convert == "sgml-text":
        from nmtkit.files import read_segments

        for seg in read_segments(source):  # as sacreBLEU extracts a test set: text, stripped, spaces collapsed
            f.write((re.sub(" +", " ", seg.text.strip(" ")) + "\n").encode("utf-8"))
    elif convert.startswith("tsv-gz:"):
        column = int(convert.split(":", 1)[1])
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as out, open(source, "rb") as src:
            for number, raw in enumerate(src, 1):
                cells = raw.rstrip(b"\n").split(b"\t")
                if len(cells) <= column:
                    raise InputError(f"has {len(cells)} tab-separated columns, expected at least {column + 1}",
                                     origin, number)
                out.write(cells[column] + b"\n")
    else:
        raise ValueError(f"unknown conversion {convert!r}; known: {', '.join(CONVERSIONS)}")


# -- resolving files ----------------------------------------------------------------------------------------------


def _check_reference(path: Path, f: DataFile, origin: str) -> None:
    """A copy from a mirror must be the reference copy: size, then sha256."""
    if f.size is not None and path.stat().st_size != f.size:
        raise InputError(f"has {path.stat().st_size:,} bytes, the catalogue's copy of {f.path} has {f.size:,} "
                         f"(a damaged or different copy{origin})", path)
    if f.sha256 is not None and (got := _sha256_cached(path)) != f.sha256:
        raise InputError(f"checksum mismatch: sha256 {got}, the catalogue's copy of {f.path} has {f.sha256} "
                         f"(a damaged or different copy{origin})", path)


class Fetcher:
    """Resolves catalogue files to paths: local mirror, cache, HTTP mirror, publisher (see the module docstring)."""

    def __init__(self, cache_dir: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
                 mirror_url: str | None = None, *, use_env: bool = True, verify: bool = False,
                 progress: bool | None = None, retries: int = 3, timeout: float = 60.0):
        self.cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.data_dir = Path(data_dir) if data_dir else (default_data_dir() if use_env else None)
        self.mirror_url = mirror_url or (default_mirror_url() if use_env else None)
        self.verify, self.progress, self.retries, self.timeout = verify, progress, retries, timeout
        self.manifest = _Manifest(self.cache)

    def get(self, dataset: str | Dataset) -> Resolved:
        """The dataset's files, fetching what neither the local mirror nor the cache holds."""
        d = lookup(dataset)
        found = {lang: self._local(f) for lang, f in d.files.items()}
        missing = {lang: f for lang, f in d.files.items() if found[lang] is None}
        if missing:
            with _lock(self.cache / ".fetch.lock"):  # one fetch at a time per cache, across processes
                found.update({lang: self._cached(f) for lang, f in missing.items()})
                todo = [f for lang, f in missing.items() if found[lang] is None]
                if todo and self.mirror_url:
                    for f in todo:
                        self._from_http_mirror(f)
                elif todo:
                    by_download: dict[Download, list[DataFile]] = {}
                    for f in todo:
                        by_download.setdefault(f.download, []).append(f)
                    for download_, files in by_download.items():
                        self._from_publisher(download_, files)
                for lang, f in missing.items():
                    if found[lang] is None:
                        found[lang] = (self.cache / "data" / f.path,
                                       "http-mirror" if self.mirror_url else "publisher")
                self._check_pair(d, found)
        elif self.verify:
            self._check_pair(d, found)
        return Resolved(d.name, {lang: p for lang, (p, _) in found.items()},
                        {lang: o for lang, (_, o) in found.items()})

    # where a file already is --------------------------------------------------------------------------------------

    def _local(self, f: DataFile) -> tuple[Path, str] | None:
        if self.data_dir is not None:
            local = self.data_dir / f.path
            if local.is_file():
                _check_reference(local, f, f" in the mirror {self.data_dir}")
                return local, "mirror"
            log.info("%s is not in the mirror %s; using the cache", f.path, self.data_dir)
        return self._cached(f)

    def _cached(self, f: DataFile) -> tuple[Path, str] | None:
        rel = f"data/{f.path}"
        path = self.cache / rel
        record = self.manifest.get(rel)
        if path.is_file() and record is not None:
            self._check_cached(path, record)
            if self.verify and record["sha256"] != f.sha256:  # (a file nmtkit has no checksum for: its content)
                try:
                    check_text(path, f.path, str(path))
                except InputError as e:
                    raise InputError(f"{e.message}: not what the catalogue describes (cached without this check: "
                                     "remove it to fetch it again)", e.path, e.line) from None
            return path, "cache"
        return None

    def _check_cached(self, path: Path, record: dict) -> None:
        if path.stat().st_size != record["size"]:
            raise InputError(f"has {path.stat().st_size:,} bytes, the cache manifest recorded {record['size']:,} "
                             "(a damaged cache: remove the file to fetch it again)", path)
        if self.verify and (got := sha256sum(path)) != record["sha256"]:
            raise InputError(f"checksum mismatch: sha256 {got}, the cache manifest recorded {record['sha256']} "
                             "(a damaged cache: remove the file to fetch it again)", path)

    def _check_pair(self, d: Dataset, found: dict) -> None:
        """The two sides of a parallel corpus have as many lines (SGML: segments), are not the same file, and each
        side that is not a reference copy reads as its language (:func:`~nmtkit.datasets.content.
        reads_as_other_language`), unless both are the catalogue's reference copies. Checked when a side was just fetched (a fetched side that is not
        a reference copy is then removed, with its record, should the check fail) or, with ``verify``, cached."""
        sides = {}
        for lang in ("en", "fr"):
            f, (path, origin) = d.files[lang], found[lang]
            sides[lang] = (f, path, origin, {} if origin == "mirror" else self.manifest.get(f"data/{f.path}") or {})
        reference = {lang for lang, (f, _, origin, record) in sides.items()
                     if origin == "mirror" or (f.sha256 is not None and record.get("sha256") == f.sha256)}
        fresh = {lang for lang, (_, _, origin, _) in sides.items() if origin in ("http-mirror", "publisher")}
        if len(reference) == 2 or not (fresh or self.verify):
            return

        def count(f: DataFile, path: Path, record: dict) -> int:
            n = record.get("segments", record.get("lines"))  # (None: a record of an older nmtkit, or a mirror's file)
            return next(iter(check_text(path, f.path, str(path)).values())) if n is None else n

        (f_en, p_en, _, r_en), (f_fr, p_fr, _, r_fr) = sides["en"], sides["fr"]
        n_en, n_fr = count(f_en, p_en, r_en), count(f_fr, p_fr, r_fr)
        src_en, src_fr = r_en.get("url", str(p_en)), r_fr.get("url", str(p_fr))
        unit = "segments" if f_en.path.endswith((".sgm", ".sgml")) else "lines"
        if r_en.get("sha256") is not None and r_en.get("sha256") == r_fr.get("sha256"):
            problem = f"the English and the French file are one and the same (sha256 {r_en['sha256']}, {src_en})"
        elif n_en != n_fr:
            problem = (f"{f_en.path} has {n_en:,} {unit} ({src_en}), {f_fr.path} has {n_fr:,} ({src_fr}): not the two "
                       "sides of one parallel corpus")
        else:  # (the language of each side not known by its checksum)
            wrong = [f"{f.path} {verdict} ({record.get('url', str(path))})"
                     for lang, (f, path, _, record) in sides.items() if lang not in reference
                     if (verdict := reads_as_other_language(path, f.path, lang))]
            if not wrong:
                return
            problem = "; ".join(wrong) + ": not the English and the French side"
        removed = sorted(fresh - reference)
        for lang in removed:
            self.manifest.put(f"data/{d.files[lang].path}", None)
            _remove(sides[lang][1])
        if removed:
            problem += f"; {' and '.join(d.files[lang].path for lang in removed)} removed from the cache"
        else:
            problem += " (remove them from the cache to fetch them again)"
        raise InputError(problem, d.name)

    # fetching -----------------------------------------------------------------------------------------------------

    def _from_http_mirror(self, f: DataFile) -> None:
        rel = f"data/{f.path}"
        target = self.cache / rel
        url = urllib.parse.urljoin(self.mirror_url.rstrip("/") + "/", urllib.parse.quote(f.path))
        content: dict = {}  # (no checksum in the catalogue: the content is checked, and its line count recorded)
        check = None if f.sha256 else (lambda part: content.update(check_text(part, f.path, url)))
        got = download(url, target, sha256=f.sha256, size=f.size, progress=self.progress, retries=self.retries,
                       timeout=self.timeout, check=check)
        if f.sha256 is None:
            log.warning("%s: no checksum in the catalogue; recorded sha256 %s (trust on first use)", url, got)
        self.manifest.put(rel, {"sha256": got, "size": target.stat().st_size, "url": url, "origin": "http-mirror",
                                "verified": f.sha256 is not None, **content, "time": _now()})

    def archive(self, d: Download, files: Iterable[DataFile] = ()) -> Path:
        """The publisher's file in ``CACHE/downloads/``, downloaded once and checked (see the checksum policy):
        without a checksum in the catalogue, it must be whole and hold the members of ``files`` and of every
        catalogue file made from it."""
        rel = f"downloads/{d.name}"
        path = self.cache / rel
        record = self.manifest.get(rel)
        if path.is_file() and record is not None:
            self._check_cached(path, record)
            if d.sha256 is not None and record["sha256"] != d.sha256:
                raise InputError(f"the cache manifest records sha256 {record['sha256']}, the catalogue expects "
                                 f"{d.sha256} (remove it to download again)", path)
            return path
        files = list(files) + [f for ds in CATALOGUE.values() for f in ds.files.values() if f.download == d]
        members = {m for f in files for m in _wanted(f)}
        layout = files[0].path if files else d.name
        got = download(d.url, path, sha256=d.sha256, size=d.size, progress=self.progress, retries=self.retries,
                       timeout=self.timeout, hint=OFFLINE_HINT,
                       check=lambda part: check_format(part, d.kind, d.url) if d.sha256 else
                       check_archive(part, d.kind, members, d.url, layout))
        if d.sha256 is None:
            log.warning("%s: the catalogue has no checksum for this file; recorded its sha256 %s in %s (trust on "
                        "first use: later uses are checked against it)", d.url, got, self.manifest.path)
        self.manifest.put(rel, {"sha256": got, "size": path.stat().st_size, "url": d.url, "origin": "publisher",
                                "verified": d.sha256 is not None, "time": _now()})
        return path

    def _from_publisher(self, d: Download, files: list[DataFile]) -> None:
        archive = self.archive(d, files)
        members = {m for f in files for m in _wanted(f)}
        extracted = _members(d, archive, members) if members else {}  # one pass over the archive for all
        try:
            for f in files:
                rel = f"data/{f.path}"
                target = self.cache / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                origin = d.url + (f" ({f.member})" if f.member else "")
                with atomic_file(target, "wb") as out:
                    if f.convert == "hansards":
                        hansards.convert(f.path, extracted, out, d.url)
                    else:
                        _convert(extracted[f.member] if f.member else archive, f.convert, out, origin)
                    content = check_open_file(out, f.path, origin)  # before it is renamed into place
                got = sha256sum(target)
                same_text = _same_text(target, f) if f.sha256 is not None and got != f.sha256 else None
                if same_text:
                    log.info("%s, made from %s, holds the reference copy's text (sha256 %s of the decompressed "
                             "text); only its gzip bytes differ", target, origin, f.text_sha256)
                elif f.sha256 is not None and got != f.sha256:
                    log.warning("%s, made from %s, differs from the catalogue's reference copy (sha256 %s, not %s): "
                                "the publisher's file is not the one the reference was made from; scores on it are "
                                "not comparable with runs on the reference copy", target, origin, got, f.sha256)
                self.manifest.put(rel, {"sha256": got, "size": target.stat().st_size, "url": d.url,
                                        "member": f.member, "convert": f.convert, "origin": "publisher",
                                        "matches_reference": None if f.sha256 is None else got == f.sha256,
                                        "text_matches_reference": same_text, **content,
                                        "time": _now()})
        finally:
            for p in extracted.values():
                _remove(p)


def _same_text(path: Path, f: DataFile) -> bool | None:
    """Whether a .gz file decompresses to the reference copy's text (None: the catalogue has no text checksum)."""
    if f.text_sha256 is None:
        return None
    h = hashlib.sha256()
    with gzip.open(path, "rb") as src:
        while block := src.read(CHUNK):
            h.update(block)
    return h.hexdigest() == f.text_sha256


def get(dataset: str | Dataset, *, cache_dir: str | os.PathLike | None = None,
        data_dir: str | os.PathLike | None = None, mirror_url: str | None = None, verify: bool = False,
        progress: bool | None = None, retries: int = 3, timeout: float = 60.0) -> Resolved:
    """The files of a dataset on this machine: from a local mirror, the cache, an HTTP mirror or the publisher.

    ``cache_dir``, ``data_dir`` and ``mirror_url`` default to ``$NMTKIT_CACHE`` (or ``~/.cache/nmtkit``),
    ``$NMTKIT_DATA`` and ``$NMTKIT_MIRROR_URL``. ``verify`` re-checks cached files against the sha256 recorded in the
    cache manifest. ``progress``: a progress bar (default: when stderr is a terminal). Problems are InputErrors.
    """
    return Fetcher(cache_dir, data_dir, mirror_url, verify=verify, progress=progress, retries=retries,
                   timeout=timeout).get(dataset)


def link(resolved: Resolved, dest: str | os.PathLike) -> dict[str, Path]:
    """Symbolic links ``DEST/LAYOUT_PATH`` -> the resolved files, so that scripts can use fixed paths."""
    d = lookup(resolved.name)
    out = {}
    for lang, path in resolved.files.items():
        where = Path(dest) / d.files[lang].path
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_name(f".{where.name}.link.tmp")
        _remove(tmp)
        os.symlink(Path(path).resolve(), tmp)
        os.replace(tmp, where)
        out[lang] = where
    return out


def describe(d: Dataset) -> dict:
    """A JSON-friendly description of a catalogue entry."""
    return {"name": d.name, "description": d.description, "pairs": d.pairs, "licence": d.licence,
            "homepage": d.homepage,
            "files": {lang: {**{k: v for k, v in dataclasses.asdict(f).items() if k != "download"},
                             "download": dataclasses.asdict(f.download) | {"policy": f.download.policy}}
                      for lang, f in d.files.items()}}
