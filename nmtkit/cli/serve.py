"""``nmt-serve``: checkpoint(s) → translation over HTTP, batching the lines of concurrent requests."""

from __future__ import annotations

import dataclasses
import json

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, given_options, retired, run, setup_logging
from nmtkit.runtime import tune_malloc
from nmtkit.serve.config import ServeConfig
from nmtkit.translate import defaults
from nmtkit.translate.config import TranslatorConfig

CONTINUOUS = ("removed: continuous batching lost to static batching at every load (bench_serve.txt); it lives on git "
              "tag retired/continuous-batching")


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.option("--model", "-m", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Checkpoint; repeat for an ensemble (averaged log-probabilities), as nmt-translate.")
@config_options(ServeConfig)
@click.option("--unk-dict", type=click.Path(dir_okay=False), help="'source target' word pairs for replace_unk.")
@config_options(TranslatorConfig)
@retired({"batching": CONTINUOUS, "join_wait_ms": CONTINUOUS})
@click.option("--no-defaults", is_flag=True,
              help="Decode with the built-in defaults under each request's settings, not the decoding defaults saved "
                   "in the (first) checkpoint (nmt-translate --save-defaults).")
@click.option("--quiet", "-q", is_flag=True, help="No log line per request (warnings and errors only).")
def main(models, unk_dict, no_defaults, quiet, **settings):
    """Serve translations over HTTP: POST /translate {"src": [lines], ...decoding options...}.

    \b
      nmt-serve -m runs/quickstart/recipe/model/checkpoint_last.pt --port 8080
      curl -s localhost:8080/translate -d '{"src": ["The agreement was signed in August 1992."], "beam": 12}'

    GET /health, GET /models, GET /openapi.json; the decoding options are nmt-translate's, by their names (beam,
    nbest, lenpen, no_repeat_ngram, sampling, ...; see docs/tools.rst), over the decoding defaults saved in the
    checkpoint (nmt-translate --save-defaults), if any.  Stops on SIGTERM or Ctrl-C after answering the requests in
    flight.
    """
    setup_logging(quiet)
    tune_malloc()
    given = given_options(click.get_current_context())

    def body():
        from nmtkit.serve.server import serve
        from nmtkit.settings import from_options
        from nmtkit.translate.unkreplace import load_unk_dict

        translator = from_options(TranslatorConfig, settings)
        saved, said = defaults.read(models[0]), []
        if no_defaults:
            saved, ignored = {}, saved
            if ignored:
                said.append(f"nmt-serve: decoding defaults saved in {models[0]} not applied (--no-defaults): "
                            f"{json.dumps(ignored)}")
        resolved = defaults.resolve(saved, {k: settings[k] for k in defaults.PATH_SETTINGS if k in given}, models[0])
        decoding = {k: v for k, v in resolved.applied.items() if k not in defaults.PATH_SETTINGS}
        if saved:
            table = f"; --candidates {resolved.candidates}" if "candidates" in resolved.applied else ""
            said.append(f"nmt-serve: decoding defaults saved in {models[0]}: {json.dumps(decoding)} under each "
                        f"request's own settings{table}" + (" (--candidates given here instead)"
                                                            if "candidates" in resolved.overridden else ""))
        cfg = from_options(ServeConfig, settings, checkpoints=list(models),
                           translator=dataclasses.replace(translator, candidates=resolved.candidates),
                           unk_dict=load_unk_dict(unk_dict) if unk_dict else {}, decoding_defaults=decoding)

        def announce(*args, **kwargs) -> None:  # (the address first, as ever: then what the requests decode with)
            print(*args, **kwargs)
            for line in said:
                click.echo(line, err=True)

        serve(cfg, announce)

    run("nmt-serve", body)


if __name__ == "__main__":
    main()
