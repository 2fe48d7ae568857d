"""``nmt-align``: checkpoint + sentence pairs → attention plots (Figure 3), Pharaoh hard alignments, AER."""

from __future__ import annotations

import json
import os
import sys

import click

from nmtkit.cli import CONTEXT, ToolCommand, backend_option, run, setup_logging
from nmtkit.symmetrize import METHODS
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
@click.option("--model", "-m", required=True, type=click.Path(dir_okay=False), help="An RNNsearch checkpoint.")
@click.option("--source", "-s", required=True, type=click.Path(dir_okay=False), help="Source sentences.")
@click.option("--target", "-t", type=click.Path(dir_okay=False),
              help="Target sentences to force-decode [the model's own beam translations].")
@click.option("--tokenized", is_flag=True,
              help="The text is whitespace-separated words already (as gold alignments count them); only the "
                   "model's lowercasing and BPE are applied.")
@click.option("--pharaoh", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write hard alignments here, 'i-j' 0-based source-target [stdout when nothing else is asked].")
@click.option("--method", default="attention", show_default=True, type=click.Choice(["attention", "posterior"]),
              help="What links are read from: the attention α (the paper's Figure 3), or the posterior α_ij p(y_i | "
                   "c_i = h_j), normalised over j: the attention reweighted by how well each source word alone "
                   "predicts the target word (nmtkit/posterior.py; Tx times the computation, and it "
                   "aligns better: tests/bench/results/bench_posterior.txt).")
@click.option("--rule", default="argmax", show_default=True, type=click.Choice(["argmax", "threshold"]),
              help="Hard links: the most attended source word per target word, or also every α >= --threshold.")
@click.option("--threshold", default=0.5, show_default=True,
              help="Weight threshold of --rule threshold (of α, or of the posterior with --method posterior).")
@click.option("--plot-dir", type=click.Path(file_okay=False),
              help="Draw each sentence's α here, one image per sentence (with an index.tsv).")
@click.option("--plot-format", default="png", show_default=True, type=click.Choice(["png", "pdf", "svg"]))
@click.option("--plot-sentences", metavar="LINES", help="Which lines to draw, e.g. 1,3,5-9 [all].")
@click.option("--force", is_flag=True, help="Replace an earlier --plot-dir.")
@click.option("--gold", type=click.Path(dir_okay=False), help="Gold alignments to compute AER against (needs -t).")
@click.option("--gold-format", default="auto", show_default=True, type=click.Choice(["auto", "pharaoh", "naacl"]),
              help="Pharaoh (i-j Sure, i-j-P Possible, 0-based) or NAACL 2003 (sent a b S|P, 1-based).")
@click.option("--gold-order", default="src-tgt", show_default=True, type=click.Choice(["src-tgt", "tgt-src"]),
              help="Which side the gold file writes first.")
@click.option("--reverse-model", type=click.Path(dir_okay=False),
              help="An RNNsearch of the other direction (target to source): the target sentences are aligned to the "
                   "source by it too, and the two directions' links symmetrised (needs -t).")
@click.option("--symmetrize", "symmetrization", default="grow-diag-final", show_default=True,
              type=click.Choice(list(METHODS)),
              help="How --reverse-model's links and the model's are combined (Koehn et al. 2003; Moses's symal), or "
                   "'soft': their attention, before links are read off (nmtkit/symmetrize.py); the AER report lists "
                   "every way.")
@click.option("--beam", default=DecodeConfig.beam, show_default=True,
              help="Beam size for the model's translations (no -t).")
@click.option("--batch-size", default=32, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@backend_option("alignments")
@click.option("--json", "as_json", is_flag=True, help="Print the AER report as JSON.")
@click.option("--quiet", "-q", is_flag=True)
def main(model, source, target, tokenized, pharaoh, method, rule, threshold, plot_dir, plot_format, plot_sentences,
         force, gold, gold_format, gold_order, reverse_model, symmetrization, beam, batch_size, device, backend,
         as_json, quiet):
    """Soft and hard word alignments of an RNNsearch model, by forced decoding of given sentence pairs.

    Lines wrapped as '<s snum=N> ... </s>' (the NAACL 2003 Hansards gold sets) are unwrapped. The report (AER,
    precision, recall) goes to stdout, or to stderr when the Pharaoh alignments do.

    \b
      nmt-align -m model.pt -s test.en -t test.fr --plot-dir plots --plot-sentences 1-4 --pharaoh test.align
      nmt-align -m model.pt -s trial.e -t trial.f --tokenized --gold trial.align --gold-order tgt-src
      nmt-align -m en-fr.pt --reverse-model fr-en.pt -s trial.e -t trial.f --tokenized --gold trial.align
      nmt-align -m model.pt -s trial.e -t trial.f --tokenized --gold trial.align --method posterior
    """
    args = dict(locals())
    setup_logging(quiet)
    run("nmt-align", lambda: _align(**args))


def _align(model, source, target, tokenized, pharaoh, method, rule, threshold, plot_dir, plot_format, plot_sentences,
           force, gold, gold_format, gold_order, reverse_model, symmetrization, beam, batch_size, device, backend,
           as_json, quiet):
    from nmtkit.align import Aligner, align_files, check_reverse
    from nmtkit.files import atomic_file, check_distinct
    from nmtkit.translate.wordalign import pharaoh as pharaoh_line

    if plot_sentences is not None and plot_dir is None:
        from nmtkit.errors import InputError

        raise InputError("--plot-sentences chooses what --plot-dir draws: give --plot-dir DIR")
    if pharaoh is None and plot_dir is None and gold is None:
        pharaoh = "-"
    check_distinct({"--pharaoh": pharaoh, "--plot-dir": plot_dir},
                   {"--model": model, "--source": source, "--target": target, "--gold": gold,
                    "--reverse-model": reverse_model})
    aligner = Aligner(model, device=device, tokenized=tokenized, batch_size=batch_size, decode=DecodeConfig(beam=beam),
                      backend=backend, method=method)
    reverse = None
    if reverse_model is not None:
        reverse = Aligner(reverse_model, device=device, tokenized=tokenized, batch_size=batch_size, backend=backend,
                          method=method)
        check_reverse(aligner, reverse, reverse_model)
    if plot_dir is not None:  # check the directory and the line numbers before the model runs
        from nmtkit.align import read_text
        from nmtkit.plots import check_plot_dir

        check_plot_dir(plot_dir, force)
        plot_lines = parse_ranges(plot_sentences, len(read_text(source)))
    result = align_files(aligner, source, target, gold, gold_format, gold_order, rule, threshold, reverse,
                         symmetrization)
    if plot_dir is not None:
        from nmtkit.plots import write_attention_plots

        items = []
        for line in plot_lines:
            s, a = result.sentences[line - 1], result.soft[line - 1]
            title = f"{os.path.basename(source)}: {s.name}"
            items.append((line, title, a.source + ["</s>"], a.target + ["</s>"], a.alpha))
        write_attention_plots(plot_dir, items, plot_format, force=force)
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
            report = {"gold": gold, "sentences": len(result.sentences), "method": method, **result.scores.to_dict()}
            if result.by_method is not None:
                report.update(symmetrization=symmetrization,
                              by_method={k: v.to_dict() for k, v in result.by_method.items()})
            out.write(json.dumps(report, indent=2) + "\n")
        else:
            out.write(f"links from the {method}: ")
            out.write(render_scores(result.scores, gold))
            if result.by_method is not None:
                out.write(render_methods(result.by_method, symmetrization))


if __name__ == "__main__":
    main(prog_name="nmt-align")
