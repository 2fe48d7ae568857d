"""The settings of a training run (:class:`TrainConfig`, the paper's recipe by default) and where a run stands
(:class:`TrainState`, saved in every checkpoint for resuming)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from nmtkit.errors import InputError
from nmtkit.models.registry import BACKENDS, default_backend
from nmtkit.train.recipes import RECIPES, default_recipe, recipe_settings
from nmtkit.train.registry import INITS, OPTIMIZERS, SCHEDULES
METRICS = ("bleu", "loss")


@dataclass
class TrainConfig:
    """Every setting of a training run; the defaults are the paper's recipe."""

    data: str
    arch: str
    save_dir: str
    model_options: dict = field(default_factory=dict)  # overrides of the model config (emb_dim=…, dropout=…)
    recipe: str = "paper"  # the recipe the settings came from (nmtkit.train.recipes; recorded, the fields rule)
    init: str = "paper"  # weight initialisation (nmtkit.train.registry.INITS): Appendix B.1 or Glorot
    label_smoothing: float = 0.0  # ε: train on the cross-entropy against (1 − ε)·onehot(y) + ε/V; 0 = the paper's
    bpe_dropout: float | None = None  # skip each BPE merge of the training pairs with this probability
    #   (nmtkit.data.bpedropout); None = the prepared corpus's (nmt-prepare --bpe-dropout), 0 when it has none
    guided_alignment: str | None = None  # a Pharaoh file of word links, one line per line of train.tok.*: train the
    #   attention towards them (nmtkit.train.guided)
    guided_alignment_order: str = "src-tgt"  # which side its links name first
    guided_alignment_weight: float = 0.1  # λ: the weight of the attention's cross-entropy (per guided row) in the loss
    seed: int = 1
    batch_size: int = 80
    pool_batches: int = 20  # minibatches per length-sorted pool (the paper: 20, i.e. 1,600 pairs)
    max_len: int | None = None  # train on pairs of at most this many tokens per side (default: the model's)
    update_freq: int = 1  # minibatches per update (gradient accumulation: the update of one N times as large)
    init_from: str | None = None  # a checkpoint whose weights start a new run (not --resume: a fresh optimizer)
    optimizer: str = "adadelta"  # nmtkit.train.registry.OPTIMIZERS
    lr: float = 1.0
    lr_scheduler: str = "constant"  # nmtkit.train.registry.SCHEDULES: constant, inverse-sqrt, linear, cosine, ...
    warmup_updates: int = 0  # linear warm-up over the first N updates (lr·u/N), with every scheduler
    lr_decay: float = 0.5  # plateau: the factor of each decay
    lr_patience: int = 1  # plateau: decay after this many validations without improvement
    min_lr: float = 0.0  # the floor of the decaying schedules (after warm-up)
    schedule_updates: int = 0  # linear, cosine: the update at which the rate reaches min_lr; 0 = max_updates, and/or
    #   the time budget (max_time), whichever comes first
    decay_fraction: float = 1.0  # linear, cosine: decay over this last part of the span, holding lr before
    ema_decay: float = 0.0  # validate and save an exponential moving average of the weights; 0 = off
    average_last: int = 0  # validate and save the mean of the weights at the last N validations; 0 = off
    rho: float = 0.95  # Adadelta's decay
    eps: float = 1e-6  # Adadelta's ε
    clip_norm: float = 1.0  # rescale the gradient to this L2 norm when larger; 0 = never
    max_updates: int = 0  # 0 = no limit
    max_epochs: int = 0
    max_time: float = 0.0  # seconds of training (updates and scheduled validations, across resumptions), 0 = none
    valid_every: int = 1000
    valid_bleu_sentences: int = 500  # BLEU on the first N validation sentences; 0 = no BLEU, -1 = all
    valid_beam: int = 1  # beam size of that decoding (1 = greedy)
    valid_batch_size: int = 80
    best_metric: str = "bleu"
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    keep_last: int = 3
    log_every: int = 100
    log_file: str | None = None  # JSON lines; default SAVE_DIR/train.jsonl
    tensorboard: str | None = None  # also write the log's records as TensorBoard events in this directory
    device: str = "cpu"
    bf16: bool = False
    backend: str | None = None  # nmtkit.models.BACKENDS: how the model computes (None: $NMTKIT_BACKEND, else fast)
    threads: int = 0  # torch intra-op threads; 0 = measured as the run goes (nmtkit.threads)
    resume: bool = False
    force: bool = False

    @property
    def horizon(self) -> int:
        """The update at which a linear or cosine schedule reaches ``min_lr`` (0: none, the time budget's)."""
        return self.schedule_updates or self.max_updates

    @property
    def time_horizon(self) -> float:
        """The seconds at which a linear or cosine schedule reaches ``min_lr``: the time budget, unless
        ``--schedule-updates`` names the update (0: none)."""
        return 0.0 if self.schedule_updates else self.max_time

    def check(self) -> None:
        OPTIMIZERS.check(self.optimizer)
        if self.recipe not in RECIPES:
            raise InputError(f"unknown recipe '{self.recipe}' (choose from {', '.join(RECIPES)})")
        if self.backend is not None and self.backend not in BACKENDS:
            raise InputError(f"unknown --backend '{self.backend}' (choose from {', '.join(BACKENDS)})")
        if self.backend is None:
            try:
                default_backend()  # ($NMTKIT_BACKEND, checked before anything is written)
            except ValueError as e:
                raise InputError(str(e)) from None
        INITS.check(self.init)
        if self.best_metric not in METRICS:
            raise InputError(f"unknown metric '{self.best_metric}' (choose from {', '.join(METRICS)})")
        SCHEDULES.check(self.lr_scheduler)
        for name in ("batch_size", "pool_batches", "valid_every", "valid_batch_size", "keep_last", "log_every",
                     "valid_beam", "lr_patience", "update_freq"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        for name, ok, want in (("warmup_updates", self.warmup_updates >= 0, "at least 0"),
                               ("average_last", self.average_last >= 0, "at least 0"),
                               ("lr_decay", 0 < self.lr_decay < 1, "in (0, 1)"),
                               ("decay_fraction", 0 < self.decay_fraction <= 1, "in (0, 1]"),
                               ("min_lr", 0 <= self.min_lr < math.inf, "finite and at least 0"),
                               ("ema_decay", 0 <= self.ema_decay < 1, "in [0, 1)"),
                               ("label_smoothing", 0 <= self.label_smoothing < 1, "in [0, 1)"),
                               ("bpe_dropout", self.bpe_dropout is None or 0 <= self.bpe_dropout < 1, "in [0, 1)"),
                               ("guided_alignment_weight", 0 < self.guided_alignment_weight < math.inf,
                                "a finite number above 0"),
                               ("lr", 0 <= self.lr < math.inf, "finite and at least 0"),
                               ("rho", 0 < self.rho < 1, "in (0, 1)"),
                               ("eps", 0 < self.eps < math.inf, "a finite number above 0"),
                               ("clip_norm", 0 <= self.clip_norm < math.inf, "finite and at least 0 (0 = never)"),
                               ("max_time", 0 <= self.max_time < math.inf, "finite and at least 0 (0 = no limit)"),
                               ("max_updates", self.max_updates >= 0, "at least 0 (0 = no limit)"),
                               ("schedule_updates", self.schedule_updates >= 0, "at least 0 (0 = --max-updates)"),
                               ("max_epochs", self.max_epochs >= 0, "at least 0 (0 = no limit)"),
                               ("patience", self.patience >= 0, "at least 0 (0 = never stop early)"),
                               ("threads", self.threads >= 0, "at least 0 (0 = measured)"),
                               ("valid_bleu_sentences", self.valid_bleu_sentences >= -1, "at least -1 (-1 = all)"),
                               ("max_len", self.max_len is None or self.max_len >= 1, "at least 1")):
            if not ok:
                raise InputError(f"--{name.replace('_', '-')} must be {want} (got {getattr(self, name)})")
        from nmtkit.train.schedule import schedule_class

        if schedule_class(self.lr_scheduler).budgeted and self.horizon <= self.warmup_updates and not self.time_horizon:
            raise InputError(f"--lr-scheduler {self.lr_scheduler} decays to --min-lr at the end of the run: it needs "
                             f"--schedule-updates or --max-updates above --warmup-updates (got {self.horizon} and "
                             f"{self.warmup_updates}), or a time budget (--max-time)")
        if self.guided_alignment_order not in ("src-tgt", "tgt-src"):
            raise InputError(f"unknown --guided-alignment-order '{self.guided_alignment_order}' (src-tgt or tgt-src)")
        if self.ema_decay and self.average_last:
            raise InputError("--ema-decay and --average-last exclude each other (choose one averaging)")
        if self.keep_last < self.average_last:
            raise InputError(f"--keep-last ({self.keep_last}) must be at least --average-last ({self.average_last}): "
                             "a resumed run reads the raw weights of the averaged checkpoints back")
        if self.resume and self.force:
            raise InputError("--resume and --force exclude each other")
        if self.resume and self.init_from:
            raise InputError("--resume continues a run with its own weights; --init-from starts a new one: choose one")


def check_given(cfg: TrainConfig, given: set[str]) -> None:
    """The settings given explicitly (``given``: field names; nmt-train's options not left at their defaults) are read
    by this run: a setting that only another optimizer or schedule reads (``--rho`` with Adam) is an error, not a
    silently ignored option."""
    for registry, chosen in ((OPTIMIZERS, cfg.optimizer), (SCHEDULES, cfg.lr_scheduler), (INITS, cfg.init)):
        own = set(registry[chosen].settings)
        for name in registry.names():
            for setting in sorted(set(registry[name].settings) & given - own):
                readers = [n for n in registry.names() if setting in registry[n].settings]
                raise InputError(f"--{setting.replace('_', '-')} is read by {registry.option} "
                                 f"{' or '.join(readers)} only; this run's is {chosen}")
    for setting in sorted(given & {"guided_alignment_order", "guided_alignment_weight"}):
        if not cfg.guided_alignment:
            raise InputError(f"--{setting.replace('_', '-')} is read with --guided-alignment only, which is not given")


# the settings of the updates themselves: a resumed run that changes one is warned (a checkpoint from before one of
# them existed ran with its default)
TRAINING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                     if f.name in ("lr", "lr_scheduler", "warmup_updates", "lr_decay", "lr_patience", "min_lr",
                                   "decay_fraction", "clip_norm", "rho", "eps",
                                   "ema_decay", "average_last", "label_smoothing",
                                   "guided_alignment_order", "guided_alignment_weight")}
TRAINING_DEFAULTS["bpe_dropout"] = 0.0  # (recorded as resolved: a checkpoint from before it trained without)


@dataclass
class TrainState:
    """Where a run is; saved in every checkpoint for resuming."""

    update: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # minibatches of the current epoch already trained on
    elapsed: float = 0.0  # seconds of training so far (across resumptions)
    best: float | None = None  # the best metric of the scheduled validations (every valid_every updates) ...
    best_update: int = 0
    bad_validations: int = 0  # ... and how many since it: what patience and the schedules count
    best_saved: float | None = None  # the metric of what checkpoint_best.pt holds (any validation: an interrupted
    best_saved_update: int = 0  # run's last one too, which must not change what patience counts)
    history: list = field(default_factory=list)  # one dict per validation


def train_config(data: str, arch: str, save_dir: str, recipe: str | None = None, **settings: Any) -> TrainConfig:
    """A :class:`TrainConfig` with a recipe's settings (default: :func:`nmtkit.train.recipes.default_recipe` of
    ``arch``), overridden by those given here."""
    name = default_recipe(arch) if recipe is None else recipe
    return TrainConfig(data=data, arch=arch, save_dir=save_dir, recipe=name,
                       **{**recipe_settings(name), **settings})
