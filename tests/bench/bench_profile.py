#!/usr/bin/env python3
"""Where the time goes: one training update and one decoding batch of the hour's model, by kind of work, against
the CPU's matmul ceiling, with Python's share apart (issue 55, part 1).

One command (about 5 minutes; run it alone, from a clean commit -- a dirty tree is refused)::

    python tests/bench/bench_profile.py                 # writes tests/bench/results/bench_profile.txt

The hour's size: ``rnnsearch-small`` on the hour's data (150,000 Hansards pairs, a joint SentencePiece vocabulary
of 16,000 units, pairs of at most 36 pieces: ``peers.prepare_hour``), batches as the 'budget' recipe makes them
(80 sentences, nmt-train's schedule, seed 1), bf16 autocast where the CPU has it natively, else fp32, as
``examples/one-hour.sh`` chooses; two threads.

- **Wall**: ``--updates`` training updates timed one by one without the profiler (after ``--warmup``); means
  over them throughout (a batch's cost follows its lengths: the FLOPs are counted over the same batches).
- **Profile**: the same batches again under ``torch.profiler`` (CPU, FLOPs of the products).  Every torch
  operation's own time (its children's taken out) goes to one kind of work by its name: products (mm, addmm,
  bmm, linear, oneDNN's), nmtkit's C kernels (the attention's step, Adadelta, bf16 casts: timed as labelled
  regions), softmax and loss, activations, element-wise and reductions, copies and casts, indexing and embeddings,
  allocation; each kind is split by phase (forward, backward -- under autograd's engine -- and the optimizer's
  step; the fused output layer computes its gradient in its forward call, so its backward products count as
  forward).  Time inside labelled regions but in no operation (custom autograd functions' Python, the optimizer's
  loop) is "Python inside ops' regions"; what is left of the profiled wall is Python, dispatch and the profiler's
  own cost per operation ("between ops", an upper bound of what Python costs: the number of operations beside it);
  the unprofiled wall of the same work is printed under it.
- **Ceiling**: the best GFLOP/s of a 2048×2048 product in the same precision (``bench_train.matmul_gflops``: torch
  or nmtkit's oneDNN route) and of the update's own largest shape, the output layer's (tokens × l) · (l × V).
  The products' row says what share of the ceiling they run at; the update's row, the model's FLOPs per update
  (``bench_train``'s formula over the measured batches) over the wall -- the share issue 55's goal is set in.
- **Decoding**: one batch of 64 lines of ``hansards/test`` (spread over the file, sorted by length as
  nmt-translate batches them) with ``one-hour.sh``'s options (beam 12, no repeated 4-gram, numbers from the
  source) on a model of ``--model-updates`` updates trained here once (or ``--model``), the same table; and the
  search's steps counted, so the time of one step is printed beside the batch's; with ``--candidates`` over the
  batch's candidate list (``nmt-translate --candidates``)::

    python tests/bench/bench_profile.py --candidates DIR/candidates.npz --model DIR-MODEL \
        --out tests/bench/results/bench_profile-candidates.txt
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, log, table  # noqa: E402

KINDS = [
    ("products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::linear",
                  "aten::matmul", "mkldnn", "onednn", "aten::_mkldnn")),
    ("nmtkit C kernels", ("nmtkit::",)),
    ("softmax and loss", ("softmax", "nll_loss", "logsumexp", "cross_entropy")),
    ("activations", ("sigmoid", "tanh", "aten::max", "aten::maximum", "relu", "aten::clamp")),
    ("copies and casts", ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
                          "aten::cat", "aten::stack", "aten::pad", "aten::constant_pad_nd")),
    ("indexing and embeddings", ("index", "gather", "scatter", "embedding", "take", "masked", "aten::where",
                                 "aten::topk", "aten::sort", "aten::argmax", "aten::nonzero")),
    ("allocation", ("aten::empty", "aten::zeros", "aten::ones", "aten::full", "aten::new_", "aten::resize_",
                    "aten::fill_", "aten::zero_")),
]
LABELS = ("Optimizer.step", "autograd::engine::evaluate_function", "nmtkit::")
DECODE_OPTIONS = dict(beam=12, no_repeat_ngram=4, source_numbers=True, all_numbers=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--model", type=Path, help="the checkpoint decoded with (default: trained once here)")
    p.add_argument("--model-updates", type=int, default=600)
    p.add_argument("--candidates", type=Path, help="decode over candidate lists from this table (nmt-translate's "
                   "--candidates; the model's prepared directory's candidates.npz)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=peers.RESULTS_DIR / "bench_profile.txt")
    p.add_argument("--allow-dirty", action="store_true")
    return p.parse_args(argv)


def kind_of(name: str) -> str:
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "element-wise and reductions" if name.startswith("aten::") else "other operations"


def label_kernels() -> None:
    """nmtkit's C kernels as labelled regions of the profile (called through ctypes, torch does not see them)."""
    import torch

    from nmtkit import kernels

    for name in ("attend_forward", "attend_backward", "adadelta", "to_bf16"):
        fn = getattr(kernels, name)

        @functools.wraps(fn)
        def wrapped(*args, _fn=fn, _name=f"nmtkit::{name}", **kw):
            with torch.profiler.record_function(_name):
                return _fn(*args, **kw)
        setattr(kernels, name, wrapped)


