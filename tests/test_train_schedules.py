"""Learning-rate schedules and averaged weights in training runs: each update's rate is the schedule's, the EMA and
the average of the last validations are what is validated and saved, time budgets anneal by the clock, and runs
with any of them resume exactly (also after a real SIGTERM)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.models import build_from_checkpoint
from nmtkit.train.trainer import Trainer, train

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")

from conftest import assert_same as _assert_same
from conftest import run_nmt_train as _nmt_train
from conftest import train_cfg as _cfg
from conftest import train_records as _train_records

pytestmark = pytest.mark.usefixtures("restore_threads")  # (the runs use threads=1: give the rest theirs back)


# -- learning-rate schedules and averaged weights --------------------------------------------------------------------

def test_a_resumed_run_keeps_the_checkpoints_and_log_of_the_uninterrupted_run(small, tmp_path):
    """An interruption's checkpoint (update 6, off the grid of 4) and its validation record go when the resumed run
    goes past them: --keep-last 2 keeps 12 and 14 as the uninterrupted run does, not 6 in place of 12."""
    common = dict(valid_every=4, keep_last=2, valid_bleu_sentences=0)
    train(_cfg(small, tmp_path / "A", max_updates=14, **common))
    train(_cfg(small, tmp_path / "B", max_updates=6, **common))
    assert _numbered(tmp_path / "B") == ["checkpoint4.pt", "checkpoint6.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 6]  # (6: the limit's, off the grid)
    # resumed at its limit it does not go on, and the record of its end stays
    assert train(_cfg(small, tmp_path / "B", max_updates=6, resume=True, **common))["history"][-1]["update"] == 6
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 6]
    train(_cfg(small, tmp_path / "B", max_updates=14, resume=True, **common))
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B") == ["checkpoint12.pt", "checkpoint14.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 8, 12, 14]
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")
    state = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")["train"]["state"]
    assert [h["update"] for h in state["history"]] == [4, 8, 12, 14]


def test_inverse_sqrt_with_warmup_sets_each_updates_rate(small, tmp_path):
    """Plain SGD without clipping: every update is θ − lr_u·g with the schedule's lr_u (warm-up lr·u/N, then
    lr·sqrt(N/u)), the rate the log records."""
    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, optimizer="sgd", lr=0.5, clip_norm=0.0, lr_scheduler="inverse-sqrt",
                           warmup_updates=3, max_updates=8, valid_every=100, valid_bleu_sentences=0))
    expected = [0.5 * u / 3 for u in (1, 2, 3)] + [0.5 * math.sqrt(3 / u) for u in range(4, 9)]
    seen = []
    step = trainer.optimizer.step

    def checking_step(*a, **k):
        lr = trainer.optimizer.param_groups[0]["lr"]
        before = [(p.detach().clone(), p.grad.detach().clone()) for p in trainer.model.parameters()]
        out = step(*a, **k)
        for p, (w, g) in zip(trainer.model.parameters(), before):
            assert torch.equal(p, w.add(g, alpha=-lr))
        seen.append(lr)
        return out

    trainer.optimizer.step = checking_step
    trainer.train()
    assert seen == pytest.approx(expected, rel=1e-12) and seen[2] == 0.5  # the full rate at the warm-up's end
    assert [r["lr"] for r in _train_records(run)] == seen


def test_plateau_decays_after_patience_bad_validations(small, tmp_path, monkeypatch):
    """Real updates with scripted validation losses: the rate halves after two validations in a row without a new
    best (the warm-up's validation not counted), down to --min-lr; the log records every update's rate."""
    losses = {2: 9.0, 4: 5.0, 6: 5.5, 8: 5.2, 10: 4.0, 12: 4.5, 14: 4.6, 16: 4.7, 18: 4.8}
    monkeypatch.setattr(Trainer, "validate", lambda self: {"update": self.state.update,
                                                           "valid_loss": losses[self.state.update], "valid_ppl": 1.0})
    run = tmp_path / "run"
    summary = train(_cfg(small, run, lr_scheduler="plateau", warmup_updates=2, lr_patience=2, lr_decay=0.5,
                         min_lr=0.3, best_metric="loss", valid_every=2, max_updates=18))
    assert summary["update"] == 18
    lrs = [r["lr"] for r in _train_records(run)]
    # updates 1-2: warm-up; 9-14: halved (8 was the second bad validation); 15-: 0.25 floored to 0.3 (14: again)
    assert lrs == [0.5, 1.0] + [1.0] * 6 + [0.5] * 6 + [0.3] * 4
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["schedule"] == {"factor": 0.25, "bad": 0,
                                                                                 "best": -4.0}


def test_ema_is_the_moving_average_of_every_updates_weights(small, tmp_path):
    """With --ema-decay D the EMA is θ₀ then D·ema + (1 − D)·θ_u after every update (computed here by hand from the
    weights after each update); the checkpoint's "model" is it (and differs from the raw weights, which train
    keeps), and the validation loss and BLEU are those of the EMA weights."""
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_bleu, validation_loss

    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, ema_decay=0.8, max_updates=6, valid_every=3, valid_bleu_sentences=8))
    weights = [{k: v.detach().clone() for k, v in trainer.model.state_dict().items()}]
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (step(*a, **k), weights.append(
        {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}))[0]
    summary = trainer.train()
    assert len(weights) == 7
    ema = {k: v.clone() for k, v in weights[0].items()}
    for u in range(1, 7):
        for k in ema:
            ema[k] = 0.8 * ema[k] + 0.2 * weights[u][k]
        if u % 3:
            continue
        payload = checkpoint.load(run / f"checkpoint{u}.pt")
        assert payload["train"]["ema"].keys() == payload["model"].keys() == ema.keys()
        for k in ema:
            torch.testing.assert_close(payload["model"][k], ema[k], rtol=1e-5, atol=1e-7, msg=k)
            assert torch.equal(payload["train"]["ema"][k], payload["model"][k])
            assert torch.equal(payload["train"]["raw_model"][k], weights[u][k])
        assert sum(not torch.equal(payload["model"][k], weights[u][k]) for k in ema) >= len(ema) - 1  # (W_a)

        data = PreparedData.open(small)
        vsrc, vtgt = data.corpus("valid", "en"), data.corpus("valid", "fr")
        record = summary["history"][u // 3 - 1]
        model = build_from_checkpoint(payload)  # what nmt-translate loads: the EMA
        expected = validation_loss(model, vsrc, vtgt, torch.device("cpu"), 20)
        assert record["valid_loss"] == pytest.approx(expected["valid_loss"], rel=1e-6)
        raw_model = build_from_checkpoint({**payload, "model": payload["train"]["raw_model"]})
        assert validation_loss(raw_model, vsrc, vtgt, torch.device("cpu"), 20)["valid_loss"] != \
            pytest.approx(record["valid_loss"], rel=1e-6)
        bleu = validation_bleu(model, data, vsrc, trainer.tgt_vocab, 8, torch.device("cpu"), 1, 20)
        assert record["valid_bleu"] == bleu["valid_bleu"]
    # the trainer goes on from the raw weights, untouched by validating the EMA
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, weights[6][k])


def test_average_last_is_the_mean_of_the_last_validations_raw_weights(small, tmp_path):
    """With --average-last 3 the "model" of each checkpoint is the mean of the raw weights ("train"."raw_model") of
    the last three validations' checkpoints, fewer at the start -- fairseq's average_checkpoints, online; validation
    runs on it."""
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_loss

    run = tmp_path / "run"
    summary = train(_cfg(small, run, average_last=3, keep_last=3, valid_every=2, max_updates=10,
                         valid_bleu_sentences=0))
    assert [h["update"] for h in summary["history"]] == [2, 4, 6, 8, 10]
    files = sorted(f for f in os.listdir(run) if re.fullmatch(r"checkpoint\d+\.pt", f))
    assert files == ["checkpoint10.pt", "checkpoint6.pt", "checkpoint8.pt"]  # --keep-last 3: the three averaged
    last = checkpoint.load(run / "checkpoint10.pt")
    raws = [checkpoint.load(run / f"checkpoint{u}.pt")["train"]["raw_model"] for u in (6, 8, 10)]
    assert last["train"]["average_updates"] == [8, 10]
    for k, v in last["model"].items():
        mean = torch.stack([r[k] for r in raws]).double().mean(0)
        torch.testing.assert_close(v.double(), mean, rtol=1e-6, atol=1e-8, msg=k)
    # (attention.W_a barely moves in 10 updates: v_a starts at 0, Appendix B.1)
    assert sum(not torch.equal(v, raws[-1][k]) for k, v in last["model"].items()) >= len(raws[-1]) - 1
    data = PreparedData.open(small)
    loss = validation_loss(build_from_checkpoint(last), data.corpus("valid", "en"), data.corpus("valid", "fr"),
                           torch.device("cpu"), 20)["valid_loss"]
    assert summary["history"][-1]["valid_loss"] == pytest.approx(loss, rel=1e-6)


def test_average_last_starts_with_fewer(small, tmp_path):
    run = tmp_path / "run"
    train(_cfg(small, run, average_last=3, keep_last=5, valid_every=2, max_updates=4, valid_bleu_sentences=0))
    first, second = checkpoint.load(run / "checkpoint2.pt"), checkpoint.load(run / "checkpoint4.pt")
    for k, v in first["model"].items():
        assert torch.equal(v, first["train"]["raw_model"][k])  # the mean of one
        mean = (first["train"]["raw_model"][k].double() + second["train"]["raw_model"][k].double()) / 2
        assert torch.equal(second["model"][k], mean.float())


def test_average_last_refuses_to_average_another_models_checkpoint_on_resume(small, tmp_path):
    """A numbered checkpoint the resumed average reads back that another model wrote (same shapes, another
    config: here dropout) is refused with one error naming it, not averaged into this run's weights."""
    from nmtkit.errors import InputError

    common = dict(average_last=3, keep_last=5, valid_every=2, valid_bleu_sentences=0)
    run, other = tmp_path / "run", tmp_path / "other"
    train(_cfg(small, run, max_updates=4, **common))
    train(_cfg(small, other, max_updates=2, model_options={"dropout": 0.3}, **common))
    shutil.copyfile(other / "checkpoint2.pt", run / "checkpoint2.pt")
    refused = r"--average-last 3: this checkpoint's config differs from .* another model's"
    with pytest.raises(InputError, match=refused) as e:
        train(_cfg(small, run, max_updates=6, resume=True, **common))
    assert str(run / "checkpoint2.pt") in str(e.value)
    assert _numbered(run) == ["checkpoint2.pt", "checkpoint4.pt"]  # nothing trained or saved


