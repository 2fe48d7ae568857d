"""TensorBoard event files beside the JSON-lines log (``nmt-train --tensorboard DIR``).

Every record the training log gets is written as scalars at its update: ``train/loss``, ``train/ppl``,
``train/lr``, ``train/grad_norm``, ``train/tgt_tokens_per_s``, … and ``valid/valid_loss``, ``valid/valid_ppl``,
``valid/valid_bleu``, … (every number of the record but ``update``). On ``--resume`` the events written after the
checkpoint resumed from are purged (TensorBoard's purge step), as the JSON log's records are dropped, so the
curves read as those of an uninterrupted run; a new (not resumed) run into the same directory replaces the earlier
run's events. Needs the ``tensorboard`` package (``pip install 'nmtkit[tensorboard]'``).

The events are written in the training process, synchronously, one flushed record at a time (the format is
TensorBoard's: TFRecord framing of ``Event`` protocol buffers, written with its ``RecordWriter``), not by
``SummaryWriter``'s background thread: a directory that cannot be written is one error line when the run starts,
and a write that fails later (a full disk) is one warning naming the file, after which the run goes on without
events -- the JSON log and the checkpoints are the run's record, and a thread's traceback ended neither.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from numbers import Real

from nmtkit.errors import InputError

log = logging.getLogger("nmtkit.train")
_serial = itertools.count()


class TensorBoardLog:
    """Scalars of training-log records, in an event file under ``log_dir``."""

    def __init__(self, log_dir: str, resumed_at: int | None = None):
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError:
            raise InputError("--tensorboard needs the tensorboard package (pip install 'nmtkit[tensorboard]')",
                             log_dir) from None
        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        # (TensorBoard's own naming: it reads every file of the directory whose name holds "tfevents")
        self.path = os.path.join(log_dir, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                                          f"{os.getpid()}.{next(_serial)}")
        self.file = None
        try:
            os.makedirs(log_dir, exist_ok=True)
            self.file = open(self.path, "wb")
            self.records = RecordWriter(self.file)
            # a new run replaces the events a run before it left there (as the JSON log is rewritten); a resumed
            # run drops those after its checkpoint: a session start at the purge step tells TensorBoard so
            purge = 0 if resumed_at is None else resumed_at + 1
            self._add(event_pb2.Event(step=purge, file_version="brain.Event:2"))
            self._add(event_pb2.Event(step=purge, session_log=event_pb2.SessionLog(
                status=event_pb2.SessionLog.START)))
            self.file.flush()
        except OSError as e:
            self.close(warn=False)
            raise InputError(f"cannot write TensorBoard events: {e.strerror}", self.path if self.file else log_dir) \
                from None

    def _add(self, event) -> None:
        event.wall_time = time.time()
        self.records.write(event.SerializeToString())

    def write(self, record: dict) -> None:
        """A log record (``type`` train or valid, ``update``, numbers) as scalars ``TYPE/KEY`` at its update."""
        if self.file is None:  # (an earlier write failed: the run goes on without events)
            return
        values = [self._summary_pb2.Summary.Value(tag=f"{record['type']}/{key}", simple_value=float(value))
                  for key, value in record.items()
                  if key != "update" and isinstance(value, Real) and not isinstance(value, bool)]
        try:
            self._add(self._event_pb2.Event(step=int(record["update"]),
                                            summary=self._summary_pb2.Summary(value=values)))
            self.file.flush()
        except OSError as e:
            log.warning("%s: cannot write TensorBoard events (%s); the run goes on without them from update %d (the "
                        "JSON log and the checkpoints are kept as usual)", self.path, e.strerror, record["update"])
            self.close(warn=False)

    def close(self, warn: bool = True) -> None:
        """Close the event file (its last flush failing is a warning, unless ``warn`` is off: already said)."""
        if self.file is not None:
            try:
                self.file.close()
            except OSError as e:
                if warn:
                    log.warning("%s: cannot write TensorBoard events (%s)", self.path, e.strerror)
            self.file = None
