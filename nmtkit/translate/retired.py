"""Decoding options that were measured, lost, and were removed (issue #56: the measurement is kept, not the option).

:data:`RETIRED` names each by its former field of :class:`nmtkit.translate.config.DecodeConfig`, with the one line a
user who still gives it reads: why it went (the committed result file that shows it) and what to use instead.
``nmt-translate`` refuses the option with it (:func:`nmtkit.cli.retired`, exit code 2), and ``nmt-serve`` a request
that names the setting (400, :func:`refuse`).  docs/performance.rst lists them.
"""

from __future__ import annotations

from collections.abc import Iterable

from nmtkit.errors import InputError

RETIRED = {
    "block_numbers": "removed: it blocked numbers' tokens and lost numbers (tests/bench/results/bench_recipe.txt); "
                     "--no-repeat-ngram leaves numbers free",
    "missing_numbers": "removed: it changed no line (bench_recipe.txt); use --all-numbers",
    "replace_unk_by": "removed: the posterior lost on every set (bench_replace_unk.txt); --replace-unk uses the "
                      "attention",
}


def refuse(names: Iterable[str]) -> None:
    """One :class:`InputError` for the first retired setting among ``names`` (a request's keys), if any:
    ``"block_numbers": removed: ...``."""
    for name in names:
        if name in RETIRED:
            raise InputError(f"\"{name}\": {RETIRED[name]}")
