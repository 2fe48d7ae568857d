"""nmtkit.datasets: the catalogue, local-mirror resolution, and downloads from a local HTTP server on 127.0.0.1.

The server (http.server in a thread, stopped by the fixture, and by a timer should a test hang) serves the shared
data from ``data_dir``, laid out as an HTTP mirror, plus in-memory files (a publisher's archive). It can corrupt a
file, drop the connection after N bytes on the first request for a file, stall after N bytes on the first request
(until ``release`` is set), and ignore ``Range`` headers.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, CHUNK, CONVERSIONS, KINDS, Fetcher, download, hansards, sha256sum
from nmtkit.errors import InputError

from conftest import lines_of

REPO = Path(__file__).resolve().parents[1]
NEWS14 = ("wmt14/newstest2014.en", "wmt14/newstest2014.fr")


# -- a local HTTP server ------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    timeout = 10  # a stuck client cannot hold a handler thread for long

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        srv = self.server
        path = self.path.split("?", 1)[0]
        srv.requests.append({"path": path, "range": self.headers.get("Range"),
                             "if_range": self.headers.get("If-Range")})
        if path in srv.extra:
            body = srv.extra[path]
        else:
            local = (srv.root / path.lstrip("/")).resolve()
            if not str(local).startswith(str(srv.root.resolve())) or not local.is_file():
                self.send_error(404, "Not Found")
                return
            body = local.read_bytes()
        if path in srv.corrupt:
            i = len(body) // 2
            body = body[:i] + bytes([body[i] ^ 0x20]) + body[i + 1:]
        etag = '"%s"' % hashlib.sha256(body).hexdigest()[:16]
        start = 0
        wanted = self.headers.get("Range")
        if wanted and not srv.ignore_range and self.headers.get("If-Range") in (None, etag):
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        drop = srv.drop_after.pop(path, None)  # only the first request for the file is cut short
        stall = srv.stall_after.pop(path, None)  # or stalls, as a server that stops sending does
        if drop is not None or stall is not None:
            self.wfile.write(body[start:start + (drop if drop is not None else stall)])
            self.wfile.flush()
            if stall is not None:
                srv.release.wait(60)
            self.close_connection = True
            return
        self.wfile.write(body[start:])


@pytest.fixture
def server(data_dir):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.root = Path(data_dir)
    srv.extra, srv.corrupt, srv.drop_after, srv.stall_after, srv.requests = {}, set(), {}, {}, []
    srv.release = threading.Event()
    srv.ignore_range = False
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(120, srv.shutdown)  # stops by itself even if the test never returns
    watchdog.daemon = True
    watchdog.start()
    try:
        yield srv
    finally:
        watchdog.cancel()
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def no_env(monkeypatch):
    for var in ("NMTKIT_DATA", "NMTKIT_CACHE", "NMTKIT_MIRROR_URL"):
        monkeypatch.delenv(var, raising=False)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def http_fetcher(server, cache: Path, **kw) -> Fetcher:
    return Fetcher(cache, mirror_url=server.url, use_env=False, progress=False, timeout=10, **kw)


# -- the catalogue ------------------------------------------------------------------------------------------------


def test_catalogue_is_consistent():
    required = {"newstest2012", "newstest2012-sgm", "newstest2013", "newstest2013-sgm", "newstest2014",
                "newstest2014-sgm", "europarl-v7", "news-commentary-v9", "un", "giga-fren", "commoncrawl", "tatoeba",
                "multi30k-train", "multi30k-val", "multi30k-test2016", "hansards-train", "hansards-dev",
                "hansards-test", "hansards-trial"}
    assert required <= set(CATALOGUE)
    paths = set()
    for name, d in CATALOGUE.items():
        assert d.name == name and d.description and d.licence
        assert {"en", "fr"} <= set(d.files) <= {"en", "fr", "align"}, name
        for lang, f in d.files.items():
            assert not f.path.startswith("/") and ".." not in f.path.split("/")
            assert f.path not in paths, f"{f.path} is listed twice"
            paths.add(f.path)
            assert f.convert in CONVERSIONS
            dl = f.download
            assert dl.name and dl.url.startswith(("https://", "http://")), dl
            assert dl.kind in KINDS
            assert (f.member is not None) == (dl.kind in ("tgz", "tar", "zip")), f.path
            # either a checksum, or the documented policy (trust on first use) for the publisher's file
            for sha in (f.sha256, dl.sha256):
                assert sha is None or (len(sha) == 64 and int(sha, 16) >= 0)
            assert (f.size is None) == (f.sha256 is None)
            assert f.text_sha256 is None or (f.sha256 is not None and f.path.endswith(".gz"))
            assert dl.policy == ("sha256" if dl.sha256 else "trust-on-first-use")
            assert ("sha256" if dl.sha256 else "trust on first use") in datasets.__doc__.replace("**", "")
    # the paper's test set has its reference checksums (as the shared data's README gives them)
    assert CATALOGUE["newstest2014"].files["en"].sha256.startswith("9a12cb6e8efb")
    assert CATALOGUE["newstest2014"].files["fr"].sha256.startswith("2bd07dc204f9")
    with pytest.raises(InputError, match="unknown dataset 'nope'"):
        datasets.lookup("nope")


def test_catalogue_checksums_come_from_the_mirror(data_dir):
    """Every file the mirror holds has its checksum in the catalogue, and every catalogue checksum is the mirror's."""
    for d in CATALOGUE.values():
        for f in d.files.values():
            local = data_dir / f.path
            if f.sha256 is None:
                assert not local.exists(), f"{f.path} is in the mirror but has no checksum in the catalogue"
            else:
                assert local.is_file(), f"{f.path}: a checksum for a file that is not in the mirror"
                assert (sha256sum(local), local.stat().st_size) == (f.sha256, f.size), f.path
            if f.text_sha256 is not None:  # the text inside a .gz copy
                h = hashlib.sha256()
                with gzip.open(local, "rb") as src:
                    while block := src.read(1 << 20):
                        h.update(block)
                assert h.hexdigest() == f.text_sha256, f.path


