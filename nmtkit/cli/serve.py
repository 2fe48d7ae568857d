"""``nmt-serve``: checkpoint(s) → translation over HTTP, batching the lines of concurrent requests."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, backend_option, retired, run, setup_logging
from nmtkit.runtime import tune_malloc

CONTINUOUS = ("removed: continuous batching lost to static batching at every load (bench_serve.txt); it lives on git "
              "tag retired/continuous-batching")


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.option("--model", "-m", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Checkpoint; repeat for an ensemble (averaged log-probabilities), as nmt-translate.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0 for every interface).")
@click.option("--port", default=8080, show_default=True, help="Port (0: any free one; the port taken is printed).")
@click.option("--max-batch", default=32, show_default=True, help="Lines decoded together, across requests.")
@click.option("--batch-wait-ms", default=5.0, show_default=True,
              help="A batch is decoded once no line has come for this long, or it holds --max-batch lines (at most "
                   "10 times this after the previous batch).")
@click.option("--max-lines", default=100, show_default=True, help="Lines a request may hold (more: 413).")
@click.option("--max-chars", default=20_000, show_default=True, help="Characters a request may hold (more: 413).")
@click.option("--max-queue", default=1_000, show_default=True,
              help="Lines that may wait for decoding (a request past it: 503 with Retry-After).")
@click.option("--timeout", default=30.0, show_default=True,
              help="Seconds a request may wait for its translations (then 504); also the grace of a shutdown.")
@click.option("--unk-dict", type=click.Path(dir_okay=False), help="'source target' word pairs for replace_unk.")
@click.option("--tokenized", is_flag=True, help="Lines are tokenised words; translations are too (no detok).")
@click.option("--batch-size", default=64, show_default=True, help="Sentences a decoding step holds.")
@click.option("--max-source-len", default=250, show_default=True,
              help="Longer lines are translated in pieces of at most this many tokens.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", default=0, help="Torch threads in all (0 = torch's default: one per core).")
@click.option("--workers", default=1, show_default=True,
              help="Decoding processes sharing the threads, each decoding a batch of its own at once (0 = on CPU "
                   "min(threads, 4)).")
@retired({"batching": CONTINUOUS, "join_wait_ms": CONTINUOUS})
@backend_option("translations")
@click.option("--quiet", "-q", is_flag=True, help="No log line per request (warnings and errors only).")
def main(models, host, port, max_batch, batch_wait_ms, max_lines, max_chars, max_queue, timeout, unk_dict, tokenized,
         batch_size, max_source_len, device, threads, workers, backend, quiet):
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
        from nmtkit.serve.config import ServeConfig
        from nmtkit.serve.server import serve
        from nmtkit.translate.unkreplace import load_unk_dict

        serve(ServeConfig(list(models), host=host, port=port, max_batch=max_batch, batch_wait_ms=batch_wait_ms,
                          max_lines=max_lines, max_chars=max_chars, max_queue=max_queue, timeout=timeout,
                          device=device, threads=threads, workers=workers, batch_size=batch_size, max_source_len=max_source_len,
                          unk_dict=load_unk_dict(unk_dict) if unk_dict else {}, tokenized=tokenized,
                          backend=backend))

    run("nmt-serve", body)


if __name__ == "__main__":
    main()
