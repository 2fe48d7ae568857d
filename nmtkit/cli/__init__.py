"""The command-line tools: one thin click command per tool over the library's plain functions.

Shared conventions, applied by :func:`run`:

- a bad input is reported as one line, ``nmt-<tool>: error: FILE:LINE: problem``, with exit code 1; a bad
  command line as one line too, ``nmt-<tool>: error: <click's message> (see 'nmt-<tool> --help')``, with click's
  exit code 2 (:class:`ToolCommand`, every tool's command class); an option that was removed (:func:`retired`) is
  refused with exit code 2 too, in one line that says why and what to use instead (no pointer to ``--help``),
  ``nmt-<tool>: error: --option: removed: ...``;
- Ctrl-C and SIGTERM stop the tool cleanly (outputs are written atomically, so nothing half-written remains),
  exit code 130;
- progress and reports go to stderr, never to stdout, so stdout can feed a pipeline.

Heavy libraries (torch) are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from collections.abc import Callable

import click


def config_options(cls, defaults: dict | None = None, skip: tuple[str, ...] = (), negatable: bool = False):
    """The options of a tool made from a config class: one per field made by :func:`nmtkit.settings.setting`, with
    its default (or ``defaults``' where a tool differs), help, metavar, choices, short flag and path kind, received
    by the field's name; a field without a default is required, a list repeatable, a bool a switch that turns its
    default around (``negatable``: and its off form too, ``--source-numbers/--no-source-numbers``, where a
    checkpoint's saved defaults may have turned it on); ``skip``: fields the tool declares itself."""
    from dataclasses import MISSING

    from nmtkit.settings import PATHS, flag_of, kind, options_of, repeated

    defaults = defaults or {}

    def add(command):
        for f in reversed([f for f in options_of(cls) if f.name not in skip]):
            names = [flag_of(f), *([f.metadata["short"]] if f.metadata["short"] else []), f.name]
            default = defaults.get(f.name, None if f.default is MISSING else f.default)
            shown = dict(help=f.metadata["help"] or None, metavar=f.metadata["metavar"])
            if f.metadata.get("envvar"):  # (a secret's: not on the command line, where ps shows it)
                shown.update(envvar=f.metadata["envvar"], show_envvar=True)
            if kind(f) is bool:
                if negatable:  # (--no-unk's off form: --unk)
                    off = "--" + names[0][5:] if names[0].startswith("--no-") else "--no-" + names[0][2:]
                    names[0] = f"{names[0]}/{off}"
                option = click.option(*names, is_flag=True, flag_value=not default, default=default, **shown)
            else:
                value = click.Choice(f.metadata["choices"]) if f.metadata["choices"] else \
                    click.Path(**PATHS[f.metadata["path"]]) if f.metadata["path"] else kind(f)
                if f.default is MISSING and f.default_factory is MISSING and f.name not in defaults:
                    shown["required"] = True  # (and no default: click's None would count as a value given)
                else:
                    shown["default"] = default
                option = click.option(*names, type=value, show_default=default is not None, multiple=repeated(f),
                                      **shown)
            command = option(command)
        return command

    return add


def decode_options(command):
    """The decoding options of a tool, one per field of :class:`nmtkit.translate.config.DecodeConfig` (written there
    once); the command receives them by their field names and builds the object with ``DecodeConfig.from_dict``.
    Each switch has its off form (``--no-source-numbers``): a checkpoint's saved defaults may turn it on
    (nmtkit/translate/defaults.py)."""
    from nmtkit.translate.config import DecodeConfig

    return config_options(DecodeConfig, negatable=True)(command)


def given_options(ctx: click.Context) -> list[str]:
    """The parameters given on the command line, not left at their defaults (by name): what wins over a
    checkpoint's saved decoding defaults (nmtkit/translate/defaults.py)."""
    from click.core import ParameterSource

    return [p.name for p in ctx.command.params
            if ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]


def retired(options: dict[str, str]):
    """Options that were removed, ``{name: message}`` (``block_numbers``: ``--block-numbers``; the message says why,
    and what to use instead): each stays known to the parser, hidden from ``--help``, with or without a value, so
    that a command line that still gives it is refused with its message on one line, ``nmt-<tool>: error:
    --block-numbers: removed: ...``, exit code 2 (a usage error), before anything else is read or written."""

    def add(command):
        for name, message in reversed(options.items()):
            flag = "--" + name.replace("_", "-")
            command = click.option(flag, f"retired_{name}", is_flag=False, flag_value="", default=None, hidden=True,
                                   expose_value=False, is_eager=True, callback=_refuse(flag, message))(command)
        return command

    return add


class _RetiredOption(click.UsageError):
    """A removed option given: its message says what replaced it (no pointer to ``--help``, which lists it no
    more)."""


def _refuse(flag: str, message: str):
    def callback(ctx, param, value):
        if value is not None:
            raise _RetiredOption(f"{flag}: {message}", ctx)

    return callback


def setup_logging(quiet: bool = False) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _flat(message: str) -> str:
    """A message on one line: its line breaks (and the spaces around them) become one space."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


class _OneLineUsageError(click.UsageError):
    """A click usage error (an unknown option, a missing argument, a bad value) shown as one line in the tools'
    format; still a ``click.UsageError`` (exit code 2) for callers that catch it."""

    def __init__(self, error: click.UsageError, prog: str):
        super().__init__(_flat(error.format_message()), error.ctx)
        self.prog, self.hint = prog, not isinstance(error, _RetiredOption)

    def show(self, file=None) -> None:
        hint = f" (see '{self.prog} --help')" if self.hint else ""
        click.echo(f"{self.prog}: error: {self.message}{hint}", err=True)


class _OneLineError(click.ClickException):
    """Any other click error (an unreadable ``click.File``) as one line, with the original's exit code."""

    def __init__(self, error: click.ClickException, prog: str):
        super().__init__(_flat(error.format_message()))
        self.exit_code, self.prog = error.exit_code, prog

    def show(self, file=None) -> None:
        click.echo(f"{self.prog}: error: {self.message}", err=True)


def _one_line(error: click.ClickException, prog: str) -> click.ClickException:
    if isinstance(error, (_OneLineUsageError, _OneLineError)):
        return error
    if isinstance(error, click.UsageError):
        return _OneLineUsageError(error, prog)
    return _OneLineError(error, prog)


class ToolCommand(click.Command):
    """The tools' click command: click's errors -- an unknown option, a missing argument, a bad value -- are shown
    as one line, ``nmt-<tool>: error: ...``, instead of click's usage block (the tools' convention for any bad
    input; see the module docstring)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as e:
            raise _one_line(e, info_name or self.name or "nmtkit") from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            raise _one_line(e, ctx.command_path) from None


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit has nothing to fail on."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def run(tool: str, body: Callable[[], object]) -> None:
    """Run a command body with the tools' error conventions (see the module docstring)."""
    from nmtkit.errors import DivergedError, InputError, WorkerError

    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        body()
    except (InputError, WorkerError, DivergedError) as e:
        click.echo(f"{tool}: error: {e}", err=True)
        sys.exit(1)
    except BrokenPipeError:  # the reader of stdout went away (| head): a normal end for a filter, as for cat
        _drop_stdout()
        sys.exit(0)
    except OSError as e:
        from nmtkit.files import WRITE_ERRORS

        if e.errno not in WRITE_ERRORS:
            raise
        where = f"{e.filename}: " if e.filename else "standard output: "
        _drop_stdout()  # (what is still buffered for a full stdout would fail again at exit, in a second message)
        click.echo(f"{tool}: error: {where}cannot write: {os.strerror(e.errno).lower()}", err=True)
        sys.exit(1)
    except KeyboardInterrupt as e:  # (one that kept resumable state, a download's .part, says so in its message)
        click.echo(f"{tool}: interrupted; {str(e) or 'no partial output was left behind'}", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
