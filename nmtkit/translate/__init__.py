"""``nmt-translate``: the streaming translator (``translator``), batch decoding (``decoding``) in this process or in
worker processes (``pool``), beam search (``search``), sampling (``sampling``), and the per-line outputs: word
alignments (``wordalign``) and the other formats (``outputs``).

The public names below are importable from the package itself (``from nmtkit.translate import Translator``); each
is looked up in its module on first use, so importing one submodule does not import the others.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Translator": "translator",
    "Translation": "translator",
    "load_unk_dict": "translator",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
