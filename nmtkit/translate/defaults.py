"""A checkpoint's decoding defaults: the options its recipe chose, carried in the checkpoint itself.

A model is decoded best with the options its recipe measured (``examples/one-hour.sh``: beam 12, no repeated 4-gram,
numbers from the source, the candidate table); a user who must copy them by hand from a side file decodes with the
built-in defaults instead.  So a checkpoint may hold them, under ``"decoding_defaults"``: decoding options by their
field names (those of :class:`~nmtkit.translate.config.DecodeConfig`, and ``candidates``), written by ``nmt-translate
--save-defaults`` (:func:`save`).  ``nmt-translate`` and ``nmt-serve`` start from them (:func:`resolve`): an option
given on the command line, or in a request, wins; a saved one that the given ones contradict (``all_numbers`` beside
a given ``sampling``) is set aside and said so; each tool says on standard error, in one line, what it applied.

Why in the checkpoint, and not beside it (Marian's ``decoder.yml``, Hugging Face's ``generation_config.json``): the
checkpoint is the one file a user copies to another machine or gives ``nmt-serve``; a side file left behind decodes
silently with other options, the very problem.  The entry is plain types: :func:`nmtkit.data.checkpoint.load`
checks its shape (a dict of numbers, strings and nulls by name), and :func:`read` checks it whole (:func:`check`)
before a tool applies it (the data layer knows no decoding option).

A path (``candidates``) is stored relative to the checkpoint's directory, and read relative to it: a checkpoint and
its table moved together keep working; a checkpoint moved without its table is refused in one line that says what to
give instead, never decoded silently without the table (an absolute path stored is refused as malformed).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from nmtkit.errors import InputError
from nmtkit.settings import flag as settings_flag

KEY = "decoding_defaults"  # the checkpoint's field
PATH_SETTINGS = ("candidates",)  # TranslatorConfig fields a checkpoint may recommend: files, relative to it


def names() -> tuple[str, ...]:
    """The settings a checkpoint may carry: the decoding options, then :data:`PATH_SETTINGS`."""
    from nmtkit.translate.config import DecodeConfig

    return (*(f.name for f in dataclasses.fields(DecodeConfig)), *PATH_SETTINGS)


def check(entry: Any, path: str) -> None:
    """A checkpoint's ``"decoding_defaults"`` as the tools can apply it: names they know, values a decoding takes,
    files named relative to the checkpoint; else one InputError naming the file."""
    from nmtkit.translate.config import DecodeConfig

    def bad(problem: str):  # (a stranger's file may hold a value of megabytes: the line stays a line)
        problem = problem if len(problem) <= 300 else problem[:300] + "..."
        return InputError(f"malformed checkpoint: '{KEY}' {problem}", path)

    if not isinstance(entry, dict) or not all(isinstance(k, str) for k in entry):
        raise bad("is not a dict of decoding options by name")
    unknown = sorted(set(entry) - set(names()))
    if unknown:
        raise bad(f"holds {', '.join(repr(k) for k in unknown)}, not a decoding option (known: {', '.join(names())})")
    for name in PATH_SETTINGS:
        value = entry.get(name)
        if name in entry and not (isinstance(value, str) and value and "\0" not in value
                                  and not os.path.isabs(value)):
            raise bad(f"'{name}' is not a file name relative to the checkpoint's directory ({value!r})")
    try:
        DecodeConfig.from_dict(_decoding(entry))
    except (InputError, TypeError, ValueError, OverflowError) as e:
        raise bad(f"holds a setting no decoding takes: {e}") from None


def read(path: str) -> dict[str, Any]:
    """The decoding defaults a checkpoint carries ({} for none), checked (:func:`check`).  Read cheaply (the
    weights memory-mapped, not read): the tools read them before their model loads, and a checkpoint that does not
    load says what is wrong with it when it does, so here a file that does not open is {} rather than an error."""
    from nmtkit.data.checkpoint import peek

    entry = peek(path, KEY)
    if entry is None:
        return {}
    check(entry, path)
    return dict(entry)


@dataclass
class Resolved:
    """What a tool decodes with: its decoding settings, its candidate table, and what of the saved defaults it
    applied (``applied``), left for a given option (``overridden``) or set aside as contradicting the given ones
    (``set_aside``)."""

    decode: Any  # DecodeConfig
    candidates: str | None
    applied: dict[str, Any] = field(default_factory=dict)
    overridden: dict[str, Any] = field(default_factory=dict)  # (the given values)
    set_aside: dict[str, Any] = field(default_factory=dict)


def resolve(saved: dict[str, Any], given: dict[str, Any], checkpoint: str | None = None) -> Resolved:
    """The settings to decode with: the ``given`` ones (the command line's, a request's) over the ``saved`` ones
    (:func:`read`) over the built-in defaults.  A saved setting that makes the given ones impossible is set aside
    (the last in field order first: ``all_numbers`` before ``source_numbers``), never the given ones; a bad given
    setting is its own one-line error.  ``checkpoint``: where the saved file names are read from (with
    ``candidates`` saved and not given, the table must be there)."""
    from nmtkit.translate.config import DecodeConfig

    order = {name: i for i, name in enumerate(names())}
    applied = {k: v for k, v in sorted(saved.items(), key=lambda kv: order[kv[0]]) if k not in given}
    overridden = {k: given[k] for k in saved if k in given}
    set_aside: dict[str, Any] = {}
    given_decoding = _decoding(given)
    while True:
        try:
            decode = DecodeConfig.from_dict({**_decoding(applied), **given_decoding})
            break
        except InputError:
            if not _decoding(applied):
                raise  # (the given settings themselves)
            saved_names = list(_decoding(applied))
            drop = next((k for k in reversed(saved_names)
                         if _valid({**_decoding(_without(applied, k)), **given_decoding})), saved_names[-1])
            set_aside[drop] = applied.pop(drop)  # (none alone: from the last on, until the given ones hold)
    candidates = given.get("candidates")
    if "candidates" in applied:
        candidates = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(checkpoint)),
                                                   applied["candidates"]))
        applied["candidates"] = candidates
        if not os.path.isfile(candidates):
            raise InputError(f"its decoding defaults name the candidate table {saved['candidates']!r} beside it, "
                             f"which is not there ({candidates}): give --candidates FILE (the candidates.npz "
                             "nmt-prepare wrote for its data), or --no-defaults", checkpoint)
    return Resolved(decode, candidates, applied, overridden, set_aside)


def flags(settings: dict[str, Any]) -> str:
    """Settings as the options of ``nmt-translate`` (``--beam 12 --source-numbers``; ``--no-source-numbers`` for a
    switch turned off)."""
    parts = []
    for name, value in settings.items():
        flag = settings_flag(name)
        if isinstance(value, bool):
            parts.append(flag if value else _negation(flag))
        else:
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(parts)


def summary(tool: str, checkpoint: str, resolved: Resolved) -> str:
    """The one line a tool says on standard error of what it applied of ``checkpoint``'s saved defaults."""
    line = f"{tool}: decoding defaults saved in {checkpoint}: {flags(resolved.applied) or 'none applied'}"
    notes = []
    if resolved.overridden:
        notes.append(f"given here instead: {flags(resolved.overridden)}")
    if resolved.set_aside:
        notes.append(f"set aside, against the options given: {flags(resolved.set_aside)}")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def save(path: str, given: dict[str, Any]) -> dict[str, Any]:
    """Write ``given`` (decoding settings by name; ``candidates`` a file) into the checkpoint at ``path`` as its
    decoding defaults, replacing any it had ({}: none), atomically; the file's other names in its directory
    (nmt-train's ``checkpoint_last.pt`` and ``checkpoint_best.pt`` link a numbered checkpoint) are linked to the new
    file.  The settings are checked first, the table against the checkpoint's vocabularies; -> the entry written."""
    from nmtkit.data import checkpoint
    from nmtkit.data.candidates import load as load_candidates
    from nmtkit.translate.config import DecodeConfig

    DecodeConfig.from_dict(_decoding(given))
    payload = checkpoint.load(path)
    entry = dict(given)
    for name in PATH_SETTINGS:
        if entry.get(name) is not None:
            load_candidates(entry[name], payload["vocab"]["src"], payload["vocab"]["tgt"])
            entry[name] = os.path.relpath(os.path.abspath(entry[name]), os.path.dirname(os.path.abspath(path)))
        else:
            entry.pop(name, None)
    check(entry, path)
    for key in ("format", "format_version", "nmtkit_version"):  # (written anew, by this version)
        payload.pop(key, None)
    payload.pop(KEY, None)
    if entry:
        payload[KEY] = entry
    others = _other_names(path)
    try:
        checkpoint.save(payload, path)
        for other in others:
            checkpoint.link(path, other)
    except OSError as e:  # (a directory it may not write in: the file is as it was)
        raise InputError(f"cannot write the checkpoint's decoding defaults: {e.strerror or e}", e.filename or path) \
            from None
    return entry


def _other_names(path: str) -> list[str]:
    """The other names of the file at ``path`` in its directory (hard links)."""
    st = os.stat(path)
    if st.st_nlink < 2:
        return []
    directory = os.path.dirname(os.path.abspath(path))
    out = []
    with os.scandir(directory) as entries:
        for e in entries:
            try:
                s = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if (s.st_ino, s.st_dev) == (st.st_ino, st.st_dev) and os.path.abspath(e.path) != os.path.abspath(path):
                out.append(e.path)
    return out


def _decoding(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in PATH_SETTINGS}


def _without(settings: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != name}


def _valid(settings: dict[str, Any]) -> bool:
    from nmtkit.translate.config import DecodeConfig

    try:
        DecodeConfig.from_dict(settings)
    except InputError:
        return False
    return True


def _negation(flag: str) -> str:
    """A switch's off form: ``--source-numbers`` → ``--no-source-numbers``, ``--no-unk`` → ``--unk``."""
    return "--" + flag[5:] if flag.startswith("--no-") else "--no-" + flag[2:]
