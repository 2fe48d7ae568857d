"""Public English–French data: a catalogue with download addresses and checksums, a checked cache, local mirrors.

    >>> from nmtkit import datasets
    >>> data = datasets.get("newstest2014")            # files in a mirror, in the cache, or downloaded once
    >>> data.files["en"], data.prefix                 # Path(.../wmt14/newstest2014.en), ".../wmt14/newstest2014"

or from a shell (a thin command over the same functions; ``--help`` lists its options)::

    python -m nmtkit.datasets --list
    python -m nmtkit.datasets --prefix newstest2014 europarl-v7

**The catalogue** (:data:`CATALOGUE`) holds news-test 2012, 2013 and 2014 (plain text and the official SGML), the
older WMT news sets, the WMT'14 English–French training corpora (Europarl v7, news commentary v9, UN, the 10⁹
French–English corpus, Common Crawl), Tatoeba and Multi30K. A :class:`Dataset` is a pair of :class:`DataFile`\\ s
(English, French); each file has a *layout path* (``wmt14/newstest2014.en``), the same in a mirror and in the cache,
and comes from a :class:`Download`: a file at a public address, usually an archive, with the member to extract and
the conversion to apply (``sgml-text``: the ``<seg>`` texts one per line, as sacreBLEU extracts them; ``gunzip``;
``tsv-gz:N``: column N of a tab-separated file, gzip-compressed).

**Where a file comes from**, in this order:

1. a local mirror, ``data_dir=`` or ``$NMTKIT_DATA`` (on the development machines ``../shared/data``), laid out by
   layout path: the file is used where it is, nothing is copied or downloaded. This is how tests and CI run offline.
2. the cache, ``cache_dir=`` or ``$NMTKIT_CACHE`` (default ``~/.cache/nmtkit``), when an earlier call put it there.
3. an HTTP mirror with the same layout, ``mirror_url=`` or ``$NMTKIT_MIRROR_URL`` (a lab's web server holding a
   copy of the shared data): the file is downloaded by its layout path.
4. the publisher's address: the archive is downloaded once into ``CACHE/downloads/``, then the file is extracted.

**Downloads** use urllib only: a tqdm progress bar on a terminal (a log line otherwise), an interrupted download
kept as ``NAME.part`` and resumed by the next call with an HTTP ``Range`` request (``If-Range`` guards against a file
that changed meanwhile; a server that ignores ranges makes it start over), a few retries within one call, and an
atomic rename into place once the file is complete and verified.

**Checksum policy.** nmtkit records a checksum only where it could compute one; none is invented.

- *Files* (:attr:`DataFile.sha256`): the sha256 and size of the copy in the shared mirror, for every file that the
  mirror holds. A copy from a mirror (local or HTTP) must match it, or it is an :class:`~nmtkit.errors.InputError`
  (a downloaded copy is removed, nothing is left in the cache). A file extracted from a publisher's download is
  compared with it too, but a difference is a *warning* naming both checksums, not an error: nmtkit cannot vouch for
  the publisher's current file (Tatoeba's is replaced every few months; the others could be re-issued), so the file is
  used, and the warning says that its scores are not comparable with runs on the reference copy.
- *Downloads* (:attr:`Download.sha256`): the publishers' archives could not be fetched where this catalogue was made,
  so their checksums are ``None``, and the policy is **trust on first use**: the first download is checked for its
  format (the archive's magic bytes; its expected members when extracted; the size when the catalogue knows it), its
  sha256 is recorded with the address and date in the cache's ``manifest.json`` and printed in a warning (pin it by
  adding it to the catalogue), and every later use of that cached archive is checked against the record (size always,
  sha256 with ``verify=True`` / ``--verify``). A download whose checksum the catalogue does know is checked strictly:
  a mismatch is a one-line InputError and the bad file is removed.
- Files made in the cache are recorded in the manifest the same way (sha256, size, origin), so ``--verify`` detects a
  damaged cache.

**Cache layout**::

    CACHE/downloads/NAME           publishers' files, as published (NAME.part while incomplete, NAME.part.json beside)
    CACHE/data/LAYOUT_PATH         dataset files (from an HTTP mirror, or extracted from downloads)
    CACHE/manifest.json            {"format": "nmtkit-cache", "version": 1, "files": {RELPATH: {sha256, size, ...}}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nmtkit import __version__
from nmtkit.errors import InputError
from nmtkit.files import atomic_file

log = logging.getLogger("nmtkit.datasets")

CHUNK = 1 << 20
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "nmtkit-cache"
MANIFEST_VERSION = 1
CONVERSIONS = ("copy", "gunzip", "sgml-text", "tsv-gz:0", "tsv-gz:1")
KINDS = ("tgz", "tar", "zip", "gz", "text")
_MAGIC = {"tgz": b"\x1f\x8b", "gz": b"\x1f\x8b", "zip": b"PK\x03\x04"}


# -- the catalogue's types ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Download:
    """One file at a public address: the unit that is downloaded, checksummed and cached."""

    name: str  # file name in CACHE/downloads/
    url: str
    kind: str  # tgz, tar, zip, gz or text
    sha256: str | None = None  # None: not known to nmtkit -> trust on first use (see the module docstring)
    size: int | None = None  # bytes, when known
    note: str = ""

    @property
    def policy(self) -> str:
        """How a download is checked: ``"sha256"`` (a known checksum) or ``"trust-on-first-use"``."""
        return "sha256" if self.sha256 else "trust-on-first-use"


@dataclass(frozen=True)
class DataFile:
    """One file of a dataset: where it lies (layout path), what it should be, and how it is made from a download."""

    path: str  # layout path, relative: the same in a mirror ($NMTKIT_DATA) and under CACHE/data/
    download: Download
    member: str | None = None  # the archive member it is made from; None: the download itself
    convert: str = "copy"  # copy, gunzip, sgml-text, tsv-gz:N
    sha256: str | None = None  # of the reference copy (the shared mirror's); None where nmtkit has none
    size: int | None = None  # bytes of the reference copy


@dataclass(frozen=True)
class Dataset:
    """A catalogue entry: a parallel corpus as two files, English and French (line i translates line i)."""

    name: str
    description: str
    files: dict  # language code -> DataFile
    pairs: int | None = None  # sentence pairs, when known
    licence: str = ""
    homepage: str = ""

    def file(self, lang: str) -> DataFile:
        if lang not in self.files:
            raise InputError(f"dataset {self.name} has no '{lang}' file (it has {', '.join(self.files)})")
        return self.files[lang]


@dataclass(frozen=True)
class Resolved:
    """Where a dataset's files are on this machine (:func:`get`)."""

    name: str
    files: dict  # language -> Path
    origins: dict  # language -> "mirror", "cache", "http-mirror" or "publisher"

    @property
    def prefix(self) -> str:
        """``PREFIX`` when the files are ``PREFIX.en``/``PREFIX.fr`` (``.gz`` allowed), else ``SRC,TGT``: the two
        forms ``nmt-prepare`` and ``nmt-select`` accept."""
        paths = [str(p) for p in self.files.values()]
        stems = set()
        for lang, p in zip(self.files, paths):
            stem = p.removesuffix(".gz")
            if not stem.endswith("." + lang):
                return ",".join(paths)
            stems.add(stem.removesuffix("." + lang))
        return stems.pop() if len(stems) == 1 else ",".join(paths)


