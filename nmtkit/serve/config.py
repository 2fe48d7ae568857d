"""The settings of ``nmt-serve`` (:class:`ServeConfig`): where it listens, how it batches and what it refuses."""

from __future__ import annotations

import math
import os
import re
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
    max_chars: int = setting(20_000, "Characters a request may hold, its lines and prefixes (more: 413).")
    max_queue: int = setting(1_000, "Lines that may wait for decoding (a request past it: 503 with Retry-After).")
    # what one request may cost, known before it is queued (nmtkit/serve/limits.py)
    max_beam: int = setting(100, "Beam a request may ask for (more: 413).")
    max_nbest: int = setting(100, "Hypotheses a line (n-best), or samples a line with sampling, a request may ask "
                                  "for (more: 413).")
    max_target_len: int = setting(
        1_000, "Target tokens a request may have a line (or a piece of a long line) decoded to: its prefix, and what "
               "its max_len_a x source tokens + max_len_b allow (more: 413).")
    max_attention_cells: int = setting(
        2_000_000, "Source x target tokens a request's attention, alignments or replace_unk may keep, counted at the "
                   "longest translations it allows (more: 413).")
    batch_work: int = setting(
        200_000, "Decoding work a batch is given, hypotheses x target tokens allowed: a request of more is decoded a "
                 "few lines a batch, behind the requests that come meanwhile.")
    timeout: float = setting(
        30.0, "Seconds a request may wait for its translations (then 504); also the grace of a shutdown.")
    read_timeout: float = setting(
        10.0, "Seconds a connection may take to send a whole request (headers and body), from its opening or its "
              "previous answer; then it is closed.")
    max_connections: int = setting(1_000, "Connections open at once (one more is answered 503 and closed).")
    allowed_hosts: list[str] = setting(
        help="A host name clients reach the server by (the Host header; repeatable, or comma-separated; '*.x.org' "
             "a domain's, '*' any). Default: --host, localhost, 127.0.0.1, ::1.", default_factory=list,
        metavar="HOST")
    cors_origin: list[str] = setting(
        help="An origin (scheme://host[:port]) whose web pages may call the server (repeatable; '*' any); requests "
             "from other sites' pages are refused (403).", default_factory=list, metavar="ORIGIN")
    api_key: str | None = setting(
        None, "A key that every request but GET /health and GET / must bring as 'Authorization: Bearer KEY'; from "
              "$NMT_SERVE_API_KEY where not given (ps shows no environment).", metavar="KEY",
        envvar="NMT_SERVE_API_KEY")
    translator: TranslatorConfig = field(default_factory=TranslatorConfig)
    unk_dict: dict = field(default_factory=dict)  # for replace_unk (nmt-serve --unk-dict, loaded)
    # the checkpoint's saved decoding defaults (nmtkit/translate/defaults.py), under each request's own settings
    decoding_defaults: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("max_batch", "max_lines", "max_chars", "max_queue", "max_beam", "max_nbest", "max_target_len",
                     "max_attention_cells", "batch_work"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        self._check_access()
        if not 0 <= self.port <= 65535:
            raise InputError(f"--port must be between 0 and 65535 (got {self.port})")
        if not 0 <= self.batch_wait_ms < math.inf:
            raise InputError(f"--batch-wait-ms must be a finite number of at least 0 (got {self.batch_wait_ms})")
        if not 0 < self.timeout < math.inf:
            raise InputError(f"--timeout must be a finite number above 0 (got {self.timeout})")
        if self.max_queue < self.max_lines:
            raise InputError(f"--max-queue ({self.max_queue}) must hold at least one request of --max-lines "
                             f"({self.max_lines})")

    def _check_access(self) -> None:
        """The checks of the connection and access settings (nmtkit/serve/connections.py, guard.py)."""
        if not 0 < self.read_timeout < math.inf:
            raise InputError(f"--read-timeout must be a finite number above 0 (got {self.read_timeout})")
        if self.max_connections < 1:
            raise InputError(f"--max-connections must be at least 1 (got {self.max_connections})")
        for value in self.allowed_hosts:
            for host in (h.strip() for h in value.split(",")):
                if not host or any(c in host for c in "/@ ") or host.count("*") > (host in ("*",) or
                                                                                  host.startswith("*.")):
                    raise InputError(f"--allowed-hosts: {host!r} is no host name (a name or an address, without "
                                     "scheme, port or path; '*.example.org' or '*')")
        for origin in self.cors_origin:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s?#@]+/?|null", origin):
                raise InputError(f"--cors-origin: {origin!r} is no origin (scheme://host[:port], e.g. "
                                 "https://app.example.org, or '*')")
        if self.api_key is not None and not re.fullmatch(r"[\x21-\x7e]+", self.api_key):
            raise InputError("--api-key must be printable ASCII without spaces (it travels in an HTTP header)")

    def check(self) -> None:
        """What needs the file system: the checkpoints are there (before the server listens; what is in them is
        checked as it loads)."""
        if not self.checkpoints:
            raise InputError("no checkpoint given (-m CHECKPOINT)")
        for path in self.checkpoints:
            if not os.path.isfile(path):
                raise InputError("no such file", path)
