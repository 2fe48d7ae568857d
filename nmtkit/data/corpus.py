"""The binarized corpus: one module owns the ``.idx``/``.bin`` format, its writer and its memory-mapped reader.

A corpus of N sentences for one language is two files (after fairseq's ``MMIDIDX`` indexed dataset):

``PREFIX.bin``
    the token ids of every sentence, back to back, in the dtype the index names (no ``<s>``/``</s>``).
``PREFIX.idx`` (little-endian)
    ========  ==================  ======================================================
    offset    type                content
    ========  ==================  ======================================================
    0         8 bytes             magic ``b"NMTKIDX\\0"``
    8         uint32              format version (1)
    12        uint8 + 3 pad       dtype code: 1 = uint16, 2 = int32
    16        uint64              N, the number of sentences
    24        int64 × (N + 1)     offsets into ``.bin``, in tokens (offsets[0] = 0)
    ...       int32 × N           lengths in tokens
    ========  ==================  ======================================================

Both files are read with :class:`numpy.memmap`, so a corpus far larger than memory costs only what is touched.
"""

from __future__ import annotations

import os
import struct
from array import array

import numpy as np

from nmtkit.errors import InputError

MAGIC = b"NMTKIDX\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIB3xQ")
DTYPE_CODES = {1: np.dtype("<u2"), 2: np.dtype("<i4")}
_CODE_OF = {dt: code for code, dt in DTYPE_CODES.items()}


def dtype_for_vocab(size: int) -> np.dtype:
    """uint16 while every id fits, int32 beyond 65,536 entries."""
    return DTYPE_CODES[1] if size <= 1 << 16 else DTYPE_CODES[2]


class CorpusWriter:
    """Streams sentences into ``PREFIX.bin`` and writes ``PREFIX.idx`` on :meth:`close`.

    >>> with CorpusWriter(prefix, np.uint16) as w:   # doctest: +SKIP
    ...     w.add([5, 9, 4])
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype not in _CODE_OF:
            raise ValueError(f"unsupported dtype {self.dtype} (use uint16 or int32)")
        self._limit = np.iinfo(self.dtype).max
        self._bin = open(self.prefix + ".bin", "wb")
        self._lengths = array("i")

    def add(self, ids) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError("a sentence is a 1-d sequence of ids")
        if ids.size and (ids.min() < 0 or ids.max() > self._limit):
            raise ValueError(f"id out of range for {self.dtype}")
        self._bin.write(ids.astype(self.dtype, copy=False).tobytes())
        self._lengths.append(int(ids.size))

    def close(self) -> None:
        if self._bin.closed:
            return
        self._bin.close()
        lengths = np.frombuffer(self._lengths, dtype=np.int32) if len(self._lengths) else np.zeros(0, np.int32)
        offsets = np.zeros(len(lengths) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        with open(self.prefix + ".idx", "wb") as f:
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, _CODE_OF[self.dtype], len(lengths)))
            f.write(offsets.tobytes())
            f.write(lengths.astype("<i4").tobytes())

    def __enter__(self) -> CorpusWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Corpus:
    """A memory-mapped binarized corpus: ``len(c)``, ``c[i]`` (a read-only array of ids), ``c.sizes``."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        idx_path, bin_path = self.prefix + ".idx", self.prefix + ".bin"
        for p in (idx_path, bin_path):
            if not os.path.isfile(p):
                raise InputError("no such file (binarized corpus)", p)
        with open(idx_path, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size or head[:8] != MAGIC:
            raise InputError("not an nmtkit binarized corpus index (bad magic)", idx_path)
        _, version, code, n = _HEADER.unpack(head)
        if version != FORMAT_VERSION:
            raise InputError(f"binarized corpus format version {version} is not understood "
                             f"(this nmtkit reads version {FORMAT_VERSION})", idx_path)
        if code not in DTYPE_CODES:
            raise InputError(f"unknown dtype code {code} in index", idx_path)
        self.dtype = DTYPE_CODES[code]
        expected = _HEADER.size + 8 * (n + 1) + 4 * n
        if os.path.getsize(idx_path) != expected:
            raise InputError(f"index is {os.path.getsize(idx_path)} bytes, expected {expected} for {n} sentences "
                             "(truncated or corrupt)", idx_path)
        self._offsets = np.memmap(idx_path, dtype="<i8", mode="r", offset=_HEADER.size, shape=(n + 1,))
        self.sizes = np.memmap(idx_path, dtype="<i4", mode="r", offset=_HEADER.size + 8 * (n + 1), shape=(n,))
        total = int(self._offsets[-1])
        if os.path.getsize(bin_path) != total * self.dtype.itemsize:
            raise InputError(f"data file is {os.path.getsize(bin_path)} bytes, the index expects "
                             f"{total * self.dtype.itemsize} (truncated or corrupt)", bin_path)
        # np.memmap cannot map an empty file; an empty corpus has no tokens to read anyway.
        self._data = (np.memmap(bin_path, dtype=self.dtype, mode="r") if total else np.zeros(0, self.dtype))
        self._check_index(idx_path)

    def _check_index(self, idx_path: str) -> None:
        """Lengths that are not negative and offsets that are their running sum (one vectorised pass)."""
        sizes, offsets = np.asarray(self.sizes), np.asarray(self._offsets)
        negative = np.flatnonzero(sizes < 0)
        if len(negative):
            raise InputError(f"index gives sentence {negative[0] + 1} a negative length ({sizes[negative[0]]}): "
                             "corrupt", idx_path)
        wrong = np.flatnonzero(np.diff(offsets) != sizes) if len(sizes) else []
        if offsets[0] != 0 or len(wrong):
            at = 0 if offsets[0] != 0 else int(wrong[0]) + 1
            raise InputError(f"index offsets are not the running sum of the sentence lengths (from sentence "
                             f"{max(at, 1)} on): corrupt", idx_path)

    def check_ids(self, vocab_size: int) -> None:
        """Refuse ids outside a vocabulary of ``vocab_size`` entries (one vectorised pass over the ids)."""
        if not len(self._data):
            return
        top, low = int(self._data.max()), int(self._data.min())
        if top >= vocab_size or low < 0:
            position = int(np.argmax((self._data >= vocab_size) | (self._data < 0)))
            sentence = int(np.searchsorted(np.asarray(self._offsets), position, side="right"))
            raise InputError(f"sentence {sentence} holds token id {int(self._data[position])}, but the vocabulary "
                             f"has {vocab_size} entries (ids 0 to {vocab_size - 1}): prepared with another "
                             "vocabulary, or corrupt", self.prefix + ".bin")

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sentence {i} out of range for {len(self)} sentences")
        i = int(i) % len(self)
        return self._data[self._offsets[i]: self._offsets[i + 1]]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def num_tokens(self) -> int:
        return int(self._offsets[-1])
