"""Process-wide helpers the library and the tools share: the allocator setting of long-running processes, the
cache directory and the one setting that chooses how models compute (``$NMTKIT_BACKEND``).  At the bottom of the
layers (nothing here imports the rest of nmtkit), so that the library never imports :mod:`nmtkit.cli` for them."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$NMTKIT_CACHE``, else ``~/.cache/nmtkit`` (downloads, compiled kernels)."""
    return Path(os.environ.get("NMTKIT_CACHE") or Path.home() / ".cache" / "nmtkit")


BACKEND_NAMES = ("fast", "reference")
FAST_SWITCHES = ("no-onednn", "no-kernels")


def backend_setting(environ=os.environ) -> tuple[str, frozenset[str]]:
    """``$NMTKIT_BACKEND``, the one environment setting of how models compute: ``fast`` (the default),
    ``reference`` (the paper's equations as they read), or ``fast:`` with fast paths turned off, comma-separated:
    ``no-onednn`` (the oneDNN products) and ``no-kernels`` (the C kernels of nmtkit/kernels, for the attention and
    Adadelta).  Returns the name and the switches; ValueError naming the setting when it is not one of these."""
    text = (environ.get("NMTKIT_BACKEND") or "fast").strip()
    name, _, rest = text.partition(":")
    switches = frozenset(s.strip() for s in rest.split(",") if s.strip())
    unknown = sorted(switches - set(FAST_SWITCHES))
    if name not in BACKEND_NAMES or (switches and name != "fast") or unknown:
        raise ValueError(f"NMTKIT_BACKEND={text!r} is not a backend (choose from {', '.join(BACKEND_NAMES)}, or "
                         f"fast:{','.join(FAST_SWITCHES)} with either switch)")
    return name, switches


def fast_switches(environ=os.environ) -> frozenset[str]:
    """The fast paths ``$NMTKIT_BACKEND`` turns off; none when the setting is not valid (it is refused, with its
    message, where a model's backend is chosen: :func:`nmtkit.models.registry.default_backend`)."""
    try:
        return backend_setting(environ)[1]
    except ValueError:
        return frozenset()


def tune_malloc() -> None:
    """Keep freed memory in the process (glibc only; a no-op elsewhere).

    Training and decoding free and reallocate large tensors (the (B, T, V) logits) at every step; glibc returns
    such blocks to the kernel and the next allocation page-faults them back in, several times slower than reusing
    them (tests/bench/results/bench_kernels.txt, part 11).
    """
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: large blocks from the heap, not from fresh mmaps
        libc.mallopt(-1, -1)  # M_TRIM_THRESHOLD = -1: never hand freed heap back (see above)
    except (OSError, AttributeError, TypeError):
        pass


IDLE_TRIM_S = 1.0  # a process that decodes on demand gives its freed heap back after this long without work


def trim_heap() -> None:
    """Give the freed heap back to the kernel (glibc's ``malloc_trim``; a no-op elsewhere): what
    :func:`tune_malloc` keeps for the next batch, given back by a process that has gone idle (a server between
    requests, a decoding worker between windows), so that its resident memory is what it holds, not the most it
    ever held."""
    try:
        import ctypes
        import ctypes.util

        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def lazy_names(package: str, names: dict[str, str]):
    """A package's public names looked up in its modules on first use (``names``: name -> module of the package), so
    that importing one submodule does not import the others: ``__all__, __getattr__ = lazy_names(__name__, {...})``
    in the package's ``__init__``."""
    import importlib

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return list(names), __getattr__