def test_sgml_conversion_reproduces_the_plain_test_set(data_dir, tmp_path):
    """news-test-2014 plain text is made from the official SGML; on the mirror's SGML that gives the mirror's text."""
    for lang in ("en", "fr"):
        f = CATALOGUE["newstest2014"].files[lang]
        sgm = data_dir / CATALOGUE["newstest2014-sgm"].files[lang].path
        out = io.BytesIO()
        datasets._convert(sgm, f.convert, out, "test")
        assert hashlib.sha256(out.getvalue()).hexdigest() == f.sha256


# -- a local mirror ($NMTKIT_DATA) --------------------------------------------------------------------------------


def test_local_mirror_is_used_in_place(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NMTKIT_DATA", str(data_dir))
    monkeypatch.setenv("NMTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NMTKIT_MIRROR_URL", raising=False)
    got = datasets.get("newstest2014")
    assert got.files == {"en": data_dir / NEWS14[0], "fr": data_dir / NEWS14[1]}
    assert got.origins == {"en": "mirror", "fr": "mirror"}
    assert got.prefix == str(data_dir / "wmt14" / "newstest2014")
    assert datasets.get("newstest2014-sgm").prefix.count(",") == 1  # SRC,TGT: names differ by more than the language
    assert datasets.get("tatoeba").prefix == str(data_dir / "tatoeba" / "fra-eng")  # .gz files
    assert not (tmp_path / "cache" / "data").exists()  # nothing copied, nothing downloaded

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "nmtkit.datasets", "--prefix", "--link", str(tmp_path / "raw"),
                          "newstest2014", "newstest2013"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(tmp_path / "raw" / "wmt14" / "newstest2014"),
                                  str(tmp_path / "raw" / "wmt14" / "newstest2013")]
    assert (tmp_path / "raw" / NEWS14[0]).resolve() == (data_dir / NEWS14[0]).resolve()


def test_local_mirror_with_a_bad_copy_is_an_error(data_dir, tmp_path, no_env):
    mirror = tmp_path / "mirror"
    for rel in NEWS14:
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes((data_dir / rel).read_bytes())
    text = (mirror / NEWS14[1]).read_bytes()
    (mirror / NEWS14[1]).write_bytes(text.replace(b"Le ", b"La ", 1))  # same size, other bytes
    with pytest.raises(InputError, match=r"checksum mismatch: sha256 [0-9a-f]{64}, the catalogue's copy"):
        datasets.get("newstest2014", data_dir=mirror, cache_dir=tmp_path / "cache")


# -- downloads from an HTTP mirror --------------------------------------------------------------------------------


def test_download_verified_by_checksum_then_cached(server, data_dir, tmp_path):
    cache = tmp_path / "cache"
    got = http_fetcher(server, cache).get("newstest2014")
    assert got.origins == {"en": "http-mirror", "fr": "http-mirror"}
    for lang, rel in zip(("en", "fr"), NEWS14):
        assert got.files[lang] == cache / "data" / rel
        assert got.files[lang].read_bytes() == (data_dir / rel).read_bytes()
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["format"] == "nmtkit-cache"
    record = manifest["files"]["data/" + NEWS14[0]]
    assert record["sha256"] == CATALOGUE["newstest2014"].files["en"].sha256 and record["verified"] is True
    assert not [p for p in files_under(cache) if p.name.endswith((".part", ".part.json", ".tmp"))]
    n = len(server.requests)
    again = http_fetcher(server, cache, verify=True).get("newstest2014")  # downloaded once: now from the cache
    assert again.origins == {"en": "cache", "fr": "cache"} and len(server.requests) == n


def test_corrupted_download_is_an_error_and_leaves_nothing(server, tmp_path):
    server.corrupt.add("/" + NEWS14[1])
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=r"checksum mismatch: sha256 [0-9a-f]{64}, expected 2bd07dc2.*removed"):
        http_fetcher(server, cache, retries=0).get("newstest2014")
    assert not (cache / "data" / NEWS14[1]).exists()
    assert not [p for p in files_under(cache / "data") if "newstest2014.fr" in p.name]  # no .part, no .tmp
    assert "data/" + NEWS14[1] not in json.loads((cache / "manifest.json").read_text())["files"]


def test_dropped_connection_resumes_on_the_next_call(server, data_dir, tmp_path):
    cache, cut = tmp_path / "cache", 100_000
    server.drop_after["/" + NEWS14[1]] = cut
    with pytest.raises(InputError, match=r"download interrupted after 100,000 bytes.*run again to resume"):
        http_fetcher(server, cache, retries=0).get("newstest2014")
    part = cache / "data" / (NEWS14[1] + ".part")
    assert part.stat().st_size == cut and not (cache / "data" / NEWS14[1]).exists()

    got = http_fetcher(server, cache, retries=0).get("newstest2014")
    last = [r for r in server.requests if r["path"] == "/" + NEWS14[1]]
    assert [r["range"] for r in last] == [None, f"bytes={cut}-"]  # the second request asked for the rest only
    assert last[1]["if_range"]  # guarded by the validator the server sent the first time
    assert sha256sum(got.files["fr"]) == CATALOGUE["newstest2014"].files["fr"].sha256
    assert not part.exists() and not part.with_name(part.name + ".json").exists()


