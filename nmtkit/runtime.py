"""Process-wide helpers the library and the tools share: the allocator setting of long-running processes and the
cache directory.  At the bottom of the layers (nothing here imports the rest of nmtkit), so that the library never
imports :mod:`nmtkit.cli` for them."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$NMTKIT_CACHE``, else ``~/.cache/nmtkit`` (downloads, compiled kernels)."""
    return Path(os.environ.get("NMTKIT_CACHE") or Path.home() / ".cache" / "nmtkit")


def tune_malloc() -> None:
    """Keep freed memory in the process (glibc only; a no-op elsewhere).

    Training and decoding free and reallocate large tensors (the (B, T, V) logits) at every step; glibc returns
    such blocks to the kernel and the next allocation page-faults them back in, several times slower than reusing
    them (a one-off measurement on a batch's logits, when this was written: tests/bench/README.md).
    """
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: large blocks from the heap, not from fresh mmaps
        libc.mallopt(-1, -1)  # M_TRIM_THRESHOLD = -1: never hand freed heap back (see above)
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
