"""The settings of ``nmt-serve`` (:class:`ServeConfig`): where it listens, how it batches and what it refuses."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from nmtkit.errors import InputError
from nmtkit.settings import setting
from nmtkit.translate.config import TranslatorConfig


@dataclass
class ServeConfig:
    """The server's own settings (one field per option of ``nmt-serve``, :mod:`nmtkit.settings`); how lines are
    read, batched and decoded is ``translator``'s, the same :class:`~nmtkit.translate.config.TranslatorConfig` as
    ``nmt-translate``'s."""

    checkpoints: list[str]  # one, or several decoded as an ensemble (as nmt-translate -m ... -m ...)
    host: str = setting("127.0.0.1", "Address to listen on (127.0.0.1: this machine only; 0.0.0.0 for every "
                                     "interface).")
    port: int = setting(8080, "Port (0: any free one; the port taken is printed).")
    max_batch: int = setting(32, "Lines decoded together, across requests.")
    batch_wait_ms: float = setting(
        5.0, "A batch is decoded once no line has come for this long, or it holds --max-batch lines (at most 10 "
             "times this after the previous batch).")
    max_lines: int = setting(100, "Lines a request may hold (more: 413).")
    max_chars: int = setting(20_000, "Characters a request may hold (more: 413).")
    max_queue: int = setting(1_000, "Lines that may wait for decoding (a request past it: 503 with Retry-After).")
    timeout: float = setting(
        30.0, "Seconds a request may wait for its translations (then 504); also the grace of a shutdown.")
    translator: TranslatorConfig = field(default_factory=TranslatorConfig)
    unk_dict: dict = field(default_factory=dict)  # for replace_unk (nmt-serve --unk-dict, loaded)

    def __post_init__(self):
        for name in ("max_batch", "max_lines", "max_chars", "max_queue"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be between 0 and 65535 (got {self.port})")
        if not 0 <= self.batch_wait_ms < math.inf:
            raise InputError(f"--batch-wait-ms must be a finite number of at least 0 (got {self.batch_wait_ms})")
        if not 0 < self.timeout < math.inf:
            raise InputError(f"--timeout must be a finite number above 0 (got {self.timeout})")
        if self.max_queue < self.max_lines:
            raise InputError(f"--max-queue ({self.max_queue}) must hold at least one request of --max-lines "
                             f"({self.max_lines})")

    def check(self) -> None:
        """What needs the file system: the checkpoints are there (before the server listens; what is in them is
        checked as it loads)."""
        if not self.checkpoints:
            raise InputError("no checkpoint given (-m CHECKPOINT)")
        for path in self.checkpoints:
            if not os.path.isfile(path):
                raise InputError("no such file", path)
