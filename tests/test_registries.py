"""The training registries (nmtkit/train/registry.py): nmt-train's choices and defaults come from them, every entry
is what its kind must be, and an optimizer or a schedule added by registration alone trains and resumes exactly."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys

import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.errors import InputError
from nmtkit.train import optimizers, schedule
from nmtkit.train.config import TrainConfig
from nmtkit.train.recipes import RECIPES
from nmtkit.train.registry import INITS, OPTIMIZERS, SCHEDULES, Registry
from nmtkit.train.trainer import train

from conftest import REPO, tiny, tiny_multi30k_run

OPTIONS = {"optimizer": OPTIMIZERS, "lr_scheduler": SCHEDULES, "init": INITS}


def test_nmt_train_offers_exactly_the_registered_names_with_trainconfigs_defaults():
    from nmtkit.cli.train import main

    params = {p.name: p for p in main.params}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name, registry in OPTIONS.items():
        assert list(params[name].type.choices) == registry.names(), name
        assert params[name].default == defaults[name] == RECIPES["paper"][name], name
        for entry in registry.names():
            assert entry in params[name].help, (name, entry)
    assert params["lr"].default == defaults["lr"] == RECIPES["paper"]["lr"]


def test_reading_nmt_trains_options_does_not_import_torch():
    """The registries name their implementations by module path: nmt-train's options, choices included, are built
    without torch (the tools start in a fraction of a second; torch is imported when the run starts)."""
    code = "import sys, nmtkit.cli.train; assert 'torch' not in sys.modules, 'torch was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_every_entry_loads_and_is_of_its_kind_and_nothing_is_left_unregistered():
    for name in OPTIMIZERS.names():
        assert issubclass(OPTIMIZERS.load(name), optimizers.UpdateRule), name
    for name in SCHEDULES.names():
        made = schedule.make_schedule(name, 0.5, total=10)
        assert isinstance(made, schedule.Schedule) and made.kind == name and made.lr(1) > 0, name
    for name in INITS.names():
        model = tiny("rnnsearch")
        torch.manual_seed(0)
        INITS.load(name)(model)
        again = tiny("rnnsearch")
        torch.manual_seed(0)
        INITS.load(name)(again)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values())), name
    # every concrete rule and schedule of the modules is reachable by a name
    registered = {OPTIMIZERS[n].target for n in OPTIMIZERS.names()} | {SCHEDULES[n].target for n in SCHEDULES.names()}
    for module, base, abstract in ((optimizers, optimizers.UpdateRule, {"UpdateRule"}),
                                   (schedule, schedule.Schedule, {"Schedule", "Budgeted"})):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, base) and name not in abstract:
                assert f"{module.__name__}:{name}" in registered, name


def test_an_unknown_name_is_one_line_naming_the_option_and_the_choices(tmp_path):
    for field, registry, option in (("optimizer", OPTIMIZERS, "--optimizer"), ("lr_scheduler", SCHEDULES,
                                                                                  "--lr-scheduler"),
                                    ("init", INITS, "--init")):
        cfg = TrainConfig(data=str(tmp_path), arch="rnnsearch-tiny", save_dir=str(tmp_path / "run"),
                          **{field: "nope"})
        with pytest.raises(InputError, match=f"^unknown {option} 'nope' \\(choose from {', '.join(registry.names())}\\)$"):
            cfg.check()
    registry = Registry("thing", "--thing")
    registry.register("a", "nmtkit.errors:InputError", "the first")
    with pytest.raises(ValueError, match="registered already"):
        registry.register("a", "nmtkit.errors:InputError", "again")
    with pytest.raises(ValueError, match="'module:attribute'"):
        registry.register("b", "nmtkit.errors.InputError", "no colon")
    assert registry.load("a") is InputError and registry.describe() == "a: the first"


# -- adding one ----------------------------------------------------------------------------------------------------

class AdagradRule(optimizers.UpdateRule):
    """What a contributor writes to add an optimizer: torch's Adagrad, clipped as torch's optimizers are."""

    def build(self, parameters):
        return torch.optim.Adagrad(parameters, lr=self.cfg.lr)


class StepDecay(schedule.Schedule):
    """What a contributor writes to add a schedule: the rate halved every 2 updates after the warm-up."""

    def rate(self, update, elapsed):
        return self.base * 0.5 ** ((update - self.warmup - 1) // 2)


@pytest.fixture
def added(monkeypatch):
    for registry in (OPTIMIZERS, SCHEDULES):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))  # (restored after the test)
    OPTIMIZERS.register("adagrad", f"{__name__}:AdagradRule", "Adagrad")
    SCHEDULES.register("step", f"{__name__}:StepDecay", "halved every 2 updates")


def test_an_optimizer_and_a_schedule_added_by_registration_train_and_resume_exactly(added, data_dir, tmp_path):
    settings = dict(optimizer="adagrad", lr=0.05, lr_scheduler="step", valid_every=3, log_every=1)
    for root in ("A", "B"):
        (tmp_path / root).mkdir()
    straight = tiny_multi30k_run(data_dir, tmp_path / "A", max_updates=6, **settings)
    cut = tiny_multi30k_run(data_dir, tmp_path / "B", max_updates=3, **settings)
    threads = torch.get_num_threads()
    try:
        train(TrainConfig(data=str(tmp_path / "B" / "data"), save_dir=str(cut), arch="rnnsearch-tiny", batch_size=16,
                          pool_batches=2, max_updates=6, valid_bleu_sentences=0, threads=1, resume=True, **settings))
    finally:
        torch.set_num_threads(threads)
    a, b = checkpoint.load(straight / "checkpoint_last.pt"), checkpoint.load(cut / "checkpoint_last.pt")
    assert a["train"]["state"]["update"] == b["train"]["state"]["update"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    state = a["train"]["optimizer"]["state"]
    assert state and all("sum" in s for s in state.values())  # Adagrad's own state: the registered rule built it
    for sa, sb in zip(a["train"]["optimizer"]["state"].values(), b["train"]["optimizer"]["state"].values()):
        assert torch.equal(sa["sum"], sb["sum"])
    rates = [r["lr"] for r in map(__import__("json").loads, open(straight / "train.jsonl")) if r["type"] == "train"]
    assert rates == pytest.approx([0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125])  # the registered schedule's rates


@pytest.mark.parametrize("args, message", [
    (["--optimizer", "adam", "--rho", "0.9"], "--rho is read by --optimizer adadelta only; this run's is adam"),
    (["--recipe", "fast", "--eps", "1e-8"], "--eps is read by --optimizer adadelta only; this run's is adam"),
    (["--lr-patience", "3"], "--lr-patience is read by --lr-scheduler plateau only; this run's is constant"),
    (["--lr-scheduler", "plateau", "--decay-fraction", "0.5"],
     "--decay-fraction is read by --lr-scheduler linear or cosine only; this run's is plateau"),
])
def test_a_setting_that_this_runs_optimizer_or_schedule_does_not_read_is_one_error(tmp_path, args, message):
    """Each entry owns its settings: one given to a run whose optimizer or schedule ignores it is refused, in one
    line, before anything is written."""
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-train"), str(tmp_path / "data"), "--arch",
                           "rnnsearch-tiny", "--save-dir", str(tmp_path / "run"), *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == f"nmt-train: error: {message}", proc.stderr
    assert not (tmp_path / "run").exists()
