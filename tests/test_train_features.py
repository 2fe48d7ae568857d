"""Training features users of fairseq and OpenNMT-py expect: gradient accumulation (--update-freq), a new run
from a checkpoint's weights (--init-from, with nmt-prepare --vocab-from for a corpus that shares its vocabularies)
and TensorBoard events (--tensorboard)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.train.trainer import TrainConfig, Trainer, train

from conftest import head_lines, train_cfg


@pytest.fixture(scope="module")
def raw(data_dir, tmp_path_factory):
    """Multi30K: pairs 201-400 ("second") and the 20 validation pairs."""
    root = tmp_path_factory.mktemp("raw")
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", root / f"second.{lang}", 400, start=200)
        head_lines(data_dir / "multi30k" / f"val.{lang}", root / f"valid.{lang}", 20)
    return root


@pytest.fixture(scope="module")
def first(small):
    """Pairs 1-200, prepared (``small``, tests/conftest.py)."""
    return small


@pytest.fixture(scope="module")
def second(raw, first, tmp_path_factory):
    """The second 200 pairs, prepared with the first corpus's vocabularies and BPE codes."""
    dest = tmp_path_factory.mktemp("second") / "data"
    prepare(PrepareConfig("en", "fr", [str(raw / "second")], str(dest), valid=str(raw / "valid"),
                          vocab_from=str(first)))
    return dest


def _cfg(data, save_dir, **kw) -> TrainConfig:
    return train_cfg(data, save_dir, **{"valid_bleu_sentences": 0, **kw})


# -- gradient accumulation ---------------------------------------------------------------------------------------

def _first_step_bound(recipe: dict, lr: float, g: torch.Tensor, dg: torch.Tensor,
                      scales: tuple[float, float]) -> torch.Tensor:
    """How far apart two first updates may land, element by element, when their gradients g and g + dg differ only
    by rounding: |dθ/dg|·|dg|, the sensitivity of the optimizer's first step to its gradient (its state starts at
    zero), plus the difference of the clipping factors of the two runs (``scales``, 1 when unclipped)."""
    g_lo = (g.abs() - dg).clamp(min=0)  # the smaller of the two gradients' magnitudes
    if recipe.get("optimizer") == "sgd":  # θ ← θ − lr·g
        return lr * dg
    s, ds = max(scales), abs(scales[0] - scales[1])
    moved = s * dg + ds * g.abs()  # |s_a·g_a − s_b·g_b|
    if recipe.get("optimizer") == "adam":  # first step, bias-corrected: θ ← θ − lr·g/(|g| + ε)
        # whose slope in g is lr·ε/(|g| + ε)²
        eps = 1e-8
        return lr * eps * moved / (s * g_lo + eps) ** 2
    # Adadelta's first step: Δθ = √ε·g/√((1 − ρ)g² + ε), whose slope in g is at most 1 (at g = 0)
    return lr * moved


@pytest.mark.parametrize("recipe", [{}, {"optimizer": "adam", "lr": 0.01}, {"optimizer": "sgd", "lr": 0.5,
                                                                           "clip_norm": 0.0}],
                         ids=["adadelta", "adam", "sgd-unclipped"])
