"""The formats the tools exchange on disk: text preprocessing (``text``), vocabularies (``vocab``), the binarized
corpus (``corpus``), the prepared directory's manifest (``manifest``), training batches (``batching``), BPE-dropout
(``bpedropout``) and the checkpoint format (``checkpoint``).  The bottom of the library with ``nmtkit.runtime``:
it imports no model and no tool (docs/design.rst).

The public names below are importable from the package itself (``from nmtkit.data import PreparedData``); each
is looked up in its module on first use, so importing one submodule does not import the others.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "PreparedData": "manifest",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
