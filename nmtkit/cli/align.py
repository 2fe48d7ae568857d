"""``nmt-align``: checkpoint + sentence pairs → attention plots (Figure 3), Pharaoh hard alignments, AER."""

from __future__ import annotations

import json
import os
import sys

import click

from nmtkit.align import AlignConfig
from nmtkit.cli import CONTEXT, ToolCommand, config_options, run, setup_logging
from nmtkit.translate.config import DecodeConfig


def parse_ranges(spec: str | None, count: int) -> list[int]:
    """``"1,3,5-9"`` → the 1-based line numbers it names (all of 1..count when ``spec`` is None or "all")."""
    from nmtkit.errors import InputError

    if spec is None or spec.strip() == "all":
        return list(range(1, count + 1))
    chosen: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise InputError(f"--plot-sentences: '{part}' is not a line number or a range such as 5-9") from None
        if not 1 <= a <= b <= count:
            raise InputError(f"--plot-sentences: '{part}' is outside lines 1-{count}")
        chosen.update(range(a, b + 1))
    return sorted(chosen)


def render_scores(scores, gold: str) -> str:
    return (f"AER {scores.aer:.4f}  precision {scores.precision:.4f}  recall {scores.recall:.4f}  against {gold} "
            f"(|A| {scores.links}, |S| {scores.sure}, |P| {scores.possible}, |A∩S| {scores.hits_sure}, "
            f"|A∩P| {scores.hits_possible}; AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|))\n")


def render_methods(by_method, chosen: str) -> str:
    """Each direction's and each symmetrisation's AER, one line each (the one written out marked)."""
    rows = [f"  {name:20} AER {sc.aer:.4f}  precision {sc.precision:.4f}  recall {sc.recall:.4f}  |A| {sc.links}"
            + ("   <- written" if name == chosen else "") for name, sc in by_method.items()]
    return "by direction and symmetrisation:\n" + "\n".join(rows) + "\n"


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@config_options(AlignConfig)
@click.option("--json", "as_json", is_flag=True, help="Print the AER report as JSON.")
@click.option("--quiet", "-q", is_flag=True)
def main(as_json, quiet, **settings):
    """Soft and hard word alignments of an RNNsearch model, by forced decoding of given sentence pairs.

    Lines wrapped as '<s snum=N> ... </s>' (the NAACL 2003 Hansards gold sets) are unwrapped. The report (AER,
    precision, recall) goes to stdout, or to stderr when the Pharaoh alignments do.

    \b
      nmt-align -m model.pt -s test.en -t test.fr --plot-dir plots --plot-sentences 1-4 --pharaoh test.align
      nmt-align -m model.pt -s trial.e -t trial.f --tokenized --gold trial.align --gold-order tgt-src
      nmt-align -m en-fr.pt --reverse-model fr-en.pt -s trial.e -t trial.f --tokenized --gold trial.align
      nmt-align -m model.pt -s trial.e -t trial.f --tokenized --gold trial.align --method posterior
    """
    from nmtkit.settings import from_options

    setup_logging(quiet)
    run("nmt-align", lambda: _align(from_options(AlignConfig, settings), as_json, quiet))  # (a bad setting: one line)


def _align(cfg: AlignConfig, as_json: bool, quiet: bool = False) -> None:
    from nmtkit.align import Aligner, align_files, check_reverse
    from nmtkit.files import atomic_file, check_distinct
    from nmtkit.translate.wordalign import pharaoh as pharaoh_line

    pharaoh = cfg.pharaoh
    if pharaoh is None and cfg.plot_dir is None and cfg.gold is None:
        pharaoh = "-"
    check_distinct({"--pharaoh": pharaoh, "--plot-dir": cfg.plot_dir},
                   {"--model": cfg.model, "--source": cfg.source, "--target": cfg.target, "--gold": cfg.gold,
                    "--reverse-model": cfg.reverse_model})
    aligner = Aligner(cfg.model, device=cfg.device, tokenized=cfg.tokenized, batch_size=cfg.batch_size,
                      decode=DecodeConfig(beam=cfg.beam), backend=cfg.backend, method=cfg.method)
    reverse = None
    if cfg.reverse_model is not None:
        reverse = Aligner(cfg.reverse_model, device=cfg.device, tokenized=cfg.tokenized, batch_size=cfg.batch_size,
                          backend=cfg.backend, method=cfg.method)
        check_reverse(aligner, reverse, cfg.reverse_model)
    if cfg.plot_dir is not None:  # check the directory and the line numbers before the model runs
        from nmtkit.align import read_text
        from nmtkit.plots import check_plot_dir

        check_plot_dir(cfg.plot_dir, cfg.force)
        plot_lines = parse_ranges(cfg.plot_sentences, len(read_text(cfg.source)))
    result = align_files(aligner, cfg.source, cfg.target, cfg.gold, cfg.gold_format, cfg.gold_order, cfg.rule,
                         cfg.threshold, reverse, cfg.symmetrization)
    if cfg.plot_dir is not None:
        from nmtkit.plots import write_attention_plots

        items = []
        for line in plot_lines:
            s, a = result.sentences[line - 1], result.soft[line - 1]
            title = f"{os.path.basename(cfg.source)}: {s.name}"
            items.append((line, title, a.source + ["</s>"], a.target + ["</s>"], a.alpha))
        names, skipped = write_attention_plots(cfg.plot_dir, items, cfg.plot_format, force=cfg.force)
        if not quiet:
            _say_where_plots_went(cfg.plot_dir, len(names), skipped)
    if pharaoh is not None:
        text = "".join(pharaoh_line(links) + "\n" for links in result.links)
        if pharaoh == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            with atomic_file(pharaoh) as f:
                f.write(text)
    if result.scores is not None:
        out = sys.stderr if pharaoh == "-" else sys.stdout
        if as_json:
            report = {"gold": cfg.gold, "sentences": len(result.sentences), "method": cfg.method,
                      **result.scores.to_dict()}
            if result.by_method is not None:
                report.update(symmetrization=cfg.symmetrization,
                              by_method={k: v.to_dict() for k, v in result.by_method.items()})
            out.write(json.dumps(report, indent=2) + "\n")
        else:
            out.write(f"links from the {cfg.method}: ")
            out.write(render_scores(result.scores, cfg.gold))
            if result.by_method is not None:
                out.write(render_methods(result.by_method, cfg.symmetrization))


def _say_where_plots_went(directory: str, written: int, skipped: list[int]) -> None:
    """Where --plot-dir's plots went, and in one line the lines too long to plot (nmtkit.plots.MAX_PLOT_WORDS)."""
    from nmtkit.plots import MAX_PLOT_WORDS

    if skipped:
        shown = ", ".join(map(str, skipped[:20])) + (", …" if len(skipped) > 20 else "")
        click.echo(f"nmt-align: not plotted: line{'s' if len(skipped) > 1 else ''} {shown} (more than "
                   f"{MAX_PLOT_WORDS} words on a side: such a figure takes gigabytes of memory to draw)", err=True)
    click.echo(f"nmt-align: {written} attention plot{'' if written == 1 else 's'} in {directory} (index.tsv lists "
               "them)", err=True)


if __name__ == "__main__":
    main(prog_name="nmt-align")
