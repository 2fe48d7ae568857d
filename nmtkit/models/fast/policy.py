"""Which fast path runs at which size, and the block sizes the paths work in: the speed policy, in one object.

Each threshold below is where a path measured faster than the plain one it replaces, end to end (the results
rows cited in ``tests/bench/README.md``), or, for ``recompute_min_elements``, where storing σ grows to hundreds of
MB; below it the plain path runs.  Every path computes the same thing either
way, so the policy changes speed only, never what a model computes beyond float rounding.  It is read from the
environment once (``NMTKIT_BACKEND=fast:no-onednn`` turns the oneDNN products off; ``fast:no-kernels`` the C
kernels, which :mod:`nmtkit.kernels` reads itself), and the tests set it with :func:`override` to run every path
at their tiny sizes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class SpeedPolicy:
    # the attention's step through the C kernel (nmtkit/kernels/attention.c) when it is usable; else torch ops
    attention_kernel: bool = True
    # below this many (B · Tx · n') attention elements per step, one row group: the small preset (n' = 256)
    # measured no faster in groups
    group_min_elements: int = 1 << 21
    # from this many attention elements per step (covered positions · n'), σ(…) is recomputed in the backward
    # rather than kept for every step: a memory rule (kept, σ is the pass's largest tensor at paper size, ~1.5M
    # elements per step); speed measured the same either way at both sizes (bench_kernels.txt, part 10)
    recompute_min_elements: int = 1 << 20
    # the per-step products through oneDNN with reordered weights (matmul.Multiplier) ...
    onednn: bool = True
    # ... for weights of at least this many elements: at the small preset's sizes (n = 256) no faster
    onednn_min_weight: int = 1 << 18
    # the search's table of E y + b for every target word (stepweights): built when it has at most this many
    # elements (128 MB of float32)
    table_max_elements: int = 32 * 2**20
    # Adadelta checks 2-D parameters of at least this many rows (vocabulary-sized) for rows without gradient
    sparse_min_rows: int = 4096
    # Adadelta without the C kernel: elements per block (2 MB of float32 per array: a block's intermediates stay in
    # the cache; larger and smaller blocks down to a quarter of this measured alike)
    adadelta_block: int = 1 << 19
    # the row groups of the attention over a batch sorted by source length (with group_min_elements above)
    attention_groups: int = 4
    # the fused output loss: logits per chunk of rows (256 MB of float32: one chunk for a paper-size batch of
    # ~2,000 targets; chunks bound the memory of larger ones), at least this many rows per chunk (fewer make
    # inefficient products), and logits per block of rows for the softmax and its gradient (4 MB: in the cache;
    # on the CPU only: a GPU's softmax takes a whole chunk)
    loss_chunk_elements: int = 1 << 26
    loss_min_chunk_rows: int = 64
    softmax_block_elements: int = 1 << 20
    # the search's top-k over a vocabulary-wide row: values per block whose maxima are ranked first
    topk_block: int = 64

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> SpeedPolicy:
        from nmtkit.runtime import fast_switches

        return cls(onednn="no-onednn" not in fast_switches(environ))


_current = SpeedPolicy.from_environment()


def policy() -> SpeedPolicy:
    """The policy in force."""
    return _current


@contextlib.contextmanager
def override(**changes) -> Iterator[SpeedPolicy]:
    """The policy with some fields changed, for the ``with`` block (tests, benchmarks)."""
    global _current
    saved = _current
    _current = dataclasses.replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved
