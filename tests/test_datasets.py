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
import re
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, CONVERSIONS, KINDS, Fetcher, download, hansards, sha256sum
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