def _untimed(records: list) -> list:
    """Validation records without their times (what two runs on one machine still differ in)."""
    return [{k: v for k, v in h.items() if k != "elapsed"} for h in records]


def _valid_records(run) -> list[dict]:
    return _untimed([r for r in map(json.loads, open(run / "train.jsonl")) if r["type"] == "valid"])


def _numbered(run) -> list[str]:
    return sorted(p.name for p in run.glob("checkpoint[0-9]*.pt"))


# interrupted off the validation grid (the interruption's own checkpoint is not a validation of plateau's or the
# average's) and on it
@pytest.mark.parametrize("stop, options", [
    (6, {"optimizer": "adam", "lr": 0.01, "lr_scheduler": "inverse-sqrt", "warmup_updates": 5}),
    (6, {"optimizer": "adam", "lr": 0.01, "lr_scheduler": "linear", "warmup_updates": 2, "schedule_updates": 14}),
    (10, {"lr_scheduler": "plateau", "lr_patience": 2, "warmup_updates": 3}),
    (6, {"ema_decay": 0.9, "model_options": {"dropout": 0.3}}),
    (6, {"average_last": 3}),
    (8, {"average_last": 3}),
    (6, {"label_smoothing": 0.1, "model_options": {"dropout": 0.3}}),
    (6, {"recipe": "fast", "optimizer": "adam", "lr": 1e-3, "init": "xavier"}),  # (the resumed run must not re-init)
], ids=["inverse-sqrt-warmup", "linear-warmup", "plateau", "ema-dropout", "average-last", "average-last-on-grid", "label-smoothing",
        "xavier-adam"])
