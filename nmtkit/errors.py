"""The error types the tools report to users as one line.

Every problem with a user's input becomes an :class:`InputError` that names the file, the line (when there is
one) and the problem, so that the command-line tools can print it as a single line and exit non-zero::

    nmt-prepare: error: data/train.fr:1207: invalid UTF-8 (byte 0xe9 at column 14)
"""

from __future__ import annotations

import os


class InputError(Exception):
    """A bad input file, option or value: a one-line message for the user.

    ``path`` and ``line`` (1-based) locate the problem when it has a place; ``str(error)`` is the full line.
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.line = line
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        return where + self.message


class DivergedError(RuntimeError):
    """Training met a non-finite loss or gradient: a one-line message; the update was not applied, nothing saved."""


class WorkerError(RuntimeError):
    """A helper process (``nmt-translate --workers``) died or failed: a one-line message naming it."""
