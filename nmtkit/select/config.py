"""nmt-select's settings, checked before any input is read, its output paths, and the folds that keep each general
pair away from the model trained on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmtkit.errors import InputError
from nmtkit.settings import setting

SIDES = ("both", "source", "target")
FOLDS = 2  # general model k scores the general pairs of fold k (fold_of), trained on a sample of the others


def fold_of(index: int) -> int:
    """The fold of the general pair at 0-based position ``index`` of the general input (all general corpora in
    order): the splitmix64 hash of the position mod FOLDS (neighbouring lines, often copies of each other, land
    in either fold independently), the same whatever the workers or the seed."""
    x = (index + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) % FOLDS


_MASK64 = (1 << 64) - 1


@dataclass
class SelectConfig:
    """Every setting of a selection run: one field per option of ``nmt-select`` (:mod:`nmtkit.settings`)."""

    source_lang: str = setting(help="Source language code, the suffix of source files (en).", short="-s")
    in_domain: list[str] = setting(
        help="In-domain corpus PREFIX (PREFIX.en/PREFIX.fr; plain, .gz or WMT SGML) or SRC_FILE,TGT_FILE. Repeat to "
             "concatenate.", metavar="PREFIX")
    general: list[str] = setting(
        help="General corpus to select from (streamed, any size); repeat to concatenate.", metavar="PREFIX")
    output: str = setting(
        help="Writes OUT_PREFIX.<lang> (the selected lines), OUT_PREFIX.scores and OUT_PREFIX.report.json.",
        short="-o", metavar="OUT_PREFIX")  # prefix: OUTPUT.<lang>, OUTPUT.scores, OUTPUT.report.json
    target_lang: str | None = setting(
        None, "Target language code (fr); leave out for monolingual corpora.", short="-t")
    #   (None: monolingual corpora of the source language)
    top_words: int | None = setting(
        None, "Select the best pairs until they hold N source words (tokens; target words with --side target).",
        metavar="N")
    top_pairs: int | None = setting(None, "Select the N best pairs.", metavar="N")
    threshold: float | None = setting(None, "Select every pair whose score is below X.", metavar="X")
    side: str = setting(
        "both", "Score both sides (Axelrod et al.) or one side only (Moore & Lewis).", choices=SIDES)
    order: int = setting(4, "N-gram order of the language models.")
    min_count: int = setting(2, "LM vocabulary: in-domain words seen at least this often; the others are <unk>.")
    heldout_every: int = setting(
        10, "Hold out every K-th in-domain pair to report perplexities (0: none).", metavar="K")
    seed: int = setting(
        1, "Seed of the random general-corpus samples for the general LMs (one per half of the pairs).")
    workers: int = setting(1, "Tokenise and score in this many processes.", short="-j")
    scores: str | None = setting(
        None, "Where the per-pair scores go [OUT_PREFIX.scores].", metavar="FILE", path=True)
    write_arpa: bool = setting(
        False, "Also write the LMs as OUT_PREFIX.{in,gen0,gen1}.<lang>.arpa (genK scores the pairs of fold K).")
    lowercase: bool = setting(False, "Lowercase after tokenisation (as nmt-prepare --lowercase).")
    normalize_punctuation: bool = setting(True, "Skip Moses punctuation normalisation.", flag="--no-normalize")
    aggressive_dash_splits: bool = setting(False, "Split hyphenated words (tokenizer.perl -a).")

    def check(self) -> None:
        if self.side not in SIDES:
            raise InputError(f"side must be one of {', '.join(SIDES)} (got '{self.side}')")
        if self.target_lang is None and self.side != "source":
            raise InputError("without a target language only --side source (monolingual selection) is possible")
        if self.target_lang is not None and self.target_lang == self.source_lang:
            raise InputError(f"source and target languages must differ (both are '{self.source_lang}')")
        if not self.in_domain or not self.general:
            raise InputError("at least one in-domain and one general corpus are needed")
        if sum(x is not None for x in (self.top_words, self.top_pairs, self.threshold)) != 1:
            raise InputError("give exactly one of --top-words, --top-pairs and --threshold")
        for name, value, low in (("--top-words", self.top_words, 1), ("--top-pairs", self.top_pairs, 1),
                                 ("--order", self.order, 2), ("--min-count", self.min_count, 1),
                                 ("--heldout-every", self.heldout_every, 0), ("--workers", self.workers, 1)):
            if value is not None and value < low:
                raise InputError(f"{name} must be at least {low} (got {value})")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise InputError(f"--threshold must be a finite number (got {self.threshold})")
        from nmtkit.files import check_distinct

        check_distinct({("--scores" if k == "scores" and self.scores else f"the -o file {v}"): v
                        for k, v in output_paths(self).items()})

    @property
    def langs(self) -> list[str]:
        """The languages read from the general corpus and written out."""
        return [self.source_lang] + ([self.target_lang] if self.target_lang else [])

    @property
    def scored(self) -> list[str]:
        """The languages whose cross-entropies make the score."""
        return {"both": self.langs, "source": [self.source_lang], "target": [self.target_lang]}[self.side]


def output_paths(cfg: SelectConfig) -> dict:
    out = cfg.output
    paths: dict = {lang: f"{out}.{lang}" for lang in cfg.langs}
    paths["scores"] = cfg.scores or f"{out}.scores"
    paths["report"] = f"{out}.report.json"
    if cfg.write_arpa:
        paths.update({(m, lang): f"{out}.{m}.{lang}.arpa" for m in ("in", *(f"gen{k}" for k in range(FOLDS)))
                      for lang in cfg.scored})
    return paths