def test_resume_with_schedule_and_averaging_equals_uninterrupted(small, tmp_path, stop, options):
    total, common = 14, dict(valid_every=4, keep_last=100, **options)
    train(_cfg(small, tmp_path / "A", max_updates=total, **common))
    train(_cfg(small, tmp_path / "B", max_updates=stop, **common))
    train(_cfg(small, tmp_path / "B", max_updates=total, resume=True, **common))

    a = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")
    b = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    assert a["train"]["state"]["update"] == b["train"]["state"]["update"] == total
    for part in (a, b):
        for key in ("resume", "save_dir"):
            part["train"]["config"].pop(key)
        state = part["train"]["state"]
        state.pop("elapsed")
        state["history"] = _untimed(state["history"])  # (the interruption's validation is not the run's: it went)
    _assert_same(a, b)  # weights (averaged and raw), optimizer, RNG, schedule, metrics, best, ... bit for bit
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")  # and the log's validations
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B")  # the interruption's checkpoint went too
    for u in range(4, total + 1, 4):  # and every scheduled checkpoint's weights on the way
        _assert_same(checkpoint.load(tmp_path / "A" / f"checkpoint{u}.pt")["model"],
                     checkpoint.load(tmp_path / "B" / f"checkpoint{u}.pt")["model"], f"checkpoint{u}")
    assert [r["lr"] for r in _train_records(tmp_path / "A")] == [r["lr"] for r in _train_records(tmp_path / "B")]
    raw = a["train"].get("raw_model", a["model"])
    if "lr_scheduler" in options:  # the schedule really moved the rate
        assert len({r["lr"] for r in _train_records(tmp_path / "A")}) > 2
    if options.get("lr_scheduler") == "plateau":
        assert a["train"]["schedule"]["factor"] < 1
    if "ema_decay" in options or "average_last" in options:
        assert sum(not torch.equal(a["model"][k], raw[k]) for k in raw) >= len(raw) - 1  # (W_a: see above)


