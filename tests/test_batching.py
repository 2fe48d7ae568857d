"""Minibatching: the paper's length-sorted pools (epoch_schedule), the token layout (collate), eval batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nmtkit.data.batching import collate, collate_source, epoch_schedule, eval_batches
from nmtkit.data.vocab import BOS, EOS, PAD

N = 1003  # not a multiple of the pool: the last pool is partial


@pytest.fixture(scope="module")
def sizes():
    rng = np.random.default_rng(12345)
    src = rng.integers(1, 51, size=N).astype(np.int32)
    tgt = rng.integers(1, 51, size=N).astype(np.int32)
    return src, tgt


def _key(src, tgt, i):
    return (int(tgt[i]), int(src[i]))


def _pools(batches, pool_batches):
    return [batches[k: k + pool_batches] for k in range(0, len(batches), pool_batches)]


def test_every_eligible_id_exactly_once_per_epoch(sizes):
    src, tgt = sizes
    eligible = np.flatnonzero((src <= 40) & (tgt <= 40))
    assert 0 < len(eligible) < N
    for epoch in range(3):
        batches = epoch_schedule(src, tgt, eligible, batch_size=8, pool_batches=5, seed=7, epoch=epoch)
        ids = np.concatenate(batches)
        assert len(ids) == len(eligible)
        assert sorted(ids.tolist()) == eligible.tolist()  # each once, nothing ineligible
        assert all(1 <= len(b) <= 8 for b in batches)


def test_pools_are_sorted_by_target_then_source_length(sizes):
    src, tgt = sizes
    eligible = np.arange(N)
    bs, pb = 8, 5
    batches = epoch_schedule(src, tgt, eligible, bs, pb, seed=3, epoch=0)
    # full pools: pb batches of bs; the last (partial) pool: N % (bs * pb) ids
    assert len(batches) == (N // (bs * pb)) * pb + math.ceil((N % (bs * pb)) / bs)
    pools = _pools(batches, pb)
    assert all(sum(len(b) for b in pool) == bs * pb for pool in pools[:-1])
    assert sum(len(b) for b in pools[-1]) == N % (bs * pb)
    any_shuffled = False
    for pool in pools:
        # put the pool's batches together in the order of their shortest member: one sorted sequence
        ordered = sorted(pool, key=lambda b: min(_key(src, tgt, i) for i in b))
        keys = [_key(src, tgt, i) for b in ordered for i in b]
        assert keys == sorted(keys)
        assert all(len(b) == bs for b in ordered[:-1])
        if [id(b) for b in ordered] != [id(b) for b in pool]:
            any_shuffled = True
    assert any_shuffled, "the minibatches of a pool are never shuffled"
    # pools are random draws, not slices of one global sort: their length ranges overlap
    firsts = [min(_key(src, tgt, i) for b in pool for i in b) for pool in pools[:-1]]
    lasts = [max(_key(src, tgt, i) for b in pool for i in b) for pool in pools[:-1]]
    assert max(firsts) < min(lasts)


def test_schedule_is_a_function_of_seed_and_epoch(sizes):
    src, tgt = sizes
    eligible = np.arange(N)

    def sched(seed, epoch):
        return [b.tolist() for b in epoch_schedule(src, tgt, eligible, 16, 4, seed=seed, epoch=epoch)]

    assert sched(1, 0) == sched(1, 0)
    assert sched(1, 5) == sched(1, 5)
    assert sched(1, 0) != sched(1, 1)
    assert sched(1, 0) != sched(2, 0)
    # different epochs put different pairs together, not just the same batches in another order
    assert {tuple(sorted(b)) for b in sched(1, 0)} != {tuple(sorted(b)) for b in sched(1, 1)}


def test_one_batch_pools_give_plain_random_batches(sizes):
    src, tgt = sizes
    eligible = np.arange(N)
    global_std = float(np.std(tgt))

    def mean_batch_std(pool_batches):
        batches = epoch_schedule(src, tgt, eligible, 40, pool_batches, seed=11, epoch=0)
        return float(np.mean([np.std(tgt[b]) for b in batches if len(b) > 1]))

    plain, pooled = mean_batch_std(1), mean_batch_std(20)
    assert plain > 0.8 * global_std  # a random sample of lengths, as spread as the corpus
    assert pooled < 0.2 * global_std  # length-sorted pools give batches of similar lengths
    # the batches of plain random batching come in random, not sorted, order
    batches = epoch_schedule(src, tgt, eligible, 40, 1, seed=11, epoch=0)
    means = [float(np.mean(tgt[b])) for b in batches]
    assert means != sorted(means)


def test_pool_as_large_as_the_corpus_sorts_globally(sizes):
    src, tgt = sizes
    bs = 10
    batches = epoch_schedule(src, tgt, np.arange(N), bs, math.ceil(N / bs), seed=0, epoch=0)
    ordered = sorted(batches, key=lambda b: min(_key(src, tgt, i) for i in b))
    keys = [_key(src, tgt, i) for b in ordered for i in b]
    assert keys == sorted(keys) and len(keys) == N


def test_collate_layout():
    src = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    tgt = [np.array([11, 12]), np.array([13, 14, 15, 16]), np.array([17])]
    batch = collate(src, tgt, np.array([0, 1, 2]))
    E, B = EOS, BOS
    assert batch.src.tolist() == [[5, 6, 7, E], [8, E, PAD, PAD], [9, 10, E, PAD]]
    assert batch.src_lens.tolist() == [4, 2, 3]
    assert batch.tgt_in.tolist() == [[B, 11, 12, PAD, PAD], [B, 13, 14, 15, 16], [B, 17, PAD, PAD, PAD]]
    assert batch.tgt_out.tolist() == [[11, 12, E, PAD, PAD], [13, 14, 15, 16, E], [17, E, PAD, PAD, PAD]]
    assert batch.num_tokens == 3 + 5 + 2  # target tokens with </s>, padding excluded
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.int64
    assert batch.ids.tolist() == [0, 1, 2]
    # a subset, in the order asked for
    sub = collate(src, tgt, np.array([2, 0]))
    assert sub.src.tolist() == [[9, 10, E, PAD], [5, 6, 7, E]]
    assert sub.tgt_out.tolist() == [[17, E, PAD], [11, 12, E]]
    assert sub.ids.tolist() == [2, 0]


def test_collate_source_layout():
    src, lens = collate_source([np.array([4, 5]), np.array([6, 7, 8, 9])])
    assert src.tolist() == [[4, 5, EOS, PAD, PAD], [6, 7, 8, 9, EOS]]
    assert lens.tolist() == [3, 5]


@pytest.mark.parametrize("with_tgt", [True, False])
def test_eval_batches_cover_every_id_once(sizes, with_tgt):
    src, tgt = sizes
    batches = eval_batches(src, tgt if with_tgt else None, 32)
    ids = np.concatenate(batches)
    assert sorted(ids.tolist()) == list(range(N))
    assert all(1 <= len(b) <= 32 for b in batches)
    assert len(batches) == math.ceil(N / 32)
    # grouped by length: padding stays small
    assert float(np.mean([src[b].max() - src[b].min() for b in batches])) < 5


def test_the_epoch_schedule_is_made_pool_by_pool_in_any_order_of_reading():
    # the trainer reads the schedule from a resumed position and in groups (--update-freq) that cross pools; each
    # pool is sorted when first read, by the lengths it is given (BPE-dropout: the epoch's own segmentations)
    from nmtkit.data.batching import EpochSchedule

    rng = np.random.default_rng(5)
    src, tgt = rng.integers(1, 40, 500), rng.integers(1, 40, 500)
    eligible = np.flatnonzero(src < 35)
    eager = epoch_schedule(src, tgt, eligible, 16, 4, seed=2, epoch=1)
    lazy = EpochSchedule(src, tgt, eligible, 16, 4, seed=2, epoch=1)
    assert len(lazy) == len(eager)
    for k in list(range(len(eager)))[::-1] + [3, 0, 17, 4, 5]:  # backwards, then jumping between pools
        assert np.array_equal(lazy[k], eager[k])
    assert [b.tolist() for b in lazy[6:13]] == [b.tolist() for b in eager[6:13]] and np.array_equal(lazy[-1], eager[-1])
    with pytest.raises(IndexError):
        lazy[len(eager)]
    # other lengths: the same pools (the same ids, drawn in the same random order), sorted by those lengths
    other = rng.integers(1, 60, 500)
    asked = []

    def lengths(ids):
        asked.append(len(ids))
        return src[ids], other[ids]

    by_other = EpochSchedule(src, tgt, eligible, 16, 4, seed=2, epoch=1, lengths=lengths)
    first = by_other[:4]  # the first pool
    assert asked == [64]  # sorted once for its four batches
    assert sorted(np.concatenate(first).tolist()) == sorted(np.concatenate(eager[:4]).tolist())
    ordered = sorted(first, key=lambda b: other[b].min())
    for a, b in zip(ordered, ordered[1:]):
        assert other[a].max() <= other[b].min()  # sorted by the lengths given, not by tgt
    assert any(not np.array_equal(a, b) for a, b in zip(first, eager[:4]))
