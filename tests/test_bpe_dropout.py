"""BPE-dropout (nmt-train --bpe-dropout): the segmentation against subword-nmt's own on real Hansards words, its
distribution, and training with it on real Multi30K pairs: new units every epoch, the same on a rerun, exact
resume, and refusal on data without BPE."""

from __future__ import annotations

import gzip
import io
import itertools
import random
from collections import Counter

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.bpedropout import BPEDropout, DropoutCorpus
from nmtkit.errors import InputError
from nmtkit.data.manifest import PreparedData
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.data.text import Preprocessor, TextConfig, learn_bpe_codes
from nmtkit.train.trainer import TrainConfig, Trainer, train
from nmtkit.data.vocab import Vocabulary

from conftest import lines_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hansards(data_dir):
    """Moses words of 3,000 Hansards French sentences and 2,000 BPE merges learned on them."""
    with gzip.open(data_dir / "hansards" / "train.fr.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in itertools.islice(f, 3000)]
    pre = Preprocessor(TextConfig("fr"))
    sentences = [pre.words(line) for line in lines]
    codes = learn_bpe_codes(Counter(w for s in sentences for w in s), 2000)
    return sentences, codes


def test_without_dropout_it_is_subword_nmts_segmentation(hansards):
    from subword_nmt.apply_bpe import BPE

    sentences, codes = hansards
    reference = BPE(io.StringIO(codes))
    mine = BPEDropout(codes, 0.0)
    for words in sentences:
        assert mine.words(words, random.Random(0)) == reference.segment_tokens(words)
    # restricted to a vocabulary, units outside it are split back as subword-nmt's --vocabulary does
    units = Counter(u for words in sentences[:1000] for u in reference.segment_tokens(words))
    vocab = Vocabulary.build(units, 600)
    restricted = BPE(io.StringIO(codes), vocab=set(vocab.tokens))
    mine = BPEDropout(codes, 0.0, vocab)
    split = 0
    for words in sentences[1000:]:
        assert mine.words(words, random.Random(0)) == restricted.segment_tokens(words)
        split += len(restricted.segment_tokens(words)) - len(reference.segment_tokens(words))
    assert split > 100  # (the restriction did split units)


def test_with_dropout_it_is_subword_nmts_dropout_given_the_same_draws(hansards, monkeypatch):
    import subword_nmt.apply_bpe as apply_bpe

    sentences, codes = hansards
    mine = BPEDropout(codes, 0.1)
    for seed in range(5):
        words = sentences[seed * 100: seed * 100 + 100]
        monkeypatch.setattr(apply_bpe, "random", random.Random(seed))  # subword-nmt draws from the random module
        reference = apply_bpe.BPE(io.StringIO(codes))
        rng = random.Random(seed)
        assert [mine.words(w, rng) for w in words] == [reference.segment_tokens(w, dropout=0.1) for w in words]


def test_dropout_distribution(hansards):
    sentences, codes = hansards
    words = [w for s in sentences[:300] for w in s]
    means = []
    for p in (0.0, 0.1, 0.3, 0.6):
        seg = BPEDropout(codes, p)
        rng = random.Random(1)
        units = [seg.word(w, rng) for w in words]
        assert all("".join(u.removesuffix("@@") for u in us) == w for us, w in zip(units, words))  # same letters
        means.append(np.mean([len(u) for u in units]))
    assert means == sorted(means) and means[-1] > 1.5 * means[0]
    # a word of two letters that one merge joins stays whole with probability 1 - p
    two = next(w for w in words if len(w) == 2 and BPEDropout(codes, 0.0).word(w, None) == [w])
    seg, rng = BPEDropout(codes, 0.3), random.Random(7)
    whole = np.mean([seg.word(two, rng) == [two] for _ in range(4000)])
    assert abs(whole - 0.7) < 0.03
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        BPEDropout(codes, 1.0)


@pytest.fixture(scope="module")
def bpe_data(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bpedrop")
    for lang in ("en", "fr"):
        (root / f"train.{lang}").write_text("\n".join(lines_of(data_dir / "multi30k" / f"train.{lang}", 300)) + "\n",
                                            encoding="utf-8")
        (root / f"valid.{lang}").write_text("\n".join(lines_of(data_dir / "multi30k" / f"val.{lang}", 20)) + "\n",
                                            encoding="utf-8")
    for name, p in (("bpe", 0.1), ("bpe0", 0.0)):
        prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / name), valid=str(root / "valid"),
                              src_vocab_size=400, tgt_vocab_size=400, bpe_merges=300, max_len=25, bpe_dropout=p,
                              workers=2 if p else 1))
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / "words"), valid=str(root / "valid"),
                          src_vocab_size=400, tgt_vocab_size=400, max_len=25))
    return root


