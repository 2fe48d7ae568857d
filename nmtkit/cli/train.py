"""``nmt-train``: a prepared directory → checkpoints of RNNsearch or RNNencdec (the paper's recipe by default)."""

from __future__ import annotations

import logging
import os
import sys

import click

from nmtkit.cli import CONTEXT, ToolCommand, backend_option, run, setup_logging
from nmtkit.runtime import tune_malloc
from nmtkit.train.recipes import RECIPES
from nmtkit.train.registry import INITS, OPTIMIZERS, SCHEDULES

PAPER = RECIPES["paper"]  # (the defaults: TrainConfig's are the paper's recipe, tests/test_registries.py)


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
@click.option("--recipe", type=click.Choice(list(RECIPES)),
              help="Training recipe: the paper's (Adadelta, Appendix B.1 init); 'fast', which learns within a CPU "
                   "budget (Glorot init, Adam 1e-3); 'budget', fast annealed to its floor as --max-time or "
                   "--max-updates runs out (see nmtkit/train/recipes.py). Options given explicitly win over it. "
                   "[fast for rnnsearch-small/rnnencdec-small, else paper]")
@click.option("--init", type=click.Choice(INITS.names()), default=PAPER["init"], show_default=True,
              help=f"Weight initialisation: {INITS.describe()}.")
@click.option("--seed", default=1, show_default=True)
@click.option("--batch-size", default=80, show_default=True, help="Sentence pairs per minibatch.")
@click.option("--pool-batches", default=20, show_default=True,
              help="Minibatches per length-sorted pool (the paper: 20 x 80 = 1,600 pairs).")
@click.option("--max-len", type=int, help="Train on pairs of at most this many tokens a side [the model's: 30/50].")
@click.option("--update-freq", default=1, show_default=True,
              help="Minibatches per update (gradient accumulation): the update of one batch N times as large.")
@click.option("--init-from", type=click.Path(dir_okay=False), metavar="CKPT",
              help="Start a new run from this checkpoint's weights (fine-tuning): new optimizer, schedule and data; "
                   "its vocabularies must be the data's (nmt-prepare --vocab-from). --resume continues a run instead.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS.names()), default=PAPER["optimizer"], show_default=True,
              help=f"The update rule: {OPTIMIZERS.describe()}.")
@click.option("--lr", default=PAPER["lr"], show_default=True, help="Learning rate (Adadelta: 1.0).")
@click.option("--lr-scheduler", type=click.Choice(SCHEDULES.names()), default=PAPER["lr_scheduler"],
              show_default=True, help=f"Learning-rate schedule: {SCHEDULES.describe()}.")
@click.option("--warmup-updates", default=0, show_default=True,
              help="Linear warm-up: lr·u/N for the first N updates (any scheduler; 0 = none).")
@click.option("--lr-decay", default=0.5, show_default=True, help="plateau: factor of each decay.")
@click.option("--lr-patience", default=1, show_default=True,
              help="plateau: decay after this many validations without improvement of --best-metric.")
@click.option("--min-lr", default=0.0, show_default=True, help="Floor of the decaying schedules (after warm-up).")
@click.option("--decay-fraction", default=1.0, show_default=True, metavar="F",
              help="linear, cosine: hold lr, then decay over the last F of the run (warm-up, stable, decay); 1 = "
              "decay from the end of the warm-up.")
@click.option("--schedule-updates", default=0, show_default=True, metavar="T",
              help="linear, cosine: the update at which the rate reaches --min-lr (0 = --max-updates). Set it to "
              "stop a run early with --max-updates and resume it on the same schedule.")
@click.option("--ema-decay", default=0.0, show_default=True,
              help="Validate and save an exponential moving average of the weights with this decay (e.g. 0.999; "
                   "0 = off). The raw weights stay in the checkpoint for --resume.")
@click.option("--average-last", default=0, show_default=True,
              help="Validate and save the mean of the weights at the last N validations (0 = off; needs "
                   "--keep-last >= N).")
@click.option("--rho", default=0.95, show_default=True, help="Adadelta decay rate.")
@click.option("--eps", default=1e-6, show_default=True, help="Adadelta epsilon.")
@click.option("--label-smoothing", default=0.0, show_default=True,
              help="Label smoothing ε: cross-entropy against (1-ε)·onehot + ε/V (0 = the paper's loss).")
@click.option("--bpe-dropout", type=float, metavar="P",
              help="BPE-dropout: segment the training pairs anew in every epoch, skipping each merge with "
                   "probability P (Provilkov et al. 2020; 0.1 is usual; needs BPE data; 0 = off). Translation "
                   "keeps the deterministic segmentation. [the prepared corpus's nmt-prepare --bpe-dropout]")
@click.option("--guided-alignment", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Guided alignment (Chen et al. 2016): also train the attention towards these word links, a "
                   "Pharaoh file with one line per line of the prepared train.tok.* (e.g. eflomal's on them; "
                   "examples/guide_links.py). RNNsearch only.")
@click.option("--guided-alignment-order", type=click.Choice(["src-tgt", "tgt-src"]), default="src-tgt",
              show_default=True, help="Which side the links of --guided-alignment name first.")
@click.option("--guided-alignment-weight", default=0.1, show_default=True,
              help="λ: the weight of the attention's cross-entropy against the links, per guided target unit, "
                   "beside each target unit's translation loss (Marian's default scale).")
@click.option("--clip-norm", default=1.0, show_default=True, help="Rescale gradients to this L2 norm; 0 = off.")
@click.option("--max-updates", default=0, show_default=True, help="Stop after this many updates (0 = no limit).")
@click.option("--max-epochs", default=0, show_default=True, help="Stop after this many epochs (0 = no limit).")
@click.option("--max-time", default=0.0, show_default=True,
              help="Stop after this many seconds of training (updates and validations, across resumptions; 0 = no "
              "limit). linear and cosine then reach --min-lr when the time runs out, at the update rate measured.")
@click.option("--valid-every", default=1000, show_default=True, help="Validate and save every N updates.")
@click.option("--valid-bleu-sentences", default=500, show_default=True,
              help="Greedy BLEU on the first N validation sentences (0 = none, -1 = all).")
@click.option("--valid-beam", default=1, show_default=True, help="Beam size of the validation BLEU decoding.")
@click.option("--valid-batch-size", default=80, show_default=True)
@click.option("--best-metric", type=click.Choice(["bleu", "loss"]), default="bleu", show_default=True)
@click.option("--patience", default=0, show_default=True,
              help="Stop after N validations without improvement (0 = never).")
@click.option("--keep-last", default=3, show_default=True, help="Numbered checkpoints to keep.")
@click.option("--log-every", default=100, show_default=True, help="Updates per log line / JSON record.")
@click.option("--log-file", type=click.Path(dir_okay=False), help="JSON-lines log [SAVE_DIR/train.jsonl].")
@click.option("--tensorboard", type=click.Path(file_okay=False),
              help="Also write the log as TensorBoard events here (loss, ppl, BLEU, lr, gradient norm, tokens/s; "
                   "needs pip install 'nmtkit[tensorboard]').")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--bf16", is_flag=True, help="bfloat16 autocast (mixed precision).")
@backend_option("updates to float rounding")
@click.option("--threads", default=0, show_default=True,
              help="Torch threads; 0 = measured: every core, or fewer while other work makes fewer faster.")
@click.option("--resume", is_flag=True, help="Continue the run in SAVE_DIR from checkpoint_last.pt.")
@click.option("--force", is_flag=True, help="Start over in a SAVE_DIR that holds checkpoints (they are deleted).")
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
