"""The command-line tools: one thin click command per tool over the library's plain functions.

Shared conventions, applied by :func:`run`:

- a bad input is reported as one line, ``nmt-<tool>: error: FILE:LINE: problem``, with exit code 1
  (click's own usage errors exit 2);
- Ctrl-C and SIGTERM stop the tool cleanly (outputs are written atomically, so nothing half-written remains),
  exit code 130;
- progress and reports go to stderr, never to stdout, so stdout can feed a pipeline.

Heavy libraries (torch) are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable

import click


def setup_logging(quiet: bool = False) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def tune_malloc() -> None:
    """Keep freed memory in the process (glibc only; a no-op elsewhere).

    Training and decoding free and reallocate large tensors (the (B, T, V) logits) at every step; glibc returns
    such blocks to the kernel and the next allocation page-faults them back in. Measured here: log_softmax over a
    batch's logits 26 → 7 ms, a 74 MB fill 22 → 3 ms.
    """
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: large blocks from the heap, not from fresh mmaps
        libc.mallopt(-1, -1)  # M_TRIM_THRESHOLD = -1: never hand freed heap back (see above)
    except (OSError, AttributeError, TypeError):
        pass


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def run(tool: str, body: Callable[[], object]) -> None:
    """Run a command body with the tools' error conventions (see the module docstring)."""
    from nmtkit.errors import InputError, WorkerError

    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        body()
    except (InputError, WorkerError) as e:
        click.echo(f"{tool}: error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo(f"{tool}: interrupted; no partial output was left behind", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
