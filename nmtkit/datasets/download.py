"""Settings, checksums, the cache manifest and its lock, and the resumable HTTP download (urllib only).
Policy: see :mod:`nmtkit.datasets`."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.client
import json
import logging
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from nmtkit import __version__
from nmtkit.errors import InputError
from nmtkit.files import atomic_file

log = logging.getLogger("nmtkit.datasets")

CHUNK = 1 << 20
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "nmtkit-cache"
MANIFEST_VERSION = 1


# -- settings -----------------------------------------------------------------------------------------------------


def default_data_dir() -> Path | None:
    """``$NMTKIT_DATA`` (a local mirror), or None."""
    value = os.environ.get("NMTKIT_DATA")
    return Path(value) if value else None


def default_mirror_url() -> str | None:
    """``$NMTKIT_MIRROR_URL`` (an HTTP mirror laid out like the shared data), or None."""
    return os.environ.get("NMTKIT_MIRROR_URL") or None


# -- checksums and the cache manifest -----------------------------------------------------------------------------


def sha256sum(path: str | os.PathLike) -> str:
    """The sha256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


_verified: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 already computed in this process


def _sha256_cached(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        _verified[key] = sha256sum(path)
    return _verified[key]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if needed): two processes never fetch the same file at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no locking
            pass
        yield


class _Manifest:
    """``CACHE/manifest.json``: what the cache holds, with sha256, size, address and date of each file."""

    def __init__(self, cache: Path):
        self.cache = cache
        self.path = cache / MANIFEST

    def read(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"corrupt cache manifest: {e} (remove it and the files beside it to start afresh)",
                             self.path) from None
        if data.get("format") != MANIFEST_FORMAT or data.get("version") != MANIFEST_VERSION:
            raise InputError(f"not an nmtkit cache manifest of version {MANIFEST_VERSION}", self.path)
        return data.get("files", {})

    def get(self, rel: str) -> dict | None:
        return self.read().get(rel)

    def put(self, rel: str, record: dict | None) -> None:
        with _lock(self.cache / ".manifest.lock"):
            files = self.read()
            if record is None:
                files.pop(rel, None)
            else:
                files[rel] = record
            self.cache.mkdir(parents=True, exist_ok=True)
            with atomic_file(self.path) as f:
                json.dump({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "files": files}, f, indent=1,
                          sort_keys=True)
                f.write("\n")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- downloading --------------------------------------------------------------------------------------------------

_TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


class _Interrupted(Exception):
    """A download stopped before its end (connection dropped, timeout); the .part file is kept."""

    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final  # not worth retrying (e.g. an unknown host name)


def _progress_bar(total: int | None, initial: int, desc: str, progress: bool | None):
    show = sys.stderr.isatty() if progress is None else progress
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                dynamic_ncols=True, file=sys.stderr, leave=False)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}


class DownloadInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a download that is kept as ``NAME.part`` for the next call to resume; its message
    says so (the tools print it after "interrupted; ")."""


def download(url: str, dest: str | os.PathLike, *, sha256: str | None = None, size: int | None = None,
             progress: bool | None = None, retries: int = 3, timeout: float = 60.0, backoff: float = 1.0,
             check: Callable[[Path], object] | None = None, hint: str = "") -> str:
    """Download ``url`` to ``dest``, resuming ``dest.part`` if an earlier call was interrupted; return the sha256.

    The file is written as ``dest.part`` (with ``dest.part.json`` recording the address and the server's validator),
    checked (``size`` and ``sha256`` when given, then ``check(part)``, which raises an InputError when the content is
    not what it should be) and renamed to ``dest``. A failed check is an InputError, and the bad file is removed. An
    interrupted transfer is retried ``retries`` times within this call, each retry resuming with an HTTP ``Range``
    request; when they are spent, an InputError says so and the ``.part`` file is kept for the next call to resume.
    HTTP errors (404, ...) are InputErrors at once; ``hint`` ends the message of an address that cannot be reached.
    Ctrl-C or SIGTERM (KeyboardInterrupt) keeps a ``.part`` that has bytes, and raises :class:`DownloadInterrupted`
    saying where it is; an empty one is removed.
    """
    dest = Path(dest)
    part, meta_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        got = _download_retrying(url, part, meta_path, size, progress, retries, timeout, backoff, dest.name, hint)
        _check_part(url, part, meta_path, got, sha256, size, check)
    except KeyboardInterrupt:
        done = part.stat().st_size if part.exists() else 0
        if not done:
            _remove(part, meta_path)
            raise
        raise DownloadInterrupted(f"the {done:,} bytes of {url} downloaded so far are kept in {part} (with "
                                  f"{meta_path.name}) for the next call to resume; nothing else was written") from None
    os.replace(part, dest)
    _remove(meta_path)
    return got


def _check_part(url: str, part: Path, meta_path: Path, got: str, sha256: str | None, size: int | None,
                check: Callable[[Path], object] | None) -> None:
    """The complete ``part`` is the file asked for; if not, it is removed and an InputError says why."""
    try:
        if size is not None and part.stat().st_size != size:
            raise InputError(f"downloaded {part.stat().st_size:,} bytes, expected {size:,}", url)
        if sha256 is not None and got != sha256.lower():
            raise InputError(f"checksum mismatch: sha256 {got}, expected {sha256}", url)
        if check is not None:
            check(part)
    except InputError as e:
        _remove(part, meta_path)
        raise InputError(f"{e.message}; the download was removed", e.path, e.line) from None


def _download_retrying(url: str, part: Path, meta_path: Path, size: int | None, progress: bool | None,
                       retries: int, timeout: float, backoff: float, desc: str, hint: str) -> str:
    attempt = 0
    while True:
        try:
            return _download_once(url, part, meta_path, size, progress, timeout, desc)
        except _Interrupted as e:
            done = part.stat().st_size if part.exists() else 0
            if not done and (attempt >= retries or e.final):
                raise InputError(f"cannot download: {e}{hint}", url) from None
            if attempt >= retries:
                raise InputError(f"download interrupted after {done:,} bytes ({e}); run again to resume from "
                                 f"{part}", url) from None
            attempt += 1
            log.warning("%s: interrupted after %s bytes (%s); resuming (retry %d of %d)", url, f"{done:,}", e,
                        attempt, retries)
            time.sleep(backoff * attempt)


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _download_once(url: str, part: Path, meta_path: Path, size: int | None, progress: bool | None, timeout: float,
                   desc: str) -> str:
    """One HTTP request: resume ``part`` when it belongs to ``url``; return the sha256 of the complete file."""
    meta = _read_json(meta_path)
    offset = part.stat().st_size if part.exists() else 0
    if offset and meta.get("url") != url:  # a stale .part of another address: start over
        offset = 0
    total = meta.get("total") if offset else None
    if offset and total is not None and offset >= total:
        offset = 0 if offset > total else offset
    headers = {"User-Agent": f"nmtkit/{__version__} (urllib)", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if meta.get("validator"):
            headers["If-Range"] = meta["validator"]
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset and total == offset:  # the .part is already complete
            return sha256sum(part)
        if e.code == 416:
            _remove(part, meta_path)
            raise _Interrupted("the server refused to resume; starting over") from None
        if e.code >= 500 or e.code == 429:
            raise _Interrupted(f"HTTP {e.code} {e.reason}") from None
        raise InputError(f"HTTP {e.code} {e.reason}", url) from None
    except ValueError as e:  # a malformed address
        raise InputError(f"cannot download: {e}", url) from None
    except _TRANSIENT as e:
        unknown_host = isinstance(getattr(e, "reason", None), socket.gaierror)
        raise _Interrupted(_reason(e), final=unknown_host) from None
    with response:
        start = 0
        if response.status == 206:
            m = re.match(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", response.headers.get("Content-Range", ""))
            if m is None or int(m.group(1)) != offset:  # not the range asked for: do not trust it
                _remove(part, meta_path)
                raise _Interrupted("the server answered with another range; starting over")
            start = offset
            total = None if m.group(3) == "*" else int(m.group(3))
        else:  # 200: the whole file (a server without ranges, or a file that changed since the .part was made)
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if start == 0 and offset:
            log.info("%s: the server sent the whole file; starting over", url)
        if size is not None and total is not None and total != size:
            raise InputError(f"the server announces {total:,} bytes, expected {size:,}", url)
        validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
        meta_path.write_text(json.dumps({"url": url, "validator": validator, "total": total}), encoding="utf-8")
        h = hashlib.sha256()
        if start:
            with open(part, "rb") as f:
                while block := f.read(CHUNK):
                    h.update(block)
        bar = _progress_bar(total, start, desc, progress)
        if bar is None:
            log.info("downloading %s%s%s", url, f" ({total:,} bytes)" if total else "",
                     f", resuming at byte {start:,}" if start else "")
        done = start
        try:
            with open(part, "ab" if start else "wb") as f:
                while True:
                    try:
                        block = response.read(CHUNK)
                    except http.client.IncompleteRead as e:  # the connection closed before Content-Length
                        f.write(e.partial)
                        raise _Interrupted("connection closed early") from None
                    except _TRANSIENT + (OSError,) as e:
                        raise _Interrupted(_reason(e)) from None
                    if not block:
                        break
                    f.write(block)
                    h.update(block)
                    done += len(block)
                    if bar is not None:
                        bar.update(len(block))
                f.flush()
                os.fsync(f.fileno())
        finally:
            if bar is not None:
                bar.close()
        if total is not None and done < total:
            raise _Interrupted(f"connection closed after {done:,} of {total:,} bytes")
        return h.hexdigest()


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if type(e).__name__ not in text else text
