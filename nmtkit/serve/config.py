"""The settings of ``nmt-serve`` (:class:`ServeConfig`): where it listens, how it batches and what it refuses."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from nmtkit.errors import InputError


@dataclass
class ServeConfig:
    checkpoints: list[str]  # one, or several decoded as an ensemble (as nmt-translate -m ... -m ...)
    host: str = "127.0.0.1"  # only this machine, unless told otherwise
    port: int = 8080  # 0: any free port (the one taken is printed)
    max_batch: int = 32  # lines decoded together, from one request or several
    batch_wait_ms: float = 5.0  # a batch is decoded once no line has arrived for this long (nmtkit/serve/batcher.py)
    max_lines: int = 100  # lines in one request (more: 413)
    max_chars: int = 20_000  # characters in one request's lines (more: 413)
    max_queue: int = 1_000  # lines waiting to be decoded (a request that would pass it: 503 with Retry-After)
    timeout: float = 30.0  # seconds a request may wait for its translations (then 504); also the shutdown's grace
    device: str = "cpu"
    threads: int = 0  # torch threads in all (0 = torch's default)
    workers: int = 1  # decoding processes sharing the threads, each decoding a batch (0 = on CPU min(threads, 4))
    batch_size: int = 64  # sentences a decoding step holds (a batch of more lines is decoded in several)
    max_source_len: int = 250  # longer lines are translated in pieces, as by nmt-translate
    unk_dict: dict = field(default_factory=dict)  # for --replace-unk
    tokenized: bool = False
    backend: str | None = None

    def check(self) -> None:
        if not self.checkpoints:
            raise InputError("no checkpoint given (-m CHECKPOINT)")
        for path in self.checkpoints:  # (before the server listens; what is in them is checked as it loads)
            if not os.path.isfile(path):
                raise InputError("no such file", path)
        for name in ("max_batch", "max_lines", "max_chars", "max_queue", "batch_size", "max_source_len"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be between 0 and 65535 (got {self.port})")
        if not 0 <= self.batch_wait_ms < math.inf:
            raise InputError(f"--batch-wait-ms must be a finite number of at least 0 (got {self.batch_wait_ms})")
        if not 0 < self.timeout < math.inf:
            raise InputError(f"--timeout must be a finite number above 0 (got {self.timeout})")
        if self.workers < 0:
            raise InputError(f"--workers must be at least 0 (got {self.workers}; 0 = automatic)")
        if self.workers > 1 and self.device != "cpu":
            raise InputError(f"--workers {self.workers} needs --device cpu (one process drives a {self.device} "
                             "device)")
        if self.threads < 0:
            raise InputError(f"--threads must be at least 0 (got {self.threads}; 0 = torch's default)")
        if self.max_queue < self.max_lines:
            raise InputError(f"--max-queue ({self.max_queue}) must hold at least one request of --max-lines "
                             f"({self.max_lines})")