def test_dropped_connection_is_retried_within_one_call(server, tmp_path):
    server.drop_after["/" + NEWS14[0]] = 4096
    got = http_fetcher(server, tmp_path / "cache", retries=1).get("newstest2014")
    assert [r["range"] for r in server.requests if r["path"] == "/" + NEWS14[0]] == [None, "bytes=4096-"]
    assert sha256sum(got.files["en"]) == CATALOGUE["newstest2014"].files["en"].sha256


def test_server_without_ranges_starts_over(server, data_dir, tmp_path):
    server.drop_after["/" + NEWS14[0]] = 5000
    server.ignore_range = True
    dest = tmp_path / "x.en"
    url = server.url + NEWS14[0]
    with pytest.raises(InputError, match="interrupted"):
        download(url, dest, retries=0, progress=False, timeout=10)
    sha = CATALOGUE["newstest2014"].files["en"].sha256
    got = download(url, dest, retries=0, progress=False, timeout=10, sha256=sha)
    assert dest.read_bytes() == (data_dir / NEWS14[0]).read_bytes() and got == sha256sum(dest)


def test_http_errors_are_one_line_input_errors(server, tmp_path):
    with pytest.raises(InputError, match=r"/no/such\.file: HTTP 404"):
        download(server.url + "no/such.file", tmp_path / "f", retries=0, progress=False, timeout=10)
    assert files_under(tmp_path) == []
    with pytest.raises(InputError, match="announces 375,106 bytes, expected 1,234"):
        download(server.url + NEWS14[0], tmp_path / "g", size=1234, retries=0, progress=False, timeout=10)
    assert files_under(tmp_path) == []


# -- a publisher's archive (no checksum in the catalogue: trust on first use) ---------------------------------------


def _publisher_dataset(server) -> datasets.Dataset:
    """The catalogue's news-test-2014 entry, with its archive's address pointing at the local server."""
    d = CATALOGUE["newstest2014"]
    dl = dataclasses.replace(d.files["en"].download, url=server.url + "wmt14/test-full.tgz")
    return dataclasses.replace(d, files={lang: dataclasses.replace(f, download=dl) for lang, f in d.files.items()})


def _test_full_tgz(data_dir, more: bytes = b"") -> bytes:
    """The news-test-2014 SGML as test-full.tgz holds it; ``more``: a third member after them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm"):
            tar.add(data_dir / "wmt14" / "sgm" / name, arcname=f"test-full/{name}")
        if more:
            info = tarfile.TarInfo("test-full/newstest2014-deen-src.de.sgm")
            info.size = len(more)
            tar.addfile(info, io.BytesIO(more))
    return buf.getvalue()


def test_publisher_archive_trust_on_first_use(server, data_dir, tmp_path, caplog):
    archive = _test_full_tgz(data_dir)
    server.extra["/wmt14/test-full.tgz"] = archive
    cache = tmp_path / "cache"
    d = _publisher_dataset(server)
    with caplog.at_level(logging.WARNING, logger="nmtkit.datasets"):
        got = Fetcher(cache, use_env=False, progress=False, timeout=10).get(d)
    assert got.origins == {"en": "publisher", "fr": "publisher"}
    assert "no checksum" in caplog.text and hashlib.sha256(archive).hexdigest() in caplog.text
    assert "differs from the catalogue's reference copy" not in caplog.text  # SGML -> text gave the reference text
    for lang, rel in zip(("en", "fr"), NEWS14):
        assert got.files[lang].read_bytes() == (data_dir / rel).read_bytes()
    files = json.loads((cache / "manifest.json").read_text())["files"]
    assert files["downloads/wmt14-test-full.tgz"]["sha256"] == hashlib.sha256(archive).hexdigest()
    assert files["data/" + NEWS14[0]]["matches_reference"] is True
    assert len([r for r in server.requests if r["path"] == "/wmt14/test-full.tgz"]) == 1  # one download, two files

    # later uses are checked against the recorded sha256: a damaged cached archive is caught
    for rel in NEWS14:
        (cache / "data" / rel).unlink()
    stored = cache / "downloads" / "wmt14-test-full.tgz"
    raw = bytearray(stored.read_bytes())
    raw[-100] ^= 0xFF
    stored.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="the cache manifest recorded"):
        Fetcher(cache, use_env=False, progress=False, verify=True).get(d)


def test_publisher_file_that_is_not_an_archive(server, tmp_path):
    server.extra["/wmt14/test-full.tgz"] = b"<html><body>Service unavailable</body></html>\n"
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match="is not a tgz file"):
        Fetcher(cache, use_env=False, progress=False, timeout=10).get(_publisher_dataset(server))
    assert files_under(cache / "downloads") == [] and files_under(cache / "data") == []


# -- what is trusted: content checks where the catalogue has no checksum ------------------------------------------

EUROPARL = ("wmt14/europarl-v7.fr-en.en", "wmt14/europarl-v7.fr-en.fr")
ERROR_PAGE = b"<html><body>Service unavailable</body></html>\n"


def _europarl(n: int) -> tuple[bytes, bytes]:
    """A parallel corpus of n lines per side, laid out as the catalogue's europarl-v7."""
    en = "".join(f"Resumption of the session number {i}, adjourned on Friday.\n" for i in range(n))
    fr = "".join(f"Reprise de la session numéro {i}, interrompue vendredi.\n" for i in range(n))
    return en.encode(), fr.encode()


def _tool_env() -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("NMTKIT_")}, "PYTHONPATH": str(REPO)}


def _datasets_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmtkit.datasets", "--quiet", *args], capture_output=True, text=True,
                          timeout=60, env=_tool_env())


