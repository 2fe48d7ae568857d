"""The training log: JSON lines (``train.jsonl`` in the run directory, or ``--log-file``), one record per
``--log-every`` updates (``type`` train: loss, perplexity, target tokens/s, gradient norm, learning rate) and one
per validation (``type`` valid), mirrored as TensorBoard scalars with ``--tensorboard`` (tblog.py).

A resumed run drops the records written after the checkpoint it resumed from and appends, so the log reads as an
uninterrupted run's; a new run rewrites it.
"""

from __future__ import annotations

import json
import logging
import math

from nmtkit.errors import InputError
from nmtkit.train import rundir

log = logging.getLogger("nmtkit.train")


class TrainLog:
    """The open log of one run (the lead process's); ``resumed_at``: the update a resumed run starts from."""

    def __init__(self, path: str, resumed_at: int | None, tensorboard_dir: str | None, drop_interim: bool = True):
        """``drop_interim``: the resumed run goes on, past the interruption's validation record (which goes)."""
        self.file, dropped = rundir.open_log(path, resumed_at, drop_interim)  # (locked: a second writer is refused)
        if dropped:
            log.info("dropped %d record(s) of %s written after update %d, the checkpoint resumed from, or by its "
                     "interruption", dropped, path, resumed_at)
        self.tensorboard = None
        if tensorboard_dir:
            from nmtkit.train.tblog import TensorBoardLog

            try:
                self.tensorboard = TensorBoardLog(tensorboard_dir, resumed_at=resumed_at)
            except InputError:
                self.file.close()
                raise

    def record(self, record: dict) -> None:
        """One record, flushed at once (a killed run keeps every record before it)."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def train_record(self, update: int, epoch: int, window: dict, lr: float, elapsed: float) -> None:
        """The record of the updates in ``window`` (sums of nll, tok, time, norm over n updates), which it empties."""
        w = window
        loss = w["nll"] / max(w["tok"], 1)
        self.record({"type": "train", "update": update, "epoch": epoch, "loss": loss, "ppl": math.exp(min(loss, 100)),
                     "tgt_tokens_per_s": w["tok"] / max(w["time"], 1e-9), "grad_norm": w["norm"] / w["n"],
                     "lr": lr, "elapsed": round(elapsed, 3),
                     # guided alignment: the attention's cross-entropy per guided row (the lead process's rows)
                     **({"align_loss": w["align"] / w["rows"]} if w.get("rows") else {})})
        for k in w:
            w[k] = 0 if k in ("tok", "n", "rows") else 0.0

    def close(self) -> None:
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
