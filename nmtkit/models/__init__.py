"""Model registry: architectures (classes) and presets (named sizes of an architecture).

    >>> from nmtkit.models import build_model, get_config, list_models, list_presets
    >>> model = build_model("rnnsearch-50", src_vocab_size=30000, tgt_vocab_size=30000)
    >>> cfg = get_config("rnnsearch-small", dropout=0.2)        # the config dataclass, with overrides

Architectures: "rnnsearch", "rnnencdec" (defaults: the paper's sizes).  Presets: rnnsearch-30/-50 and
rnnencdec-30/-50 (the paper's m=620, n=1000, n'=1000, l=500), rnnsearch-small/rnnencdec-small (256/256/256/256, CPU),
rnnsearch-tiny/rnnencdec-tiny (tests).  An unknown name or option is a ValueError that lists the valid ones.

Each registered class has ``arch`` (its registry name) and ``config_class`` (a dataclass with ``to_dict`` and
``from_dict``); a model keeps its config as ``model.config``, so a checkpoint can store ``model.arch`` and
``model.config.to_dict()`` and rebuild with ``build_model(arch, **config_dict)`` (vocab sizes included).
"""

from __future__ import annotations

from nmtkit.models.registry import (
    BACKENDS,
    default_backend,
    make_backend,
    set_backend,
    build_from_checkpoint,
    build_model,
    model_for_inference,
    empty_model,
    get_config,
    list_models,
    list_presets,
    model_class,
    preset_recipe,
    register_model,
    register_preset,
    resolve,
)
# The model modules register their architectures and presets when imported.
from nmtkit.models.config import RNNencdecConfig, RNNsearchConfig
from nmtkit.models.backend import Backend, EncoderOut
from nmtkit.models.rnnsearch import RNNencdec, RNNsearch
from nmtkit.models.params import count_weights, load_paper_parameters, paper_parameters
from nmtkit.data.vocab import BOS, EOS, PAD, UNK  # the token conventions the models follow

__all__ = [
    "BACKENDS",
    "Backend",
    "default_backend",
    "make_backend",
    "set_backend",
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "EncoderOut",
    "RNNencdec",
    "RNNencdecConfig",
    "RNNsearch",
    "RNNsearchConfig",
    "build_from_checkpoint",
    "build_model",
    "count_weights",
    "empty_model",
    "get_config",
    "list_models",
    "list_presets",
    "load_paper_parameters",
    "model_class",
    "model_for_inference",
    "paper_parameters",
    "preset_recipe",
    "register_model",
    "register_preset",
    "resolve",
]