def _cached_files(cache: Path) -> list[str]:
    """What the cache holds, but its lock files (empty: they only serialize fetches)."""
    return [str(p.relative_to(cache)) for p in files_under(cache) if not p.name.endswith(".lock")]


def test_html_error_page_from_a_mirror_is_not_cached(server, tmp_path):
    """The red team's command: an HTTP mirror answering every request with an error page."""
    for rel in EUROPARL:
        server.extra["/" + rel] = ERROR_PAGE
    cache = tmp_path / "cache"
    for verify in ([], ["--verify"]):  # the second call downloads again and refuses again: nothing was kept
        out = _datasets_tool("--mirror-url", server.url, "--cache", str(cache), *verify, "europarl-v7")
        assert (out.returncode, out.stdout) == (1, "")
        assert out.stderr.splitlines() == [
            f"nmtkit.datasets: error: {server.url}{EUROPARL[0]}: is an HTML or XML page, not a corpus (it starts "
            "with b'<html><body>Service unavailable</body></html>'); the download was removed"]
        assert _cached_files(cache) == []


@pytest.mark.parametrize("layout, body, message", [
    (EUROPARL[0], b"\n <!DOCTYPE html>\n<html><title>503</title>", r": is an HTML or XML page, not a corpus \(it "
     r"starts with b'<!DOCTYPE html>'\)"),
    (EUROPARL[1], b'<?xml version="1.0"?><Error><Code>NoSuchKey</Code></Error>', ": is an HTML or XML page"),
    (EUROPARL[1], "Reprise de la session\nLe Président déclare\n".encode("latin-1"), r":2: is not UTF-8 text "
     r"\(byte 0xe9\)"),
    (EUROPARL[0], b"", ": is empty"),
    (EUROPARL[0], b"Resumption\0\0\0\n", ":1: holds a NUL byte"),
    ("wmt14/giga-fren.release2.fixed.en.gz", b"Not Found\n", r": is not gzip-compressed text \(it starts with "
     r"b'Not Found'\)"),
    ("wmt14/giga-fren.release2.fixed.en.gz", gzip.compress("".join(f"Hello {i}\n" for i in range(5000)).encode(),
                                                          mtime=0)[:-40],  # (mtime 0: one test id in every worker)
     ": cannot decompress: Compressed file ended before the end-of-stream marker was reached"),
    ("wmt14/sgm/newstest2012-src.en.sgm", ERROR_PAGE, r": is not WMT SGML: no <srcset>, <refset> or <tstset> header"),
])
def test_a_mirrors_file_must_look_like_its_kind(server, tmp_path, layout, body, message):
    """Each kind of catalogue file without a checksum, as an HTTP mirror might serve something else in its place:
    the other side of the pair is good (and is kept: it passed its checks), the bad one leaves nothing."""
    d = next(d for d in CATALOGUE.values() if any(f.path == layout for f in d.files.values()))
    for f, text in zip(d.files.values(), _europarl(3)):
        server.extra["/" + f.path] = gzip.compress(text) if f.path.endswith(".gz") else text
    server.extra["/" + layout] = body
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match="^" + re.escape(server.url + layout) + message + ".*; the download was "
                       "removed$"):
        http_fetcher(server, cache, retries=0).get(d.name)
    assert [p for p in _cached_files(cache) if layout.rsplit("/", 1)[1] in p or p.endswith(".tmp")] == []
    records = json.loads((cache / "manifest.json").read_text())["files"] if (cache / "manifest.json").exists() else {}
    assert "data/" + layout not in records


def test_the_two_sides_of_a_mirrors_corpus_must_agree(server, tmp_path):
    en, fr = _europarl(10)
    server.extra["/" + EUROPARL[0]], server.extra["/" + EUROPARL[1]] = en, fr.replace(b"\n", b" ", 1)  # 9 lines
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=r"^europarl-v7: wmt14/europarl-v7.fr-en.en has 10 lines \(http://\S+\), "
                       r"wmt14/europarl-v7.fr-en.fr has 9 \(http://\S+\): not the two sides of one parallel corpus; "
                       r"wmt14/europarl-v7.fr-en.en and wmt14/europarl-v7.fr-en.fr removed from the cache$"):
        http_fetcher(server, cache, retries=0).get("europarl-v7")
    assert _cached_files(cache) == ["manifest.json"]
    assert json.loads((cache / "manifest.json").read_text())["files"] == {}
    server.extra["/" + EUROPARL[1]] = en  # the English text twice
    with pytest.raises(InputError, match="the English and the French file are one and the same"):
        http_fetcher(server, cache, retries=0).get("europarl-v7")
    server.extra["/" + EUROPARL[1]] = fr
    got = http_fetcher(server, cache, retries=0).get("europarl-v7")
    records = json.loads((cache / "manifest.json").read_text())["files"]
    assert [records["data/" + rel]["lines"] for rel in EUROPARL] == [10, 10]
    assert got.files["fr"].read_bytes() == fr


