"""nmtkit.datasets: the catalogue, local-mirror resolution, and downloads from a local HTTP server on 127.0.0.1.

The server (http.server in a thread, stopped by the fixture, and by a timer should a test hang) serves the shared
data from ``data_dir``, laid out as an HTTP mirror, plus in-memory files (a publisher's archive). It can corrupt a
file, drop the connection after N bytes on the first request for a file, and ignore ``Range`` headers.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, CONVERSIONS, KINDS, Fetcher, download, sha256sum
from nmtkit.errors import InputError

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
        if drop is not None:
            self.wfile.write(body[start:start + drop])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body[start:])


@pytest.fixture
def server(data_dir):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.root = Path(data_dir)
    srv.extra, srv.corrupt, srv.drop_after, srv.requests = {}, set(), {}, []
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
                "multi30k-train", "multi30k-val", "multi30k-test2016"}
    assert required <= set(CATALOGUE)
    paths = set()
    for name, d in CATALOGUE.items():
        assert d.name == name and d.description and d.licence
        assert set(d.files) == {"en", "fr"}, name
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


def _test_full_tgz(data_dir) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm"):
            tar.add(data_dir / "wmt14" / "sgm" / name, arcname=f"test-full/{name}")
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
