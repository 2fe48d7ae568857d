"""nmt-prepare's settings, checked (:meth:`PrepareConfig.check`) before any input is read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nmtkit.errors import InputError

DEFAULT_SHORTLIST = 30000  # the paper's shortlists: the 30,000 most frequent words of each language


@dataclass
class PrepareConfig:
    """Every setting of a preparation run (the click command fills this from its options)."""

    source_lang: str
    target_lang: str
    train: list[str]
    dest: str
    valid: str | None = None
    test: list[str] = field(default_factory=list)
    src_vocab_size: int | None = None  # the source shortlist: the K most frequent training tokens (None: 30,000)
    tgt_vocab_size: int | None = None  # (either refused with vocab_from, which brings its directory's)
    max_len: int = 50
    max_ratio: float | None = None  # drop training pairs whose token counts differ more than this factor (Moses)
    dedup: bool = False  # drop training pairs that repeat an earlier pair exactly (after tokenisation)
    lowercase: bool = False
    normalize_punctuation: bool = True
    aggressive_dash_splits: bool = False
    bpe_merges: int | None = None
    bpe_codes: str | None = None  # path of an existing codes file
    spm_vocab_size: int | None = None  # learn a joint SentencePiece model of this many units
    spm_model: str | None = None  # path of an existing SentencePiece model file
    spm_type: str = "unigram"  # SentencePiece's model type when learning one: unigram or bpe
    spm_split_digits: bool = False  # when learning one: every digit a unit of its own
    bpe_dropout: float = 0.0  # BPE-dropout the training will use: the shortlists also count one such segmentation
    vocab_from: str | None = None  # a prepared directory whose vocabularies, BPE codes and text settings are reused
    workers: int = 1
    force: bool = False

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
        if self.spm_type not in ("unigram", "bpe"):
            raise InputError(f"--spm-type must be unigram or bpe (got '{self.spm_type}')")
        if self.max_ratio is not None and not (1 <= self.max_ratio < math.inf):
            raise InputError(f"--max-ratio must be a finite number of at least 1 (got {self.max_ratio})")
        if self.bpe_merges is not None and self.bpe_merges < 1:
            raise InputError(f"--bpe-merges must be at least 1 (got {self.bpe_merges})")