# -- the catalogue ------------------------------------------------------------------------------------------------

STATMT = "https://www.statmt.org"
WMT14_DEV = Download("wmt14-dev.tgz", f"{STATMT}/wmt14/dev.tgz", "tgz",
                     note="WMT'14 development sets (news-test 2008-2013, many languages), plain text and SGML")
WMT14_TEST = Download("wmt14-test-full.tgz", f"{STATMT}/wmt14/test-full.tgz", "tgz",
                      note="WMT'14 test sets, full versions, SGML")
EUROPARL = Download("training-parallel-europarl-v7.tgz", f"{STATMT}/wmt13/training-parallel-europarl-v7.tgz", "tgz")
COMMONCRAWL = Download("training-parallel-commoncrawl.tgz", f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz",
                       "tgz")
UN = Download("training-parallel-un.tgz", f"{STATMT}/wmt13/training-parallel-un.tgz", "tgz")
NEWS_COMMENTARY = Download("training-parallel-nc-v9.tgz", f"{STATMT}/wmt14/training-parallel-nc-v9.tgz", "tgz")
GIGA_FREN = Download("training-giga-fren.tar", f"{STATMT}/wmt10/training-giga-fren.tar", "tar")
TATOEBA = Download("tatoeba-fra-eng.zip", "https://www.manythings.org/anki/fra-eng.zip", "zip",
                   note="replaced in place by each new release: the mirror holds the 2019-04-07 one")