def test_a_side_in_the_other_language_is_not_trusted(server, data_dir, tmp_path):
    """#34 item 2: text of the right language.  Real Hansards lines: the two sides swapped, or French on the English
    side, are refused with one line naming each wrong side and what it reads as, and nothing is cached; the right
    pair is taken."""
    en = "".join(x + "\n" for x in lines_of(data_dir / "hansards" / "dev.en", 400)).encode()
    fr_lines = lines_of(data_dir / "hansards" / "dev.fr", 400)
    fr = "".join(x + "\n" for x in fr_lines).encode()
    cache = tmp_path / "cache"
    server.extra["/" + EUROPARL[0]], server.extra["/" + EUROPARL[1]] = fr, en
    with pytest.raises(InputError, match=r"^europarl-v7: wmt14/europarl-v7.fr-en.en reads as French \([\d,]+ English "
                       r"function words, [\d,]+ French in its first 1,000 lines\) \(http://\S+\); "
                       r"wmt14/europarl-v7.fr-en.fr reads as English \(.*\): not the English and the French side; "
                       r"wmt14/europarl-v7.fr-en.en and wmt14/europarl-v7.fr-en.fr removed from the cache$"):
        http_fetcher(server, cache, retries=0).get("europarl-v7")
    assert _cached_files(cache) == ["manifest.json"]
    other = "".join(x + "\n" for x in fr_lines[200:] + fr_lines[:200]).encode()  # French, other order: not the same
    server.extra["/" + EUROPARL[0]], server.extra["/" + EUROPARL[1]] = other, fr
    with pytest.raises(InputError, match=r"^europarl-v7: wmt14/europarl-v7.fr-en.en reads as French .*: not the "
                                         r"English and the French side; .* removed from the cache$") as e:
        http_fetcher(server, cache, retries=0).get("europarl-v7")
    assert "fr-en.fr reads" not in str(e.value)
    server.extra["/" + EUROPARL[0]], server.extra["/" + EUROPARL[1]] = en, fr
    got = http_fetcher(server, cache, retries=0).get("europarl-v7")
    assert got.files["en"].read_bytes() == en and got.files["fr"].read_bytes() == fr


def test_verify_finds_an_error_page_cached_without_the_checks(tmp_path):
    """A cache filled by an nmtkit without the content checks: --verify finds the page it recorded."""
    cache = tmp_path / "cache"
    files = {}
    for rel in EUROPARL:
        (cache / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / "data" / rel).write_bytes(ERROR_PAGE)
        files["data/" + rel] = {"sha256": hashlib.sha256(ERROR_PAGE).hexdigest(), "size": len(ERROR_PAGE),
                                "url": "http://mirror/" + rel, "origin": "http-mirror", "verified": False}
    (cache / "manifest.json").write_text(json.dumps({"format": "nmtkit-cache", "version": 1, "files": files}))
    with pytest.raises(InputError, match=r"europarl-v7.fr-en.en: is an HTML or XML page, not a corpus .*cached "
                                         "without this check: remove it to fetch it again"):
        Fetcher(cache, use_env=False, verify=True).get("europarl-v7")
    assert Fetcher(cache, use_env=False).get("europarl-v7").origins == {"en": "cache", "fr": "cache"}  # (trusted)


def test_truncated_publisher_archive_is_not_trusted(server, data_dir, tmp_path):
    """Cut after the members the catalogue takes, Content-Length saying the cut size: the old code used it."""
    whole = _test_full_tgz(data_dir, more=os.urandom(300_000))  # (random: the cut falls in the third member)
    server.extra["/wmt14/test-full.tgz"] = whole[:-100_000]
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=r"/wmt14/test-full.tgz: is not a complete tgz file: Compressed file ended "
                                         r"before the end-of-stream marker was reached; the download was removed$"):
        Fetcher(cache, use_env=False, progress=False, timeout=10).get(_publisher_dataset(server))
    assert _cached_files(cache) == []
    server.extra["/wmt14/test-full.tgz"] = whole  # the whole archive is taken
    got = Fetcher(cache, use_env=False, progress=False, timeout=10).get(_publisher_dataset(server))
    assert sha256sum(got.files["fr"]) == CATALOGUE["newstest2014"].files["fr"].sha256


def test_tar_cut_at_a_member_boundary_is_not_trusted(server, tmp_path):
    """A plain tar (the Hansards') that ends after a whole member, before its end-of-archive blocks."""
    dev = [(stem, n) for stem, split, n in hansards.sittings() if split == "dev"]
    whole = _isi_archive(dev, v7=False)
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        last = tar.getmembers()[-1]
    cut = last.offset_data + -(-last.size // 512) * 512
    server.extra[ISI_TAR] = whole[:cut]
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=rf"is not a complete tar file: it ends at byte {cut:,}, without the "
                                         rf"end-of-archive blocks due after its last member at byte {cut:,}"):
        Fetcher(cache, use_env=False, progress=False, timeout=10).get(_local(server, CATALOGUE["hansards-dev"]))
    assert _cached_files(cache) == []


def _tatoeba_zip(n: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("fra.txt", "".join(f"Go {i}.\tVa {i} !\tCC-BY 2.0 (France)\n" for i in range(n)))
    return buf.getvalue()


def test_failed_extraction_leaves_no_temporary_file(server, tmp_path):
    """A cached archive damaged in place (same size, so only --verify's checksum would see it): extraction fails in
    the middle of a member, and its temporary copy goes with it."""
    d = CATALOGUE["tatoeba"]
    server.extra["/anki/fra-eng.zip"] = _tatoeba_zip(3000)
    dl = dataclasses.replace(d.files["en"].download, url=server.url + "anki/fra-eng.zip")
    local = dataclasses.replace(d, files={k: dataclasses.replace(f, download=dl) for k, f in d.files.items()})
    cache = tmp_path / "cache"
    got = Fetcher(cache, use_env=False, progress=False, timeout=10).get(local)
    assert gzip.decompress(got.files["fr"].read_bytes()).split(b"\n")[2999] == b"Va 2999 !"
    for path in got.files.values():
        path.unlink()
    stored = cache / "downloads" / dl.name
    raw = bytearray(stored.read_bytes())
    raw[raw.index(b"Va 1500 !")] ^= 0x20
    stored.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"cannot read the archive: Bad CRC-32 for file 'fra.txt'"):
        Fetcher(cache, use_env=False, progress=False, timeout=10).get(local)
    assert [p for p in _cached_files(cache) if p.endswith(".tmp")] == []


def test_unreachable_publisher_says_what_to_do(tmp_path):
    d = CATALOGUE["europarl-v7"]
    dl = dataclasses.replace(d.files["en"].download, url="http://nmtkit-offline.invalid/europarl.tgz")
    local = dataclasses.replace(d, files={k: dataclasses.replace(f, download=dl) for k, f in d.files.items()})
    with pytest.raises(InputError, match=r"^http://nmtkit-offline.invalid/europarl.tgz: cannot download: .*; without "
                       r"internet, point \$NMTKIT_DATA \(or --data\) at a copy of the shared data, such as "
                       r"../shared/data beside a checkout, or \$NMTKIT_MIRROR_URL \(or --mirror-url\) at an HTTP "
                       "mirror"):
        Fetcher(tmp_path / "cache", use_env=False, progress=False, retries=0, timeout=10).get(local)


def test_quickstart_without_data_says_what_to_do_and_leaves_nothing(tmp_path):
    """A fresh checkout with no ../shared/data, no $NMTKIT_DATA and no internet (a proxy that does not resolve)."""
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    (checkout / "examples" / "quickstart.sh").write_bytes((REPO / "examples" / "quickstart.sh").read_bytes())
    offline = "http://nmtkit-offline.invalid:3128"
    env = {**{k: v for k, v in _tool_env().items() if k.lower() not in ("no_proxy", "all_proxy")},
           "NMTKIT_CACHE": str(tmp_path / "cache"), "http_proxy": offline, "https_proxy": offline,
           "HTTP_PROXY": offline, "HTTPS_PROXY": offline, "QUICKSTART_TINY": "1"}
    work = tmp_path / "qs"
    out = subprocess.run(["bash", str(checkout / "examples" / "quickstart.sh"), str(work)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("== ")]
    assert len(errors) == 1 and errors[0].startswith(f"nmtkit.datasets: error: {hansards.ISI}/"), out.stderr
    assert all(hint in errors[0] for hint in ("$NMTKIT_DATA", "../shared/data", "--mirror-url"))
    assert not work.exists()  # no empty runs/quickstart/raw/


def test_sigterm_during_a_download_keeps_what_it_says_and_the_next_call_resumes(server, tmp_path):
    en, fr = _europarl(25_000)  # the English side over one read block (1 MiB): a block reaches the .part file
    assert len(en) > CHUNK + 4096
    server.extra["/" + EUROPARL[0]], server.extra["/" + EUROPARL[1]] = en, fr
    server.stall_after["/" + EUROPARL[0]] = CHUNK + 4096
    cache = tmp_path / "cache"
    args = [sys.executable, "-m", "nmtkit.datasets", "--quiet", "--mirror-url", server.url, "--cache", str(cache),
            "europarl-v7"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_tool_env())
    part = cache / "data" / (EUROPARL[0] + ".part")
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size == CHUNK):  # the first block is written; the server stalls
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert (proc.returncode, stdout) == (130, "")
    said = re.fullmatch(r"nmtkit\.datasets: interrupted; the ([\d,]+) bytes of (\S+) downloaded so far are kept in "
                        r"(\S+) \(with (\S+)\) for the next call to resume; nothing else was written\n", stderr)
    assert said, stderr
    assert (int(said[1].replace(",", "")), said[2], said[3]) == (CHUNK, server.url + EUROPARL[0], str(part))
    assert part.read_bytes() == en[:CHUNK] and json.loads((part.parent / said[4]).read_text())["url"] == said[2]
    assert sorted(_cached_files(cache)) == ["data/" + EUROPARL[0] + ".part", "data/" + EUROPARL[0] + ".part.json"]

    server.release.set()
    out = _datasets_tool("--mirror-url", server.url, "--cache", str(cache), "europarl-v7")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(cache / "data" / rel) for rel in EUROPARL]
    assert [r["range"] for r in server.requests if r["path"] == "/" + EUROPARL[0]] == [None, f"bytes={CHUNK}-"]
    assert (cache / "data" / EUROPARL[0]).read_bytes() == en and (cache / "data" / EUROPARL[1]).read_bytes() == fr
    assert sorted(_cached_files(cache)) == ["data/" + rel for rel in EUROPARL] + ["manifest.json"]


def test_converted_file_differing_from_the_reference_is_a_warning(server, tmp_path, caplog):
    """A publisher's file that changed (Tatoeba's does) is used, with a warning naming both checksums."""
    d = CATALOGUE["multi30k-val"]
    server.extra["/val.en.gz"] = gzip.compress(b"A new release.\n")
    server.extra["/val.fr.gz"] = gzip.compress(b"Une nouvelle version.\n")
    files = {lang: dataclasses.replace(f, download=dataclasses.replace(f.download, url=f"{server.url}val.{lang}.gz"))
             for lang, f in d.files.items()}
    with caplog.at_level(logging.WARNING, logger="nmtkit.datasets"):
        got = Fetcher(tmp_path / "cache", use_env=False, progress=False).get(dataclasses.replace(d, files=files))
    assert got.files["en"].read_text() == "A new release.\n"
    assert "differs from the catalogue's reference copy" in caplog.text and d.files["en"].sha256 in caplog.text


