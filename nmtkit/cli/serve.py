"""``nmt-serve``: checkpoint(s) → translation over HTTP, batching the lines of concurrent requests."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, retired, run, setup_logging
from nmtkit.runtime import tune_malloc
from nmtkit.serve.config import ServeConfig
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
@click.option("--quiet", "-q", is_flag=True, help="No log line per request (warnings and errors only).")
def main(models, unk_dict, quiet, **settings):
    """Serve translations over HTTP: POST /translate {"src": [lines], ...decoding options...}.

    \b
      nmt-serve -m runs/quickstart/recipe/model/checkpoint_last.pt --port 8080
      curl -s localhost:8080/translate -d '{"src": ["The agreement was signed in August 1992."], "beam": 12}'

    GET /health, GET /models, GET /openapi.json; the decoding options are nmt-translate's, by their names (beam,
    nbest, lenpen, no_repeat_ngram, sampling, ...; see docs/tools.rst).  Stops on SIGTERM or Ctrl-C after
    answering the requests in flight.
    """
    setup_logging(quiet)
    tune_malloc()

    def body():
        from nmtkit.serve.server import serve
        from nmtkit.settings import from_options
        from nmtkit.translate.unkreplace import load_unk_dict

        serve(from_options(ServeConfig, settings, checkpoints=list(models),
                           translator=from_options(TranslatorConfig, settings),
                           unk_dict=load_unk_dict(unk_dict) if unk_dict else {}))

    run("nmt-serve", body)


if __name__ == "__main__":
    main()
