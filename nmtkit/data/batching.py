"""Minibatches as the paper made them: length-sorted pools of 1,600 pairs split into 20 minibatches of 80.

"Every 20 updates, we fetched 1,600 sentence pairs, sorted them according to the lengths and split them into 20
minibatches" (Section 4.2 / Appendix B.2). Here each epoch visits the training pairs in a random order drawn from
``(seed, epoch)``; consecutive pools of ``batch_size × pool_batches`` pairs are sorted by (target, source) length
and cut into ``pool_batches`` minibatches, whose order within the pool is shuffled. The whole schedule of an
epoch is a pure function of ``(seed, epoch)``, so a run resumed at (epoch, batch) sees exactly the batches an
uninterrupted run would have seen.

Token layout of a batch (see :mod:`nmtkit.models.rnnsearch`): the source is ``x_1 … x_Tx </s>``, the decoder
input ``<s> y_1 … y_Ty`` and its output ``y_1 … y_Ty </s>``, right-padded with ``<pad>`` = 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmtkit.data.corpus import Corpus
from nmtkit.data.vocab import BOS, EOS, PAD


@dataclass
class Batch:
    """One minibatch as tensors (batch first)."""

    src: torch.Tensor  # (B, Tx) source ids + </s>, padded
    src_lens: torch.Tensor  # (B,) true lengths including </s>
    tgt_in: torch.Tensor  # (B, Ty) <s> y_1 … y_T, padded
    tgt_out: torch.Tensor  # (B, Ty) y_1 … y_T </s>, padded
    ids: np.ndarray  # (B,) sentence numbers in the corpus

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) target tokens, ``</s>`` included: the unit of tokens/second."""
        return int((self.tgt_out != PAD).sum())

    def to(self, device) -> Batch:
        return Batch(self.src.to(device), self.src_lens.to(device), self.tgt_in.to(device),
                     self.tgt_out.to(device), self.ids)


def collate_source(sentences: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Source id arrays → (src (B, Tx) with ``</s>`` appended, right-padded; src_lens (B,))."""
    lens = np.array([len(s) + 1 for s in sentences], dtype=np.int64)
    src = np.full((len(sentences), int(lens.max(initial=1))), PAD, dtype=np.int64)
    for k, s in enumerate(sentences):
        src[k, : len(s)] = s
        src[k, len(s)] = EOS
    return torch.from_numpy(src), torch.from_numpy(lens)


def collate(src: Corpus, tgt: Corpus, ids: np.ndarray) -> Batch:
    """Gather sentences ``ids`` of a parallel corpus into a :class:`Batch`."""
    src_t, src_lens = collate_source([src[i] for i in ids])
    tgt_sents = [tgt[i] for i in ids]
    width = max(len(t) for t in tgt_sents) + 1
    tgt_in = np.full((len(ids), width), PAD, dtype=np.int64)
    tgt_out = np.full((len(ids), width), PAD, dtype=np.int64)
    for k, t in enumerate(tgt_sents):
        tgt_in[k, 0] = BOS
        tgt_in[k, 1: len(t) + 1] = t
        tgt_out[k, : len(t)] = t
        tgt_out[k, len(t)] = EOS
    return Batch(src_t, src_lens, torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), np.asarray(ids))


class EpochSchedule(Sequence):
    """The minibatches (arrays of sentence ids) of one epoch, in order: the paper's pooled length sorting, made
    pool by pool when first read.

    ``eligible`` holds the ids that may be trained on (e.g. those within a maximum length). ``pool_batches = 1``
    gives plain random batches; a pool as large as the corpus gives globally sorted batches.  A pool is sorted by
    ``lengths(ids) -> (source lengths, target lengths)`` when one of its batches is first read (default: the
    prepared corpus's ``src_sizes`` and ``tgt_sizes``); with BPE-dropout these are the epoch's own segmentations,
    which the trainer does not know before it segments the pool.  Every random draw is made up front in one order,
    so the batches are a pure function of ``(seed, epoch)`` and ``lengths``, whichever batch is read first.
    """

    def __init__(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray, eligible: np.ndarray, batch_size: int,
                 pool_batches: int, seed: int, epoch: int, lengths=None):
        rng = np.random.default_rng([seed, epoch])
        self.order = eligible[rng.permutation(len(eligible))]
        self.batch_size, self.pool_batches = batch_size, pool_batches
        pool = batch_size * pool_batches
        self.starts = list(range(0, len(self.order), pool))
        # the order of each pool's minibatches, drawn pool after pool as an eager schedule would draw them
        self.shuffles = [rng.permutation(-(-min(pool, len(self.order) - s) // batch_size)) for s in self.starts]
        self.lengths = lengths or (lambda ids: (src_sizes[ids], tgt_sizes[ids]))
        self._pool: tuple[int, list[np.ndarray]] | None = None  # (index, its minibatches in order): the last read
        self._len = sum(len(p) for p in self.shuffles)

    def __len__(self) -> int:
        return self._len

    def _batches_of(self, p: int) -> list[np.ndarray]:
        if self._pool is None or self._pool[0] != p:
            start = self.starts[p]
            ids = self.order[start: start + self.batch_size * self.pool_batches]
            src_len, tgt_len = self.lengths(ids)
            # sort by target length, then source length; stable, so equal lengths keep the random order
            ids = ids[np.lexsort((np.asarray(src_len), np.asarray(tgt_len)))]
            chunk = [ids[k: k + self.batch_size] for k in range(0, len(ids), self.batch_size)]
            self._pool = (p, [chunk[j] for j in self.shuffles[p]])
        return self._pool[1]

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} of an epoch of {len(self)}")
        k %= len(self)
        return self._batches_of(k // self.pool_batches)[k % self.pool_batches]  # (every pool but the last is full)


def epoch_schedule(src_sizes: np.ndarray, tgt_sizes: np.ndarray, eligible: np.ndarray, batch_size: int,
                   pool_batches: int, seed: int, epoch: int, lengths=None) -> list[np.ndarray]:
    """The whole :class:`EpochSchedule` of an epoch, as a list."""
    return list(EpochSchedule(src_sizes, tgt_sizes, eligible, batch_size, pool_batches, seed, epoch, lengths))


def eval_batches(src_sizes: np.ndarray, tgt_sizes: np.ndarray | None, batch_size: int) -> list[np.ndarray]:
    """Batches for evaluation: every sentence once, grouped by length to limit padding (restore order by id)."""
    order = (np.argsort(src_sizes, kind="stable") if tgt_sizes is None
             else np.lexsort((tgt_sizes, src_sizes)))
    return [order[k: k + batch_size] for k in range(0, len(order), batch_size)]


def forced_blocks(src_ids: Sequence[np.ndarray], tgt_ids: Sequence[np.ndarray], batch_size: int, device,
                  compute) -> list[np.ndarray]:
    """``compute(batch)`` -> (B, Ty, Tx) array over the pairs (``src_ids``, ``tgt_ids``) batched by length, without
    gradients: each pair's block (len(tgt) + 1, len(src) + 1) (its tokens and ``</s>``), in input order."""
    out: list[np.ndarray] = [None] * len(src_ids)  # type: ignore[list-item]
    src_sizes = np.array([len(s) for s in src_ids], dtype=np.int64)
    tgt_sizes = np.array([len(t) for t in tgt_ids], dtype=np.int64)
    with torch.no_grad():
        for ids in eval_batches(src_sizes, tgt_sizes, batch_size):
            values = compute(collate(src_ids, tgt_ids, ids).to(device))
            for k, i in enumerate(ids):
                out[i] = values[k, : tgt_sizes[i] + 1, : src_sizes[i] + 1]
    return out