def test_progress_bar_and_listing(server, tmp_path, capsys):
    download(server.url + NEWS14[0], tmp_path / "x", progress=True, retries=0, timeout=10)
    err = capsys.readouterr().err
    assert "x:" in err and "366k" in err.replace("K", "k")  # tqdm's bar: the name, the size in KiB
    out = subprocess.run([sys.executable, "-m", "nmtkit.datasets", "--list", "--json"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    listed = {d["name"]: d for d in json.loads(out.stdout)}
    assert set(listed) == set(CATALOGUE)
    assert listed["europarl-v7"]["files"]["en"]["download"]["policy"] == "trust-on-first-use"
    assert listed["newstest2014"]["files"]["fr"]["sha256"] == CATALOGUE["newstest2014"].files["fr"].sha256


# -- the Canadian Hansards --------------------------------------------------------------------------------------


def test_hansards_sittings_table_is_the_mirrors(data_dir):
    """The table in nmtkit.datasets.hansards is the mirror's sittings.tsv; its line counts add up to the splits."""
    rows = [line.rstrip("\n").split("\t") for line in (data_dir / "hansards" / "sittings.tsv").open(encoding="utf-8")]
    assert rows[0] == ["file_stem", "split", "n_lines"]
    assert hansards.sittings() == [(stem, split, int(n)) for stem, split, n in rows[1:]]
    for split in hansards.SPLITS:
        d = CATALOGUE[f"hansards-{split}"]
        expected = sum(n for _, s, n in hansards.sittings() if s == split)
        assert d.pairs == expected
        for lang, f in d.files.items():
            assert (f.path, f.convert, f.download.kind) == (f"hansards/{split}.{lang}" + (".gz" if split == "train"
                                                                                          else ""), "hansards", "tar")
            assert sum(n for _, n in hansards.members(f.path)) == expected
            assert all(m.startswith(f.member) and m.endswith(f".{lang[0]}.gz") for m, _ in hansards.members(f.path))
    with (data_dir / "hansards" / "dev.fr").open("rb") as dev:
        assert sum(1 for _ in dev) == CATALOGUE["hansards-dev"].pairs
    # independent evidence that the table counts whole ISI sitting files: the Berkeley Aligner's copies of 001-003
    sample = data_dir / "hansards-trial" / "train-sample"
    for stem, _, n in hansards.sittings()[:3]:
        assert (sample / f"{stem}.e").read_bytes().count(b"\n") == n


def test_hansards_resolve_from_the_mirror(data_dir, tmp_path, no_env):
    for name in ("hansards-train", "hansards-dev", "hansards-test"):
        split = name.split("-")[1]
        got = datasets.get(name, data_dir=data_dir, cache_dir=tmp_path / "cache")
        assert got.origins == {"en": "mirror", "fr": "mirror"}
        assert got.files == {lang: data_dir / CATALOGUE[name].files[lang].path for lang in ("en", "fr")}
        assert got.prefix == str(data_dir / "hansards" / split)  # what nmt-prepare takes
    trial = datasets.get("hansards-trial", data_dir=data_dir, cache_dir=tmp_path / "cache")
    assert trial.files == {k: data_dir / "hansards-trial" / f"trial.{ext}"
                           for k, ext in (("en", "e"), ("fr", "f"), ("align", "align"))}
    assert not (tmp_path / "cache" / "data").exists()


def test_hansards_from_an_http_mirror(server, data_dir, tmp_path):
    cache = tmp_path / "cache"
    fetcher = http_fetcher(server, cache)
    for name in ("hansards-train", "hansards-dev", "hansards-trial"):
        got = fetcher.get(name)
        assert set(got.origins.values()) == {"http-mirror"}
        for key, f in CATALOGUE[name].files.items():
            assert got.files[key] == cache / "data" / f.path
            assert sha256sum(got.files[key]) == f.sha256
    asked = {r["path"] for r in server.requests}
    assert {"/hansards/train.en.gz", "/hansards/dev.fr", "/hansards-trial/trial.align"} <= asked


ISI_TAR = "/hansard/" + hansards.HOUSE_TRAINING


def _isi_text(stem: str, side: str, n: int) -> list[str]:
    """A fake sitting file's lines: Latin-1 letters, and white space at the ends that the conversion drops."""
    word = "Séance" if side == "f" else "Sitting"
    return [f"{word} {stem[-4:]} n° {i} : Côté, député de Trois-Rivières « oui » à {i} h " for i in range(n)]


def _isi_archive(stems, short: str | None = None, v7: bool = True) -> bytes:
    """A plain tar laid out as ISI's (one gzip file per sitting and side, ISO-8859-1), with one member more, and a
    first header without the ustar magic, as old tars have; ``short``: a member written one line short."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for stem, n in stems:
            for side in ("e", "f"):
                name = f"{hansards.MEMBER_DIR}{stem}.{side}.gz"
                lines = _isi_text(stem, side, n - (name == short))
                body = gzip.compress("".join(line + "\n" for line in lines).encode("iso-8859-1"), mtime=0)
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    raw = bytearray(buf.getvalue())
    if v7:  # no magic, no version; the checksum recomputed
        raw[257:265] = bytes(8)
        raw[148:156] = b" " * 8
        raw[148:156] = b"%06o\0 " % sum(raw[:512])
    return bytes(raw)


def _local(server, d: datasets.Dataset) -> datasets.Dataset:
    """A catalogue entry whose archive's address points at the local server."""
    return dataclasses.replace(d, files={lang: dataclasses.replace(f, download=dataclasses.replace(
        f.download, url=server.url + ISI_TAR.lstrip("/"))) for lang, f in d.files.items()})


def _expected(stems, side: str) -> bytes:
    return "".join(line.strip() + "\n" for stem, n in stems for line in _isi_text(stem, side, n)).encode("utf-8")


def test_hansards_from_the_publishers_archive(server, tmp_path, caplog):
    """dev: the sittings of the real table, joined in its order, Latin-1 made UTF-8 (fake text, so not the mirror's)."""
    dev = [(stem, n) for stem, split, n in hansards.sittings() if split == "dev"]
    decoy = ("hansard.36.1.house.debates.102", 5)  # another sitting in the archive: not taken
    server.extra[ISI_TAR] = _isi_archive([decoy] + dev[::-1])  # archive order does not matter, the table's does
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING, logger="nmtkit.datasets"):
        got = Fetcher(cache, use_env=False, progress=False, timeout=10).get(_local(server, CATALOGUE["hansards-dev"]))
    assert got.origins == {"en": "publisher", "fr": "publisher"}
    for lang in ("en", "fr"):
        assert got.files[lang].read_bytes() == _expected(dev, lang[0])
    fr = got.files["fr"].read_text(encoding="utf-8").splitlines()
    assert len(fr) == 5423 and fr[0] == "Séance .100 n° 0 : Côté, député de Trois-Rivières « oui » à 0 h"
    assert fr[1815].startswith("Séance .101 n° 0 ")  # 100's lines, then 101's
    assert "trust on first use" in caplog.text and "differs from the catalogue's reference copy" in caplog.text
    assert len([r for r in server.requests if r["path"] == ISI_TAR]) == 1  # one download for both files


def test_hansards_line_count_mismatch_is_an_error(server, tmp_path):
    dev = [(stem, n) for stem, split, n in hansards.sittings() if split == "dev"]
    short = f"{hansards.MEMBER_DIR}{dev[1][0]}.f.gz"
    server.extra[ISI_TAR] = _isi_archive(dev, short=short)
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match=rf"\({re.escape(short)}\): has 3,607 lines, the sittings table of "
                                         r"hansards/dev.fr expects 3,608"):
        Fetcher(cache, use_env=False, progress=False, timeout=10).get(_local(server, CATALOGUE["hansards-dev"]))
    assert not (cache / "data" / "hansards" / "dev.fr").exists()
    assert not [p for p in files_under(cache) if p.name.endswith(".tmp")]
    server.extra[ISI_TAR] = _isi_archive(dev[:1], v7=False)
    with pytest.raises(InputError, match=r"the archive has no member .*101\.f\.gz"):
        Fetcher(tmp_path / "other", use_env=False, progress=False, timeout=10).get(
            _local(server, CATALOGUE["hansards-dev"]))