MULTI30K = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"

# sha256 and size of the shared mirror's copies (computed from ../shared/data; see the checksum policy above)
_REFERENCE = {
    "wmt14/newstest2012.en": ("f9e51f85c4948033fc7d77ef427f4d88908a8dd3f778970f62d0baafac3ff97e", 381734),
    "wmt14/newstest2012.fr": ("29aa5aff172127f6adf5625cc2f8e44f579d524700e84f1ec0eb14f4f19719e4", 440985),
    "wmt14/newstest2013.en": ("ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e", 332974),
    "wmt14/newstest2013.fr": ("909b63be5df3eb8c13e1d5967bf3f0adfdb9f6ed5e638c5bffff563ee2ff7f41", 393465),
    "wmt14/newstest2014.en": ("9a12cb6e8efb3509ebede627e4a9c83ee64935509d561ff70f4b7bd5f93f6096", 375106),
    "wmt14/newstest2014.fr": ("2bd07dc204f965bf88e90adb6223a8cb850f9bf9840df6af1f4945195936656e", 445720),
    "wmt14/sgm/newstest2014-fren-src.en.sgm": ("5521ed9b1d07763c7e8d7ddfc0fda269cd114612a6283bd3836979ea4dd10a26",
                                               441845),
    "wmt14/sgm/newstest2014-fren-ref.fr.sgm": ("c57025c8a338c642fe3ad0206ddc75d258a5584e1d470b75f37af2fb666d7e93",
                                               514587),
    "wmt-news-older/news-test2008.en": ("134e1140848bb0d05e774dbe35b8b69602faf401250c03dbb437bdbe38c37b6f", 263240),
    "wmt-news-older/news-test2008.fr": ("e212f59bb002d73a1bfebdcf101a6c51db3ccfd8a3115cc8a18414b6ee2a28f9", 301220),
    "wmt-news-older/newssyscomb2009.en": ("b734a44294fa3b23a2491cd9a2c59fb5eb71332ace70b2c9039978863dd0e43d", 62557),
    "wmt-news-older/newssyscomb2009.fr": ("bf74d7a28aa72aa79cbff02bec00a14983f65616dd37ee53e17a37e9d933505e", 70529),
    "wmt-news-older/newstest2009.en": ("3fc92718e7b994ca0a5dc57e63b68d5c80244a56e5bb1cec11d2e8dd10b3ff3c", 345562),
    "wmt-news-older/newstest2009.fr": ("2f4f17f73c3b927a3a0ba4cc082f22f70dd396d7d71cd14e160940207f5f6958", 391108),
    "wmt-news-older/newstest2010.en": ("1ebece77e333965cbc66fde735a6f17e026b4d6690f4f7fdaba839b7bdadac3b", 328648),
    "wmt-news-older/newstest2010.fr": ("131ee7deb0ea517bdd6a85ca5f6f5ca3136c5f76daba426ef4dde3d60b9e66a9", 383398),
    "wmt-news-older/newstest2011.en": ("d387569743c0fa9097df4d4e2c1dd9e6ba9ef3cee6e0f473da3204c887dcf8fd", 396884),
    "wmt-news-older/newstest2011.fr": ("9631ea545acf4b921add6baba856b03efae9f0de4c330a314091b3f925506c7f", 456618),
    "tatoeba/fra-eng.en.gz": ("625a056ed473a0548adbede97cdc42f148e9903ecc42b236a4b6056b0d554673", 1264005),
    "tatoeba/fra-eng.fr.gz": ("2f832acaaf0a241e8636e6464634556006cf10f17ce6c336c1bcb0aad85662b1", 1729646),
    "multi30k/train.en": ("460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6", 1801238),
    "multi30k/train.fr": ("5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d", 2111303),
    "multi30k/val.en": ("1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227", 63297),
    "multi30k/val.fr": ("5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc", 73924),
    "multi30k/test_2016_flickr.en": ("399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182", 62076),
    "multi30k/test_2016_flickr.fr": ("cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6", 72261),
}


