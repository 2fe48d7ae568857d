"""The Canadian Hansards in nmtkit.datasets (nmtkit.datasets.hansards): the sittings table is the mirror's and adds
up to the splits; the splits resolve from a local mirror and download from an HTTP one; from the publisher's tar
(ISI's sitting files, fake ones here, served by a local HTTP server: ``http_mirror`` in tests/conftest.py) they are
joined in the table's order, Latin-1 made UTF-8, each sitting's line count checked, a tar cut short refused; the
trial set's download is checked by its checksum; the listing shows them.
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

import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, Fetcher, hansards, sha256sum
from nmtkit.errors import InputError

from conftest import REPO, files_under, http_fetcher, http_mirror
from conftest import cached_files as _cached_files


@pytest.fixture
def server(data_dir):
    """The shared data served by a local HTTP server on 127.0.0.1 (``http_mirror``: tests/conftest.py)."""
    with http_mirror(data_dir) as srv:
        yield srv


# -- the sittings table, and the splits from a mirror ----------------------------------------------------------------

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


# -- from the publisher's archive ------------------------------------------------------------------------------------

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


# -- the listing -----------------------------------------------------------------------------------------------------

def test_listing_shows_the_hansards():
    out = subprocess.run([sys.executable, "-m", "nmtkit.datasets", "--list"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    for name, pairs in (("hansards-train", 914450), ("hansards-dev", 5423), ("hansards-test", 6525)):
        assert f" {pairs} " in lines[name] and hansards.HOUSE_TRAINING in lines[name]
        assert "trust-on-first-use" in lines[name]
    assert "berkeleyaligner" in lines["hansards-trial"] and "(sha256)" in lines["hansards-trial"]
