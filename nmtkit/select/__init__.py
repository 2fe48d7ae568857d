"""``nmt-select``: cross-entropy-difference data selection (``selection``), its n-gram language models (``lm``,
``lm_count``, ``lm_arpa``) and the scoring workers and scores file (``scores``).

The public names below are importable from the package itself (``from nmtkit.select import SelectConfig``); each
is looked up in its module on first use, so importing one submodule does not import the others.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "SelectConfig": "selection",
    "select": "selection",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
