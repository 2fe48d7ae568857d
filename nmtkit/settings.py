"""Settings declared once: a field of a tool's config dataclass carries what its command-line option shows.

:func:`setting` makes the field (its default, a help text of a sentence or two, and where useful a ``metavar``, a
``short`` flag, the ``choices`` of a text, ``path`` for a file name, the ``flag`` where it is not the field's
name); :func:`nmtkit.cli.config_options` turns the fields of a config class into the click options of a tool, and
the tool builds the config from its keywords in one call (:func:`from_options`).  A field made without
:func:`setting` is no option (set by the tool itself, e.g. the checkpoints).  A field without a default is a
required option; a ``list[str]`` field a repeatable one; a ``bool`` field a switch that turns its default around
(``--lowercase`` sets False to True, ``--no-normalize`` True to False).  The checks of a value, and of values
together, live in the config's ``__post_init__`` (or its ``check``), once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field
from typing import Any

KINDS = {"int": int, "float": float, "bool": bool, "str": str, "str | None": str, "int | None": int,
         "float | None": float, "list[str]": str, "list[str] | None": str}

# what a ``path`` names (the keywords of its click.Path): a file (True), a directory ("dir"), a file that must
# exist ("existing"), a file or '-' for a standard stream ("-")
PATHS = {True: {"dir_okay": False}, "dir": {"file_okay": False}, "existing": {"exists": True, "dir_okay": False},
         "-": {"dir_okay": False, "allow_dash": True}}


def setting(default: Any = MISSING, help: str = "", metavar: str | None = None, short: str | None = None,
            choices: tuple[str, ...] | None = None, path: bool | str = False, default_factory: Any = MISSING,
            flag: str | None = None, envvar: str | None = None):
    """A config field with what its option shows: ``help``, ``metavar``, a ``short`` flag (``"-b"``), the values a
    text may take (``choices``), whether it names a file (``path``: a key of :data:`PATHS`), and its ``flag`` where
    that is not the field's name (``"--no-normalize"``), and the environment variable read where the option is not
    given (``envvar``: for a secret, which ``ps`` would show on a command line)."""
    metadata = {"help": help, "metavar": metavar, "short": short, "choices": choices, "path": path, "flag": flag,
                "envvar": envvar}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def kind(f: dataclasses.Field) -> type:
    """The type of a field's values: int, float, bool or str (its annotation; ``X | None`` may also be None)."""
    return KINDS[f.type if isinstance(f.type, str) else f.type.__name__]


def repeated(f: dataclasses.Field) -> bool:
    """Whether a field holds a list (its option is given once per value)."""
    return str(f.type).startswith("list[")


def options_of(cls) -> list[dataclasses.Field]:
    """The fields of a config class that are command-line options (those made by :func:`setting`), in order."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag(name: str) -> str:
    """A field's option: ``max_source_len`` → ``--max-source-len``."""
    return "--" + name.replace("_", "-")


def flag_of(f: dataclasses.Field) -> str:
    """The option of a field: its own ``flag``, else the one of its name (:func:`flag`)."""
    return f.metadata["flag"] or flag(f.name)


def from_options(cls, values: dict[str, Any], **others: Any):
    """The config built from a tool's keywords: each option field by its name from ``values`` (the others there
    are the tool's own), and ``others`` besides; a repeatable option's values as a list, and one not given at all
    leaves its field the default."""
    given = {}
    for f in options_of(cls):
        if f.name in values:
            value = values[f.name]
            if repeated(f):
                if not value:
                    continue
                value = list(value)
            given[f.name] = value
    return cls(**given, **others)


def model_backend(computes: str):
    """The ``backend`` field of a tool that runs a model (``--backend``); ``computes``: what the reference gives the
    same of."""
    from nmtkit.runtime import BACKEND_NAMES

    return setting(None, "How the model computes: the fast paths, or the paper's equations as they read "
                         f"(nmtkit/models/reference.py; the same {computes}, slowly) [$NMTKIT_BACKEND, else fast].",
                   choices=BACKEND_NAMES)
