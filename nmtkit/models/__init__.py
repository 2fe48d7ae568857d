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

import dataclasses
from typing import Any, Callable

from torch import nn

_MODELS: dict[str, type] = {}
_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {}


def register_model(name: str) -> Callable[[type], type]:
    """Class decorator: ``@register_model("rnnsearch")``.  The class needs a ``config_class`` dataclass."""

    def wrap(cls: type) -> type:
        if name in _MODELS or name in _PRESETS:
            raise ValueError(f"model {name!r} is already registered")
        if not dataclasses.is_dataclass(getattr(cls, "config_class", None)):
            raise ValueError(f"model {name!r} needs a dataclass config_class attribute")
        cls.arch = name
        _MODELS[name] = cls
        return cls

    return wrap


def register_preset(name: str, arch: str, **fields: Any) -> None:
    """A named set of config values for a registered architecture (validated when used)."""
    if name in _PRESETS or name in _MODELS:
        raise ValueError(f"preset {name!r} is already registered")
    _PRESETS[name] = (arch, dict(fields))


def list_models() -> list[str]:
    """Registered architecture names."""
    return sorted(_MODELS)


def list_presets() -> list[str]:
    """Registered preset names."""
    return sorted(_PRESETS)


def resolve(arch_or_preset: str) -> tuple[str, dict[str, Any]]:
    """(architecture, preset fields) for an architecture or preset name."""
    if arch_or_preset in _PRESETS:
        arch, fields = _PRESETS[arch_or_preset]
        return arch, dict(fields)
    if arch_or_preset in _MODELS:
        return arch_or_preset, {}
    raise ValueError(
        f"unknown model or preset {arch_or_preset!r}; valid: {', '.join(list_models() + list_presets())}"
    )


def get_config(arch_or_preset: str, **overrides: Any):
    """The config dataclass of an architecture or preset, with overrides applied (unknown option -> ValueError)."""
    arch, fields = resolve(arch_or_preset)
    config_class = _MODELS[arch].config_class
    valid = [f.name for f in dataclasses.fields(config_class)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for {arch}; valid options: {', '.join(valid)}")
    return config_class.from_dict({**fields, **overrides})


def build_model(arch_or_preset: str, src_vocab_size: int, tgt_vocab_size: int, **overrides: Any) -> nn.Module:
    """Build an initialised model; ``overrides`` are config fields (e.g. ``dropout=0.2, encoder_gru="torch"``)."""
    arch, _ = resolve(arch_or_preset)
    config = get_config(arch_or_preset, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **overrides)
    return _MODELS[arch](config)


def model_class(arch: str) -> type:
    """The registered class of an architecture name."""
    if arch not in _MODELS:
        raise ValueError(f"unknown model {arch!r}; valid: {', '.join(list_models())}")
    return _MODELS[arch]


# Registration happens on import; these imports come last because they use the functions above.
from nmtkit.models.rnnsearch import (  # noqa: E402
    BOS,
    EOS,
    PAD,
    UNK,
    EncoderOut,
    RNNencdec,
    RNNencdecConfig,
    RNNsearch,
    RNNsearchConfig,
)
from nmtkit.models.params import count_weights, load_paper_parameters, paper_parameters  # noqa: E402

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "EncoderOut",
    "RNNencdec",
    "RNNencdecConfig",
    "RNNsearch",
    "RNNsearchConfig",
    "build_model",
    "count_weights",
    "get_config",
    "list_models",
    "list_presets",
    "load_paper_parameters",
    "model_class",
    "paper_parameters",
    "register_model",
    "register_preset",
    "resolve",
]
