"""Resuming a training run: which checkpoint to resume from, whether it fits what was asked, and what changed.
What a checkpoint holds of the run is the trainer's own (:meth:`nmtkit.train.trainer.Trainer.state_dict` and
``load_state_dict``); this module is the file policy around it.

A resumed run must reach the weights of an uninterrupted one, so what it may not change is refused here in one line
(the model's preset or ``-o`` options, the optimizer, the training pairs, the vocabularies), what changes the updates
that follow is warned (learning-rate settings, seed, batch size), and what does not (limits, logging, devices) is
logged.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import typing
import zlib

import numpy as np
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.train.config import TrainState

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
    check_training_state(payload, last)
    for side, vocab in vocabs.items():
        if payload["vocab"][side] != vocab.tokens:
            raise InputError(f"the {side} vocabulary of the checkpoint ({len(payload['vocab'][side])} entries) "
                             f"differs from the data's ({len(vocab)} entries)", last)
    return payload


# What LRSchedule.state_dict and the trainer's log window hold (the schedule's last three: budgeted schedules only)
SCHEDULE_ENTRIES = {"factor": (float,), "bad": (int,), "best": (float, type(None)), "total": (int,),
                    "budget": (float,), "decay_fraction": (float,)}
LOG_WINDOW_ENTRIES = {"nll": (float,), "tok": (int,), "time": (float,), "norm": (float,), "n": (int,),
                      "align": (float,), "rows": (int,)}  # (the last two: guided alignment's)
_KINDS = {int: "a whole number", float: "a finite number", type(None): "None", list: "a list", bool: "true or false"}
# the entries that count (updates, epochs, seconds, tokens, validations): never below 0 (an update of -1 divides a
# warm-up by zero)
COUNTS = ("update", "epoch", "batch_in_epoch", "elapsed", "best_update", "bad_validations", "best_saved_update",
          "bad", "total", "budget", "tok", "time", "n", "rows")


def check_training_state(payload: dict, path: str) -> None:
    """The checkpoint's ``"train"`` section as :func:`restore_training`, :func:`check_fits` and the averaging read
    it (what :func:`training_payload` writes): each entry of its type; the weights (``model``, ``raw_model``,
    ``ema``) those of the checkpoint's config; the optimizer's state one group over the model's weights, each
    tensor shaped as its weight; the RNG states this torch's.  Else one InputError naming the file and the entry."""
    def bad(field: str, problem: str) -> InputError:
        return InputError(f"malformed checkpoint: 'train{field}' {problem}", path)

    train = payload.get("train")
    if train is None:
        raise InputError("checkpoint has no training state to resume from", path)
    if not isinstance(train, dict):
        raise bad("", "is not a dict")
    for key in ("state", "optimizer", "rng"):
        if key not in train:
            raise bad(f".{key}", "is missing")
    model = model_of(payload, path)
    shapes = model.state_dict()
    checkpoint.check_shapes(payload["model"], shapes, "model", path)
    for key in ("raw_model", "ema"):
        weights = train.get(key)
        if key not in train:
            continue
        if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                    for k, v in weights.items()):
            raise bad(f".{key}", "is not a dict of named tensors")
        checkpoint.check_shapes(weights, shapes, f"train.{key}", path)
        checkpoint.check_weights(weights, f"train.{key}", path)
    hints = typing.get_type_hints(TrainState)
    _check_entries(train["state"], {k: typing.get_args(h) or (h,) for k, h in hints.items()}, (), ".state", bad)
    _check_counts(train["state"], COUNTS, ".state", bad)
    for i, record in enumerate(train["state"].get("history", [])):
        if not isinstance(record, dict):
            raise bad(f".state.history[{i}]", "is not a dict of a validation's figures")
    _check_optimizer(train["optimizer"], list(model.named_parameters()), bad)
    _check_rng(train["rng"], ".rng", bad)
    for i, rng in enumerate(train["rng"].get("per_rank") or []):
        _check_rng(rng, f".rng.per_rank[{i}]", bad)
    if "schedule" in train:
        _check_entries(train["schedule"], SCHEDULE_ENTRIES, ("factor", "bad", "best"), ".schedule", bad)
        _check_counts(train["schedule"], COUNTS, ".schedule", bad)
    if "log_window" in train:
        _check_entries(train["log_window"], LOG_WINDOW_ENTRIES, (), ".log_window", bad)
        _check_counts(train["log_window"], COUNTS, ".log_window", bad)
    if not isinstance(train.get("config", {}), dict) or not all(isinstance(k, str) for k in train.get("config", {})):
        raise bad(".config", "is not a dict of settings")
    if not isinstance(train.get("config", {}).get("optimizer", ""), str):
        raise bad(".config.optimizer", "is not an optimizer's name")
    if train.get("data") is not None:
        _check_entries(train["data"], {"pairs": (int,), "tokens": (list,), "crc32": (int,)}, ("pairs", "tokens",
                                                                                              "crc32"), ".data", bad)
        tokens = train["data"]["tokens"]
        if len(tokens) != 2 or not all(_fits(n, (int,)) for n in tokens):
            raise bad(".data.tokens", "is not two token counts")
    if train.get("guide") is not None:
        _check_entries(train["guide"], {"sha256": (str,), "links": (int,)}, ("sha256", "links"), ".guide", bad)
    updates = train.get("average_updates", [])
    if not isinstance(updates, list) or not all(_fits(u, (int,)) for u in updates):
        raise bad(".average_updates", "is not a list of update numbers")


