"""nmtkit.datasets' downloads, from a local HTTP server on 127.0.0.1 (``http_mirror`` in tests/conftest.py: it
serves the shared data laid out as an HTTP mirror, plus in-memory files such as a publisher's archive, and can
corrupt a file, drop or stall a connection after N bytes, and ignore ``Range``): a download checked by its checksum
and cached, resumed after a dropped connection or a SIGTERM, a publisher's archive trusted on first use, and the
content checks of what has no checksum (an HTML error page, a file of the wrong kind, two sides that disagree or
are in the wrong language, a truncated archive); what to do without a network; the progress bar and the listing.
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
import zipfile
import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, CHUNK, Fetcher, download, hansards, sha256sum
from nmtkit.errors import InputError

from conftest import NEWS14, REPO, files_under, http_fetcher, http_mirror, lines_of, wait_until
from conftest import cached_files as _cached_files


@pytest.fixture
def server(data_dir):
    """The shared data served by a local HTTP server on 127.0.0.1 (``http_mirror``: tests/conftest.py)."""
    with http_mirror(data_dir) as srv:
        yield srv


# -- downloads from an HTTP mirror -----------------------------------------------------------------------------------

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


# -- a publisher's archive (no checksum in the catalogue: trust on first use) ----------------------------------------

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


# -- what is trusted: content checks where the catalogue has no checksum ---------------------------------------------

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

    def first_block_written():  # (then the server stalls)
        if part.exists() and part.stat().st_size == CHUNK:
            return True
        assert proc.poll() is None, proc.communicate()
        return False

    wait_until(first_block_written, 60, f"the first {CHUNK:,} bytes of {EUROPARL[0]} in {part}")
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