def _cfg(data, save_dir, **kw) -> TrainConfig:
    base = dict(arch="rnnsearch-tiny", batch_size=16, pool_batches=2, valid_every=6, valid_bleu_sentences=0,
                valid_batch_size=20, log_every=1, threads=1, optimizer="adam", lr=0.01, bpe_dropout=0.1)
    base.update(kw)
    return TrainConfig(data=str(data), save_dir=str(save_dir), **base)


def test_the_training_pairs_are_segmented_anew_each_epoch(bpe_data, tmp_path):
    data = PreparedData.open(bpe_data / "bpe")
    trainer = Trainer(_cfg(bpe_data / "bpe", tmp_path / "r"))
    src_view, tgt_view = trainer.train_views
    assert isinstance(src_view, DropoutCorpus) and len(src_view) == len(trainer.train_src)
    vocab = data.vocab("fr")
    kept = [int(n) for n in lines_of(bpe_data / "bpe" / "train.kept")]
    words = lines_of(bpe_data / "bpe" / "train.tok.fr")
    epochs = []
    for epoch in (0, 1, 0):
        tgt_view.epoch = epoch
        epochs.append([tgt_view[k].tolist() for k in range(len(tgt_view))])
        for k in range(len(tgt_view)):  # the same words, another segmentation; units mostly known
            assert "".join(vocab.decode(epochs[-1][k])).replace("@@", "") == words[kept[k] - 1].replace(" ", "") \
                or 1 in epochs[-1][k]
    assert epochs[0] == epochs[2]  # a pure function of (seed, epoch, sentence)
    differ = sum(a != b for a, b in zip(epochs[0], epochs[1]))
    assert differ > len(tgt_view) // 4
    deterministic = [trainer.train_tgt[k].tolist() for k in range(len(tgt_view))]
    assert sum(len(a) for a in epochs[0]) > sum(len(d) for d in deterministic)  # dropout makes more units
    def unk_rate(sentences):
        return sum(a.count(1) for a in sentences) / sum(len(a) for a in sentences)

    assert unk_rate(deterministic) == 0 and unk_rate(epochs[0]) < 0.002  # (a shortlist that counted dropout)
    # with a shortlist made without dropout, units outside it are split back: fewer <unk> than without that (but
    # still ~1%: characters that the deterministic segmentation always merges are in no shortlist)
    codes = data.text_config("fr").bpe_codes
    narrow = PreparedData.open(bpe_data / "bpe0").vocab("fr")
    restricted, unrestricted = BPEDropout(codes, 0.1, narrow), BPEDropout(codes, 0.1)
    split_back, plain = ([narrow.encode(seg.words(words[n - 1].split(), random.Random(n))).tolist() for n in kept]
                         for seg in (restricted, unrestricted))
    assert unk_rate(split_back) < 0.8 * unk_rate(plain)
    trainer.rundir.unlock()


def test_training_with_dropout_resumes_exactly_and_records_it(bpe_data, tmp_path):
    pairs = len(PreparedData.open(bpe_data / "bpe").corpus("train", "en"))
    updates = pairs // 16 + 4  # into the second epoch, whose segmentations differ
    train(_cfg(bpe_data / "bpe", tmp_path / "A", max_updates=updates))
    train(_cfg(bpe_data / "bpe", tmp_path / "B", max_updates=updates - 7))
    train(_cfg(bpe_data / "bpe", tmp_path / "B", max_updates=updates, resume=True))
    train(_cfg(bpe_data / "bpe", tmp_path / "C", max_updates=updates, bpe_dropout=0.0))
    a, b, c = (checkpoint.load(tmp_path / x / "checkpoint_last.pt") for x in "ABC")
    assert a["train"]["config"]["bpe_dropout"] == 0.1 and a["train"]["state"]["epoch"] == 1
    for name, w in a["model"].items():
        assert torch.equal(w, b["model"][name]), name
    assert any(not torch.equal(w, c["model"][k]) for k, w in a["model"].items())  # dropout changed the training


