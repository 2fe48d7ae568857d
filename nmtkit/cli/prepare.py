"""``nmt-prepare``: raw parallel text → a prepared directory (vocabularies, binarized corpora, manifest)."""

from __future__ import annotations

import click

from nmtkit.cli import CONTEXT, ToolCommand, run, setup_logging


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.option("--source-lang", "-s", required=True, help="Source language code, the suffix of source files (en).")
@click.option("--target-lang", "-t", required=True, help="Target language code (fr).")
@click.option("--train", "train", multiple=True, required=True, metavar="PREFIX",
              help="Training corpus PREFIX (PREFIX.en/PREFIX.fr; plain, .gz or WMT SGML), or SRC_FILE,TGT_FILE. "
                   "Repeat to concatenate corpora.")
@click.option("--valid", metavar="PREFIX", help="Validation corpus (never filtered or reordered).")
@click.option("--test", "test", multiple=True, metavar="PREFIX",
              help="Test corpus; repeat for several (splits test, test1, ...). Never filtered or reordered.")
@click.option("--dest", "-d", required=True, type=click.Path(file_okay=False), help="Directory to create.")
@click.option("--src-vocab-size", type=int,
              help="Source shortlist: the K most frequent training tokens (4 specials are added) [30000; not with "
                   "--vocab-from].")
@click.option("--tgt-vocab-size", type=int, help="Target shortlist size K [30000; not with --vocab-from].")
@click.option("--max-len", default=50, show_default=True,
              help="Drop training pairs with a side longer than this many tokens (the paper: 30 or 50).")
@click.option("--lowercase", is_flag=True, help="Lowercase after tokenisation.")
@click.option("--no-normalize", is_flag=True, help="Skip Moses punctuation normalisation.")
@click.option("--aggressive-dash-splits", is_flag=True, help="Split hyphenated words (tokenizer.perl -a).")
@click.option("--bpe-merges", type=int, metavar="N", help="Learn N joint BPE merges on the training data.")
@click.option("--bpe-codes", type=click.Path(dir_okay=False), metavar="FILE", help="Apply these subword-nmt codes.")
@click.option("--bpe-dropout", default=0.0, show_default=True, metavar="P",
              help="Prepare for training with BPE-dropout P (nmt-train applies it): the shortlists also count "
                   "one dropout segmentation of the training pairs, so they hold the units dropout makes.")
@click.option("--spm-vocab-size", type=int, metavar="N",
              help="Learn a joint SentencePiece model of N units on the training words (instead of BPE).")
@click.option("--spm-type", type=click.Choice(["unigram", "bpe"]), default="unigram", show_default=True,
              help="SentencePiece's model type, with --spm-vocab-size.")
@click.option("--spm-split-digits", is_flag=True,
              help="With --spm-vocab-size: every digit is a unit of its own, so that a number is spelt digit by "
                   "digit in both languages and a model can copy numbers it never saw.")
@click.option("--spm-model", type=click.Path(dir_okay=False), metavar="FILE",
              help="Apply this SentencePiece model (a .model file) to the Moses words.")
@click.option("--vocab-from", type=click.Path(file_okay=False), metavar="DIR",
              help="Reuse another prepared directory's vocabularies and subword model (to fine-tune its models here "
                   "with nmt-train --init-from).")
@click.option("--max-ratio", type=float, metavar="R",
              help="Drop training pairs one side of which has more than R times the other's tokens "
                   "(clean-corpus-n.perl's ratio; Moses uses 9) [off].")
@click.option("--dedup", is_flag=True, help="Drop training pairs that repeat an earlier pair exactly.")
@click.option("--workers", "-j", default=1, show_default=True, help="Tokenise in this many processes.")
@click.option("--force", is_flag=True, help="Replace DEST if it already holds a prepared corpus.")
@click.option("--quiet", "-q", is_flag=True, help="Report only warnings and errors.")
def main(source_lang, target_lang, train, valid, test, dest, src_vocab_size, tgt_vocab_size, max_len, lowercase,
         no_normalize, aggressive_dash_splits, bpe_merges, bpe_codes, bpe_dropout, spm_vocab_size, spm_type,
         spm_split_digits, spm_model, vocab_from, max_ratio, dedup, workers, force, quiet):
    """Tokenise, filter, build shortlist vocabularies and binarize a parallel corpus into DEST.

    \b
    Example (the paper's setting: words, 30,000-word shortlists, training pairs of at most 50 words):
      nmt-prepare -s en -t fr --train data/train --valid data/newstest2013 \\
          --test data/newstest2014 --dest data-bin/wmt14 --workers 2
    """
    from nmtkit.prepare import PrepareConfig, prepare

    setup_logging(quiet)
    cfg = PrepareConfig(
        source_lang=source_lang, target_lang=target_lang, train=list(train), valid=valid, test=list(test),
        dest=dest, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, max_len=max_len,
        lowercase=lowercase, normalize_punctuation=not no_normalize, aggressive_dash_splits=aggressive_dash_splits,
        bpe_merges=bpe_merges, bpe_codes=bpe_codes, bpe_dropout=bpe_dropout, spm_vocab_size=spm_vocab_size,
        spm_type=spm_type, spm_split_digits=spm_split_digits, spm_model=spm_model, vocab_from=vocab_from, max_ratio=max_ratio, dedup=dedup,
        workers=workers, force=force,
    )
    run("nmt-prepare", lambda: prepare(cfg))


if __name__ == "__main__":
    main()
