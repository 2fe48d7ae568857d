"""Public English–French data: a catalogue with download addresses and checksums, a checked cache, local mirrors.

    >>> from nmtkit import datasets
    >>> data = datasets.get("newstest2014")            # files in a mirror, in the cache, or downloaded once
    >>> data.files["en"], data.prefix                 # Path(.../wmt14/newstest2014.en), ".../wmt14/newstest2014"

or from a shell (a thin command over the same functions; ``--help`` lists its options)::

    python -m nmtkit.datasets --list
    python -m nmtkit.datasets --prefix newstest2014 europarl-v7

**The catalogue** (:data:`CATALOGUE`) holds news-test 2012, 2013 and 2014 (plain text and the official SGML), the
older WMT news sets, the WMT'14 English–French training corpora (Europarl v7, news commentary v9, UN, the 10⁹
French–English corpus, Common Crawl), Tatoeba, Multi30K, and the Canadian Hansards (the mirror's ``hansards/`` train,
dev and test splits; ``hansards-trial``, the NAACL 2003 gold word alignments). A :class:`Dataset` is a pair of
:class:`DataFile`\\ s (English, French; ``hansards-trial`` has a third, ``align``); each file has a *layout path*
(``wmt14/newstest2014.en``), the same in a mirror and in the cache, and comes from a :class:`Download`: a file at a
public address, usually an archive, with the member to extract and the conversion to apply (``sgml-text``: the
``<seg>`` texts one per line, as sacreBLEU extracts them; ``gunzip``; ``tsv-gz:N``: column N of a tab-separated file,
gzip-compressed; ``hansards``: a split's ISI sitting files joined in the mirror's order, ISO-8859-1 made UTF-8, each
sitting's line count checked: :mod:`nmtkit.datasets.hansards` says where the data is published and how sure that is).

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
atomic rename into place once the file is complete and verified. Ctrl-C or SIGTERM keeps the ``.part`` and its
``.part.json`` for the next call to resume, and the message says where they are (an empty ``.part`` is removed);
an archive extraction that fails or is stopped leaves no temporary file. A publisher's address that cannot be
reached (no internet) is one error line that says what to do instead: a local mirror or an HTTP mirror.

**Checksum policy.** nmtkit records a checksum only where it could compute one; none is invented.

- *Files* (:attr:`DataFile.sha256`): the sha256 and size of the copy in the shared mirror, for every file that the
  mirror holds. A copy from a mirror (local or HTTP) must match it, or it is an :class:`~nmtkit.errors.InputError`
  (a downloaded copy is removed, nothing is left in the cache). A file extracted from a publisher's download is
  compared with it too, but a difference is a *warning* naming both checksums, not an error: nmtkit cannot vouch for
  the publisher's current file (Tatoeba's is replaced every few months; the others could be re-issued), so the file is
  used, and the warning says that its scores are not comparable with runs on the reference copy. A ``.gz`` file made
  here has other gzip bytes than the mirror's; where the catalogue knows the sha256 of the text inside
  (:attr:`DataFile.text_sha256`), the same text is no warning.
- *Downloads* (:attr:`Download.sha256`): the publishers' archives could not be fetched where this catalogue was made,
  so their checksums are ``None`` (except the Hansards trial alignments: files at a fixed commit of a repository,
  whose bytes are the mirror's), and the policy is **trust on first use**: the first download is checked for its
  content (below) and, when the catalogue knows it, its size; its sha256 is recorded with the address and date in
  the cache's ``manifest.json`` and printed in a warning (pin it by adding it to the catalogue), and every later use
  of that cached archive is checked against the record (size always, sha256 with ``verify=True`` / ``--verify``). A
  download whose checksum the catalogue does know is checked strictly: a mismatch is a one-line InputError and the bad
  file is removed.
- Files made in the cache are recorded in the manifest the same way (sha256, size, origin), so ``--verify`` detects a
  damaged cache.

**Content checks** (:mod:`nmtkit.datasets.content`): a file whose checksum nmtkit does not know must look like what
the catalogue says it is before it is renamed into the cache and recorded, so that an HTML error page or a cut
download is never taken for a corpus:

- an archive (``tgz``, ``tar``, ``zip``, ``gz``) starts with its magic bytes, reads to its end (a tar's end-of-archive
  blocks, gzip's end and CRC, every zip member's CRC: a truncated file fails, whatever Content-Length said) and holds
  every member that the catalogue makes a file from (those read in full);
- a dataset file, downloaded from an HTTP mirror or made from a publisher's archive, is UTF-8 throughout, without a
  NUL byte, not empty, gzip that decompresses to its end when its name ends in ``.gz``, WMT SGML (its ``<srcset>``-like
  header) when it ends in ``.sgm``, and otherwise does not start as an HTML or XML page (``<!DOCTYPE``, ``<html``,
  ``<?xml``, ...); its line count (SGML: segments) is recorded, and the English and French files of a dataset must
  have as many, must not be one and the same file, and must each read as their language (of a handful of frequent
  English and French function words, the first 1,000 lines of the English side hold more English ones and the
  French side more French ones), unless both are the catalogue's reference copies.

A download that fails is one error line naming its address and what it looked like, a non-zero exit, and is
removed, nothing recorded; a dataset file that fails is not renamed into place, and a pair that disagrees has its
newly fetched sides removed. ``--verify`` repeats the content checks on cached files that are not reference copies
(a cache filled by an older nmtkit). These checks cannot tell a misaligned corpus whose line counts agree, nor a
side of another language than English or French: only a checksum can.

**Cache layout**::

    CACHE/downloads/NAME           publishers' files, as published (NAME.part while incomplete, NAME.part.json beside)
    CACHE/data/LAYOUT_PATH         dataset files (from an HTTP mirror, or extracted from downloads)
    CACHE/manifest.json            {"format": "nmtkit-cache", "version": 1, "files": {RELPATH: {sha256, size, ...}}}
"""

from nmtkit.datasets.catalogue import (
    CATALOGUE,
    CONVERSIONS,
    KINDS,
    DataFile,
    Dataset,
    Download,
    Resolved,
    catalogue,
    lookup,
)
from nmtkit.datasets.download import (
    CHUNK,
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    DownloadInterrupted,
    default_data_dir,
    default_mirror_url,
    download,
    sha256sum,
)
from nmtkit.datasets.fetch import Fetcher, _convert, describe, get, link  # noqa: F401  (_convert: the tests use it)
from nmtkit.runtime import default_cache_dir

__all__ = [
    "CATALOGUE", "CHUNK", "CONVERSIONS", "KINDS", "MANIFEST", "MANIFEST_FORMAT", "MANIFEST_VERSION",
    "DataFile", "Dataset", "Download", "DownloadInterrupted", "Fetcher", "Resolved",
    "catalogue", "default_cache_dir", "default_data_dir", "default_mirror_url", "describe", "download", "get",
    "link", "lookup", "sha256sum",
]
