"""``nmt-select``: cross-entropy-difference data selection (Axelrod et al., 2011; Moore & Lewis, 2010)."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, run, setup_logging
from nmtkit.select.config import SelectConfig


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@config_options(SelectConfig)
@click.option("--quiet", "-q", is_flag=True, help="Report only warnings and errors.")
def main(quiet, **settings):
    """Select the general-corpus pairs most like the in-domain data: score = [H_in(src) - H_gen(src)] +
    [H_in(tgt) - H_gen(tgt)] with 4-gram modified Kneser-Ney LMs, lowest first.

    \b
    Example (the paper's data selection, keeping 348M of 850M words):
      nmt-select -s en -t fr --in-domain data/news --general data/europarl --general data/un \\
          --top-words 348000000 -o data/selected --workers 2
    """
    from nmtkit.select.selection import select
    from nmtkit.settings import from_options

    setup_logging(quiet)
    cfg = from_options(SelectConfig, settings)
    run("nmt-select", lambda: select(cfg))


if __name__ == "__main__":
    main()