def test_update_freq_makes_the_update_of_one_batch_n_times_as_large(first, tmp_path, recipe):
    accumulated = Trainer(_cfg(first, tmp_path / "a", update_freq=2, **recipe))
    whole = Trainer(_cfg(first, tmp_path / "b", batch_size=32, **recipe))
    initial = {k: v.clone() for k, v in whole.model.state_dict().items()}
    for name, w in accumulated.model.state_dict().items():  # the same start
        assert torch.equal(w, initial[name])
    rng = np.random.default_rng(3)
    a_ids, b_ids = (rng.choice(len(accumulated.eligible), 16, replace=False) for _ in range(2))
    a_ids, b_ids = accumulated.eligible[a_ids], accumulated.eligible[b_ids]
    nll_a, tok_a, norm_a = accumulated._step([a_ids, b_ids])
    nll_b, tok_b, norm_b = whole._step([np.concatenate([a_ids, b_ids])])
    assert tok_a == tok_b and nll_a == pytest.approx(nll_b, rel=1e-6) and norm_a == pytest.approx(norm_b, rel=1e-5)
    # The two gradients are the same sums of per-token terms added in another order (two halves, then their sum):
    # float32 rounding moves each element by a few ε₃₂ of the terms it adds, about √n of them for n target tokens
    # (rounding errors add as a random walk).  Those terms are of the scale of the model's largest gradient element
    # G, not of the element itself: a small gradient is a small sum of large terms that cancel (the attention's
    # v_a: its softmax's derivative sums to zero over the source words).  So each element is allowed 4·√n·ε₃₂·G.
    eps32 = torch.finfo(torch.float32).eps
    clip = whole.cfg.clip_norm or float("inf")
    scales = (min(1.0, clip / norm_a), min(1.0, clip / norm_b))
    checked = 0
    params_a = dict(accumulated.model.named_parameters())
    grads = {name: [g.to_dense() if g.is_sparse else g for g in (params_a[name].grad, p.grad)]  # (embeddings: sparse)
             for name, p in whole.model.named_parameters()}
    dg_bound = 4 * tok_a ** 0.5 * eps32 * max(float(g_b.abs().max()) for _, g_b in grads.values())
    for name, p_b in whole.model.named_parameters():
        g_a, g_b = grads[name]
        dg = (g_a - g_b).abs()
        assert float(dg.max()) <= dg_bound, (f"{name}: gradient elements apart by up to {float(dg.max()):.3g}, "
                                             f"above the rounding bound {dg_bound:.3g} ({g_b.numel()} elements)")
        # and so the weights: the optimizer's sensitivity to its gradient times the gradients' distance, plus a
        # rounding of each weight's own value
        w_a, w_b = params_a[name].detach(), p_b.detach()
        bound = (_first_step_bound(recipe, whole.cfg.lr, g_b, torch.full_like(g_b, dg_bound), scales)
                 + 2 * eps32 * w_b.abs())
        off = (w_a - w_b).abs() > bound
        assert not off.any(), (f"{name}: {int(off.sum())} of {off.numel()} weights beyond the bound; worst "
                               f"{float(((w_a - w_b).abs() - bound).max()):.3g} past it")
        checked += 1
    assert checked == len(params_a) > 0
    assert max(float((w - initial[k]).abs().max()) for k, w in whole.model.state_dict().items()) > 1e-4  # (real)


def test_update_freq_counts_updates_and_resumes_exactly(first, tmp_path):
    from nmtkit.data.manifest import PreparedData

    pairs = len(PreparedData.open(first).corpus("train", "en"))
    batches = pairs // 32 * 2 + -(-(pairs % 32) // 16)  # an epoch: pools of 2 batches of 16
    epoch = position = updates = 0  # where 5 updates of 3 minibatches end: an epoch's last group may be shorter
    while updates < 5:
        while position < batches and updates < 5:
            position, updates = position + min(3, batches - position), updates + 1
        if updates < 5:
            epoch, position = epoch + 1, 0
    straight = train(_cfg(first, tmp_path / "A", update_freq=3, max_updates=5))
    state = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")["train"]["state"]
    assert straight["update"] == 5 and (state["epoch"], state["batch_in_epoch"]) == (epoch, position)
    train(_cfg(first, tmp_path / "B", update_freq=3, max_updates=3))
    train(_cfg(first, tmp_path / "B", update_freq=3, max_updates=5, resume=True))
    a, b = (checkpoint.load(tmp_path / x / "checkpoint_last.pt") for x in ("A", "B"))
    for name, w in a["model"].items():
        assert torch.equal(w, b["model"][name]), name


# -- a new run from a checkpoint's weights -----------------------------------------------------------------------

