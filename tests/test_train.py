"""Training (nmtkit.train.trainer and nmt-train) on small real Multi30K corpora with the tiny presets.

What is proven here: the model can overfit a few dozen real pairs; the defaults are the paper's recipe and clipping
really rescales; checkpoints are self-contained; the stopping rules work; the recipes resolve as documented (the
paper's changes nothing), Glorot initialisation and label smoothing do what they say.  Elsewhere: resuming
(test_resume.py), data parallelism (test_data_parallel.py), bad input (test_train_errors.py), schedules and
averaged weights (test_train_schedules.py), the optimizer (test_adadelta.py), the registries (test_registries.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmtkit.data import checkpoint
from nmtkit.models import build_from_checkpoint
from nmtkit.train.adadelta import Adadelta
from nmtkit.data.batching import collate, collate_source
from nmtkit.train.trainer import TrainConfig, Trainer, train
from nmtkit.data.vocab import PAD, Vocabulary
from nmtkit.errors import InputError

REPO = Path(__file__).resolve().parents[1]
NMT_TRAIN = str(REPO / "bin" / "nmt-train")

from conftest import assert_same as _assert_same
from conftest import load_state as _load_state
from conftest import nmt_train_env as _env
from conftest import run_nmt_train as _nmt_train
from conftest import train_cfg as _cfg
from conftest import train_records as _train_records

pytestmark = pytest.mark.usefixtures("restore_threads")  # (the runs use threads=1: give the rest theirs back)


def _teacher_forced_nll(model, src_corpus, tgt_corpus, ids) -> float:
    model.eval()
    batch = collate(src_corpus, tgt_corpus, np.asarray(ids))
    with torch.no_grad():
        logits = model(batch.src, batch.src_lens, batch.tgt_in)
    return float(F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD,
                                 reduction="sum")) / batch.num_tokens


# -- learning --------------------------------------------------------------------------------------------------------

def test_overfits_a_few_dozen_real_pairs(overfit_data, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.translate.search import greedy

    data = PreparedData.open(overfit_data)
    src, tgt = data.corpus("train", "en"), data.corpus("train", "fr")
    assert len(src) >= 28 and max(src.sizes) <= 10 and max(tgt.sizes) <= 10
    ids = np.arange(len(src))
    summary = train(_cfg(overfit_data, tmp_path / "run", optimizer="adam", lr=0.02, batch_size=32, pool_batches=1,
                         max_updates=150, valid_every=1000, valid_bleu_sentences=0, log_every=10))
    assert summary["status"] == "done" and summary["update"] == 150

    model = build_from_checkpoint(checkpoint.load(tmp_path / "run" / "checkpoint_last.pt"))
    fresh = build_from_checkpoint({**checkpoint.load(tmp_path / "run" / "checkpoint_last.pt"),
                                    "model": type(model)(model.config).state_dict()})
    assert _teacher_forced_nll(fresh, src, tgt, ids) > 3.0  # an untrained model is far from it
    nll = _teacher_forced_nll(model, src, tgt, ids)
    assert nll < 0.1, f"training NLL per token {nll:.4f} after 150 updates"
    # the training log went down with it
    losses = [r["loss"] for r in map(json.loads, open(tmp_path / "run" / "train.jsonl")) if r["type"] == "train"]
    assert len(losses) == 15 and losses[-1] < 0.2 * losses[0]

    batch_src, lens = collate_source([src[i] for i in ids])
    hyps = greedy(model, batch_src, lens)
    exact = sum(h.tokens == tgt[i].tolist() for i, h in zip(ids, hyps))
    assert exact >= 0.9 * len(ids), f"greedy reproduced {exact} of {len(ids)} training targets"
    # batched decoding (with padding) finds what decoding each sentence alone finds
    for i in ids[:6]:
        one_src, one_len = collate_source([src[i]])
        alone = greedy(model, one_src, one_len)[0]
        assert alone.tokens == hyps[i].tokens
        assert alone.score == pytest.approx(hyps[i].score, abs=1e-4)


# -- the paper's recipe ----------------------------------------------------------------------------------------------

def test_default_recipe_is_the_papers(small, tmp_path):
    from nmtkit.cli.train import main

    cfg = TrainConfig(data=str(small), arch="rnnsearch-tiny", save_dir=str(tmp_path / "run"))
    assert (cfg.optimizer, cfg.lr, cfg.rho, cfg.eps) == ("adadelta", 1.0, 0.95, 1e-6)
    assert (cfg.batch_size, cfg.pool_batches, cfg.clip_norm) == (80, 20, 1.0)
    # the command line has the same defaults
    defaults = {p.name: p.default for p in main.params}
    for name in ("optimizer", "lr", "rho", "eps", "batch_size", "pool_batches", "clip_norm"):
        assert defaults[name] == getattr(cfg, name), name
    # and the optimizer built from them is the paper's Adadelta over every weight
    cfg.threads = 1
    trainer = Trainer(cfg)
    opt = trainer.optimizer
    assert type(opt) is Adadelta and isinstance(opt, torch.optim.Adadelta)  # torch's, faster (tests below)
    group = opt.param_groups[0]
    assert (group["rho"], group["eps"], group["lr"], group["weight_decay"]) == (0.95, 1e-6, 1.0, 0)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == \
        sum(p.numel() for p in trainer.model.parameters())


@pytest.mark.parametrize("clip_norm", [1.0, 0.0])
def test_gradient_is_rescaled_to_norm_one(small, tmp_path, monkeypatch, clip_norm):
    """The optimizer sees g * 1/||g|| when ||g|| > 1 (and the raw g with clipping off), g of the GroundHog cost."""
    import nmtkit.train.trainer as train_mod

    seen_ids = []

    def recording_collate(src, tgt, ids):
        seen_ids.append(np.array(ids))
        return collate(src, tgt, ids)

    monkeypatch.setattr(train_mod, "collate", recording_collate)
    trainer = Trainer(_cfg(small, tmp_path / "run", batch_size=80, pool_batches=20, max_updates=1,
                           clip_norm=clip_norm, valid_bleu_sentences=0))
    with torch.no_grad():  # a model with a huge gradient: large output weights
        trainer.model.W_o.mul_(300.0)
    reference = copy.deepcopy(trainer.model)
    reference.sparse_embedding_grads = False  # the reference gradient: dense, as autograd gives it by default
    grads_at_step, sparse = [], []
    step = trainer.optimizer.step

    def recording_step(*a, **k):  # what the update uses: the gradient times grad_scale (Adadelta, see train.py)
        scale = k.get("grad_scale", 1.0)
        grads_at_step.append([p.grad.detach().to_dense() * scale for p in trainer.model.parameters()])
        sparse.append({name for name, p in trainer.model.named_parameters() if p.grad.is_sparse})
        return step(*a, **k)

    trainer.optimizer.step = recording_step
    trainer.train()
    assert len(grads_at_step) == 1
    assert sparse == [{"E_src", "E_tgt"}]  # Adadelta on the CPU: row-sparse embedding gradients (gradients.py)
    ids = seen_ids[0]
    assert len(ids) == 80

    # the unclipped gradient of: summed target NLL averaged over the batch's sentences
    batch = collate(trainer.train_src, trainer.train_tgt, ids)
    reference.train()
    logits = reference(batch.src, batch.src_lens, batch.tgt_in)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD,
                           reduction="sum") / len(ids)
    loss.backward()
    raw_grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in reference.parameters()]
    raw_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in raw_grads)))
    assert raw_norm > 10, raw_norm  # far above the threshold of 1

    got = grads_at_step[0]
    got_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in got)))
    scale = 1.0 / raw_norm if clip_norm else 1.0
    if clip_norm:
        assert got_norm <= 1.0 + 1e-5 and got_norm == pytest.approx(1.0, rel=1e-4)
    else:
        assert got_norm == pytest.approx(raw_norm, rel=1e-4)
    for g, r in zip(got, raw_grads):
        torch.testing.assert_close(g, r * scale, rtol=1e-4, atol=1e-7 * max(scale * raw_norm, 1.0))

# -- checkpoints of a run --------------------------------------------------------------------------------------------

def test_checkpoints_are_self_contained_and_rotated(small, multi30k_200, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import get_config
    from nmtkit.data.text import Preprocessor, TextConfig

    run = tmp_path / "run"
    trainer = Trainer(_cfg(small, run, max_updates=8, valid_every=2, keep_last=2, log_every=2))
    summary = trainer.train()
    assert summary["update"] == 8

    # rotation: the two newest numbered checkpoints, plus last and best
    files = sorted(f for f in os.listdir(run) if f.endswith(".pt"))
    assert files == ["checkpoint6.pt", "checkpoint8.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert (run / "checkpoint_last.pt").read_bytes() == (run / "checkpoint8.pt").read_bytes()
    history = summary["history"]
    assert [h["update"] for h in history] == [2, 4, 6, 8]
    bleus = [h["valid_bleu"] for h in history]
    best_update = history[bleus.index(max(bleus))]["update"]  # the first of the best
    assert summary["best_update"] == best_update
    best = checkpoint.load(run / "checkpoint_best.pt")
    assert best["train"]["state"]["update"] == best_update
    assert checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]["update"] == 8

    # the JSON log: one train record per log interval, one valid record per validation
    records = [json.loads(line) for line in open(run / "train.jsonl")]
    assert [r["update"] for r in records if r["type"] == "train"] == [2, 4, 6, 8]
    assert [r["update"] for r in records if r["type"] == "valid"] == [2, 4, 6, 8]
    for r in records:
        if r["type"] == "train":
            assert r["loss"] > 0 and r["tgt_tokens_per_s"] > 0 and math.isfinite(r["grad_norm"])

    payload = checkpoint.load(run / "checkpoint_last.pt")
    data = PreparedData.open(small)
    src_vocab, tgt_vocab = Vocabulary.load(small / "vocab.en"), Vocabulary.load(small / "vocab.fr")
    assert payload["vocab"] == {"src": src_vocab.tokens, "tgt": tgt_vocab.tokens}
    assert (payload["source_lang"], payload["target_lang"]) == ("en", "fr")
    codes = (small / "bpe.codes").read_text(encoding="utf-8")
    assert codes.count("\n") > 100
    for side, lang in (("src", "en"), ("tgt", "fr")):
        pre = payload["preprocessing"][side]
        assert pre["bpe_codes"] == codes
        assert pre["lang"] == lang
        assert {k: v for k, v in pre.items() if k != "bpe_codes"} == \
            {k: v for k, v in data.manifest["preprocessing"][lang].items() if k != "bpe_codes"}
    assert payload["arch"] == "rnnsearch"
    assert payload["config"] == get_config("rnnsearch-tiny", src_vocab_size=len(src_vocab),
                                           tgt_vocab_size=len(tgt_vocab)).to_dict()
    assert payload["train"]["config"]["data"] == str(small)

    # the checkpoint alone turns raw validation sentences into the ids the prepared data holds
    subwords = 0
    for side, lang in (("src", "en"), ("tgt", "fr")):
        pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"][side]))
        vocab = Vocabulary(payload["vocab"][side])
        corpus = data.corpus("valid", lang)
        for i, line in enumerate((multi30k_200 / f"valid.{lang}").read_text(encoding="utf-8").splitlines()):
            tokens = pre.tokenize(line)
            subwords += sum(t.endswith("@@") for t in tokens)
            assert vocab.encode(tokens).tolist() == corpus[i].tolist(), (lang, i)
    assert subwords > 0  # BPE was really applied, from the codes in the checkpoint

    # and rebuilds a model that computes exactly what the trained one computes
    model = build_from_checkpoint(payload).eval()
    trainer.model.eval()
    batch = collate(data.corpus("valid", "en"), data.corpus("valid", "fr"), np.arange(10))
    with torch.no_grad():
        assert torch.equal(model(batch.src, batch.src_lens, batch.tgt_in),
                           trainer.model(batch.src, batch.src_lens, batch.tgt_in))


# -- stopping rules --------------------------------------------------------------------------------------------------

def test_early_stopping_with_patience(small, tmp_path):
    summary = train(_cfg(small, tmp_path / "run", optimizer="sgd", lr=0.0, best_metric="loss", patience=2,
                         valid_every=2, max_updates=100, valid_bleu_sentences=0))
    # nothing can improve: the first validation is the best, two more without improvement stop the run
    assert summary["status"] == "early-stopped"
    assert summary["update"] == 6
    assert [h["update"] for h in summary["history"]] == [2, 4, 6]
    assert len({h["valid_loss"] for h in summary["history"]}) == 1
    assert summary["best_update"] == 2
    assert checkpoint.load(tmp_path / "run" / "checkpoint_best.pt")["train"]["state"]["update"] == 2
    assert _load_state(tmp_path / "run" / "checkpoint_last.pt")["update"] == 6


def test_max_epochs_stops_the_run(small, tmp_path):
    from nmtkit.data.manifest import PreparedData

    data = PreparedData.open(small)
    n = len(data.corpus("train", "en"))
    assert max(data.corpus("train", "en").sizes) <= 50 and max(data.corpus("train", "fr").sizes) <= 50
    summary = train(_cfg(small, tmp_path / "run", batch_size=64, pool_batches=1, max_epochs=2, valid_every=1000,
                         valid_bleu_sentences=0))
    assert summary["status"] == "done"
    assert summary["update"] == 2 * math.ceil(n / 64)  # every pair once per epoch, two epochs
    assert summary["epoch"] == 2
    assert _load_state(tmp_path / "run" / "checkpoint_last.pt")["update"] == summary["update"]


def test_max_time_stops_the_run(small, tmp_path):
    t0 = time.monotonic()
    summary = train(_cfg(small, tmp_path / "run", max_time=1.5, valid_every=100000, valid_bleu_sentences=0,
                         log_every=100000))
    wall = time.monotonic() - t0
    assert summary["status"] == "done"
    state = _load_state(tmp_path / "run" / "checkpoint_last.pt")
    assert state["update"] == summary["update"] >= 1
    assert state["elapsed"] >= 1.5
    assert state["elapsed"] < 1.5 + 5  # stopped within an update or so (one tiny update is far below a second)
    assert wall < 60


def test_validation_bleu_by_beam_search_and_resume_warning(small, tmp_path, caplog):
    import logging

    summary = train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=2, valid_bleu_sentences=8,
                         valid_beam=3))
    record = summary["history"][-1]
    assert record["valid_bleu_sentences"] == 8 and "(beam 3, Moses-tokenised)" in record["valid_bleu_signature"]
    assert 0.0 <= record["valid_bleu"] <= 100.0
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
        train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=4, valid_bleu_sentences=0, resume=True,
                   batch_size=8))
    assert any("--batch-size" in r.getMessage() and "differ" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmtkit.train"):  # (the update's own settings: a warning too)
        train(_cfg(small, tmp_path / "run", valid_every=2, max_updates=6, valid_bleu_sentences=0, resume=True,
                   batch_size=8, clip_norm=5.0, rho=0.9, eps=1e-8))
    changed = [r.getMessage() for r in caplog.records if "other training settings" in r.getMessage()]
    assert len(changed) == 1 and all(f"--{k}" in changed[0] for k in ("clip-norm 1.0 -> 5.0", "rho 0.95 -> 0.9",
                                                                      "eps 1e-06 -> 1e-08"))

# -- recipes, initialisation and label smoothing ---------------------------------------------------------------------

def test_recipes_resolve_to_train_configs(small, tmp_path):
    from nmtkit.train.recipes import RECIPES, default_recipe, recipe_settings
    from nmtkit.train.config import train_config

    assert [default_recipe(a) for a in ("rnnsearch-small", "rnnencdec-small", "rnnsearch-tiny", "rnnencdec-tiny",
                                        "rnnsearch", "rnnencdec", "rnnsearch-50", "rnnencdec-30")] == \
        ["fast", "fast"] + ["paper"] * 6
    old = TrainConfig(data=str(small), arch="rnnsearch-tiny", save_dir=str(tmp_path))
    assert train_config(str(small), "rnnsearch-tiny", str(tmp_path)) == old  # the paper's recipe: the defaults
    assert train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="paper") == \
        dataclasses.replace(old, arch="rnnsearch-small")
    fast = train_config(str(small), "rnnsearch-small", str(tmp_path))
    assert (fast.recipe, fast.optimizer, fast.lr, fast.init) == ("fast", "adam", 1e-3, "xavier-flat")
    assert dataclasses.replace(fast, recipe="paper", optimizer="adadelta", lr=1.0, init="paper") == \
        dataclasses.replace(old, arch="rnnsearch-small")  # nothing else differs
    mine = train_config(str(small), "rnnsearch-small", str(tmp_path), lr=0.002, label_smoothing=0.1)
    assert (mine.recipe, mine.optimizer, mine.lr, mine.init, mine.label_smoothing) == \
        ("fast", "adam", 0.002, "xavier-flat", 0.1)
    settings = recipe_settings("fast")
    settings["lr"] = 5.0
    assert RECIPES["fast"]["lr"] == 1e-3  # a copy
    budget = train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="budget", max_time=600)
    assert dataclasses.replace(budget, recipe="fast", lr_scheduler="constant", decay_fraction=1.0, min_lr=0.0,
                               max_time=0.0) == fast  # fast, annealed over the last 30% to 1e-5
    assert (budget.lr_scheduler, budget.decay_fraction, budget.min_lr) == ("linear", 0.3, 1e-5)
    with pytest.raises(InputError, match="or a time budget \\(--max-time\\)"):  # it needs a budget
        train_config(str(small), "rnnsearch-small", str(tmp_path), recipe="budget").check()
    with pytest.raises(ValueError, match="unknown recipe 'quick' \\(choose from paper, fast, budget\\)"):
        recipe_settings("quick")

    with pytest.raises(InputError, match="unknown recipe 'quick'"):
        Trainer(_cfg(small, tmp_path / "run", recipe="quick"))
    with pytest.raises(InputError, match="unknown --init 'glorot' \\(choose from paper, xavier, "
                                         "xavier-flat\\)"):
        Trainer(_cfg(small, tmp_path / "run", init="glorot"))
    assert not (tmp_path / "run").exists()


CLI_SMALL = ("--batch-size", 16, "--pool-batches", 2, "--max-updates", 1, "--valid-bleu-sentences", 0,
             "--threads", 1, "-q")


@pytest.mark.parametrize("args, want", [
    (["-a", "rnnsearch-small"], ("fast", "adam", 1e-3, "xavier-flat")),
    (["-a", "rnnencdec-small"], ("fast", "adam", 1e-3, "xavier-flat")),
    (["-a", "rnnsearch-tiny"], ("paper", "adadelta", 1.0, "paper")),
    (["-a", "rnnsearch", "-o", "emb_dim=16", "-o", "hidden_dim=24", "-o", "attn_dim=16", "-o", "maxout_dim=8"],
     ("paper", "adadelta", 1.0, "paper")),
    (["-a", "rnnsearch-small", "--lr", "0.002", "--recipe", "fast"], ("fast", "adam", 0.002, "xavier-flat")),
    (["-a", "rnnsearch-small", "--recipe", "paper"], ("paper", "adadelta", 1.0, "paper")),
    # an option given explicitly wins even when it spells the option's default
    (["-a", "rnnsearch-small", "--init", "paper", "--optimizer", "adadelta"], ("fast", "adadelta", 1e-3, "paper")),
    (["-a", "rnnsearch-tiny", "--recipe", "fast", "--optimizer", "sgd"], ("fast", "sgd", 1e-3, "xavier-flat")),
], ids=["small", "encdec-small", "tiny", "bare-arch", "fast-explicit-lr", "small-paper", "explicit-defaults",
        "tiny-fast-sgd"])
def test_recipe_on_the_command_line(small, tmp_path, args, want):
    run = tmp_path / "run"
    res = _nmt_train(small, *args, "--save-dir", run, *CLI_SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    last = checkpoint.load(run / "checkpoint_last.pt")
    cfg = last["train"]["config"]
    assert (cfg["recipe"], cfg["optimizer"], cfg["lr"], cfg["init"]) == want
    assert (cfg["label_smoothing"], cfg["lr_scheduler"], cfg["ema_decay"], cfg["batch_size"]) == (0, "constant", 0, 16)
    state = last["train"]["optimizer"]["state"]  # (SGD without momentum keeps none)
    assert bool(state) == (want[1] != "sgd")
    assert all(("exp_avg" in v) == (want[1] == "adam") and ("square_avg" in v) == (want[1] == "adadelta")
               for v in state.values())
    assert last["train"]["optimizer"]["param_groups"][0]["lr"] == want[2]
    # the weights after one update are near their initialisation's scale: B.1's N(0, 0.01²) or Glorot's
    E = last["model"]["E_src"]
    glorot = (2 / sum(E.shape)) ** 0.5
    if want[3].startswith("xavier"):
        assert abs(E.std().item() / glorot - 1) < 0.25, E.std().item()
    else:
        assert E.std().item() < 0.03 < 0.5 * glorot, E.std().item()


def test_unknown_recipe_or_init_is_a_usage_error(small, tmp_path):
    for option, value in (("--recipe", "quick"), ("--init", "glorot")):
        res = _nmt_train(small, "-a", "rnnsearch-small", "--save-dir", tmp_path / "run", option, value)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"nmt-train: error: Invalid value for '{option}'") and f"'{value}'" in res.stderr
    assert not (tmp_path / "run").exists()


def test_paper_recipe_changes_nothing(small, tmp_path):
    """--recipe paper, and no recipe on a tiny preset, train to the very weights of a TrainConfig of the defaults
    (the settings from before recipes existed).  That run too in a process of its own: BLAS's sums may be ordered
    otherwise inside pytest's process (differences of 1e-9)."""
    code = ("import sys; from nmtkit.train.trainer import TrainConfig, train; train(TrainConfig(data=sys.argv[1], "
            "arch='rnnsearch-tiny', save_dir=sys.argv[2], batch_size=16, pool_batches=2, valid_every=4, "
            "valid_bleu_sentences=0, valid_batch_size=20, log_every=1, threads=1, max_updates=3))")
    res = subprocess.run([sys.executable, "-c", code, str(small), str(tmp_path / "old")], capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    common = ("-a", "rnnsearch-tiny", "--batch-size", 16, "--pool-batches", 2, "--valid-every", 4,
              "--valid-bleu-sentences", 0, "--valid-batch-size", 20, "--log-every", 1, "--threads", 1,
              "--max-updates", 3, "-q")
    for name, extra in (("paper", ("--recipe", "paper")), ("none", ())):
        res = _nmt_train(small, *common, *extra, "--save-dir", tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
    old = checkpoint.load(tmp_path / "old" / "checkpoint_last.pt")
    for name in ("paper", "none"):
        new = checkpoint.load(tmp_path / name / "checkpoint_last.pt")
        _assert_same(old["model"], new["model"], name)
        _assert_same(old["train"]["optimizer"], new["train"]["optimizer"], name)
        assert torch.equal(old["train"]["rng"]["torch"], new["train"]["rng"]["torch"])
        a, b = (dict(c["train"]["config"]) for c in (old, new))
        for c in (a, b):
            c.pop("save_dir")
        assert a == b and b["recipe"] == "paper"
    torch.manual_seed(1)  # (the run's seed: its initial weights)
    from nmtkit.models import build_model

    fresh = build_model("rnnsearch-tiny", len(old["vocab"]["src"]), len(old["vocab"]["tgt"])).state_dict()
    trained = sum(not torch.equal(v, fresh[k]) for k, v in old["model"].items())
    assert trained >= len(fresh) - 2  # it did train, so the equality says something (v_a = 0 at first: W_a, U_a
    # get no gradient from the first update)


def _smoothed_loss_per_token(model, src_corpus, tgt_corpus, eps) -> float:
    from nmtkit.data.batching import eval_batches

    model.eval()
    loss, ntok = 0.0, 0
    for ids in eval_batches(np.asarray(src_corpus.sizes), np.asarray(tgt_corpus.sizes), 80):
        batch = collate(src_corpus, tgt_corpus, ids)
        with torch.no_grad():
            loss += float(model.training_loss(batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out, eps)[0])
        ntok += batch.num_tokens
    return loss / ntok


def test_label_smoothing_changes_the_updates_not_the_logged_losses(small, tmp_path):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.train.validation import validation_loss

    common = dict(max_updates=4, valid_every=4, valid_bleu_sentences=0, optimizer="adam", lr=1e-3, init="xavier")
    train(_cfg(small, tmp_path / "plain", **common))
    train(_cfg(small, tmp_path / "smooth", label_smoothing=0.1, **common))
    plain = checkpoint.load(tmp_path / "plain" / "checkpoint4.pt")
    smooth = checkpoint.load(tmp_path / "smooth" / "checkpoint4.pt")
    assert smooth["train"]["config"]["label_smoothing"] == 0.1
    differ = sum(not torch.equal(v, smooth["model"][k]) for k, v in plain["model"].items())
    assert differ >= len(plain["model"]) - 1, differ
    # the logged training loss is the NLL: at update 1 both runs had the same weights and the same batch
    p_log, s_log = _train_records(tmp_path / "plain"), _train_records(tmp_path / "smooth")
    assert [r["update"] for r in s_log] == [1, 2, 3, 4]
    assert s_log[0]["loss"] == pytest.approx(p_log[0]["loss"], rel=1e-6)
    assert s_log[0]["ppl"] == pytest.approx(math.exp(s_log[0]["loss"]), rel=1e-9)
    # the logged validation loss is the NLL of the saved model, not its smoothed loss
    data = PreparedData.open(small)
    vsrc, vtgt = data.corpus("valid", "en"), data.corpus("valid", "fr")
    model = build_from_checkpoint(smooth)
    nll = validation_loss(model, vsrc, vtgt, torch.device("cpu"), 20)["valid_loss"]
    logged = smooth["train"]["state"]["history"][-1]
    assert logged["update"] == 4 and logged["valid_loss"] == pytest.approx(nll, rel=1e-6)
    valid_records = [json.loads(line) for line in open(tmp_path / "smooth" / "train.jsonl")
                     if '"type": "valid"' in line]
    assert valid_records[-1]["valid_loss"] == pytest.approx(nll, rel=1e-6)
    assert _smoothed_loss_per_token(model, vsrc, vtgt, 0.1) > nll + 1e-3  # (which would differ)
    assert _smoothed_loss_per_token(model, vsrc, vtgt, 0.0) == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "1.5"])
