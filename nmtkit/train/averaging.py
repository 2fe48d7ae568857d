"""Averaged weights in ``nmt-train``: an exponential moving average (``--ema-decay``) or the mean of the last N
validations' weights (``--average-last``), validated and saved in place of the raw training weights.

- :class:`EMA`: after every update ``ema ← D·ema + (1 − D)·θ`` (float32, on the model's device, two
  ``torch._foreach`` operations over all the weights), starting from the initial weights (ema = θ₀).
- :class:`LastN`: at each validation, the mean of the raw weights at the last N validations, the current one
  included (fewer at the start): the average fairseq's ``scripts/average_checkpoints.py`` makes offline of N
  checkpoints, here summed in float64 in the order of the updates, divided by their number and rounded to the
  weights' dtype.  The validations counted are those every ``--valid-every`` updates, not the checkpoint an
  interruption saves (which an uninterrupted run does not have).  The N − 1 earlier snapshots are kept in memory
  (on the CPU), not in the checkpoint.

Either way the validation (loss and BLEU) runs on the averaged weights, which the checkpoint's top-level
``"model"`` holds (what ``nmt-translate`` and :func:`nmtkit.models.build_from_checkpoint` load); the raw weights, from
which training goes on, go into the checkpoint's ``"train"`` section as ``"raw_model"``, and with EMA the average
as ``"ema"`` (the very tensors of ``"model"``: ``torch.save`` writes them once, so the checkpoint grows by one copy
of the weights).  A resumed run restores both exactly: ``LastN`` reads the earlier snapshots back from the
``"raw_model"`` of the numbered checkpoints that ``"train"."average_updates"`` names.  ``--keep-last`` must be at
least N, so that the N checkpoints a ``"model"`` averages are there (to average offline too), and the rotation
keeps a checkpoint beyond it while an average still needs it (after an interruption's extra checkpoint).  (A
checkpoint without ``"raw_model"`` -- older, or of a run without averaging -- holds its raw weights in ``"model"``.)
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os

import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.train.resume import check_training_state

log = logging.getLogger("nmtkit.train")


def raw_weights(payload: dict) -> dict:
    """The raw training weights of a checkpoint: ``train.raw_model`` when it has them, else ``model``."""
    return payload.get("train", {}).get("raw_model", payload["model"])


@contextlib.contextmanager
def using_weights(model: torch.nn.Module, weights: dict | None):
    """The model with ``weights`` (a state dict) copied into its tensors for the duration, then its own restored
    bit for bit (copies, so that the version counters move and weight caches (models/fast/stepweights.py) are
    rebuilt); ``None``: the model as it is."""
    if weights is None:
        yield model
        return
    own = model.state_dict()
    with torch.no_grad():
        saved = {k: v.detach().clone() for k, v in own.items()}
        for k, v in own.items():
            v.copy_(weights[k])
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(saved[k])


class EMA:
    """The exponential moving average of a model's floating-point weights (``decay`` = D)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        own = model.state_dict()
        self.names = [k for k, v in own.items() if v.is_floating_point()]
        self.live = [own[k] for k in self.names]  # (aliases of the parameters, which the optimizers update in place)
        self.shadow = [v.detach().to(torch.float32, copy=True) for v in self.live]
        self.other = {k: v for k, v in own.items() if not v.is_floating_point()}

    @torch.no_grad()
    def after_update(self) -> None:
        torch._foreach_mul_(self.shadow, self.decay)
        torch._foreach_add_(self.shadow, self.live, alpha=1.0 - self.decay)

    def weights(self, raw: dict | None = None) -> dict:
        """The EMA as a state dict on the CPU (the live tensors where the model is on the CPU)."""
        out = {k: v.detach().cpu() for k, v in zip(self.names, self.shadow)}
        out.update({k: v.detach().cpu() for k, v in self.other.items()})
        return out

    def after_validation(self, update: int, raw: dict) -> None:
        pass

    def needed(self) -> set:
        return set()

    def train_entries(self, model_entry: dict) -> dict:
        return {"ema": model_entry}

    @torch.no_grad()
    def resume(self, payload: dict, save_dir: str) -> None:
        """The EMA of the checkpoint's run; a run that had none starts it from the raw weights (already there)."""
        state = payload["train"].get("ema")
        if state is None:
            log.warning("the checkpoint holds no EMA: it starts from the weights at update %d",
                        payload["train"]["state"]["update"])
            return
        for k, v in zip(self.names, self.shadow):
            v.copy_(state[k])


