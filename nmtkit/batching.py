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

from nmtkit.corpus import Corpus
from nmtkit.vocab import BOS, EOS, PAD


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


def epoch_schedule(src_sizes: np.ndarray, tgt_sizes: np.ndarray, eligible: np.ndarray, batch_size: int,
                   pool_batches: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The minibatches (arrays of sentence ids) of one epoch, in order: the paper's pooled length sorting.

    ``eligible`` holds the ids that may be trained on (e.g. those within a maximum length). ``pool_batches = 1``
    gives plain random batches; a pool as large as the corpus gives globally sorted batches.
    """
    rng = np.random.default_rng([seed, epoch])
    order = eligible[rng.permutation(len(eligible))]
    pool = batch_size * pool_batches
    batches: list[np.ndarray] = []
    for start in range(0, len(order), pool):
        ids = order[start: start + pool]
        # sort by target length, then source length; stable, so equal lengths keep the random order
        ids = ids[np.lexsort((src_sizes[ids], tgt_sizes[ids]))]
        chunk = [ids[k: k + batch_size] for k in range(0, len(ids), batch_size)]
        batches.extend(chunk[j] for j in rng.permutation(len(chunk)))
    return batches


def eval_batches(src_sizes: np.ndarray, tgt_sizes: np.ndarray | None, batch_size: int) -> list[np.ndarray]:
    """Batches for evaluation: every sentence once, grouped by length to limit padding (restore order by id)."""
    order = (np.argsort(src_sizes, kind="stable") if tgt_sizes is None
             else np.lexsort((tgt_sizes, src_sizes)))
    return [order[k: k + batch_size] for k in range(0, len(order), batch_size)]
