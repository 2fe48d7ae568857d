"""``nmt-prepare``: raw parallel text → a prepared directory (vocabularies, binarized corpora, manifest)."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, run, setup_logging
from nmtkit.prepare.config import PrepareConfig


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@config_options(PrepareConfig)
@click.option("--quiet", "-q", is_flag=True, help="Report only warnings and errors.")
def main(quiet, **settings):
    """Tokenise, filter, build shortlist vocabularies and binarize a parallel corpus into DEST.

    \b
    Example (the paper's setting: words, 30,000-word shortlists, training pairs of at most 50 words):
      nmt-prepare -s en -t fr --train data/train --valid data/newstest2013 \\
          --test data/newstest2014 --dest data-bin/wmt14 --workers 2
    """
    from nmtkit.prepare import prepare
    from nmtkit.settings import from_options

    setup_logging(quiet)
    cfg = from_options(PrepareConfig, settings)
    run("nmt-prepare", lambda: prepare(cfg))


if __name__ == "__main__":
    main()