class LastN:
    """The mean of the raw weights at the last ``n`` validations (the current one included)."""

    def __init__(self, n: int):
        self.n = n
        self.snapshots: collections.deque = collections.deque(maxlen=n - 1)  # (update, raw weights), oldest first

    def after_update(self) -> None:
        pass

    @torch.no_grad()
    def weights(self, raw: dict) -> dict:
        """The mean of the stored snapshots and ``raw`` (the current weights) as a state dict on the CPU."""
        group = [w for _, w in self.snapshots] + [raw]
        out = {}
        for k, v in raw.items():
            if not v.is_floating_point():
                out[k] = v.detach().cpu().clone()
                continue
            total = torch.zeros(v.shape, dtype=torch.float64)
            for w in group:
                total.add_(w[k].detach().cpu().double())
            out[k] = total.div_(len(group)).to(v.dtype)
        return out

    def after_validation(self, update: int, raw: dict) -> None:
        """Keep the raw weights of a (scheduled) validation for the averages that follow."""
        if self.n > 1:
            self.snapshots.append((update, {k: v.detach().cpu().clone() for k, v in raw.items()}))

    def needed(self) -> set:
        """The updates whose numbered checkpoints a resumed run reads back: not to be rotated away."""
        return {u for u, _ in self.snapshots}

    def train_entries(self, model_entry: dict) -> dict:
        return {"average_updates": [u for u, _ in self.snapshots]}

    def resume(self, payload: dict, save_dir: str) -> None:
        """The snapshots the checkpoint's run held (``train.average_updates``; a checkpoint of a run without
        averaging: none), read back from the numbered checkpoints' raw weights; where one is missing (deleted, or a
        shorter --keep-last before), the average restarts from the later ones, with a warning."""
        updates = payload["train"].get("average_updates", [])[-(self.n - 1):] if self.n > 1 else []
        here = payload["train"]["state"]["update"]
        found = []
        for u in reversed(updates):
            path = os.path.join(save_dir, f"checkpoint{u}.pt")
            other = payload if u == here else checkpoint.load(path) if os.path.isfile(path) else None
            if other is not None and other is not payload:  # (read as the resumed checkpoint was)
                check_training_state(other, path)
                differs = [key for key in ("arch", "config") if other.get(key) != payload.get(key)]
                if differs:  # (its weights would be averaged into this model's, shapes permitting)
                    verb = "differ" if len(differs) > 1 else "differs"
                    raise InputError(f"--average-last {self.n}: this checkpoint's {' and '.join(differs)} {verb} "
                                     "from the resumed checkpoint's: it is another model's, not this run's; remove "
                                     "it (the average restarts without it) or start over with --force", path)
            if other is None or other["train"]["state"]["update"] != u:
                log.warning("--average-last %d: no %s with the raw weights of update %d, so the average restarts "
                            "from the %d validation(s) after it", self.n, path, u, len(found))
                break
            found.append((u, raw_weights(other)))
        self.snapshots.clear()
        for u, w in reversed(found):
            self.snapshots.append((u, {k: v.detach().cpu().clone() for k, v in w.items()}))


def make(model: torch.nn.Module, ema_decay: float, average_last: int) -> EMA | LastN | None:
    """The averaging the options ask for (None: none; the raw weights are validated and saved)."""
    if ema_decay and average_last:  # (TrainConfig.check refuses it on the command line)
        raise ValueError("EMA and the average of the last validations exclude each other")
    if ema_decay:
        return EMA(model, ema_decay)
    return LastN(average_last) if average_last else None
