"""nmt-select's settings, checked before any input is read, its output paths, and the folds that keep each general
pair away from the model trained on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmtkit.errors import InputError

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
    """Every setting of a selection run (the click command fills this from its options)."""

    source_lang: str
    in_domain: list[str]
    general: list[str]
    output: str  # prefix: OUTPUT.<lang>, OUTPUT.scores, OUTPUT.report.json
    target_lang: str | None = None  # None: monolingual corpora of the source language
    side: str = "both"  # both (Axelrod et al.), source or target (Moore & Lewis)
    top_words: int | None = None
    top_pairs: int | None = None
    threshold: float | None = None
    order: int = 4
    min_count: int = 2
    heldout_every: int = 10
    seed: int = 1
    workers: int = 1
    scores: str | None = None  # default OUTPUT.scores
    write_arpa: bool = False  # OUTPUT.{in,gen0,gen1}.<lang>.arpa
    lowercase: bool = False
    normalize_punctuation: bool = True
    aggressive_dash_splits: bool = False

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
