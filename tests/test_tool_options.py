"""Every tool's options are declared once, as fields of its config dataclasses (nmtkit/settings.py): for each tool
whose options are made from its configs, every field with help is an option with the field's default (or the
tool's own, where it says so), its help, its type and choices; and a tool builds its configs from its keywords,
so that what the command line says is what the library gets."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import MISSING

import click
import pytest

from nmtkit.align import AlignConfig
from nmtkit.prepare.config import PrepareConfig
from nmtkit.score.report import ScoreConfig
from nmtkit.select.config import SelectConfig
from nmtkit.serve.config import ServeConfig
from nmtkit.settings import flag_of, kind, options_of, repeated
from nmtkit.train.config import TrainConfig
from nmtkit.translate.config import DecodeConfig, TranslatorConfig

from conftest import REPO

# tool -> (its click command's module, the config classes its options come from, the defaults it sets itself, the
# options it declares by hand: files and switches of the tool itself, no setting of its configs)
TOOLS = {
    "nmt-translate": ("nmtkit.cli.translate", (DecodeConfig, TranslatorConfig), {"workers": 0},
                      {"models", "input_path", "output_path", "prefix_path", "unk_dict", "nbest_file", "alignments",
                       "attention", "scores", "no_defaults", "save_defaults", "quiet"}),
    "nmt-serve": ("nmtkit.cli.serve", (ServeConfig, TranslatorConfig), {}, {"models", "unk_dict", "no_defaults",
                                                                            "quiet"}),
    # (--init, --optimizer, --lr-scheduler: their choices and help come from nmtkit/train/registry.py, their defaults
    # from TrainConfig, tests/test_registries.py)
    "nmt-train": ("nmtkit.cli.train", (TrainConfig,), {"recipe": None},
                  {"data", "arch", "list_archs", "save_dir", "model_options", "init", "optimizer", "lr_scheduler",
                   "quiet"}),
    "nmt-prepare": ("nmtkit.cli.prepare", (PrepareConfig,), {}, {"quiet"}),
    "nmt-select": ("nmtkit.cli.select", (SelectConfig,), {}, {"quiet"}),
    "nmt-align": ("nmtkit.cli.align", (AlignConfig,), {}, {"as_json", "quiet"}),
    # (--metrics: a comma-separated list of ScoreConfig.metrics)
    "nmt-score": ("nmtkit.cli.score", (ScoreConfig,), {}, {"hypotheses", "metrics", "as_json", "quiet"}),
}
TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_config_field_is_an_option_with_its_default_and_help(tool):
    module, configs, own, by_hand = TOOLS[tool]
    main = __import__(module, fromlist=["main"]).main
    params = {p.name: p for p in main.params}
    for cls in configs:
        fields = options_of(cls)
        assert fields, cls
        for f in fields:
            p = params[f.name]
            assert p.opts[0] == flag_of(f) and (p.help or "") == f.metadata["help"], f.name
            if f.metadata["short"]:
                assert f.metadata["short"] in p.opts, f.name
            required = f.default is MISSING and f.default_factory is MISSING and f.name not in own
            assert p.required == required, f.name
            if repeated(f):
                assert p.multiple, f.name
            elif not required:
                assert p.default == own.get(f.name, f.default), f.name
            if kind(f) is bool:
                assert p.is_flag and p.flag_value == (not f.default), f.name
            elif f.metadata["choices"]:
                assert tuple(p.type.choices) == f.metadata["choices"]
            elif f.metadata["path"]:
                assert isinstance(p.type, click.Path)
            else:
                assert p.type is TYPES[kind(f)], f.name
    declared = {f.name for cls in configs for f in options_of(cls)}
    hidden = {p.name for p in main.params if p.name.startswith("retired_")}  # (refused: nmtkit/translate/retired.py)
    assert {p.name for p in main.params} - declared - hidden == by_hand


def test_nmt_serve_takes_nmt_translates_settings_of_the_translator():
    """--bf16, --candidates, --window, --backend: nmt-serve has them because nmt-translate's TranslatorConfig does,
    without a line of its own."""
    from nmtkit.cli.serve import main

    names = {p.name for p in main.params}
    assert {"bf16", "candidates", "window", "backend", "tokenized", "batch_size"} <= names


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
    (["--workers", "-2"], "--workers must be at least 0 (got -2; 0 = automatic)"),
    (["--workers", "2", "--device", "cuda"], "--workers 2 needs --device cpu"),
    (["--max-queue", "10", "--max-lines", "20"], "--max-queue (10) must hold at least one request of --max-lines"),
    (["--port", "70000"], "--port must be between 0 and 65535 (got 70000)"),
])
def test_a_cross_field_check_is_made_once_in_the_config_and_reads_as_one_line(trained, args, message):
    """The checks live in the configs' __post_init__: nmt-serve refuses a bad setting in one line, exit code 1,
    before it listens (and nmt-translate the same translator settings)."""
    _, ckpt = trained
    tools = ["nmt-serve"] + (["nmt-translate"] if "--max-queue" not in args and "--port" not in args else [])
    for tool in tools:
        proc = subprocess.run([sys.executable, str(REPO / "bin" / tool), "-m", str(ckpt), *args], input=b"",
                              capture_output=True, timeout=120)
        lines = proc.stderr.decode().strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (tool, proc.stderr.decode())
        assert lines[0].startswith(f"{tool}: error: ")


def test_a_switch_turns_its_default_around_and_a_repeated_option_gives_a_list():
    """--no-normalize sets normalize_punctuation to False; --train, given twice, is a list of two; --test, not given,
    leaves its field's default (and -n, not given, nmt-score's names their default, None)."""
    from nmtkit.cli.prepare import main
    from nmtkit.settings import from_options

    args = ["-s", "en", "-t", "fr", "--train", "a", "--train", "b", "-d", "out", "--no-normalize"]
    values = main.make_context("nmt-prepare", args).params
    cfg = from_options(PrepareConfig, values)
    assert cfg.train == ["a", "b"] and cfg.test == [] and cfg.normalize_punctuation is False and cfg.dest == "out"
    assert from_options(PrepareConfig, {**values, "normalize_punctuation": True}).normalize_punctuation
    assert from_options(ScoreConfig, {"reference": "r", "names": ()}, hypotheses=["h"]).names is None


def test_the_library_gets_what_the_command_line_says():
    """A config built from the tool's keywords equals the one built by hand."""
    from nmtkit.settings import from_options

    values = {"batch_size": 8, "window": 16, "bf16": True, "beam": 3, "host": "127.0.0.1", "port": 0}
    assert from_options(TranslatorConfig, values) == TranslatorConfig(batch_size=8, window=16, bf16=True)
    cfg = from_options(ServeConfig, values, checkpoints=["m.pt"], translator=TranslatorConfig(bf16=True))
    assert cfg.port == 0 and cfg.translator.bf16 and cfg.checkpoints == ["m.pt"]
