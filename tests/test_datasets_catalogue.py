"""nmtkit.datasets' catalogue and local mirrors, without a network: the catalogue is consistent, its checksums are
the shared data's, the SGML conversion gives the reference text, and a local mirror ($NMTKIT_DATA) is used where it
lies, a bad copy in it refused.  (Downloads: tests/test_datasets_download.py; the Hansards:
tests/test_datasets_hansards.py.)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys

import pytest

from nmtkit import datasets
from nmtkit.datasets import CATALOGUE, CONVERSIONS, KINDS, sha256sum
from nmtkit.errors import InputError

from conftest import NEWS14, REPO


# -- the catalogue ---------------------------------------------------------------------------------------------------

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


# -- a local mirror ($NMTKIT_DATA) -----------------------------------------------------------------------------------

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