class _Clock:
    """A deterministic clock for the trainer (``nmtkit.train.trainer.clock``): every reading is one second after the
    one before, so an update and a scheduled validation each take one second; at reading ``term_at`` it sends this
    process a real SIGTERM."""

    def __init__(self, term_at: int | None = None):
        self.readings, self.term_at = 0, term_at

    def __call__(self) -> float:
        self.readings += 1
        if self.readings == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return float(self.readings)


def test_a_run_stopped_by_a_real_sigterm_keeps_after_resuming_what_the_uninterrupted_run_keeps(small, tmp_path,
                                                                                                 monkeypatch):
    """#34 item 9 with the signal itself (the test above stops at --max-updates): SIGTERM lands in update 7, off
    the grid of 4; it saves without validating (no record of its own), and its checkpoint goes once the resumed run
    is past it."""
    import nmtkit.train.trainer as trainer_module

    common = dict(valid_every=4, keep_last=2, valid_bleu_sentences=0, max_updates=14)
    train(_cfg(small, tmp_path / "A", **common))
    # two clock readings per update and per scheduled validation: reading 15 starts update 7 (see below)
    monkeypatch.setattr(trainer_module, "clock", _Clock(term_at=15))
    stopped = train(_cfg(small, tmp_path / "B", **common))
    assert stopped["status"] == "interrupted" and stopped["update"] == 7
    assert _numbered(tmp_path / "B") == ["checkpoint4.pt", "checkpoint7.pt"]
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4]
    monkeypatch.undo()
    train(_cfg(small, tmp_path / "B", resume=True, **common))
    assert _numbered(tmp_path / "A") == _numbered(tmp_path / "B") == ["checkpoint12.pt", "checkpoint14.pt"]
    assert _valid_records(tmp_path / "A") == _valid_records(tmp_path / "B")
    assert [r["update"] for r in _valid_records(tmp_path / "B")] == [4, 8, 12, 14]
    state = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")["train"]["state"]
    assert [h["update"] for h in state["history"]] == [4, 8, 12, 14]


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_a_time_budget_anneals_by_the_clock_and_resumes_exactly(small, tmp_path, monkeypatch, kind):
    """--max-time with a decaying schedule: the rate reaches --min-lr when the run's time (updates and scheduled
    validations) reaches the budget, and a run stopped by SIGTERM and resumed follows the uninterrupted run's rates
    and reaches its weights bit for bit (given the same clock readings: time is the schedule's input)."""
    import nmtkit.train.trainer as trainer_module

    common = dict(optimizer="adam", lr=0.01, lr_scheduler=kind, warmup_updates=2, decay_fraction=0.5, min_lr=1e-4,
                  max_time=24, valid_every=4, keep_last=100)
    monkeypatch.setattr(trainer_module, "clock", _Clock())
    a = train(_cfg(small, tmp_path / "A", **common))
    # two readings per update and per scheduled validation: reading 15 starts update 7 (after 6 updates and one
    # validation), which the signal lets finish
    monkeypatch.setattr(trainer_module, "clock", _Clock(term_at=15))
    stopped = train(_cfg(small, tmp_path / "B", **common))
    assert stopped["status"] == "interrupted" and stopped["update"] == 7
    monkeypatch.setattr(trainer_module, "clock", _Clock())
    b = train(_cfg(small, tmp_path / "B", resume=True, **common))
    # 1 s an update and 1 s a scheduled validation (updates 4, 8, 12, 16): 24 s are reached at update 20 (20 + 4)
    assert a["status"] == b["status"] == "done" and a["update"] == b["update"] == 20
    lrs = [r["lr"] for r in _train_records(tmp_path / "A")]
    assert lrs == [r["lr"] for r in _train_records(tmp_path / "B")]
    assert lrs[:2] == pytest.approx([0.005, 0.01])  # warm-up
    assert lrs[2:6] == pytest.approx([0.01] * 4)  # held: the first half of the span after the warm-up
    assert all(x > y for x, y in zip(lrs[10:], lrs[11:]))  # then decaying ...
    assert lrs[-1] == pytest.approx(1e-4, rel=0.2)  # ... to the floor as the time runs out
    ca = checkpoint.load(tmp_path / "A" / "checkpoint_last.pt")
    cb = checkpoint.load(tmp_path / "B" / "checkpoint_last.pt")
    assert ca["train"]["state"]["elapsed"] == cb["train"]["state"]["elapsed"] == 25.0  # (and update 20's validation)
    assert ca["train"]["schedule"] == cb["train"]["schedule"] == {"factor": 1.0, "bad": 0, "best": None, "total": 0,
                                                                  "budget": 24.0, "decay_fraction": 0.5}
    _assert_same(ca["model"], cb["model"], "model")
    _assert_same(ca["train"]["optimizer"], cb["train"]["optimizer"], "optimizer")


