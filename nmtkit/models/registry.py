"""The model registry: architectures (classes registered with :func:`register_model`) and presets (named sizes of an
architecture, :func:`register_preset`), the functions that build from them, and the backends a model computes with
(backend.py; :func:`make_backend`).  ``nmtkit.models`` re-exports it;
the model modules import it from here, so that no module imports the package that imports it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from torch import nn

from nmtkit.models.backend import Backend
from nmtkit.models.fast.backend import FastBackend
from nmtkit.models.reference import ReferenceBackend

_MODELS: dict[str, type] = {}
_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {}
_RECIPES: dict[str, str] = {}  # preset -> the training recipe it is meant for (nmtkit.train.recipes)


# How a model computes (backend.py): the name a model's ``backend`` takes -> the implementation.  The one place
# where a name becomes a backend; its names are nmtkit.runtime.BACKEND_NAMES, which the environment setting and the
# tools' --backend accept (tests/test_model_api.py checks that the two agree).
BACKENDS: dict[str, type[Backend]] = {"fast": FastBackend, "reference": ReferenceBackend}


def default_backend() -> str:
    """The backend a model is built with: ``$NMTKIT_BACKEND``'s (``fast`` or ``reference``, :func:`nmtkit.runtime.
    backend_setting`), else ``fast``.  The tools' ``--backend`` (nmt-train, nmt-translate, nmt-align, nmt-score)
    sets a model's ``backend`` explicitly."""
    from nmtkit.runtime import backend_setting

    return backend_setting()[0]


def make_backend(name: str | None = None) -> Backend:
    """The backend called ``name`` (None: :func:`default_backend`).  Unknown -> ValueError."""
    name = default_backend() if name is None else name
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    return BACKENDS[name]()


def set_backend(model: nn.Module, name: str | None) -> nn.Module:
    """Switch ``model`` to backend ``name`` (None: leave it); the same weights either way.  Unknown -> ValueError."""
    if name is not None:
        model.backend = name
    return model


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


def register_preset(name: str, arch: str, recipe: str = "paper", **fields: Any) -> None:
    """A named set of config values for a registered architecture (validated when used), and the name of the
    training recipe it is meant for (``nmtkit.train.recipes``: what nmt-train uses unless told otherwise)."""
    if name in _PRESETS or name in _MODELS:
        raise ValueError(f"preset {name!r} is already registered")
    _PRESETS[name] = (arch, dict(fields))
    _RECIPES[name] = recipe


def preset_recipe(arch_or_preset: str) -> str:
    """The recipe a preset names (``paper`` for an architecture's own name).  Unknown name -> ValueError."""
    resolve(arch_or_preset)
    return _RECIPES.get(arch_or_preset, "paper")


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


def empty_model(arch_or_preset: str, **config: Any) -> nn.Module:
    """The model :func:`build_model` builds, on the meta device: its weights' names and shapes, with no memory and
    nothing drawn (a model about to receive a checkpoint's weights needs no initialisation: QR decompositions of
    every recurrent matrix, seconds at the paper's sizes)."""
    import torch

    with torch.device("meta"):
        return build_model(arch_or_preset, **config)


def build_from_checkpoint(payload: dict, path: str | None = None) -> nn.Module:
    """The model of a loaded checkpoint (:func:`nmtkit.data.checkpoint.load`'s payload: ``arch``, ``config``,
    ``model``), its weights the checkpoint's exactly, on CPU (move it with ``.to(device)``).  A config that builds no
    model -> ValueError; weights other than the config's model's (a name or a shape) -> an InputError naming
    ``path`` and the weight."""
    import torch

    from nmtkit.data.checkpoint import check_shapes

    model = empty_model(payload["arch"], **payload["config"])
    shapes = model.state_dict()
    check_shapes(payload["model"], shapes, "model", path)
    # every weight a fresh tensor of the model's dtype holding the checkpoint's values (never the checkpoint's own
    # tensor: two of its weights may share memory, or have another dtype or layout), put in place of the meta one.
    # (Not model.to_empty(): from the meta device it goes through torch's Python reference of empty_like, whose
    # first use imports sympy and torch.fx, a large part of every tool's start-up: bench_startup.txt, run 3.)
    weights = {name: torch.empty(meta.shape, dtype=meta.dtype).copy_(payload["model"][name])
               for name, meta in shapes.items()}
    model.load_state_dict(weights, assign=True)
    return model


def model_for_inference(payload: dict, path: str | None = None, device="cpu", backend: str | None = None) -> nn.Module:
    """The model of a loaded checkpoint ready to run: its weights (:func:`build_from_checkpoint`) on ``device``, on
    ``backend`` (None: the default), in eval mode.  What the translator, the aligner and the scorer load; a
    checkpoint whose model cannot be rebuilt is one InputError naming ``path``."""
    from nmtkit.errors import InputError

    try:
        return set_backend(build_from_checkpoint(payload, path), backend).to(device).eval()
    except (ValueError, RuntimeError) as e:
        raise InputError(f"cannot rebuild the model: {str(e).splitlines()[0]}", path) from None
