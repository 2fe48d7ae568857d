"""``nmt-select``: cross-entropy-difference data selection (Axelrod et al., 2011; Moore & Lewis, 2010)."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, run, setup_logging


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.option("--source-lang", "-s", required=True, help="Source language code, the suffix of source files (en).")
@click.option("--target-lang", "-t", help="Target language code (fr); leave out for monolingual corpora.")
@click.option("--in-domain", "in_domain", multiple=True, required=True, metavar="PREFIX",
              help="In-domain corpus PREFIX (PREFIX.en/PREFIX.fr; plain, .gz or WMT SGML) or SRC_FILE,TGT_FILE. "
                   "Repeat to concatenate.")
@click.option("--general", "general", multiple=True, required=True, metavar="PREFIX",
              help="General corpus to select from (streamed, any size); repeat to concatenate.")
@click.option("--top-words", type=int, metavar="N",
              help="Select the best pairs until they hold N source words (tokens; target words with --side target).")
@click.option("--top-pairs", type=int, metavar="N", help="Select the N best pairs.")
@click.option("--threshold", type=float, metavar="X", help="Select every pair whose score is below X.")
@click.option("--side", type=click.Choice(["both", "source", "target"]), default="both", show_default=True,
              help="Score both sides (Axelrod et al.) or one side only (Moore & Lewis).")
@click.option("--order", default=4, show_default=True, help="N-gram order of the language models.")
@click.option("--min-count", default=2, show_default=True,
              help="LM vocabulary: in-domain words seen at least this often; the others are <unk>.")
@click.option("--heldout-every", default=10, show_default=True, metavar="K",
              help="Hold out every K-th in-domain pair to report perplexities (0: none).")
@click.option("--seed", default=1, show_default=True,
              help="Seed of the random general-corpus samples for the general LMs (one per half of the pairs).")
@click.option("--workers", "-j", default=1, show_default=True, help="Tokenise and score in this many processes.")
@click.option("--output", "-o", required=True, metavar="OUT_PREFIX",
              help="Writes OUT_PREFIX.<lang> (the selected lines), OUT_PREFIX.scores and OUT_PREFIX.report.json.")
@click.option("--scores", type=click.Path(dir_okay=False), metavar="FILE",
              help="Where the per-pair scores go [OUT_PREFIX.scores].")
@click.option("--write-arpa", is_flag=True, help="Also write the LMs as OUT_PREFIX.{in,gen0,gen1}.<lang>.arpa (genK scores the pairs of fold K).")
@click.option("--lowercase", is_flag=True, help="Lowercase after tokenisation (as nmt-prepare --lowercase).")
@click.option("--no-normalize", is_flag=True, help="Skip Moses punctuation normalisation.")
@click.option("--aggressive-dash-splits", is_flag=True, help="Split hyphenated words (tokenizer.perl -a).")
@click.option("--quiet", "-q", is_flag=True, help="Report only warnings and errors.")
def main(source_lang, target_lang, in_domain, general, top_words, top_pairs, threshold, side, order, min_count,
         heldout_every, seed, workers, output, scores, write_arpa, lowercase, no_normalize, aggressive_dash_splits,
         quiet):
    """Select the general-corpus pairs most like the in-domain data: score = [H_in(src) - H_gen(src)] +
    [H_in(tgt) - H_gen(tgt)] with 4-gram modified Kneser-Ney LMs, lowest first.

    \b
    Example (the paper's data selection, keeping 348M of 850M words):
      nmt-select -s en -t fr --in-domain data/news --general data/europarl --general data/un \\
          --top-words 348000000 -o data/selected --workers 2
    """
    from nmtkit.select.selection import SelectConfig, select

    setup_logging(quiet)
    cfg = SelectConfig(
        source_lang=source_lang, target_lang=target_lang, in_domain=list(in_domain), general=list(general),
        output=output, side=side, top_words=top_words, top_pairs=top_pairs, threshold=threshold, order=order,
        min_count=min_count, heldout_every=heldout_every, seed=seed, workers=workers, scores=scores,
        write_arpa=write_arpa, lowercase=lowercase, normalize_punctuation=not no_normalize,
        aggressive_dash_splits=aggressive_dash_splits,
    )
    run("nmt-select", lambda: select(cfg))


if __name__ == "__main__":
    main()
