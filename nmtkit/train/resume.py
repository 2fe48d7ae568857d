"""Resuming a training run: what a checkpoint holds of the run, which checkpoint to resume from, whether it fits
what was asked, what changed, and putting the trainer back where the checkpoint left it.

A resumed run must reach the weights of an uninterrupted one, so what it may not change is refused here in one line
(the model's preset or ``-o`` options, the optimizer, the training pairs, the vocabularies), what changes the updates
that follow is warned (learning-rate settings, seed, batch size), and what does not (limits, logging, devices) is
logged.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import zlib

import numpy as np
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.train.config import TRAINING_DEFAULTS, TrainState

log = logging.getLogger("nmtkit.train")

DATA_SETTINGS = ("seed", "batch_size", "pool_batches", "max_len", "update_freq")  # (the batches an update sees)


def data_fingerprint(train_src, train_tgt) -> dict:
    """What identifies the training pairs (beyond the vocabularies): their count and a CRC of their lengths."""
    sizes = [np.ascontiguousarray(np.asarray(c.sizes, dtype=np.int64)) for c in (train_src, train_tgt)]
    return {"pairs": len(train_src), "tokens": [int(x.sum()) for x in sizes],
            "crc32": zlib.crc32(sizes[1].tobytes(), zlib.crc32(sizes[0].tobytes()))}


def find_checkpoint(rundir, resume: bool, force: bool, vocabs: dict) -> dict | None:
    """The payload to resume from (``checkpoint_last.pt``; the newest numbered one if a kill came before it was
    first linked), or None for a fresh run; a save directory that holds a run is refused unless resume or force."""
    last = rundir.file("checkpoint_last.pt")
    numbered = rundir.numbered()
    if not resume:
        if glob.glob(rundir.file("checkpoint*.pt")) and not force:
            raise InputError("already holds checkpoints; use --resume to continue that run or --force to start "
                             "over", rundir.path)
        return None
    if not os.path.isfile(last) and numbered:  # (the numbered checkpoint is complete: saved atomically)
        checkpoint.link(numbered[-1][1], last)
        log.warning("no checkpoint_last.pt (a kill came before it was linked): resuming from %s",
                    os.path.basename(numbered[-1][1]))
    if not os.path.isfile(last):
        raise InputError("nothing to resume: no checkpoint_last.pt", rundir.path)
    payload = checkpoint.load(last)
    if "train" not in payload:
        raise InputError("checkpoint has no training state to resume from", last)
    for side, vocab in vocabs.items():
        if payload["vocab"][side] != vocab.tokens:
            raise InputError(f"the {side} vocabulary of the checkpoint ({len(payload['vocab'][side])} entries) "
                             f"differs from the data's ({len(vocab)} entries)", last)
    return payload


def saved_config(payload: dict) -> dict:
    """The model config a checkpoint's model is built with: its saved fields, and the defaults of the fields an
    older nmtkit did not have (``state_word``: such a model is Appendix A's), as ``build_from_checkpoint`` fills
    them in."""
    from nmtkit.models import model_class

    return model_class(payload["arch"]).config_class.from_dict(payload["config"]).to_dict()


def check_fits(payload: dict, cfg, vocab_sizes: tuple[int, int], fingerprint: dict, last: str) -> None:
    """Refuse a resume whose architecture, model (preset, -o options), optimizer or training pairs differ from
    the checkpoint's run."""
    from nmtkit.models import get_config, resolve

    if resolve(cfg.arch)[0] != payload["arch"]:
        raise InputError(f"--arch {cfg.arch} does not match the checkpoint's architecture '{payload['arch']}'", last)
    before = payload["train"].get("config", {}).get("optimizer", cfg.optimizer)
    if before != cfg.optimizer:  # (its state would not fit: a KeyError at the first update)
        raise InputError(f"--optimizer {cfg.optimizer} does not match the optimizer of the checkpoint's run, "
                         f"'{before}' (resume with --optimizer {before}, or that run's --recipe)", last)
    want = get_config(cfg.arch, src_vocab_size=vocab_sizes[0], tgt_vocab_size=vocab_sizes[1],
                      **cfg.model_options).to_dict()
    have = saved_config(payload)
    keys = [k for k in sorted(set(want) | set(have)) if have.get(k) != want.get(k)]
    if keys:
        differ = [f"{k} {have.get(k)!r} -> {want.get(k)!r}" for k in keys]
        fix = " ".join(f"-o {k}={have[k]}" for k in keys if k in have and not k.endswith("vocab_size"))
        raise InputError(f"the model asked for differs from the checkpoint's ({', '.join(differ)}); resume with "
                         f"the run's --arch and -o options{f' (here: {fix})' if fix else ''}, or start a new run",
                         last)
    then = payload["train"].get("data")
    if then is not None and then != fingerprint:
        raise InputError(f"the training data differs from the checkpoint's run ({then['pairs']:,} pairs, "
                         f"{then['tokens'][0]:,}/{then['tokens'][1]:,} tokens then; {fingerprint['pairs']:,} pairs, "
                         f"{fingerprint['tokens'][0]:,}/{fingerprint['tokens'][1]:,} tokens now); resume on that "
                         "run's data", cfg.data)


def report_changes(before: dict, now: dict, training_defaults: dict) -> None:
    """Warn of resumed settings that change the updates that follow; log the others that changed."""
    def flag(k, v):
        return f"--{k.replace('_', '-')} {v} -> {now[k]}"

    data = [flag(k, before[k]) for k in DATA_SETTINGS if k in before and before[k] != now[k]]
    if data:
        log.warning("resuming with other data settings than the interrupted run (%s): the batches that follow "
                    "differ from an uninterrupted run's", ", ".join(data))
    then = {**training_defaults, **before}  # (a checkpoint from before one of them existed ran with its default)
    training = [flag(k, then[k]) for k in training_defaults if then[k] != now[k]]
    if training:
        log.warning("resuming with other training settings than the interrupted run (%s): the updates that "
                    "follow differ from an uninterrupted run's", ", ".join(training))
    quiet = set(training_defaults) | set(DATA_SETTINGS) | {"resume", "force", "init_from"}
    other = [flag(k, before[k]) for k in now if k not in quiet and k in before and before[k] != now[k]]
    if other:  # (what may change without changing the updates: limits, logging, devices, ...)
        log.info("resuming with %s", ", ".join(other))


def restore_best(state, rundir, lead: bool) -> None:
    """The best checkpoint and the history as the uninterrupted run has them: the best of the scheduled validations
    (an interruption's validation may have been linked as best; it goes back), relinked if a kill came between the
    links, and only the scheduled validations in the history."""
    interim = state.best_saved_update if state.best_saved_update != state.best_update else None
    # an interruption's (or an earlier limit's) validation is not one of the run's: the run goes on past it
    state.history = [h for h in state.history if h.get("scheduled", True)]
    state.best_saved, state.best_saved_update = state.best, state.best_update  # (also: an older nmtkit's state)
    if lead and state.best is not None and rundir.repair_best(state.best_update):
        why = (f"the interrupted run's last validation, at update {interim}, is not a scheduled one"
               if interim is not None else "a kill had come between the links")
        log.warning("checkpoint_best.pt relinked to checkpoint%d.pt, the best of the run's scheduled validations "
                    "(%s)", state.best_update, why)


def initial_weights(path: str, cfg, vocabs: dict) -> dict:
    """The weights of ``--init-from CHECKPOINT`` for a new run: its architecture and model config must be the ones
    asked for, and its vocabularies the prepared data's (else refused, saying what differs).  What ``"model"``
    holds is taken (with averaging, the averaged weights)."""
    from nmtkit.models import get_config, resolve

    payload = checkpoint.load(path)
    if resolve(cfg.arch)[0] != payload["arch"]:
        raise InputError(f"is a {payload['arch']} checkpoint; --arch {cfg.arch} is another architecture", path)
    for side, vocab in vocabs.items():
        theirs = payload["vocab"][side]
        if theirs != vocab.tokens:
            first = next((i for i, (a, b) in enumerate(zip(theirs, vocab.tokens)) if a != b),
                         min(len(theirs), len(vocab.tokens)))
            raise InputError(f"its {side} vocabulary ({len(theirs)} entries) differs from the prepared data's "
                             f"({len(vocab)} entries) from id {first} on; prepare the data with the checkpoint's "
                             "vocabularies (nmt-prepare --src-vocab/--tgt-vocab) or start from scratch", path)
    want = get_config(cfg.arch, src_vocab_size=len(vocabs["src"]), tgt_vocab_size=len(vocabs["tgt"]),
                      **cfg.model_options).to_dict()
    have = saved_config(payload)
    differ = [f"{k} {have.get(k)!r} (checkpoint) vs {want.get(k)!r} (asked)" for k in sorted(set(want) | set(have))
              if have.get(k) != want.get(k) and k != "dropout"]
    if differ:
        raise InputError(f"its model differs from the one asked for ({', '.join(differ)}); give the checkpoint's "
                         "--arch and -o options", path)
    return payload["model"]


def training_payload(trainer, weights: dict | None = None) -> dict:
    """The checkpoint of a :class:`nmtkit.train.trainer.Trainer`'s run as it is, what :func:`restore_training`
    reads back; ``weights``: what ``"model"`` holds when averaging (default: the averaged weights now), the raw
    weights going into the train section (nmtkit/train/averaging.py)."""
    src, tgt = trainer.data.source_lang, trainer.data.target_lang
    raw = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    if weights is None and trainer.averager is not None:
        weights = trainer.averager.weights(raw)
    rng = trainer.procs.rng_state()
    if trainer._rank_rngs is not None:
        rng["per_rank"] = trainer._rank_rngs
    return {
        "arch": trainer.model.arch,
        "config": trainer.model.config.to_dict(),
        "source_lang": src,
        "target_lang": tgt,
        "vocab": {"src": list(trainer.src_vocab.tokens), "tgt": list(trainer.tgt_vocab.tokens)},
        "preprocessing": {"src": trainer.data.text_config(src).to_dict(),
                          "tgt": trainer.data.text_config(tgt).to_dict()},
        "model": raw if weights is None else weights,
        "train": {
            "optimizer": trainer.optimizer.state_dict(),
            "state": dataclasses.asdict(trainer.state),
            "rng": rng,
            "config": dataclasses.asdict(trainer.cfg),
            "data": trainer._fingerprint,
            "log_window": dict(trainer.log_window),
            "schedule": trainer.schedule.state_dict(),
            **({} if weights is None else {"raw_model": raw, **trainer.averager.train_entries(weights)}),
        },
    }


def restore_training(trainer, payload: dict) -> None:
    """Put a :class:`nmtkit.train.trainer.Trainer` whose model holds the checkpoint's weights back where the
    checkpoint's run was: optimizer state, counters and metrics history, this process's RNG states, the schedule's
    state and the averaged weights; changed settings are logged."""
    train = payload["train"]
    trainer.optimizer.load_state_dict(train["optimizer"])
    trainer.state = TrainState(**train["state"])
    trainer.log_window.update(train.get("log_window", {}))
    restore_best(trainer.state, trainer.rundir, trainer.rank == 0)
    per_rank = train["rng"].get("per_rank")  # (each process's own: its dropout draws differ)
    mine = per_rank[trainer.rank] if per_rank and len(per_rank) == trainer.world else train["rng"]
    torch.set_rng_state(mine["torch"])
    if trainer.device.type == "cuda" and "cuda" in mine:
        torch.cuda.set_rng_state(mine["cuda"], trainer.device)
    log.info("resumed from update %d (epoch %d, batch %d)", trainer.state.update, trainer.state.epoch + 1,
             trainer.state.batch_in_epoch)
    if "schedule" in train:
        changed = trainer.schedule.load_state_dict(train["schedule"])
        if changed:
            log.warning("--resume: %s (the run's weights follow the new schedule from here)", changed)
    if trainer.averager is not None and trainer.rank == 0:  # (only the lead process validates and saves)
        trainer.averager.resume(payload, trainer.cfg.save_dir)
    report_changes(train.get("config", {}), dataclasses.asdict(trainer.cfg), TRAINING_DEFAULTS)