def test_bad_label_smoothing_is_refused(small, tmp_path, value):
    res = _nmt_train(small, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--label-smoothing", value)
    shown = repr(float(value))
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip() == f"nmt-train: error: --label-smoothing must be in [0, 1) (got {shown})", res.stderr
    assert not (tmp_path / "run").exists()


def test_xavier_init_changes_the_initial_weights_and_is_reproducible(small, tmp_path):
    from nmtkit.models.params import paper_parameters

    paper = Trainer(_cfg(small, tmp_path / "p0"))
    xavier = Trainer(_cfg(small, tmp_path / "x0", init="xavier"))
    P, X = paper_parameters(paper.model), paper_parameters(xavier.model)
    for key, x in X.items():
        name = key.rsplit(".", 1)[-1]
        if name.startswith("b"):
            assert torch.all(x == 0) and torch.all(P[key] == 0), key
        elif name not in ("U", "U_z", "U_r"):
            assert not torch.equal(x, P[key]), key
            bound = (6 / (x.shape[0] + (x.shape[1] if x.dim() == 2 else 1))) ** 0.5
            assert x.abs().max() <= bound and x.abs().max() > 0.8 * bound, key  # Glorot's scale, not B.1's
            assert P[key].abs().max() < 0.6 * bound, key
    # a fresh run is reproducible under its seed and starts from other weights than the paper's init
    runs = {}
    for name, kw in (("x1", dict(init="xavier")), ("x2", dict(init="xavier")), ("seed2", dict(init="xavier", seed=2)),
                     ("paper", {})):
        train(_cfg(small, tmp_path / name, max_updates=2, valid_every=1, valid_bleu_sentences=0, **kw))
        runs[name] = checkpoint.load(tmp_path / name / "checkpoint1.pt")
    _assert_same(runs["x1"]["model"], runs["x2"]["model"])
    _assert_same(checkpoint.load(tmp_path / "x1" / "checkpoint2.pt")["model"],
                 checkpoint.load(tmp_path / "x2" / "checkpoint2.pt")["model"])
    for other in ("seed2", "paper"):
        assert not torch.equal(runs["x1"]["model"]["E_src"], runs[other]["model"]["E_src"]), other
        assert not torch.equal(runs["x1"]["model"]["W_o"], runs[other]["model"]["W_o"]), other
    assert runs["x1"]["train"]["config"]["init"] == "xavier" and runs["paper"]["train"]["config"]["init"] == "paper"
    # one Adadelta update moves a weight by about 1e-3 at most: the first checkpoint is still at Glorot's scale
    W = runs["x1"]["model"]["W_s"]
    bound = (6 / sum(W.shape)) ** 0.5
    assert abs(W.std().item() / (bound / 3 ** 0.5) - 1) < 0.25
    assert runs["paper"]["model"]["W_s"].std().item() < 0.2 * bound / 3 ** 0.5


def test_progress_lines_report_the_log_windows_mean_like_the_json_records(small, tmp_path, caplog):
    # (a single update's loss swings with its batch: the log line once read 0.67 amid losses of 4)
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="nmtkit.train"):
        train(_cfg(small, tmp_path / "run", max_updates=8, log_every=3, valid_every=6, valid_bleu_sentences=0))
    lines = [r.getMessage() for r in caplog.records if re.match(r"update \d+ epoch", r.getMessage())]
    records = {r["update"]: r for r in map(json.loads, (tmp_path / "run" / "train.jsonl").read_text().splitlines())
               if r["type"] == "train"}
    assert [int(line.split()[1]) for line in lines] == sorted(records) == [3, 6]
    for line in lines:
        update = int(line.split()[1])
        loss = float(re.search(r"loss ([0-9.]+)", line).group(1))
        assert loss == pytest.approx(records[update]["loss"], abs=6e-5)
    assert lines[0].endswith("validation in 3 updates") and lines[1].endswith("validating")