def test_hansards_train_is_gzip_and_its_text_is_checked(server, tmp_path, monkeypatch, caplog):
    """train (a small table): gzip output; the same text as the reference under other gzip bytes is no warning."""
    monkeypatch.setattr(hansards, "_SITTINGS", ("1.001:3 1.002:2 1.003:4/dev 1.004:1/test ",))
    stems = [(f"hansard.36.1.house.debates.00{i}", n) for i, n in ((1, 3), (2, 2), (3, 4), (4, 1))]
    server.extra[ISI_TAR] = _isi_archive(stems)
    d = _local(server, CATALOGUE["hansards-train"])
    en = hashlib.sha256(_expected(stems[:2], "e")).hexdigest()
    d = dataclasses.replace(d, files={**d.files, "en": dataclasses.replace(d.files["en"], text_sha256=en)})
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="nmtkit.datasets"):
        got = Fetcher(cache, use_env=False, progress=False, timeout=10).get(d)
    for lang in ("en", "fr"):
        raw = got.files[lang].read_bytes()
        assert raw[3] & 0x08 and raw[10:19] == f"train.{lang}\0".encode()  # the name inside, as in the mirror
        assert gzip.decompress(raw) == _expected(stems[:2], lang[0])
    assert "holds the reference copy's text" in caplog.text
    warned = [r.getMessage() for r in caplog.records if "differs from the catalogue's reference" in r.getMessage()]
    assert len(warned) == 1 and "train.fr.gz" in warned[0]  # fr's text is not the mirror's: warned
    files = json.loads((cache / "manifest.json").read_text())["files"]
    assert files["data/hansards/train.en.gz"]["text_matches_reference"] is True
    assert files["data/hansards/train.fr.gz"]["text_matches_reference"] is False


def test_hansards_trial_download_is_checked_strictly(server, data_dir, tmp_path, caplog):
    """The trial files are at a fixed commit: their sha256 is known, so a download is verified, not trusted."""
    d = CATALOGUE["hansards-trial"]
    for key, f in d.files.items():
        assert f.download.policy == "sha256" and f.download.url.endswith(f.path.split("/")[1])
        server.extra["/ba/" + f.path.split("/")[1]] = (data_dir / f.path).read_bytes()
    local = dataclasses.replace(d, files={k: dataclasses.replace(f, download=dataclasses.replace(
        f.download, url=server.url + "ba/" + f.path.split("/")[1])) for k, f in d.files.items()})
    with caplog.at_level(logging.WARNING, logger="nmtkit.datasets"):
        got = Fetcher(tmp_path / "cache", use_env=False, progress=False, timeout=10).get(local)
    assert got.origins == dict.fromkeys(("en", "fr", "align"), "publisher") and not caplog.text
    assert got.files["align"].read_bytes() == (data_dir / "hansards-trial" / "trial.align").read_bytes()
    server.corrupt.add("/ba/trial.f")
    with pytest.raises(InputError, match="checksum mismatch"):
        Fetcher(tmp_path / "other", use_env=False, progress=False, timeout=10, retries=0).get(local)


def test_listing_shows_the_hansards():
    out = subprocess.run([sys.executable, "-m", "nmtkit.datasets", "--list"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    for name, pairs in (("hansards-train", 914450), ("hansards-dev", 5423), ("hansards-test", 6525)):
        assert f" {pairs} " in lines[name] and hansards.HOUSE_TRAINING in lines[name]
        assert "trust-on-first-use" in lines[name]
    assert "berkeleyaligner" in lines["hansards-trial"] and "(sha256)" in lines["hansards-trial"]
