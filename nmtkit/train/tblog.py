"""TensorBoard event files beside the JSON-lines log (``nmt-train --tensorboard DIR``).

Every record the training log gets is written as scalars at its update: ``train/loss``, ``train/ppl``,
``train/lr``, ``train/grad_norm``, ``train/tgt_tokens_per_s``, … and ``valid/valid_loss``, ``valid/valid_ppl``,
``valid/valid_bleu``, … (every number of the record but ``update``). On ``--resume`` the events written after the
checkpoint resumed from are purged (TensorBoard's ``purge_step``), as the JSON log's records are dropped, so the
curves read as those of an uninterrupted run; a new (not resumed) run into the same directory replaces the earlier
run's events. Needs the ``tensorboard`` package (``pip install
'nmtkit[tensorboard]'``).
"""

from __future__ import annotations

from numbers import Real

from nmtkit.errors import InputError


class TensorBoardLog:
    """Scalars of training-log records, in event files under ``log_dir``."""

    def __init__(self, log_dir: str, resumed_at: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise InputError("--tensorboard needs the tensorboard package (pip install 'nmtkit[tensorboard]')",
                             log_dir) from None
        try:
            # a new run replaces the events a run before it left there (as the JSON log is rewritten); a resumed
            # run drops those after its checkpoint
            self.writer = SummaryWriter(log_dir, purge_step=0 if resumed_at is None else resumed_at + 1)
        except OSError as e:
            raise InputError(f"cannot write TensorBoard events: {e.strerror}", log_dir) from None

    def write(self, record: dict) -> None:
        """A log record (``type`` train or valid, ``update``, numbers) as scalars ``TYPE/KEY`` at its update."""
        step = int(record["update"])
        for key, value in record.items():
            if key != "update" and isinstance(value, Real) and not isinstance(value, bool):
                self.writer.add_scalar(f"{record['type']}/{key}", float(value), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