@pytest.mark.parametrize("options, words", [
    ({"lr_scheduler": "noam"}, "--lr-scheduler 'noam'"),
    ({"lr_scheduler": "linear"}, "--lr-scheduler linear decays to --min-lr at the end of the run: it needs "
                                 "--schedule-updates or --max-updates above --warmup-updates (got 0 and 0), or a time "
                                 "budget (--max-time)"),
    ({"lr_scheduler": "linear", "max_time": 60, "decay_fraction": 0.0}, "--decay-fraction must be in (0, 1] (got 0.0)"),
    ({"lr_scheduler": "cosine", "max_time": 60, "decay_fraction": 1.5}, "--decay-fraction must be in (0, 1] (got 1.5)"),
    ({"lr_scheduler": "cosine", "max_updates": 10, "warmup_updates": 10}, "(got 10 and 10)"),
    ({"warmup_updates": -1}, "--warmup-updates must be at least 0 (got -1)"),
    ({"lr_decay": 1.0}, "--lr-decay must be in (0, 1) (got 1.0)"),
    ({"lr_decay": 0.0}, "--lr-decay must be in (0, 1) (got 0.0)"),
    ({"lr_patience": 0}, "--lr-patience must be at least 1 (got 0)"),
    ({"min_lr": -0.1}, "--min-lr must be finite and at least 0 (got -0.1)"),
    ({"min_lr": math.inf}, "--min-lr must be finite and at least 0 (got inf)"),
    ({"ema_decay": 1.5}, "--ema-decay must be in [0, 1) (got 1.5)"),
    ({"ema_decay": 1.0}, "--ema-decay must be in [0, 1) (got 1.0)"),
    ({"ema_decay": math.nan}, "--ema-decay must be in [0, 1) (got nan)"),
    ({"average_last": -2}, "--average-last must be at least 0 (got -2)"),
    ({"average_last": 5, "keep_last": 3}, "--keep-last (3) must be at least --average-last (5)"),
    ({"average_last": 2, "ema_decay": 0.99}, "--ema-decay and --average-last exclude each other"),
])
def test_bad_schedule_and_averaging_values_are_refused(small, tmp_path, options, words):
    from nmtkit.errors import InputError

    with pytest.raises(InputError) as e:
        Trainer(_cfg(small, tmp_path / "run", **options))
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_bad_values_on_the_command_line_and_plateau_without_validation(overfit_data, small, tmp_path):
    res = _nmt_train(small, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--ema-decay", 1.5)
    assert res.returncode == 1 and res.stderr.strip() == "nmt-train: error: --ema-decay must be in [0, 1) (got 1.5)"
    res = _nmt_train(overfit_data, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run",
                     "--lr-scheduler", "plateau")  # (no valid split)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "plateau needs a validation set" in lines[0], res.stderr
    assert not (tmp_path / "run").exists()


def test_resuming_an_old_checkpoint_with_ema_starts_it_from_the_weights(small, tmp_path, caplog):
    """A checkpoint without the new train entries (an older run: its "model" is the raw weights) resumes with
    averaging switched on: the EMA starts from those weights, with warnings about the changed settings."""
    import logging

    run = tmp_path / "run"
    train(_cfg(small, run, max_updates=4, valid_bleu_sentences=0))
    old = checkpoint.load(run / "checkpoint_last.pt")
    del old["train"]["schedule"]
    for k in ("lr_scheduler", "warmup_updates", "lr_decay", "lr_patience", "min_lr", "ema_decay", "average_last"):
        del old["train"]["config"][k]
    checkpoint.save(old, run / "checkpoint_last.pt")
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
        trainer = Trainer(_cfg(small, run, max_updates=4, valid_bleu_sentences=0, resume=True, ema_decay=0.5))
    assert any("--ema-decay 0.0 -> 0.5" in r.getMessage() for r in caplog.records)
    assert any("holds no EMA" in r.getMessage() for r in caplog.records)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, old["model"][k]) and torch.equal(trainer.averager.weights()[k], v)
