"""The settings of a training run (:class:`TrainConfig`, the paper's recipe by default) and where a run stands
(:class:`TrainState`, saved in every checkpoint for resuming)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from nmtkit.errors import InputError
from nmtkit.runtime import BACKEND_NAMES, backend_setting
from nmtkit.train.recipes import RECIPES, default_recipe, recipe_settings
from nmtkit.settings import model_backend, setting
from nmtkit.train.registry import INITS, OPTIMIZERS, SCHEDULES

METRICS = ("bleu", "loss")
MAX_SEED = 2**32 - 1  # (what every generator a run seeds takes: torch, numpy, Python's random)


@dataclass
class TrainConfig:
    """Every setting of a training run; the defaults are the paper's recipe.  One field per option of
    ``nmt-train`` (:mod:`nmtkit.settings`: its help, metavar and choices are written here, once)."""

    data: str
    arch: str
    save_dir: str
    model_options: dict = field(default_factory=dict)  # overrides of the model config (emb_dim=…, dropout=…)
    # (the options of nmt-train, in its --help's order; --optimizer, --lr-scheduler and --init are declared by
    # nmt-train from the registries, nmtkit/train/registry.py)
    recipe: str = setting(
        "paper", "Training recipe: the paper's (Adadelta, Appendix B.1 init); 'fast', which learns within a CPU "
                 "budget (Glorot init, Adam 1e-3); 'budget', fast annealed to its floor as --max-time or "
                 "--max-updates runs out (see nmtkit/train/recipes.py). Options given explicitly win over it. "
                 "[fast for rnnsearch-small/rnnencdec-small, else paper]", choices=tuple(RECIPES))
    # (the recipe the settings came from, nmtkit.train.recipes; recorded, the fields rule)
    init: str = "paper"  # weight initialisation (nmtkit.train.registry.INITS): Appendix B.1 or Glorot
    seed: int = setting(1, f"Random seed of the initialisation, the batches and dropout (0 to {MAX_SEED:,}).")
    batch_size: int = setting(80, "Sentence pairs per minibatch.")
    pool_batches: int = setting(20, "Minibatches per length-sorted pool (the paper: 20 x 80 = 1,600 pairs).")
    max_len: int | None = setting(
        None, "Train on pairs of at most this many tokens a side [the model's: 30/50].")
    update_freq: int = setting(
        1, "Minibatches per update (gradient accumulation): the update of one batch N times as large.")
    init_from: str | None = setting(
        None, "Start a new run from this checkpoint's weights (fine-tuning): new optimizer, schedule and data; its "
              "vocabularies must be the data's (nmt-prepare --vocab-from). --resume continues a run instead.",
        metavar="CKPT", path=True)
    optimizer: str = "adadelta"  # nmtkit.train.registry.OPTIMIZERS
    lr: float = setting(1.0, "Learning rate (Adadelta: 1.0).")
    lr_scheduler: str = "constant"  # nmtkit.train.registry.SCHEDULES: constant, inverse-sqrt, linear, cosine, ...
    warmup_updates: int = setting(0, "Linear warm-up: lr·u/N for the first N updates (any scheduler; 0 = none).")
    lr_decay: float = setting(0.5, "plateau: factor of each decay.")
    lr_patience: int = setting(
        1, "plateau: decay after this many validations without improvement of --best-metric.")
    min_lr: float = setting(0.0, "Floor of the decaying schedules (after warm-up).")
    decay_fraction: float = setting(
        1.0, "linear, cosine: hold lr, then decay over the last F of the run (warm-up, stable, decay); 1 = decay "
             "from the end of the warm-up.", metavar="F")
    schedule_updates: int = setting(
        0, "linear, cosine: the update at which the rate reaches --min-lr (0 = --max-updates). Set it to stop a run "
           "early with --max-updates and resume it on the same schedule.", metavar="T")
    #   (0: max_updates, and/or the time budget, max_time, whichever comes first)
    ema_decay: float = setting(
        0.0, "Validate and save an exponential moving average of the weights with this decay (e.g. 0.999; 0 = off). "
             "The raw weights stay in the checkpoint for --resume.")
    average_last: int = setting(
        0, "Validate and save the mean of the weights at the last N validations (0 = off; needs --keep-last >= N).")
    rho: float = setting(0.95, "Adadelta decay rate.")
    eps: float = setting(1e-6, "Adadelta epsilon.")
    label_smoothing: float = setting(
        0.0, "Label smoothing ε: cross-entropy against (1-ε)·onehot + ε/V (0 = the paper's loss).")
    bpe_dropout: float | None = setting(
        None, "BPE-dropout: segment the training pairs anew in every epoch, skipping each merge with probability P "
              "(Provilkov et al. 2020; 0.1 is usual; needs BPE data; 0 = off). Translation keeps the deterministic "
              "segmentation. [the prepared corpus's nmt-prepare --bpe-dropout]", metavar="P")
    #   (nmtkit.data.bpedropout; None = the prepared corpus's, 0 when it has none)
    guided_alignment: str | None = setting(
        None, "Guided alignment (Chen et al. 2016): also train the attention towards these word links, a Pharaoh "
              "file with one line per line of the prepared train.tok.* (e.g. eflomal's on them; "
              "examples/guide_links.py). RNNsearch only.", metavar="FILE", path="existing")
    #   (nmtkit.train.guided)
    guided_alignment_order: str = setting(
        "src-tgt", "Which side the links of --guided-alignment name first.", choices=("src-tgt", "tgt-src"))
    guided_alignment_weight: float = setting(
        0.1, "λ: the weight of the attention's cross-entropy against the links, per guided target unit, beside each "
             "target unit's translation loss (Marian's default scale).")
    clip_norm: float = setting(1.0, "Rescale gradients to this L2 norm; 0 = off.")
    max_updates: int = setting(0, "Stop after this many updates (0 = no limit).")
    max_epochs: int = setting(0, "Stop after this many epochs (0 = no limit).")
    max_time: float = setting(
        0.0, "Stop after this many seconds of training (updates and validations, across resumptions; 0 = no limit). "
             "linear and cosine then reach --min-lr when the time runs out, at the update rate measured.")
    valid_every: int = setting(1000, "Validate and save every N updates.")
    valid_bleu_sentences: int = setting(500, "Greedy BLEU on the first N validation sentences (0 = none, -1 = all).")
    valid_beam: int = setting(1, "Beam size of the validation BLEU decoding.")
    valid_batch_size: int = setting(80)
    best_metric: str = setting("bleu", choices=METRICS)
    patience: int = setting(0, "Stop after N validations without improvement (0 = never).")
    keep_last: int = setting(3, "Numbered checkpoints to keep.")
    log_every: int = setting(100, "Updates per log line / JSON record.")
    log_file: str | None = setting(None, "JSON-lines log [SAVE_DIR/train.jsonl].", path=True)
    tensorboard: str | None = setting(
        None, "Also write the log as TensorBoard events here (loss, ppl, BLEU, lr, gradient norm, tokens/s; needs "
              "pip install 'nmtkit[tensorboard]').", path="dir")
    device: str = setting("cpu", "cpu, cuda, cuda:1, ...")
    bf16: bool = setting(False, "bfloat16 autocast (mixed precision).")
    backend: str | None = model_backend("updates to float rounding")
    #   (nmtkit.models.BACKENDS; None: $NMTKIT_BACKEND, else fast)
    threads: int = setting(
        0, "Torch threads; 0 = measured: every core, or fewer while other work makes fewer faster.")
    #   (torch intra-op threads; 0 = measured as the run goes, nmtkit.threads)
    resume: bool = setting(False, "Continue the run in SAVE_DIR from checkpoint_last.pt.")
    force: bool = setting(False, "Start over in a SAVE_DIR that holds checkpoints (they are deleted).")

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
        if self.backend is not None and self.backend not in BACKEND_NAMES:
            raise InputError(f"unknown --backend '{self.backend}' (choose from {', '.join(BACKEND_NAMES)})")
        if self.backend is None:
            try:
                backend_setting()  # ($NMTKIT_BACKEND, checked before anything is written)
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
        for name, ok, want in (("seed", 0 <= self.seed <= MAX_SEED, f"a whole number from 0 to {MAX_SEED:,}"),
                               ("warmup_updates", self.warmup_updates >= 0, "at least 0"),
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
        if self.average_last == 1:  # (the mean of one validation's weights is those weights: nothing averaged)
            raise InputError("--average-last 1 averages nothing (the mean of one validation's weights is those "
                             "weights): give 2 or more, or 0 for no averaging")
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
