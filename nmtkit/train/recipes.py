"""Training recipes: named sets of training settings, one option (``nmt-train --recipe``) to choose them.

- ``paper``: Section 4.2 and Appendix B of the paper, exactly: Adadelta (ε = 10⁻⁶, ρ = 0.95, learning rate 1), the
  B.1 initialisation, no label smoothing, no averaging.  The default for the paper-size presets and the bare
  architectures.
- ``fast``: what learns within the budget a CPU user has (thousands of updates, not the paper's 5 days on a GPU),
  measured one change at a time by ``tests/bench/bench_learning.py`` (results in ``tests/bench/results/``).  The
  model's equations are the paper's; only what the paper leaves to the recipe differs: Glorot initialisation of the
  non-recurrent matrices instead of B.1's N(0, 0.01²) / N(0, 0.001²), with v_a = 0 as in B.1 (``xavier-flat``:
  α starts uniform; with a Glorot v_a the attention collapses onto the source's ``</s>`` early and aligns far
  worse), and Adam with learning rate 10⁻³ instead of Adadelta.  The default for the small presets
  (``rnnsearch-small``, ``rnnencdec-small``), the sizes a CPU trains.  (Those presets also differ in the model,
  not the recipe: maxout l = 256 and the decoder state reading the current word; nmtkit/models/config.py.)
  Tried at 5,000 updates beside OpenNMT-py and not adopted: an EMA of the weights (mixed: BLEU up, chrF down) and
  a linear decay of the rate (worse): tests/bench/results/bench_quality.txt, runs 3 and 4.

- ``budget``: ``fast`` trained to a budget, of time (``--max-time``) or of updates (``--max-updates``): the rate
  held at 10⁻³, then over the last 30% of the run decayed linearly to 10⁻⁵, reaching it as the budget runs out
  (nmtkit/train/schedule.py: a time budget is carried to updates at the rate measured as the run goes).  The
  recipe of ``examples/one-hour.sh``.  Provisional: the shape follows the budgeted-training literature (a rate
  held while the model is far from converged, annealed at the end; decaying from the first update lost BLEU at
  5,000 updates, bench_quality.txt run 4).  Its comparison with ``fast`` at equal time is undecided
  (tests/bench/results/bench_recipe.txt, 900 s: within one run's noise); the comparison at 3,600 s is still to
  be made.  It needs a budget: without one nmt-train says so.

Batches of 80 sentences, the pools of 1,600 sorted by length and the gradient clipped at L2 norm 1 are the paper's
in both.  A setting given explicitly (``--lr 0.002`` or ``TrainConfig(lr=…)`` through
:func:`nmtkit.train.config.train_config`) wins over the recipe's.
"""

from __future__ import annotations

from typing import Any

RECIPES: dict[str, dict[str, Any]] = {
    "paper": dict(optimizer="adadelta", lr=1.0, init="paper", label_smoothing=0.0, lr_scheduler="constant",
                  warmup_updates=0, ema_decay=0.0),
    "fast": dict(optimizer="adam", lr=1e-3, init="xavier-flat", label_smoothing=0.0, lr_scheduler="constant",
                 warmup_updates=0, ema_decay=0.0),
    "budget": dict(optimizer="adam", lr=1e-3, init="xavier-flat", label_smoothing=0.0, lr_scheduler="linear",
                   warmup_updates=0, decay_fraction=0.3, min_lr=1e-5, ema_decay=0.0),
}


def default_recipe(arch: str) -> str:
    """The recipe a preset or architecture trains with unless told otherwise: the one its preset names
    (``register_preset(..., recipe=)``, nmtkit/models/config.py: ``fast`` for the small presets), else ``paper``."""
    from nmtkit.models.registry import preset_recipe

    try:
        return preset_recipe(arch)
    except ValueError:  # (an unknown name is refused where the model is built, with the list of names)
        return "paper"


def recipe_settings(name: str) -> dict[str, Any]:
    """The TrainConfig fields a recipe sets (a copy).  Unknown name -> ValueError listing the recipes."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}' (choose from {', '.join(RECIPES)})")
    return dict(RECIPES[name])