def _file(path: str, download: Download, member: str | None = None, convert: str = "copy") -> DataFile:
    sha, size = _REFERENCE.get(path, (None, None))
    return DataFile(path, download, member, convert, sha, size)


def _pair(name: str, description: str, en: DataFile, fr: DataFile, **info) -> Dataset:
    return Dataset(name, description, {"en": en, "fr": fr}, **info)


WMT = dict(licence="WMT shared-task data, free for research",
           homepage="https://www.statmt.org/wmt14/translation-task.html")


def _catalogue() -> dict[str, Dataset]:
    sets = []
    for year, pairs in ((2012, 3003), (2013, 3000)):
        sets.append(_pair(f"newstest{year}", f"WMT news-test-{year}, plain text (the paper's development set is "
                          "news-test-2012 and 2013 together)",
                          _file(f"wmt14/newstest{year}.en", WMT14_DEV, f"dev/newstest{year}.en"),
                          _file(f"wmt14/newstest{year}.fr", WMT14_DEV, f"dev/newstest{year}.fr"), pairs=pairs, **WMT))
        sets.append(_pair(f"newstest{year}-sgm", f"WMT news-test-{year}, the official SGML",
                          _file(f"wmt14/sgm/newstest{year}-src.en.sgm", WMT14_DEV, f"dev/newstest{year}-src.en.sgm"),
                          _file(f"wmt14/sgm/newstest{year}-ref.fr.sgm", WMT14_DEV, f"dev/newstest{year}-ref.fr.sgm"),
                          pairs=pairs, **WMT))
    sgm14 = {lang: _file(f"wmt14/sgm/newstest2014-fren-{side}.{lang}.sgm", WMT14_TEST,
                         f"test-full/newstest2014-fren-{side}.{lang}.sgm")
             for lang, side in (("en", "src"), ("fr", "ref"))}
    sets.append(_pair("newstest2014", "WMT news-test-2014 (full, 176 documents), plain text: the paper's test set. "
                      "Made from the SGML as sacreBLEU does (segment texts, runs of spaces collapsed)",
                      *(DataFile(f"wmt14/newstest2014.{lang}", WMT14_TEST, sgm14[lang].member, "sgml-text",
                                 *_REFERENCE[f"wmt14/newstest2014.{lang}"]) for lang in ("en", "fr")),
                      pairs=3003, **WMT))
    sets.append(_pair("newstest2014-sgm", "WMT news-test-2014 (full), the official SGML", sgm14["en"], sgm14["fr"],
                      pairs=3003, **WMT))
    for name, pairs in (("news-test2008", 2051), ("newssyscomb2009", 502), ("newstest2009", 2525),
                        ("newstest2010", 2489), ("newstest2011", 3003)):
        sets.append(_pair(name, f"WMT {name}: older news, plain text",
                          _file(f"wmt-news-older/{name}.en", WMT14_DEV, f"dev/{name}.en"),
                          _file(f"wmt-news-older/{name}.fr", WMT14_DEV, f"dev/{name}.fr"), pairs=pairs, **WMT))
    for name, download, member, description in (
        ("europarl-v7", EUROPARL, "training/europarl-v7.fr-en", "Europarl v7 (the paper: 61M words)"),
        ("news-commentary-v9", NEWS_COMMENTARY, "training/news-commentary-v9.fr-en",
         "News commentary v9 (the paper: 5.5M words)"),
        ("un", UN, "un/undoc.2000.fr-en", "UN corpus (the paper: 421M words)"),
        ("commoncrawl", COMMONCRAWL, "commoncrawl.fr-en", "Common Crawl (one of the paper's crawled corpora)"),
    ):
        base = member.rsplit("/", 1)[-1]
        sets.append(_pair(name, f"WMT'14 en-fr training corpus: {description}",
                          _file(f"wmt14/{base}.en", download, f"{member}.en"),
                          _file(f"wmt14/{base}.fr", download, f"{member}.fr"), **WMT))
    sets.append(_pair("giga-fren", "WMT'14 en-fr training corpus: the 10^9 French-English corpus (one of the paper's "
                      "crawled corpora), gzip",
                      _file("wmt14/giga-fren.release2.fixed.en.gz", GIGA_FREN, "giga-fren.release2.fixed.en.gz"),
                      _file("wmt14/giga-fren.release2.fixed.fr.gz", GIGA_FREN, "giga-fren.release2.fixed.fr.gz"),
                      **WMT))
    sets.append(_pair("tatoeba", "Tatoeba sentence pairs (manythings.org release; the mirror's is of 2019-04-07): "
                      "short everyday sentences, roughly sorted by length, gzip",
                      _file("tatoeba/fra-eng.en.gz", TATOEBA, "fra.txt", "tsv-gz:0"),
                      _file("tatoeba/fra-eng.fr.gz", TATOEBA, "fra.txt", "tsv-gz:1"), pairs=153496,
                      licence="CC-BY 2.0 FR; attribution: www.manythings.org/anki and tatoeba.org",
                      homepage="https://www.manythings.org/anki/"))
    for split, pairs in (("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)):
        name = "multi30k-" + {"train": "train", "val": "val", "test_2016_flickr": "test2016"}[split]
        files = [_file(f"multi30k/{split}.{lang}", Download(f"multi30k-{split}.{lang}.gz",
                                                           f"{MULTI30K}/{split}.{lang}.gz", "gz"), None, "gunzip")
                 for lang in ("en", "fr")]
        sets.append(_pair(name, f"Multi30K task 1, {split}: human translations of image captions", *files,
                          pairs=pairs, licence="non-commercial research and education use",
                          homepage="https://github.com/multi30k/dataset"))
    return {d.name: d for d in sets}


CATALOGUE: dict[str, Dataset] = _catalogue()


def catalogue() -> list[Dataset]:
    """The catalogue's datasets, in order."""
    return list(CATALOGUE.values())


def lookup(name: str | Dataset) -> Dataset:
    """A dataset by name (an unknown name is an InputError that lists the known ones)."""
    if isinstance(name, Dataset):
        return name
    if name not in CATALOGUE:
        raise InputError(f"unknown dataset '{name}'; known: {', '.join(CATALOGUE)}")
    return CATALOGUE[name]


# -- settings -----------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$NMTKIT_CACHE``, else ``~/.cache/nmtkit``."""
    return Path(os.environ.get("NMTKIT_CACHE") or Path.home() / ".cache" / "nmtkit")


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


def download(url: str, dest: str | os.PathLike, *, sha256: str | None = None, size: int | None = None,
             progress: bool | None = None, retries: int = 3, timeout: float = 60.0, backoff: float = 1.0) -> str:
    """Download ``url`` to ``dest``, resuming ``dest.part`` if an earlier call was interrupted; return the sha256.

    The file is written as ``dest.part`` (with ``dest.part.json`` recording the address and the server's validator),
    checked (``size`` and ``sha256`` when given) and renamed to ``dest``. A checksum or size mismatch is an
    InputError, and the bad file is removed. An interrupted transfer is retried ``retries`` times within this call,
    each retry resuming with an HTTP ``Range`` request; when they are spent, an InputError says so and the ``.part``
    file is kept for the next call to resume. HTTP errors (404, ...) are InputErrors at once.
    """
    dest = Path(dest)
    part, meta_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    attempt = 0
    while True:
        try:
            got = _download_once(url, part, meta_path, size, progress, timeout, dest.name)
            break
        except _Interrupted as e:
            done = part.stat().st_size if part.exists() else 0
            if not done and (attempt >= retries or e.final):
                raise InputError(f"cannot download: {e}", url) from None
            if attempt >= retries:
                raise InputError(f"download interrupted after {done:,} bytes ({e}); run again to resume from "
                                 f"{part}", url) from None
            attempt += 1
            log.warning("%s: interrupted after %s bytes (%s); resuming (retry %d of %d)", url, f"{done:,}", e,
                        attempt, retries)
            time.sleep(backoff * attempt)
    if size is not None and part.stat().st_size != size:
        _remove(part, meta_path)
        raise InputError(f"downloaded {part.stat().st_size:,} bytes, expected {size:,}; the download was removed",
                         url)
    if sha256 is not None and got != sha256.lower():
        _remove(part, meta_path)
        raise InputError(f"checksum mismatch: sha256 {got}, expected {sha256}; the download was removed", url)
    os.replace(part, dest)
    _remove(meta_path)
    return got


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


# -- extraction ---------------------------------------------------------------------------------------------------


def _check_format(path: Path, kind: str, origin: str) -> None:
    """The download is what the catalogue says it is (not, e.g., an HTML error page)."""
    with open(path, "rb") as f:
        head = f.read(512)
    ok = head.startswith(_MAGIC[kind]) if kind in _MAGIC else True
    if kind == "tar":
        ok = len(head) >= 262 and head[257:262] == b"ustar"
    if not ok:
        raise InputError(f"is not a {kind} file (it starts with {head[:16]!r}); the download was removed", origin)


def _members(download: Download, archive: Path, wanted: Iterable[str]) -> dict[str, Path]:
    """Extract archive members into temporary files beside the archive (one pass); member -> temporary path."""
    wanted = set(wanted)
    out: dict[str, Path] = {}

    def sink(member: str, stream) -> None:
        fd, tmp = tempfile.mkstemp(dir=archive.parent, prefix=".member.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(stream, f, CHUNK)
        out[member] = Path(tmp)

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
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
        for p in out.values():
            _remove(p)
        raise InputError(f"cannot read the archive: {e}", archive) from None
    missing = sorted(wanted - set(out))
    if missing:
        for p in out.values():
            _remove(p)
        raise InputError(f"the archive has no member {', '.join(missing)}", archive)
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
            return path, "cache"
        return None

    def _check_cached(self, path: Path, record: dict) -> None:
        if path.stat().st_size != record["size"]:
            raise InputError(f"has {path.stat().st_size:,} bytes, the cache manifest recorded {record['size']:,} "
                             "(a damaged cache: remove the file to fetch it again)", path)
        if self.verify and (got := sha256sum(path)) != record["sha256"]:
            raise InputError(f"checksum mismatch: sha256 {got}, the cache manifest recorded {record['sha256']} "
                             "(a damaged cache: remove the file to fetch it again)", path)

    # fetching -----------------------------------------------------------------------------------------------------

    def _from_http_mirror(self, f: DataFile) -> None:
        rel = f"data/{f.path}"
        target = self.cache / rel
        url = urllib.parse.urljoin(self.mirror_url.rstrip("/") + "/", urllib.parse.quote(f.path))
        got = download(url, target, sha256=f.sha256, size=f.size, progress=self.progress, retries=self.retries,
                       timeout=self.timeout)
        if f.sha256 is None:
            log.warning("%s: no checksum in the catalogue; recorded sha256 %s (trust on first use)", url, got)
        self.manifest.put(rel, {"sha256": got, "size": target.stat().st_size, "url": url, "origin": "http-mirror",
                                "verified": f.sha256 is not None, "time": _now()})

    def archive(self, d: Download) -> Path:
        """The publisher's file in ``CACHE/downloads/``, downloaded once and checked (see the checksum policy)."""
        rel = f"downloads/{d.name}"
        path = self.cache / rel
        record = self.manifest.get(rel)
        if path.is_file() and record is not None:
            self._check_cached(path, record)
            if d.sha256 is not None and record["sha256"] != d.sha256:
                raise InputError(f"the cache manifest records sha256 {record['sha256']}, the catalogue expects "
                                 f"{d.sha256} (remove it to download again)", path)
            return path
        got = download(d.url, path, sha256=d.sha256, size=d.size, progress=self.progress, retries=self.retries,
                       timeout=self.timeout)
        try:
            _check_format(path, d.kind, d.url)
        except InputError:
            _remove(path)
            raise
        if d.sha256 is None:
            log.warning("%s: the catalogue has no checksum for this file; recorded its sha256 %s in %s (trust on "
                        "first use: later uses are checked against it)", d.url, got, self.manifest.path)
        self.manifest.put(rel, {"sha256": got, "size": path.stat().st_size, "url": d.url, "origin": "publisher",
                                "verified": d.sha256 is not None, "time": _now()})
        return path

    def _from_publisher(self, d: Download, files: list[DataFile]) -> None:
        archive = self.archive(d)
        members = {f.member for f in files if f.member is not None}
        extracted = _members(d, archive, members) if members else {}  # one pass over the archive for all
        try:
            for f in files:
                rel = f"data/{f.path}"
                target = self.cache / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                origin = d.url + (f" ({f.member})" if f.member else "")
                with atomic_file(target, "wb") as out:
                    _convert(extracted[f.member] if f.member else archive, f.convert, out, origin)
                got = sha256sum(target)
                if f.sha256 is not None and got != f.sha256:
                    log.warning("%s, made from %s, differs from the catalogue's reference copy (sha256 %s, not %s): "
                                "the publisher's file is not the one the reference was made from; scores on it are "
                                "not comparable with runs on the reference copy", target, origin, got, f.sha256)
                self.manifest.put(rel, {"sha256": got, "size": target.stat().st_size, "url": d.url,
                                        "member": f.member, "convert": f.convert, "origin": "publisher",
                                        "matches_reference": None if f.sha256 is None else got == f.sha256,
                                        "time": _now()})
        finally:
            for p in extracted.values():
                _remove(p)


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


# -- the command --------------------------------------------------------------------------------------------------


def _main(argv=None) -> None:
    import click

    from nmtkit.cli import run, setup_logging

    @click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
    @click.argument("names", nargs=-1, metavar="[NAME]...")
    @click.option("--list", "list_", is_flag=True, help="List the catalogue (name, pairs, address, checksums).")
    @click.option("--all", "all_", is_flag=True, help="Every dataset of the catalogue (tens of GB: the WMT'14 "
                  "training corpora).")
    @click.option("--prefix", is_flag=True, help="Print one corpus prefix per dataset (PREFIX or SRC,TGT, as "
                  "nmt-prepare takes them) instead of one path per file.")
    @click.option("--link", "link_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="Also make symbolic links DIR/LAYOUT_PATH to the files (fixed paths for scripts).")
    @click.option("--cache", "cache_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="Cache directory [$NMTKIT_CACHE or ~/.cache/nmtkit].")
    @click.option("--data", "data_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="A local mirror to use instead of downloading [$NMTKIT_DATA].")
    @click.option("--mirror-url", metavar="URL", help="An HTTP mirror laid out like the shared data "
                  "[$NMTKIT_MIRROR_URL].")
    @click.option("--verify", is_flag=True, help="Re-check cached files against the sha256 in the cache manifest.")
    @click.option("--retries", default=3, show_default=True, help="Resumed retries of an interrupted download.")
    @click.option("--json", "as_json", is_flag=True, help="With --list: the catalogue as JSON.")
    @click.option("--quiet", "-q", is_flag=True)
    def main(names, list_, all_, prefix, link_dir, cache_dir, data_dir, mirror_url, verify, retries, as_json,
             quiet):
        """Find or download public English-French data: print where each file is on this machine.

        \b
        Files come from a local mirror ($NMTKIT_DATA), the cache ($NMTKIT_CACHE), an HTTP mirror
        ($NMTKIT_MIRROR_URL) or the publisher (downloaded once, checked, resumable).
          python -m nmtkit.datasets --list
          python -m nmtkit.datasets newstest2014                 # prints .../newstest2014.en and .fr
          python -m nmtkit.datasets --prefix --link data/raw newstest2012 newstest2013 europarl-v7
        """
        setup_logging(quiet)

        def body():
            if list_:
                if as_json:
                    click.echo(json.dumps([describe(d) for d in catalogue()], indent=1))
                    return
                for d in catalogue():
                    checks = sorted({"sha256" if f.sha256 else "none" for f in d.files.values()})
                    dl = sorted({f.download.url for f in d.files.values()})
                    click.echo(f"{d.name:20} {d.pairs or '':>9}  files: {'/'.join(checks):6}  download: "
                               f"{' '.join(dl)} ({d.files['en'].download.policy})")
                return
            chosen = list(CATALOGUE) if all_ else list(names)
            if not chosen:
                raise click.UsageError("name at least one dataset (see --list), or --all")
            fetcher = Fetcher(cache_dir, data_dir, mirror_url, verify=verify, retries=retries)
            for name in chosen:
                resolved = fetcher.get(name)
                if link_dir:  # print the links: fixed paths, wherever the files are
                    resolved = dataclasses.replace(resolved, files=link(resolved, link_dir))
                if prefix:
                    click.echo(resolved.prefix)
                else:
                    for path in resolved.files.values():
                        click.echo(str(path))

        run("nmtkit.datasets", body)

    main(args=argv, prog_name="python -m nmtkit.datasets")


if __name__ == "__main__":
    _main()