def test_prepare_vocab_from_reuses_the_vocabularies_and_codes(first, second):
    for name in ("vocab.en", "vocab.fr", "bpe.codes"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "train.en.bin").read_bytes() != (second / "train.en.bin").read_bytes()


def test_prepare_vocab_from_refuses_other_text_settings(raw, first, tmp_path):
    with pytest.raises(InputError, match=r"its en text settings differ \(lowercase False there, True here\)"):
        prepare(PrepareConfig("en", "fr", [str(raw / "second")], str(tmp_path / "x"), vocab_from=str(first),
                              lowercase=True))
    with pytest.raises(InputError, match="--vocab-from brings its directory's subword segmentation"):
        prepare(PrepareConfig("en", "fr", [str(raw / "second")], str(tmp_path / "x"), vocab_from=str(first),
                              bpe_merges=10))


def test_init_from_starts_a_new_run_from_the_weights(first, second, tmp_path):
    train(_cfg(first, tmp_path / "base", max_updates=4, optimizer="adam", lr=0.01))
    base = checkpoint.load(tmp_path / "base" / "checkpoint_last.pt")
    tuned = Trainer(_cfg(second, tmp_path / "tuned", max_updates=2, init_from=str(tmp_path / "base" /
                                                                                   "checkpoint_last.pt")))
    for name, w in base["model"].items():
        assert torch.equal(tuned.model.state_dict()[name], w), name
    assert tuned.state.update == 0 and not tuned.optimizer.state  # a fresh optimizer (Adadelta here), a new run
    summary = tuned.train()
    assert summary["update"] == 2
    after = checkpoint.load(tmp_path / "tuned" / "checkpoint_last.pt")
    assert after["train"]["config"]["init_from"].endswith("checkpoint_last.pt")
    assert after["train"]["data"]["pairs"] != base["train"]["data"]["pairs"] or \
        after["train"]["data"]["crc32"] != base["train"]["data"]["crc32"]


def test_init_from_refuses_other_vocabularies_models_and_resume(raw, first, tmp_path):
    train(_cfg(first, tmp_path / "base", max_updates=2))
    ckpt = str(tmp_path / "base" / "checkpoint_last.pt")
    own = tmp_path / "own"
    prepare(PrepareConfig("en", "fr", [str(raw / "second")], str(own), src_vocab_size=120, tgt_vocab_size=130,
                          bpe_merges=150))
    with pytest.raises(InputError, match=r"its src vocabulary \(\d+ entries\) differs from the prepared data's "
                                         r"\(\d+ entries\) from id \d+ on"):
        Trainer(_cfg(own, tmp_path / "x", init_from=ckpt))
    with pytest.raises(InputError, match=r"its model differs from the one asked for \(hidden_dim 48 \(checkpoint\) "
                                         r"vs 64 \(asked\)\)"):
        Trainer(_cfg(first, tmp_path / "y", init_from=ckpt, model_options={"hidden_dim": 64}))
    with pytest.raises(InputError, match="--resume continues a run with its own weights; --init-from starts"):
        Trainer(_cfg(first, tmp_path / "base", init_from=ckpt, resume=True))
    shutil.rmtree(tmp_path / "x", ignore_errors=True)


# -- TensorBoard -------------------------------------------------------------------------------------------------

