"""nmtkit.data.corpus: the .idx/.bin binarized corpus, its writer and memory-mapped reader."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from nmtkit.data.corpus import Corpus, CorpusWriter, dtype_for_vocab
from nmtkit.errors import InputError

SENTENCES = [[5, 9, 4], [], [65535], [0, 1, 2, 3, 4, 5, 6], [], [7]]


def write_corpus(prefix, sentences, dtype):
    with CorpusWriter(prefix, dtype) as w:
        for s in sentences:
            w.add(s)
    return str(prefix)


def parse_idx(path):
    """An independent reading of the .idx layout documented in nmtkit/data/corpus.py."""
    data = open(path, "rb").read()
    magic, version, code, n = struct.unpack_from("<8sIB3xQ", data, 0)
    offsets = struct.unpack_from(f"<{n + 1}q", data, 24)
    lengths = struct.unpack_from(f"<{n}i", data, 24 + 8 * (n + 1))
    assert len(data) == 24 + 8 * (n + 1) + 4 * n
    return magic, version, code, n, list(offsets), list(lengths)


@pytest.mark.parametrize("dtype,code,big", [(np.uint16, 1, 65535), (np.int32, 2, 2_000_000)])
def test_round_trip_and_byte_layout(tmp_path, dtype, code, big):
    sentences = SENTENCES + [[big, 0, big]]
    prefix = write_corpus(tmp_path / "train.en", sentences, dtype)
    magic, version, got_code, n, offsets, lengths = parse_idx(prefix + ".idx")
    assert (magic, version, got_code, n) == (b"NMTKIDX\x00", 1, code, len(sentences))
    assert lengths == [len(s) for s in sentences]
    assert offsets == [0, 3, 3, 4, 11, 11, 12, 15]
    itemsize = np.dtype(dtype).itemsize
    raw = open(prefix + ".bin", "rb").read()
    assert len(raw) == 15 * itemsize
    assert np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).tolist() == sum(sentences, [])

    c = Corpus(prefix)
    assert len(c) == len(sentences) and c.num_tokens == 15 and c.dtype == np.dtype(dtype)
    assert [c[i].tolist() for i in range(len(c))] == sentences
    assert [x.tolist() for x in c] == sentences
    assert c.sizes.tolist() == [len(s) for s in sentences]
    assert c[-1].tolist() == [big, 0, big]
    with pytest.raises(IndexError):
        c[len(sentences)]
    with pytest.raises(IndexError):
        c[-len(sentences) - 1]
    with pytest.raises(ValueError):  # memory-mapped read-only
        c[0][0] = 1


def test_empty_corpus_and_all_empty_sentences(tmp_path):
    c = Corpus(write_corpus(tmp_path / "e", [], np.uint16))
    assert len(c) == 0 and c.num_tokens == 0 and list(c) == []
    assert (tmp_path / "e.bin").stat().st_size == 0
    c = Corpus(write_corpus(tmp_path / "f", [[], [], []], np.int32))
    assert len(c) == 3 and [x.tolist() for x in c] == [[], [], []] and c.sizes.tolist() == [0, 0, 0]


def test_writer_rejects_out_of_range_ids_and_bad_dtypes(tmp_path):
    with CorpusWriter(tmp_path / "a", np.uint16) as w:
        with pytest.raises(ValueError):
            w.add([65536])
        with pytest.raises(ValueError):
            w.add([-1])
        with pytest.raises(ValueError):
            w.add([[1, 2]])
        w.add([1])
    assert [x.tolist() for x in Corpus(tmp_path / "a")] == [[1]]  # rejected sentences were not written
    with pytest.raises(ValueError):
        CorpusWriter(tmp_path / "b", np.float32)


def test_dtype_for_vocab():
    assert dtype_for_vocab(30004) == np.uint16
    assert dtype_for_vocab(65536) == np.uint16  # ids 0..65535
    assert dtype_for_vocab(65537) == np.int32


@pytest.fixture
def good(tmp_path):
    return write_corpus(tmp_path / "c", [[1, 2, 3], [4]], np.uint16)


def _patch(path, offset, data):
    b = bytearray(open(path, "rb").read())
    b[offset: offset + len(data)] = data
    open(path, "wb").write(bytes(b))


def test_bad_magic(good):
    _patch(good + ".idx", 0, b"FAIRSEQ\x00")
    with pytest.raises(InputError, match="bad magic") as e:
        Corpus(good)
    assert e.value.path == good + ".idx"


def test_bad_version(good):
    _patch(good + ".idx", 8, struct.pack("<I", 2))
    with pytest.raises(InputError, match="version 2") as e:
        Corpus(good)
    assert e.value.path == good + ".idx"


def test_unknown_dtype_code(good):
    _patch(good + ".idx", 12, b"\x07")
    with pytest.raises(InputError, match="dtype"):
        Corpus(good)


@pytest.mark.parametrize("cut", [1, 4, 30])
def test_truncated_idx(good, cut):
    data = open(good + ".idx", "rb").read()
    open(good + ".idx", "wb").write(data[:-cut])
    with pytest.raises(InputError) as e:
        Corpus(good)
    assert e.value.path == good + ".idx"


def test_truncated_and_overlong_bin(good):
    data = open(good + ".bin", "rb").read()
    open(good + ".bin", "wb").write(data[:-2])
    with pytest.raises(InputError, match="truncated") as e:
        Corpus(good)
    assert e.value.path == good + ".bin"
    open(good + ".bin", "wb").write(data + b"\x00\x00")
    with pytest.raises(InputError):
        Corpus(good)


def test_missing_files(good):
    os.unlink(good + ".bin")
    with pytest.raises(InputError, match="no such file") as e:
        Corpus(good)
    assert e.value.path == good + ".bin"