def test_prepare_counts_the_units_dropout_makes_into_the_shortlists(bpe_data, tmp_path):
    with_dropout, without = PreparedData.open(bpe_data / "bpe"), PreparedData.open(bpe_data / "bpe0")
    assert with_dropout.manifest["bpe"]["dropout"] == 0.1 and "dropout" not in without.manifest["bpe"]
    # the same codes and the same deterministic training units; only the shortlists differ
    assert with_dropout.text_config("fr") == without.text_config("fr")
    assert with_dropout.manifest["splits"]["train"]["tokens"] == without.manifest["splits"]["train"]["tokens"]
    codes = with_dropout.text_config("fr").bpe_codes
    kept = [int(n) for n in lines_of(bpe_data / "bpe" / "train.kept")]
    words = lines_of(bpe_data / "bpe" / "train.tok.fr")

    def unk_rate(vocab):  # of epoch 3's dropout segmentation, unrestricted
        seg = BPEDropout(codes, 0.1)
        ids = [vocab.encode(seg.words(words[n - 1].split(), random.Random(f"{n}:3"))) for n in kept]
        return sum(int((a == 1).sum()) for a in ids) / sum(len(a) for a in ids)

    assert unk_rate(with_dropout.vocab("fr")) < unk_rate(without.vocab("fr")) / 2
    # a corpus prepared with the vocabularies of the first inherits its BPE-dropout
    prepare(PrepareConfig("en", "fr", [str(bpe_data / "valid")], str(tmp_path / "ft"), vocab_from=str(bpe_data / "bpe")))
    assert PreparedData.open(tmp_path / "ft").manifest["bpe"]["dropout"] == 0.1
    for bad, needle in ((dict(bpe_dropout=0.1), "--bpe-dropout needs BPE"),
                        (dict(bpe_dropout=0.1, vocab_from=str(bpe_data / "bpe")), "--vocab-from brings"),
                        (dict(bpe_dropout=1.5, bpe_merges=10), r"must be in \[0, 1\)")):
        with pytest.raises(InputError, match=needle):
            PrepareConfig("en", "fr", [str(bpe_data / "train")], str(tmp_path / "x"), **bad).check()


def test_training_takes_the_corpus_dropout_unless_told(bpe_data, tmp_path):
    assert Trainer(_cfg(bpe_data / "bpe", tmp_path / "a", bpe_dropout=None)).cfg.bpe_dropout == 0.1
    trainer = Trainer(_cfg(bpe_data / "bpe", tmp_path / "b", bpe_dropout=0.0))
    assert trainer.train_views == (trainer.train_src, trainer.train_tgt)
    assert Trainer(_cfg(bpe_data / "words", tmp_path / "c", bpe_dropout=None)).cfg.bpe_dropout == 0.0


def test_bpe_dropout_needs_bpe_data_and_a_probability(bpe_data, tmp_path):
    with pytest.raises(InputError, match="--bpe-dropout needs a corpus prepared with BPE"):
        Trainer(_cfg(bpe_data / "words", tmp_path / "w"))
    for p in (-0.1, 1.0):
        with pytest.raises(InputError, match=r"--bpe-dropout must be in \[0, 1\)"):
            _cfg(bpe_data / "bpe", tmp_path / "p", bpe_dropout=p).check()


def test_pools_are_sorted_by_the_epochs_dropout_lengths(bpe_data, tmp_path):
    # a minibatch holds sentences of like length in the units it is trained on, not in the prepared ones, so that
    # dropout's longer, ragged segmentations are not padded to the longest (tests/bench/bench_bpe_dropout.py)
    from nmtkit.data.batching import EpochSchedule

    trainer = Trainer(_cfg(bpe_data / "bpe", tmp_path / "r", pool_batches=4))
    src_view, tgt_view = trainer.train_views
    for view in trainer.train_views:
        view.epoch = 1
    schedule = EpochSchedule(np.asarray(trainer.train_src.sizes), np.asarray(trainer.train_tgt.sizes),
                             trainer.eligible, 16, 4, seed=1, epoch=1, lengths=trainer._pool_lengths())
    pool = schedule[:4]
    lengths = [[len(tgt_view[k]) for k in batch] for batch in pool]  # (read back from the pool's segmentations)
    spans = sorted((min(ls), max(ls)) for ls in lengths)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))  # the batches do not overlap in length
    fresh = DropoutCorpus.__new__(DropoutCorpus)  # the same segmentations without the pool's kept copies
    fresh.__dict__.update(tgt_view.__dict__, _made={})
    assert [[fresh[k].tolist() for k in b] for b in pool] == [[tgt_view[k].tolist() for k in b] for b in pool]
    prepared = [[int(trainer.train_tgt.sizes[k]) for k in b] for b in pool]
    assert lengths != prepared  # dropout changed the lengths the pool was sorted by
    trainer.rundir.unlock()
