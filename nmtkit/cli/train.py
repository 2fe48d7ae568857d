"""``nmt-train``: a prepared directory → checkpoints of RNNsearch or RNNencdec (the paper's recipe by default)."""

from __future__ import annotations

import logging
import os
import sys

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, run, setup_logging
from nmtkit.runtime import tune_malloc
from nmtkit.train.config import TrainConfig
from nmtkit.train.registry import INITS, OPTIMIZERS, SCHEDULES

# the options made from the registries (their choices and help; their defaults are TrainConfig's, the paper's
# recipe: tests/test_registries.py); every other option of nmt-train is a field of TrainConfig
DEFAULTS = TrainConfig.__dataclass_fields__


def _model_option(ctx, param, values):
    out = {}
    for item in values:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", ctx=ctx, param=param)
        for kind in (int, float):
            try:
                out[key] = kind(raw)
                break
            except ValueError:
                continue
        else:
            out[key] = raw
    return out


def _list_archs(ctx, param, value):
    """--list-archs: the registry's architectures and presets on stdout, one per line, then exit."""
    if not value or ctx.resilient_parsing:
        return
    from nmtkit.models import list_models, list_presets, resolve

    for name in list_models():
        click.echo(f"{name}\tarchitecture (its config's defaults; -o KEY=VALUE to change them)")
    for name in list_presets():
        arch, fields = resolve(name)
        click.echo(f"{name}\t{arch}: " + " ".join(f"{k}={v}" for k, v in fields.items()))
    ctx.exit()


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.argument("data", type=click.Path(file_okay=False))
@click.option("--arch", "-a", required=True, help="Architecture or preset: rnnsearch-50, rnnencdec-30, "
              "rnnsearch-small, rnnsearch, ... (see --list-archs).")
@click.option("--list-archs", is_flag=True, is_eager=True, expose_value=False, callback=_list_archs,
              help="List the architectures and presets, then exit.")
@click.option("--save-dir", required=True, type=click.Path(file_okay=False), help="Where checkpoints go.")
@click.option("--model-option", "-o", "model_options", multiple=True, callback=_model_option, metavar="KEY=VALUE",
              help="Override a model setting, e.g. -o hidden_dim=512 -o dropout=0.2. Repeatable.")
@click.option("--init", type=click.Choice(INITS.names()), default=DEFAULTS["init"].default, show_default=True,
              help=f"Weight initialisation: {INITS.describe()}.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS.names()), default=DEFAULTS["optimizer"].default,
              show_default=True, help=f"The update rule: {OPTIMIZERS.describe()}.")
@click.option("--lr-scheduler", type=click.Choice(SCHEDULES.names()), default=DEFAULTS["lr_scheduler"].default,
              show_default=True, help=f"Learning-rate schedule: {SCHEDULES.describe()}.")
@config_options(TrainConfig, defaults={"recipe": None})  # (None: the preset's recipe, nmtkit.train.recipes)
@click.option("--quiet", "-q", is_flag=True)
def main(data, arch, save_dir, model_options, quiet, recipe, **options):
    """Train a model on the prepared corpus DATA (made by nmt-prepare).

    \b
    The paper's RNNsearch-50 (Adadelta, batches of 80, clipping at 1, pools of 1,600):
      nmt-train data-bin/wmt14 --arch rnnsearch-50 --save-dir runs/rnnsearch-50 --device cuda
    A small model on two CPU cores, for 10 minutes:
      nmt-train data-bin/small --arch rnnsearch-small --save-dir runs/small --max-time 600 --valid-every 200
    Data parallel on 2 processes (same result as one with the same total batch):
      torchrun --nproc_per_node 2 $(which nmt-train) data-bin/small --arch rnnsearch-small --save-dir runs/dp
    """
    from nmtkit.train.recipes import default_recipe, recipe_settings
    from nmtkit.train.config import check_given, train_config
    from nmtkit.train.trainer import train

    setup_logging(quiet)
    tune_malloc()
    ctx = click.get_current_context()
    # the recipe's settings replace the options left at their defaults; those given explicitly win
    from_recipe = recipe_settings(recipe or default_recipe(arch))
    options = {k: v for k, v in options.items()
               if k not in from_recipe or ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}
    cfg = train_config(data, arch, save_dir, recipe, model_options=model_options, **options)
    given = {k for k in options if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}
    result = {}

    def body():
        check_given(cfg, given)
        result.update(train(cfg))

    try:
        run("nmt-train", body)
        if result.get("status") == "interrupted":
            click.echo(f"nmt-train: interrupted at update {result['update']}; checkpoint saved in {save_dir} "
                       "(continue with --resume)", err=True)
            sys.exit(130)
    except SystemExit as e:
        _end_of_a_data_parallel_process(e.code)
        raise
    _end_of_a_data_parallel_process(0)


def _end_of_a_data_parallel_process(code) -> None:
    """A process of a data-parallel run (under torchrun) ends here, with ``code``, without the interpreter's
    shutdown; one process alone goes on to the normal exit.

    gloo's threads outlive the process group (``destroy_process_group`` does not free it after a training run,
    nmtkit/train/distributed.py), and a C++ thread that needs the interpreter while it shuts down is ended by
    unwinding, which aborts the process ("terminate called without an active exception", SIGABRT, in some
    runs of tests/bench/soak_torchrun.py without this exit: results/soak_torchrun.txt).  Everything the run writes is
    complete and closed when the command's body returns; the logs and standard streams are flushed here."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if code is None:
        code = 0
    elif not isinstance(code, int):  # (sys.exit("message"): the message, then 1)
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