def _events(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in log_dir, as TensorBoard itself reads them: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _needs_tensorboard() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:  # (part of the test extra)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("tensorboard is not installed -- under CI it is part of the test extra")
        pytest.skip("tensorboard is not installed (pip install -e '.[test]')")


def test_tensorboard_events_hold_the_logs_records_and_resume_like_it(first, tmp_path):
    _needs_tensorboard()
    train(_cfg(first, tmp_path / "A", max_updates=8, optimizer="adam", lr=0.01, valid_bleu_sentences=5,
               tensorboard=str(tmp_path / "tbA")))
    records = [json.loads(x) for x in (tmp_path / "A" / "train.jsonl").read_text().splitlines()]
    events = _events(tmp_path / "tbA")
    for kind in ("train", "valid"):
        for key in ("loss", "ppl", "lr", "grad_norm", "tgt_tokens_per_s") if kind == "train" else \
                ("valid_loss", "valid_bleu"):
            expected = [(r["update"], r[key]) for r in records if r["type"] == kind]
            assert len(expected) == (8 if kind == "train" else 2)
            got = events[f"{kind}/{key}"]
            assert [s for s, _ in got] == [s for s, _ in expected]
            assert np.allclose([v for _, v in got], [v for _, v in expected], rtol=1e-6), key
    # killed before update 6's checkpoint (its events up to 6 written), resumed from 4 to 8: the same curves
    train(_cfg(first, tmp_path / "B", max_updates=6, optimizer="adam", lr=0.01, valid_bleu_sentences=5,
               valid_every=4, tensorboard=str(tmp_path / "tbB")))
    run = tmp_path / "B"
    for name in ("checkpoint6.pt", "checkpoint_last.pt"):  # as if killed just before update 6's save
        os.unlink(run / name)
    os.link(run / "checkpoint4.pt", run / "checkpoint_last.pt")
    train(_cfg(first, tmp_path / "B", max_updates=8, optimizer="adam", lr=0.01, valid_bleu_sentences=5,
               tensorboard=str(tmp_path / "tbB"), resume=True))
    resumed = _events(tmp_path / "tbB")
    for tag in ("train/loss", "train/grad_norm", "valid/valid_loss"):
        assert [s for s, _ in resumed[tag]] == [s for s, _ in events[tag]], tag
        assert np.allclose([v for _, v in resumed[tag]], [v for _, v in events[tag]], rtol=1e-5), tag


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_tensorboard_where_nothing_can_be_written_is_one_line_before_training(first, tmp_path, where):
    """--tensorboard where no event file can be made: under a path that is a file, or a directory that exists but
    takes no new file (/proc/self: what a read-only directory is to a user who is not root; SummaryWriter opened
    its file in its thread, which printed a traceback after the run had started): one line naming it, exit 1, no
    traceback, and no run started."""
    import subprocess
    import sys

    from conftest import REPO

    _needs_tensorboard()
    (tmp_path / "a-file").write_text("x")
    tb = str(tmp_path / "a-file" / "tb") if where == "under-a-file" else "/proc/self"
    res = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-train"), str(first), "--arch", "rnnsearch-tiny",
                          "--save-dir", str(tmp_path / "run"), "--max-updates", "2", "--threads", "1",
                          "--tensorboard", tb], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(lines) == 1 and "cannot write TensorBoard events" in lines[0] and tb in lines[0], lines
    assert not list((tmp_path / "run").glob("checkpoint*.pt"))


def test_a_tensorboard_write_that_fails_mid_run_is_a_warning_and_the_run_goes_on(first, tmp_path, monkeypatch,
                                                                                 caplog):
    """A full disk under the event file at update 3: one warning naming the file, then the run trains to its end
    with its checkpoints and JSON log (the events it had written stay readable)."""
    import errno
    import logging

    from tensorboard.summary.writer import record_writer

    _needs_tensorboard()
    write, calls = record_writer.RecordWriter.write, []

    def full_disk(self, data):  # records 1-2: the file's header; then one a log record; the 5th finds the disk full
        calls.append(1)
        if len(calls) >= 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full_disk)
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
        summary = train(_cfg(first, tmp_path / "run", max_updates=6, valid_every=2,
                             tensorboard=str(tmp_path / "tb")))
    assert summary["update"] == 6 and (tmp_path / "run" / "checkpoint6.pt").is_file()
    warned = [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "tb" / "events.out.tfevents.") in warned[0] and \
        "No space left on device" in warned[0], warned
    records = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert max(r["update"] for r in records) == 6
    assert [s for s, _ in _events(tmp_path / "tb")["train/loss"]] == [1, 2]  # (what was written before)
    assert len(calls) == 5  # nothing more was tried after the failure

