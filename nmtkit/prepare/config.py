"""nmt-prepare's settings, checked (:meth:`PrepareConfig.check`) before any input is read."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmtkit.errors import InputError
from nmtkit.settings import setting

DEFAULT_SHORTLIST = 30000  # the paper's shortlists: the 30,000 most frequent words of each language
SPM_TYPES = ("unigram", "bpe")  # SentencePiece's model types


@dataclass
class PrepareConfig:
    """Every setting of a preparation run: one field per option of ``nmt-prepare`` (:mod:`nmtkit.settings`)."""

    source_lang: str = setting(help="Source language code, the suffix of source files (en).", short="-s")
    target_lang: str = setting(help="Target language code (fr).", short="-t")
    train: list[str] = setting(
        help="Training corpus PREFIX (PREFIX.en/PREFIX.fr; plain, .gz or WMT SGML), or SRC_FILE,TGT_FILE. Repeat to "
             "concatenate corpora.", metavar="PREFIX")
    dest: str = setting(help="Directory to create.", short="-d", path="dir")
    valid: str | None = setting(None, "Validation corpus (never filtered or reordered).", metavar="PREFIX")
    test: list[str] = setting(
        help="Test corpus; repeat for several (splits test, test1, ...). Never filtered or reordered.",
        metavar="PREFIX", default_factory=list)
    src_vocab_size: int | None = setting(
        None, "Source shortlist: the K most frequent training tokens (4 specials are added) [30000; not with "
              "--vocab-from].")
    tgt_vocab_size: int | None = setting(None, "Target shortlist size K [30000; not with --vocab-from].")
    #   (None: DEFAULT_SHORTLIST; either refused with vocab_from, which brings its directory's)
    max_len: int = setting(
        50, "Drop training pairs with a side longer than this many tokens (the paper: 30 or 50).")
    lowercase: bool = setting(False, "Lowercase after tokenisation.")
    normalize_punctuation: bool = setting(True, "Skip Moses punctuation normalisation.", flag="--no-normalize")
    aggressive_dash_splits: bool = setting(False, "Split hyphenated words (tokenizer.perl -a).")
    bpe_merges: int | None = setting(None, "Learn N joint BPE merges on the training data.", metavar="N")
    bpe_codes: str | None = setting(None, "Apply these subword-nmt codes.", metavar="FILE", path=True)
    bpe_dropout: float = setting(
        0.0, "Prepare for training with BPE-dropout P (nmt-train applies it): the shortlists also count one dropout "
             "segmentation of the training pairs, so they hold the units dropout makes.", metavar="P")
    spm_vocab_size: int | None = setting(
        None, "Learn a joint SentencePiece model of N units on the training words (instead of BPE).", metavar="N")
    spm_type: str = setting("unigram", "SentencePiece's model type, with --spm-vocab-size.", choices=SPM_TYPES)
    spm_split_digits: bool = setting(
        False, "With --spm-vocab-size: every digit is a unit of its own, so that a number is spelt digit by digit in "
               "both languages and a model can copy numbers it never saw.")
    spm_model: str | None = setting(
        None, "Apply this SentencePiece model (a .model file) to the Moses words.", metavar="FILE", path=True)
    vocab_from: str | None = setting(
        None, "Reuse another prepared directory's vocabularies and subword model (to fine-tune its models here with "
              "nmt-train --init-from).", metavar="DIR", path="dir")
    #   (its vocabularies, BPE codes and text settings are reused)
    max_ratio: float | None = setting(
        None, "Drop training pairs one side of which has more than R times the other's tokens (clean-corpus-n.perl's "
              "ratio; Moses uses 9) [off].", metavar="R")
    dedup: bool = setting(False, "Drop training pairs that repeat an earlier pair exactly.")
    workers: int = setting(1, "Tokenise in this many processes.", short="-j")
    force: bool = setting(False, "Replace DEST if it already holds a prepared corpus.")

    def shortlist(self, lang: str) -> int:
        """The shortlist size of language ``lang`` (the source's or the target's)."""
        size = self.src_vocab_size if lang == self.source_lang else self.tgt_vocab_size
        return DEFAULT_SHORTLIST if size is None else size

    def check(self) -> None:
        if not self.source_lang or not self.target_lang or self.source_lang == self.target_lang:
            raise InputError(f"source and target languages must be two different codes "
                             f"(got '{self.source_lang}' and '{self.target_lang}')")
        if not self.train:
            raise InputError("at least one --train corpus is needed (the vocabularies come from it)")
        for name, value in (("--src-vocab-size", self.src_vocab_size), ("--tgt-vocab-size", self.tgt_vocab_size),
                            ("--max-len", self.max_len), ("--workers", self.workers)):
            if value is not None and value < 1:
                raise InputError(f"{name} must be at least 1 (got {value})")
        sizes = [name for name, v in (("--src-vocab-size", self.src_vocab_size),
                                      ("--tgt-vocab-size", self.tgt_vocab_size)) if v is not None]
        if self.vocab_from is not None and sizes:
            raise InputError(f"--vocab-from brings its directory's vocabularies, of their own sizes; drop "
                             f"{' and '.join(sizes)}")
        segmentations = [name for name, v in (("--bpe-merges", self.bpe_merges), ("--bpe-codes", self.bpe_codes),
                                               ("--spm-vocab-size", self.spm_vocab_size),
                                               ("--spm-model", self.spm_model)) if v is not None]
        if len(segmentations) > 1:
            raise InputError(f"{' and '.join(segmentations)} exclude each other (one subword segmentation)")
        if self.vocab_from is not None and segmentations:
            raise InputError(f"--vocab-from brings its directory's subword segmentation; drop {segmentations[0]}")
        if self.spm_vocab_size is not None and self.spm_vocab_size < 2:
            raise InputError(f"--spm-vocab-size must be at least 2 (got {self.spm_vocab_size})")
        if not 0 <= self.bpe_dropout < 1:
            raise InputError(f"--bpe-dropout must be in [0, 1) (got {self.bpe_dropout})")
        if self.bpe_dropout and self.bpe_merges is None and self.bpe_codes is None:
            raise InputError("--bpe-dropout needs BPE (--bpe-merges or --bpe-codes)"
                             + ("; --vocab-from brings its directory's vocabularies and BPE-dropout"
                                if self.vocab_from is not None else ""))
        if self.spm_split_digits and self.spm_vocab_size is None:
            raise InputError("--spm-split-digits is a setting of a SentencePiece model being learned: it needs "
                             "--spm-vocab-size")
        if self.spm_type not in SPM_TYPES:
            raise InputError(f"--spm-type must be unigram or bpe (got '{self.spm_type}')")
        if self.max_ratio is not None and not (1 <= self.max_ratio < math.inf):
            raise InputError(f"--max-ratio must be a finite number of at least 1 (got {self.max_ratio})")
        if self.bpe_merges is not None and self.bpe_merges < 1:
            raise InputError(f"--bpe-merges must be at least 1 (got {self.bpe_merges})")

