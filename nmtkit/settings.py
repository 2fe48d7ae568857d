"""Settings declared once: a field of a tool's config dataclass carries what its command-line option shows.

:func:`setting` makes the field (its default, a help text of a sentence or two, and where useful a ``metavar``, a
``short`` flag, the ``choices`` of a text, ``path`` for a file name); :func:`nmtkit.cli.config_options` turns the
fields of a config class into the click options of a tool, and the tool builds the config from its keywords in
one call (:func:`from_options`).  A field without help is no option (set by the tool itself, e.g. the checkpoints).
The checks of a value, and of values together, live in the config's ``__post_init__``, once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field
from typing import Any

KINDS = {"int": int, "float": float, "bool": bool, "str": str, "str | None": str, "int | None": int,
         "float | None": float}


def setting(default: Any = MISSING, help: str = "", metavar: str | None = None, short: str | None = None,
            choices: tuple[str, ...] | None = None, path: bool = False, default_factory: Any = MISSING):
    """A config field with what its option shows: ``help``, ``metavar``, a ``short`` flag (``"-b"``), the values a
    text may take (``choices``), whether it names a file (``path``)."""
    metadata = {"help": help, "metavar": metavar, "short": short, "choices": choices, "path": path}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def kind(f: dataclasses.Field) -> type:
    """The type of a field's values: int, float, bool or str (its annotation; ``X | None`` may also be None)."""
    return KINDS[f.type if isinstance(f.type, str) else f.type.__name__]


def options_of(cls) -> list[dataclasses.Field]:
    """The fields of a config class that are command-line options (those with help), in order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("help")]


def flag(name: str) -> str:
    """A field's option: ``max_source_len`` → ``--max-source-len``."""
    return "--" + name.replace("_", "-")


def from_options(cls, values: dict[str, Any], **others: Any):
    """The config built from a tool's keywords: each option field by its name from ``values`` (the others there
    are the tool's own), and ``others`` besides."""
    return cls(**{f.name: values[f.name] for f in options_of(cls) if f.name in values}, **others)