def test_bf16_where_it_is_emulated_is_warned_about(small, tmp_path, caplog, monkeypatch):
    # (on a CPU without AVX-512 BF16 or AMX, rnnsearch-50 trained at 11 target tokens/s with --bf16, 369 without)
    import logging

    from nmtkit import device

    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert device.bf16_is_native(torch.device("cpu")) is bool(native)
    assert device.bf16_is_native(torch.device("cuda")) is True
    for is_native in (False, True):
        monkeypatch.setattr(device, "bf16_is_native", lambda d, v=is_native: v)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmtkit.train"):
            Trainer(_cfg(small, tmp_path / f"run{is_native}", bf16=True)).rundir.unlock()
        warned = [r.getMessage() for r in caplog.records if "--bf16 on this CPU" in r.getMessage()]
        assert len(warned) == (0 if is_native else 1)
        assert not warned or "emulated" in warned[0]


def test_the_reference_backend_trains_to_the_fast_ones_weights(small, tmp_path):
    """nmt-train --backend reference: the paper's equations as written (nmtkit/models/reference.py) make the same
    updates as the fast paths, to float32 rounding (plain SGD, no clipping: each update is linear in the gradient)."""
    runs = {}
    for backend in ("fast", "reference"):
        trainer = Trainer(_cfg(small, tmp_path / backend, optimizer="sgd", lr=0.5, clip_norm=0.0, max_updates=3,
                               valid_every=3, valid_bleu_sentences=2, backend=backend))
        assert trainer.model.backend == backend
        trainer.train()
        runs[backend] = checkpoint.load(tmp_path / backend / "checkpoint_last.pt")
    fast, ref = runs["fast"]["model"], runs["reference"]["model"]
    for k in fast:
        torch.testing.assert_close(ref[k], fast[k], atol=2e-5, rtol=1e-4, msg=k)
    assert runs["reference"]["train"]["config"]["backend"] == "reference"
    ref_valid, fast_valid = (runs[b]["train"]["state"]["history"][-1] for b in ("reference", "fast"))
    assert ref_valid["valid_loss"] == pytest.approx(fast_valid["valid_loss"], rel=1e-4)
    assert ref_valid.get("bleu") == pytest.approx(fast_valid.get("bleu"), abs=1e-6)  # (greedy search on each)


def test_a_bad_backend_is_one_line(small, tmp_path):
    res = _nmt_train(small, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--backend", "slow")
    assert res.returncode == 2 and "'slow' is not one of 'fast', 'reference'" in res.stderr, res.stderr
    env = dict(_env(), NMTKIT_BACKEND="slow")
    res = subprocess.run([sys.executable, NMT_TRAIN, str(small), "--arch", "rnnsearch-tiny", "--save-dir",
                          str(tmp_path / "run"), "--max-updates", "1"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        ("nmt-train: error: NMTKIT_BACKEND='slow' is not a backend (choose from fast, reference, or "
         "fast:no-onednn,no-kernels with either switch)")], res.stderr
    assert not (tmp_path / "run").exists()