def phase_of(event) -> str:
    e = event
    while e is not None:
        if e.name.startswith("Optimizer.step") or e.name.startswith("nmtkit::adadelta"):
            return "optimizer"
        if e.name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        e = e.cpu_parent
    return "forward"


def breakdown(prof, calls: int) -> tuple[dict, float, float, float]:
    """{(kind, phase): own ms per call}, own ms per call in all, product GFLOP per call, operations per call."""
    own = collections.defaultdict(float)
    flops = 0.0
    events = prof.events()
    for e in events:
        t = e.self_cpu_time_total / 1000.0 / calls  # ms per call
        if any(e.name.startswith(x) for x in LABELS[:2]):
            kind = "Python inside ops' regions"
        else:
            kind = kind_of(e.name)
        own[kind, phase_of(e)] += t
        if kind == "products":
            flops += (e.flops or 0) / calls
    return dict(own), sum(own.values()), flops / 1e9, len(events) / calls


def report_rows(own: dict, total_own: float, wall_ms: float, product_gflop: float, ceiling: float,
                plain_ms: float, events: float) -> list[list]:
    phases = ("forward", "backward", "optimizer")
    kinds = [k for k, _ in KINDS] + ["element-wise and reductions", "other operations", "Python inside ops' regions"]
    rows = []
    for k in kinds:
        cells = [own.get((k, ph), 0.0) for ph in phases]
        if sum(cells) < 0.005:
            continue
        share = ""
        if k == "products" and sum(cells) > 0:
            rate = product_gflop / (sum(cells) / 1000)
            share = f"{rate:,.0f} GFLOP/s = {rate / ceiling:.0%} of the ceiling"
        rows.append([k] + [f"{c:,.1f}" for c in cells] + [f"{sum(cells):,.1f}", f"{sum(cells) / wall_ms:.0%}", share])
    outside = wall_ms - total_own
    rows.append(["between ops: Python, dispatch, the profiler", "", "", "", f"{outside:,.1f}",
                 f"{outside / wall_ms:.0%}", f"{events:,.0f} ops"])
    rows.append(["wall (profiled)", "", "", "", f"{wall_ms:,.1f}", "100%", ""])
    rows.append(["wall (unprofiled, the same work)", "", "", "", f"{plain_ms:,.1f}", f"{plain_ms / wall_ms:.0%}", ""])
    return rows


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    out = peers.start_report("bench_profile.py", "Where the time of the hour's model goes: one training update, one "
                             "decoding batch", argv, a.allow_dirty)
    if out is None:
        return 2
    try:
        import numpy as np
        import torch

        import bench_train
        from nmtkit.data.batching import EpochSchedule
        from nmtkit.device import bf16_is_native
        from nmtkit.models import get_config
        from nmtkit.train.config import train_config
        from nmtkit.train.trainer import Trainer

        torch.set_num_threads(2)
        prec = a.precision if a.precision != "auto" else (
            "bf16" if bf16_is_native(torch.device("cpu")) else "fp32")
        prep = peers.prepare_hour(a.work)
        label_kernels()
        save = a.work / "profile-run"
        cfg = train_config(str(prep), "rnnsearch-small", str(save), "budget", max_updates=10 ** 6, threads=2,
                           bf16=prec == "bf16", seed=1, force=True, valid_every=10 ** 9, valid_bleu_sentences=0)
        trainer = Trainer(cfg)
        schedule = EpochSchedule(np.asarray(trainer.train_src.sizes), np.asarray(trainer.train_tgt.sizes),
                                 trainer.eligible, cfg.batch_size, cfg.pool_batches, cfg.seed, 0, None)
        n = a.warmup + a.updates
        groups = [schedule[i: i + 1] for i in range(n)]
        walls, tokens = [], []
        for i, g in enumerate(groups[:n]):
            t0 = time.perf_counter()
            _, ntok, _ = trainer._step(g)
            if i >= a.warmup:
                walls.append(time.perf_counter() - t0)
                tokens.append(ntok)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
            t0 = time.perf_counter()
            for g in groups[a.warmup:]:  # (the same batches as timed: their cost is their lengths')
                trainer._step(g)
            profiled_ms = (time.perf_counter() - t0) * 1000 / a.updates
        trainer.rundir.unlock()
        wall_ms = statistics.mean(walls) * 1000  # (means throughout: the own times are totals over the updates)
        own, total_own, product_gflop, events = breakdown(prof, a.updates)
        mcfg = get_config("rnnsearch-small", src_vocab_size=len(trainer.src_vocab),
                          tgt_vocab_size=len(trainer.tgt_vocab))
        src, tgt = trainer.train_src.sizes, trainer.train_tgt.sizes
        batches = [((np.asarray(src)[ids] + 1).tolist(), (np.asarray(tgt)[ids] + 1).tolist())
                   for g in groups[a.warmup: n] for ids in g]
        per_tok = bench_train.train_flops_per_target_token(mcfg, batches)
        tok_update = sum(tokens) / len(tokens)
        ceiling = bench_train.matmul_gflops(2048, prec)
        V, l = len(trainer.tgt_vocab), mcfg.maxout_dim
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        x, w = torch.randn(int(tok_update), l).to(dtype), torch.randn(l, V).to(dtype)
        for _ in range(2):
            x @ w
        t0 = time.perf_counter()
        for _ in range(5):
            x @ w
        out_rate = 2 * x.shape[0] * l * V * 5 / (time.perf_counter() - t0) / 1e9
        model_rate = per_tok * tok_update / (wall_ms / 1000) / 1e9
        out += ["", f"Training: rnnsearch-small, {prec}, 2 threads, vocabulary {V:,} (target), batches of "
                f"{cfg.batch_size} sentences, {tok_update:,.0f} target tokens an update (mean of {a.updates}); "
                f"update {wall_ms:,.0f} ms (mean, unprofiled; the batches' range {min(walls) * 1000:,.0f}–"
                f"{max(walls) * 1000:,.0f})", "",
                f"ceiling: {ceiling['best']:,.0f} GFLOP/s ({prec}, 2048², {ceiling['by']}); the output layer's "
                f"shape ({int(tok_update)}×{l})·({l}×{V}): {out_rate:,.0f} GFLOP/s",
                f"the model: {per_tok / 1e6:.1f} MFLOP per target token (bench_train's formula) → "
                f"{model_rate:,.0f} GFLOP/s = {model_rate / ceiling['best']:.0%} of the ceiling "
                f"(issue 55's goal: ≥ 65% in bf16, ≥ 75% in fp32)", "",
                "own time per update, ms, by kind of work and phase (share of the profiled wall):", ""]
        out += table(["kind", "forward", "backward", "optimizer", "all", "share", "products' rate"],
                     report_rows(own, total_own, profiled_ms, product_gflop, ceiling["best"], wall_ms, events),
                     "lrrrrrl")

        # -- decoding -----------------------------------------------------------------------------------------
        from nmtkit.translate.config import DecodeConfig
        from nmtkit.translate.translator import Translator

        model = a.model or a.work / f"steady-model-{a.model_updates}" / "checkpoint_last.pt"
        if not model.is_file():
            log(f"training the decoding model: {a.model_updates} updates")
            import bench_steady

            peers.run_measured(bench_steady.train_cmd(peers.REPO, prep, model.parent, a.model_updates,
                                                      ["--threads", "2"], prec),
                               env=peers.quiet_env(), log_path=a.work / "logs" / "profile-model.log")
        root = peers.data_root()
        test = (root / "hansards" / "test.en").read_text(encoding="utf-8").splitlines()
        lines = [test[i] for i in range(0, len(test), len(test) // 64)][:64]
        tr = Translator([str(model)], DecodeConfig(**DECODE_OPTIONS), threads=2, workers=1, batch_size=64,
                        candidates=str(a.candidates) if a.candidates else None)
        steps = [0]
        real_step = tr.models[0].decode_step

        def counting_step(*args, **kw):
            steps[0] += 1
            return real_step(*args, **kw)
        tr.models[0].decode_step = counting_step
        list(tr.translate(enumerate(lines, 1)))  # warm-up
        dwalls = []
        for _ in range(3):
            steps[0] = 0
            t0 = time.perf_counter()
            hyps = list(tr.translate(enumerate(lines, 1)))
            dwalls.append(time.perf_counter() - t0)
        nsteps = steps[0]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as dprof:
            t0 = time.perf_counter()
            list(tr.translate(enumerate(lines, 1)))
            dprofiled_ms = (time.perf_counter() - t0) * 1000
        dwall_ms = statistics.median(dwalls) * 1000
        down, dtotal, dgflop, devents = breakdown(dprof, 1)
        words = sum(len(h.text.split()) for h in hyps)
        out += ["", f"Decoding: one batch of {len(lines)} lines of hansards/test (spread over the file), "
                f"{', '.join(f'{k}={v}' for k, v in DECODE_OPTIONS.items())}, 2 threads, model {model}"
                + (f", over candidate lists from {a.candidates}" if a.candidates else "") + "; "
                f"{dwall_ms:,.0f} ms the batch (median of 3, unprofiled; range {min(dwalls) * 1000:,.0f}–"
                f"{max(dwalls) * 1000:,.0f}), "
                + (f"{nsteps} calls of the decoder's step (the second pass of the numbers included) → "
                   f"{dwall_ms / nsteps:,.1f} ms a step; " if nsteps else "")
                + f"{words:,} words written", "",
                "own time per batch, ms, by kind of work (share of the profiled wall):", ""]
        out += table(["kind", "forward", "backward", "optimizer", "all", "share", "products' rate"],
                     report_rows(down, dtotal, dprofiled_ms, dgflop, ceiling["best"], dwall_ms, devents),
                     "lrrrrrl")
        top = sorted(((e.self_cpu_time_total, e.key) for e in dprof.key_averages()), reverse=True)[:12]
        out += ["", "the decoding batch's 12 largest operations by own time (ms): " + "; ".join(
            f"{name} {us / 1000:,.1f}" for us, name in top)]
        ttop = sorted(((e.self_cpu_time_total / a.updates, e.key) for e in prof.key_averages()), reverse=True)[:12]
        out += ["the training update's 12 largest operations by own time (ms per update): " + "; ".join(
            f"{name} {us / 1000:,.1f}" for us, name in ttop)]
        return peers.finish_report(out, [], 55, a.out, t_start)
    except BenchError as e:
        return peers.fail_report(out, a.out, e)


if __name__ == "__main__":
    sys.exit(main())
