"""``nmt-translate``: checkpoint(s) + raw text → translations, one line out per line in, in order, streaming."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from nmtkit.cli import (CONTEXT, ToolCommand, config_options, decode_options, given_options, retired, run,
                        setup_logging)
from nmtkit.runtime import tune_malloc
from nmtkit.translate import defaults
from nmtkit.translate.config import TranslatorConfig
from nmtkit.translate.retired import RETIRED


def read_input(stream, name: str):
    """(line number, text) for every line of a binary stream, split on b"\\n" only, a CRLF line end dropped whole (a
    prefix is written back as given: a "\\r" would stay inside its translation); invalid UTF-8 is reported with its
    line number and decoded with U+FFFD in place of the bad bytes, so no line is lost; a UTF-8 byte-order mark that
    starts the stream is dropped (files.without_bom)."""
    from nmtkit.files import without_bom

    for lineno, raw in enumerate(stream, start=1):
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = without_bom(raw[:-1] if raw.endswith(b"\r") else raw, lineno)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            click.echo(f"nmt-translate: warning: {name}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at "
                       f"column {e.start + 1}); translated with U+FFFD in place of the bad bytes", err=True)
            text = raw.decode("utf-8", errors="replace")
        yield lineno, text


@contextlib.contextmanager
def _output(path: str | None):
    """stdout for None or '-', else a file written atomically (renamed into place only on success)."""
    if path in (None, "-"):
        yield sys.stdout
    else:
        from nmtkit.files import atomic_file

        with atomic_file(path) as f:
            yield f


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.option("--model", "-m", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Checkpoint; repeat for an ensemble (averaged log-probabilities).")
@click.option("--input", "-i", "input_path", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Input text [stdin].")
@click.option("--output", "-o", "output_path", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Translations [stdout].")
@decode_options
@retired(RETIRED)
@click.option("--prefix", "prefix_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Target prefixes, one line per input line: each translation starts with its line's prefix, "
                   "written as given (forced decoding; an empty line: no prefix; '-': stdin, when the input is a "
                   "file).")
@click.option("--unk-dict", type=click.Path(dir_okay=False), help="'source target' word pairs for --replace-unk.")
@click.option("--nbest-file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Where the n-best list goes [stdout, instead of the translations].")
@click.option("--alignments", type=click.Path(dir_okay=False), help="Write Pharaoh word alignments (i-j) here.")
@click.option("--attention", type=click.Path(dir_okay=False),
              help="Write the soft attention matrices here (JSON lines, for nmt-align and plotting).")
@click.option("--scores", type=click.Path(dir_okay=False), help="Write each translation's log-probability here.")
@config_options(TranslatorConfig, defaults={"workers": 0})
@click.option("--no-defaults", is_flag=True,
              help="Decode with this command line's options and the built-in defaults only, not the decoding defaults "
                   "saved in the (first) checkpoint.")
@click.option("--save-defaults", is_flag=True,
              help="Save the decoding options given on this command line (--candidates too) in the checkpoint as its "
                   "decoding defaults, replacing any it had, and exit: nmt-translate and nmt-serve then apply them "
                   "unless told otherwise.")
@click.option("--quiet", "-q", is_flag=True)
def main(models, input_path, output_path, prefix_path, unk_dict, nbest_file, alignments, attention, scores,
         no_defaults, save_defaults, quiet, **settings):
    """Translate text with one or more checkpoints: exactly one output line per input line, in order.

    \b
      nmt-translate -m runs/rnnsearch/checkpoint_best.pt < newstest2014.en > out.fr
      nmt-translate -m a.pt -m b.pt --beam 12 --nbest 5 --nbest-file out.nbest -i in.en -o out.fr
      nmt-translate -m model.pt --prefix drafts.fr -i in.en -o out.fr          # post-editing
      nmt-translate -m model.pt --sampling topp:0.9 --seed 7 < mono.en > back.fr
      nmt-translate -m model.pt --beam 12 --no-repeat-ngram 4 --save-defaults   # what model.pt decodes with

    A checkpoint's saved decoding defaults (--save-defaults; examples/one-hour.sh saves its recipe's) apply unless
    an option given here says otherwise (--no-defaults: none); a line on stderr says which applied.
    """
    args = dict(locals())
    args["given"] = given_options(click.get_current_context())
    setup_logging(quiet)
    tune_malloc()
    run("nmt-translate", lambda: _translate(**args))


def _translate(models, input_path, output_path, prefix_path, unk_dict, nbest_file, alignments, attention, scores,
               no_defaults, save_defaults, quiet, settings, given):
    import dataclasses

    import torch

    from nmtkit.errors import InputError
    from nmtkit.files import check_distinct
    from nmtkit.settings import from_options
    from nmtkit.translate.translator import Translator
    from nmtkit.translate.unkreplace import load_unk_dict
    from nmtkit.translate import outputs

    # (both checked before any file is opened)
    config = from_options(TranslatorConfig, settings)
    # the decoding options given here, over the checkpoint's saved defaults (nmtkit/translate/defaults.py)
    decoding = [k for k in settings if k not in config.__dataclass_fields__ or k in defaults.PATH_SETTINGS]
    given_decoding = {k: settings[k] for k in given if k in decoding}
    if save_defaults:
        return _save_defaults(models, given_decoding, [k for k in given if k not in decoding], quiet)
    saved = defaults.read(models[0])
    if no_defaults:
        saved, ignored = {}, saved
        if ignored and not quiet:
            click.echo(f"nmt-translate: decoding defaults saved in {models[0]} not applied (--no-defaults): "
                       f"{defaults.flags(ignored)}", err=True)
    resolved = defaults.resolve(saved, given_decoding, models[0])
    if saved and not quiet:
        click.echo(defaults.summary("nmt-translate", models[0], resolved), err=True)
    decode = resolved.decode
    config = dataclasses.replace(config, candidates=resolved.candidates)
    if config.threads:
        torch.set_num_threads(config.threads)
    if decode.alignment_method != "attention" and not alignments:
        raise InputError(f"--alignment-method {decode.alignment_method} says how --alignments are made: give "
                         "--alignments FILE")
    if decode.nbest > 1 and nbest_file is None and output_path in (None, "-"):
        nbest_file = "-"
    check_distinct({"--output": None if nbest_file == "-" else output_path, "--nbest-file": nbest_file,
                    "--alignments": alignments, "--attention": attention, "--scores": scores},
                   {"--input": input_path, "--unk-dict": unk_dict, "--prefix": prefix_path,
                    **{f"--model {m}": m for m in models}})
    if prefix_path == "-" and input_path == "-":
        raise InputError("--prefix - and the input both name standard input: give the input with -i FILE or the "
                         "prefixes as a file")
    stream, name = _open_input(input_path, "--input")
    prefixes = prefix_stream = None
    prefix_name = "prefixes"
    if prefix_path is not None:  # (opened before the checkpoints are loaded: a missing file is reported at once)
        prefix_stream, prefix_name = _open_input(prefix_path, "--prefix")
        prefixes = (text for _, text in read_input(prefix_stream, prefix_name))
    translator = Translator(list(models), decode, config, unk_dict=load_unk_dict(unk_dict) if unk_dict else None,
                            need_attention=bool(alignments or attention))
    progress, lines = None, read_input(stream, name)
    if sys.stderr.isatty() and not quiet:  # (the input file's line count as its total; it counts the lines read)
        from nmtkit.progress import reading, translation_bar

        progress = translation_bar(input_path)
        lines = reading(lines, progress)
    with contextlib.ExitStack() as stack:
        stack.enter_context(translator)  # stops its worker processes however this ends
        if prefix_stream is not None and prefix_path != "-":
            stack.enter_context(prefix_stream)
        main_out = None if nbest_file == "-" else stack.enter_context(_output(output_path))
        nbest_out = stack.enter_context(_output(nbest_file)) if nbest_file else None
        align_out = stack.enter_context(_output(alignments)) if alignments else None
        attn_out = stack.enter_context(_output(attention)) if attention else None
        score_out = stack.enter_context(_output(scores)) if scores else None
        files = [f for f in (main_out, nbest_out, align_out, attn_out, score_out) if f is not None]
        for t in translator.translate(lines, prefixes, prefix_name):
            if main_out is not None:
                main_out.write(t.text + "\n")
            for out, line in ((nbest_out, outputs.nbest_entries), (align_out, outputs.alignment_line),
                              (attn_out, outputs.attention_line), (score_out, outputs.score_line)):
                if out is not None:
                    out.write(line(t))
            if progress is not None:
                progress.update(1)
            for f in files:  # (each line as soon as it is ready: a pipeline may be waiting for it)
                f.flush()
        for f in files:
            f.flush()
    if progress is not None:
        progress.close()
    if input_path != "-":
        stream.close()


def _save_defaults(models, given: dict, others: list[str], quiet: bool) -> None:
    """``--save-defaults``: the decoding options given, written into the one checkpoint as its defaults."""
    from nmtkit.errors import InputError

    if len(models) != 1:
        raise InputError(f"--save-defaults writes the decoding defaults of one checkpoint: give one -m (got "
                         f"{len(models)})")
    main_params = {p.name: p for p in main.params}
    shown = [main_params[k].opts[0] for k in others if k not in ("models", "save_defaults", "quiet")]
    if shown:
        raise InputError(f"--save-defaults saves decoding options and translates nothing: {shown[0]} is not a "
                         "decoding option (give it when translating)")
    entry = defaults.save(models[0], given)
    if not quiet:
        where = " (--candidates relative to the checkpoint's directory)" if "candidates" in entry else ""
        click.echo(f"nmt-translate: {models[0]}: decoding defaults saved: "
                   f"{defaults.flags(entry) + where if entry else 'none (any it had are cleared)'}", err=True)


def _open_input(path: str, option: str):
    """(binary stream, name for messages) of an input: standard input for '-' (one line if it is closed)."""
    from nmtkit.errors import InputError

    if path == "-":
        if sys.stdin is None:  # (started with stdin closed: nmt-translate <&-)
            raise InputError(f"is closed: give {option} a file, or pipe the text in", "standard input")
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb"), path
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", path) from None


def entry() -> None:
    """Run main(), ending quietly when the reader of stdout goes away (``nmt-translate ... | head``)."""
    try:
        main(prog_name="nmt-translate")
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    entry()