def model_of(payload: dict, path: str):
    """The model of a checkpoint's ``arch`` and ``config`` on the meta device (names and shapes only); a config
    that builds none is one InputError naming the file."""
    from nmtkit.models import empty_model

    try:
        return empty_model(payload["arch"], **payload["config"])
    except (TypeError, ValueError) as e:
        raise InputError(f"malformed checkpoint: 'config' builds no {payload['arch']} model: {e}", path) from None


def _fits(value, kinds: tuple) -> bool:
    """Whether ``value`` is of one of ``kinds`` (an int is a float too, a bool no number; floats are finite)."""
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, float):
        return float in kinds and math.isfinite(value)
    if isinstance(value, int):
        return int in kinds or float in kinds
    return isinstance(value, kinds)


def _check_entries(value, spec: dict, required: tuple, field: str, bad) -> None:
    """``value`` a dict of ``spec``'s keys only (``required`` among them), each of one of its kinds."""
    if not isinstance(value, dict):
        raise bad(field, f"is not a dict ({type(value).__name__})")
    for key in required:
        if key not in value:
            raise bad(f"{field}.{key}", "is missing")
    for key, item in value.items():
        if key not in spec:
            raise bad(field, f"has {key!r}, which is none of {', '.join(spec)}")
        if not _fits(item, spec[key]):
            kinds = " or ".join(_KINDS.get(k, k.__name__) for k in spec[key])
            raise bad(f"{field}.{key}", f"is {repr(item)[:40]}, not {kinds}")


def _check_counts(value: dict, counts: tuple, field: str, bad) -> None:
    """The ``counts`` among ``value``'s entries (checked by :func:`_check_entries`) are at least 0."""
    for key in counts:
        if key in value and value[key] < 0:
            raise bad(f"{field}.{key}", f"is {value[key]!r}, below 0")


def _check_optimizer(state, params: list, bad) -> None:
    """An optimizer's ``state_dict`` over ``params`` ((name, weight) in the model's order): one group naming each
    weight once; each weight's state tensors dense, real, finite, and of its shape (or scalars)."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        raise bad(".optimizer", "is not an optimizer's state (a dict of 'state' and 'param_groups')")
    groups = state["param_groups"]
    ids = groups[0].get("params") if len(groups) == 1 and isinstance(groups[0], dict) else None
    if not isinstance(ids, list) or not all(_fits(i, (int,)) for i in ids) or len(set(ids)) != len(ids) \
            or len(ids) != len(params):
        raise bad(".optimizer.param_groups", f"is not one group of the model's {len(params)} weights")
    for key, value in groups[0].items():
        if key in ("lr", "rho", "eps", "weight_decay", "momentum", "dampening") and not _fits(value, (float,)):
            raise bad(f".optimizer.param_groups[0].{key}", f"is {repr(value)[:40]}, not a finite number")
    weight = dict(zip(ids, params))
    for i, entry in state["state"].items():
        if i not in weight or not isinstance(entry, dict):
            raise bad(".optimizer.state", f"has an entry {repr(i)[:40]} that is no weight's state")
        name, p = weight[i]
        for key, t in entry.items():
            if not isinstance(t, torch.Tensor):
                if t is not None and not _fits(t, (float,)):
                    raise bad(f".optimizer.state[{i}].{key}", f"is {repr(t)[:40]}, not a tensor or number")
            elif t.layout != torch.strided or not t.is_floating_point():
                raise bad(f".optimizer.state[{i}].{key}", f"is not a dense real tensor ({t.layout}, {t.dtype})")
            elif t.dim() and t.shape != p.shape:
                raise bad(f".optimizer.state[{i}].{key}", f"has shape {list(t.shape)}; its weight '{name}' has "
                          f"{list(p.shape)}")
            elif not bool(torch.isfinite(t).all()):
                raise bad(f".optimizer.state[{i}].{key}", "is not finite")


def _check_rng(rng, field: str, bad) -> None:
    """A process's RNG states: torch's (this torch's size) and, on CUDA, the device's; uint8 vectors."""
    if not isinstance(rng, dict):
        raise bad(field, "is not a dict of generator states")
    if "torch" not in rng:
        raise bad(f"{field}.torch", "is missing")
    size = torch.get_rng_state().numel()
    for key in ("torch", "cuda"):
        t = rng.get(key)
        if key not in rng:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.layout != torch.strided or t.dim() != 1 \
                or (key == "torch" and t.numel() != size):
            what = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise bad(f"{field}.{key}", f"is not a generator's state ({what}; this torch's is uint8 [{size}])")
    if "per_rank" in rng and (field != ".rng" or not isinstance(rng["per_rank"], list)):
        raise bad(f"{field}.per_rank", "is not a list of the processes' states")


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
    """The best checkpoint as the uninterrupted run has it: the best of the scheduled validations (an
    interruption's validation may have been linked as best; it goes back), relinked if a kill came between the
    links.  Where --keep-last did not keep that checkpoint (a limit's validation off the grid beat it and the run
    ended there), checkpoint_best.pt stays what it holds, and a later validation replaces it only by beating it."""
    interim = state.best_saved_update if state.best_saved_update != state.best_update else None
    if interim is not None and not os.path.isfile(rundir.file(f"checkpoint{state.best_update}.pt")):
        if lead:
            log.warning("checkpoint_best.pt stays checkpoint%d.pt, the interrupted run's last validation: "
                        "checkpoint%d.pt, the best of its scheduled validations, was not kept (--keep-last)",
                        interim, state.best_update)
        return
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
    model = model_of(payload, path)
    want = get_config(cfg.arch, src_vocab_size=len(vocabs["src"]), tgt_vocab_size=len(vocabs["tgt"]),
                      **cfg.model_options).to_dict()
    have = saved_config(payload)
    differ = [f"{k} {have.get(k)!r} (checkpoint) vs {want.get(k)!r} (asked)" for k in sorted(set(want) | set(have))
              if have.get(k) != want.get(k) and k != "dropout"]
    if differ:
        raise InputError(f"its model differs from the one asked for ({', '.join(differ)}); give the checkpoint's "
                         "--arch and -o options", path)
    checkpoint.check_shapes(payload["model"], model.state_dict(), "model", path)
    return payload["model"]
