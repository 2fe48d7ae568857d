#!/usr/bin/env python3
"""Training speed of nmtkit, side by side with OpenNMT-py 3.5.1, and against the CPU's matmul ceiling.

One command (about 24 minutes on two quiet cores; ``--quick`` for a smoke run of under 3 minutes)::

    python tests/bench/bench_train.py                  # writes tests/bench/results/bench_train.txt
    python tests/bench/bench_train.py --quick          # writes tests/bench/results/bench_train-quick.txt
    python tests/bench/bench_train.py --parts paper    # only the paper-size part

Part ``small`` (the peers' setting, ``../shared/peers/README.md``): the seeded synthetic 20k-pair corpus
(``make_corpus.py``), 8,000-word vocabularies, batches of 80 sentences, 300 updates; the figure is real
(non-padding) target tokens per second over the updates after the first 50 — the README's counting rule. Runs
are interleaved in one session (OpenNMT-py, nmtkit/Adam, nmtkit/Adadelta, then again in rotated order, ...; by
default 3 repeats of the head-to-head pair, nmtkit/Adadelta in the first only) and the medians reported, with the
ratio nmtkit/OpenNMT-py also taken pair by pair (each repeat's two runs are neighbours in time, so their ratio is
less exposed to the machine's drift). Every run's figure is listed too: on a shared machine one disturbed run
shows up there.

- OpenNMT-py: the README's yaml template as is (``brnn`` GRU encoder, 128 per direction, GRU decoder 256, ``mlp``
  attention, input feeding, Adam 0.001, no clipping, no dropout); tokens/s from its own ``Step`` reports.
- nmtkit: ``rnnsearch-small`` (embeddings 256, hidden 256 per direction, alignment 256, maxout 256) with the
  paper's GRU (reset gate before U), (1) with Adam 0.001 and no clipping, like the peer, and (2) with the paper's
  recipe (Adadelta ε=1e-6 ρ=0.95, gradient norm clipped at 1); tokens/s from ``train.jsonl``
  (``tgt_tokens_per_s`` × window time, windows after the first 50 updates). Both tools run as subprocesses, with
  torch's default thread count, data loading in the training process.  Variant ``nmtkit-adam-bf16`` (not in the
  default list; only where the CPU has native bfloat16) is (1) under ``--bf16`` autocast, for the one-hour issue's
  question whether bf16 buys updates at this size; its GFLOP/s share is of the bf16 matmul ceiling.

Part ``quality``: "validation quality unchanged" with bf16: ``rnnsearch-small`` trained twice on the synthetic
corpus with the paper's recipe and the same seed and batches, in fp32 and with ``--bf16``, validated three times
(cross-entropy on the dev set, greedy BLEU on 500 of its sentences); the goal line asks for the final validation
loss within 2% of fp32's.

Part ``paper``: ``rnnsearch-50`` (m=620, n=1000, n'=1000, l=500) with 30,000-word shortlists on the first 150,000
Hansards pairs (pairs of at most 50 tokens a side: realistic lengths), Adadelta, batch 80, in fp32 and with
``--bf16`` (CPU autocast): tokens/s over 20 updates after 3 warm-up updates, the median of 5 interleaved repeats
(fp32, bf16, bf16, fp32, fp32, bf16, ...: one 20-update run varies by up to ±6% on this VM, run to run, the same
code on the same batches; 5 rather than 3 since stop 16; every run's figure is listed; bench_ab_train.py
compares two revisions in alternate runs). With it: the model's FLOPs per target token, the CPU's measured
fp32/bf16 matmul GFLOP/s and the share of that ceiling reached.

FLOPs per target token (counted from the config; matmuls only, 2 FLOPs per multiply-add; elementwise work,
softmax, embeddings and padding not counted). With m, n, n', l, V the sizes and 2n the annotation size, per
forward pass:

    encoder, per source token (both directions):  2·(3n·m + 3n·n) + n'·2n      (W/W_z/W_r, U/U_z/U_r; U_a h_j)
    decoder, per target token:  3n·m + 3n·n + 3n·2n + n'·n + 2l·(n + m + 2n) + V·l
                                 (W y, U s, C c for the three gates; W_a s; U_o, V_o, C_o; W_o)
    attention, per (target token, source token) pair:  n' + 2n                  (v_aᵀ tanh(·); Σ_j α_ij h_j)
    per sentence:  n·n                                                          (s_0 = tanh(W_s ←h_1))

    FLOPs/target token (training) = 3 × 2 × [decoder + encoder·ΣTx/ΣTy + (n'+2n)·Σ(Tx·Ty)/ΣTy + n²·S/ΣTy]

over the exact minibatches of the measured updates (nmtkit's schedule is a pure function of seed and epoch),
lengths counting ``</s>``; backward ≈ 2 × forward gives the factor 3. For rnnsearch-50 (V = 30,000) this is
≈ 253 MFLOP per target token.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, run_measured, spread, table  # noqa: E402

VARIANTS = ("onmt", "nmtkit-adam", "nmtkit-adadelta", "nmtkit-adam-bf16")
DEFAULT_VARIANTS = VARIANTS[:3]
PARTS = ("small", "paper", "quality")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring for what is measured and how.")
    p.add_argument("--parts", default="small,paper,quality",
                   help="comma list of: small (vs OpenNMT-py), paper (rnnsearch-50), quality (fp32 vs bf16)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"small part: comma list of {', '.join(VARIANTS)} [%(default)s]")
    p.add_argument("--repeats", type=int, help="interleaved repeats of the small part [3; quick 1]")
    p.add_argument("--adadelta-repeats", type=int, default=1,
                   help="of which nmtkit-adadelta takes part in the first N [1: it is not the comparison]")
    p.add_argument("--updates", type=int, help="updates per small run [300; quick 40]")
    p.add_argument("--skip", type=int, help="updates excluded from the count (also the log interval) [50; quick 20]")
    p.add_argument("--paper-updates", type=int, help="measured updates at paper size [20; quick 2]")
    p.add_argument("--paper-warmup", type=int, help="warm-up updates at paper size, not counted [3; quick 2]")
    p.add_argument("--paper-repeats", type=int, default=None, help="interleaved fp32/bf16 repeats [5; quick 1]")
    p.add_argument("--precisions", default="fp32,bf16", help="paper part: fp32, bf16 or both")
    p.add_argument("--quality-updates", type=int, help="quality part: updates per run [600; quick 60]")
    p.add_argument("--quality-optimizer", choices=("adadelta", "adam"), default="adadelta",
                   help="quality part: the paper's recipe (Adadelta, clip 1) or the small part's Adam 1e-3, no clip "
                        "(the one-hour recipe's rate before its annealing) [adadelta]")
    p.add_argument("--hansards-lines", type=int, default=150000, help="Hansards pairs for the 30k-vocabulary corpus")
    p.add_argument("--matmul-size", type=int, default=2048, help="square matmul size for the GFLOP/s ceiling")
    p.add_argument("--onmt-venv", type=Path, default=peers.DEFAULT_ONMT_VENV)
    p.add_argument("--onmt-workers", type=int, default=0, help="OpenNMT-py num_workers [0: in-process, like nmtkit]")
    p.add_argument("--onmt-bucket-size", type=int,
                   help="OpenNMT-py bucket_size [its default 262,144; quick 8,192: a smoke run, not a comparison]")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK, help="work/cache directory [%(default)s]")
    p.add_argument("--fresh", action="store_true", help="rebuild the cached corpora and vocabularies")
    p.add_argument("--out", type=Path, help="report file [results/bench_train.txt; quick: bench_train-quick.txt]")
    p.add_argument("--quick", action="store_true", help="smoke run: small counts (figures not comparable)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(argv)
    q = a.quick
    a.repeats = a.repeats or (1 if q else 3)
    a.updates = a.updates or (40 if q else 300)
    a.skip = a.skip or (20 if q else 50)
    a.paper_updates = a.paper_updates or (2 if q else 20)
    a.paper_warmup = a.paper_warmup if a.paper_warmup is not None else (2 if q else 3)
    a.paper_repeats = a.paper_repeats or (1 if q else 5)
    a.quality_updates = a.quality_updates or (60 if q else 600)
    if q and a.onmt_bucket_size is None:
        a.onmt_bucket_size = 8192
    a.out = a.out or peers.RESULTS_DIR / ("bench_train-quick.txt" if q else "bench_train.txt")
    a.parts = [x for x in a.parts.split(",") if x]
    a.variants = [x for x in a.variants.split(",") if x]
    a.precisions = [x for x in a.precisions.split(",") if x]
    for name, items, valid in (("--parts", a.parts, PARTS), ("--variants", a.variants, VARIANTS),
                               ("--precisions", a.precisions, ("fp32", "bf16"))):
        bad = [x for x in items if x not in valid]
        if bad:
            p.error(f"{name}: unknown {', '.join(bad)} (choose from {', '.join(valid)})")
    if a.updates <= a.skip or a.updates % a.skip:
        p.error(f"--updates ({a.updates}) must be a multiple of --skip ({a.skip}) and larger")
    import torch

    from nmtkit.device import bf16_is_native

    a.bf16_native = bf16_is_native(torch.device("cpu"))
    if not a.bf16_native and ("quality" in a.parts or ("paper" in a.parts and "bf16" in a.precisions)
                              or ("small" in a.parts and "nmtkit-adam-bf16" in a.variants)):
        # (emulated, one 2048x2048 bf16 product takes minutes here: the ceiling alone would not finish)
        p.error("this CPU has no native bfloat16 (no AVX-512 BF16 or AMX): bf16 is emulated, many times slower "
                "than fp32; run --parts small,paper --precisions fp32 here")
    return a


# -- FLOPs --------------------------------------------------------------------------------------------------------

def macs_per_unit(cfg) -> dict:
    """Multiply-adds of one forward pass, per unit (see the module docstring)."""
    m, n, a, l, V = cfg.emb_dim, cfg.hidden_dim, cfg.attn_dim, cfg.maxout_dim, cfg.tgt_vocab_size
    c = 2 * n
    return {
        "encoder_per_src_token": 2 * (3 * n * m + 3 * n * n) + a * c,
        "decoder_per_tgt_token": 3 * n * m + 3 * n * n + 3 * n * c + a * n + 2 * l * (n + m + c) + V * l,
        "attention_per_pair": a + c,
        "per_sentence": n * n,
    }


def train_flops_per_target_token(cfg, batches: list[tuple[list[int], list[int]]]) -> float:
    """3 × 2 × forward multiply-adds per real target token over the given (src lengths, tgt lengths) batches."""
    u = macs_per_unit(cfg)
    sx = sum(sum(s) for s, _ in batches)
    sy = sum(sum(t) for _, t in batches)
    sxy = sum(x * y for s, t in batches for x, y in zip(s, t))
    S = sum(len(s) for s, _ in batches)
    macs = (u["decoder_per_tgt_token"] * sy + u["encoder_per_src_token"] * sx + u["attention_per_pair"] * sxy
            + u["per_sentence"] * S)
    return 3 * 2 * macs / sy


def scheduled_lengths(prep: Path, arch: str, first: int, count: int, batch_size: int = 80, seed: int = 1):
    """The (source, target) lengths incl. </s> of nmt-train's minibatches first+1 … first+count (its schedule)."""
    import numpy as np

    from nmtkit.data.batching import epoch_schedule
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import get_config

    data = PreparedData.open(str(prep))
    src = np.asarray(data.corpus("train", data.source_lang).sizes)
    tgt = np.asarray(data.corpus("train", data.target_lang).sizes)
    max_len = getattr(get_config(arch), "max_len", None) or 10**9
    eligible = np.flatnonzero((src <= max_len) & (tgt <= max_len))
    batches, epoch = [], 0
    while len(batches) < first + count:
        batches += epoch_schedule(src, tgt, eligible, batch_size, 20, seed, epoch)
        epoch += 1
    return [((src[b] + 1).tolist(), (tgt[b] + 1).tolist()) for b in batches[first: first + count]]


def matmul_gflops(n: int, dtype_name: str, reps: int = 8) -> dict:
    """Best and median GFLOP/s of two n×n matrices multiplied (2n³ FLOPs per call), by torch.matmul and by
    nmtkit's oneDNN route (``nmtkit.models.fast.matmul.Multiplier``, which training's per-step products take on CPU):
    the faster of the two."""
    import torch

    from nmtkit.models.fast.matmul import Multiplier

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    found = {}
    by_b = Multiplier(b.t().contiguous())  # x ↦ x b
    for name, fn in (("torch.matmul", torch.matmul), ("oneDNN", lambda x, _: by_b.product(x))):
        for _ in range(2):
            fn(a, b)
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(a, b)
            rates.append(2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
        found[name] = {"best": max(rates), "median": median(rates), "by": name}
    return max(found.values(), key=lambda r: r["best"])


# -- the runs -----------------------------------------------------------------------------------------------------

class Session:
    def __init__(self, args):
        self.a = args
        self.work = args.work
        self.runs = self.work / "train-runs"
        self.onmt_bin, self.onmt_reason = None, ""
        self.synth_data = self.synth_prep = self.real_prep = None

    def setup_small(self):
        a = self.a
        if a.fresh:
            for d in ("synth-data", "prep-synth-v8000", "onmt-vocab"):
                shutil.rmtree(self.work / d, ignore_errors=True)
        self.synth_data = peers.make_synthetic_corpus(self.work)
        if any(v.startswith("nmtkit") for v in a.variants):
            self.synth_prep = peers.prepare_synthetic(self.work, self.synth_data)
        if "onmt" in a.variants:
            self.onmt_bin, self.onmt_reason = peers.find_onmt(a.onmt_venv)
            if self.onmt_bin is None:
                log(f"SKIPPING OpenNMT-py: {self.onmt_reason}")
            else:
                cfg = peers.onmt_config(self.work, self.synth_data, self.runs / "onmt-vocab-build", 1)
                peers.onmt_build_vocab(self.onmt_bin, cfg, self.work)

    def run_onmt(self, r: int) -> dict:
        a = self.a
        d = self.runs / f"onmt-r{r}"
        shutil.rmtree(d, ignore_errors=True)
        cfg = peers.onmt_config(self.work, self.synth_data, d, a.updates, report_every=a.skip,
                                workers=a.onmt_workers, bucket_size=a.onmt_bucket_size)
        m = run_measured([self.onmt_bin / "onmt_train", "-config", cfg], env=peers.onmt_env(),
                         log_path=d / "train.log")
        res = peers.onmt_tokens_per_s(m.output, a.skip)
        res.update(wall_s=m.wall_s, rss_kb=m.max_rss_kb, params=peers.onmt_params(m.output))
        for ckpt in d.glob("*.pt"):
            ckpt.unlink()
        return res

    def run_nmtkit(self, r: int, variant: str) -> dict:
        """``variant``: adam, adadelta or adam-bf16 (Adam under bf16 autocast)."""
        a = self.a
        d = self.runs / f"nmtkit-{variant}-r{r}"
        shutil.rmtree(d, ignore_errors=True)
        opts = OPTIMIZER_OPTIONS[variant.split("-")[0]] + (["--bf16"] if variant.endswith("-bf16") else [])
        m = run_measured(peers.nmtkit_tool("nmt-train") + [
            self.synth_prep, "--arch", "rnnsearch-small", "--save-dir", d, "--max-updates", a.updates,
            "--log-every", a.skip, "--valid-every", 10 ** 9, "--valid-bleu-sentences", 0, "--seed", 1, "--force",
        ] + opts, env=peers.quiet_env(), log_path=d.parent / f"{d.name}.log")
        res = peers.nmtkit_tokens_per_s(d / "train.jsonl", a.skip)
        res.update(wall_s=m.wall_s, rss_kb=m.max_rss_kb)
        shutil.copyfile(d / "train.jsonl", d.parent / f"{d.name}.jsonl")  # kept with the log
        shutil.rmtree(d, ignore_errors=True)
        return res

    def run_paper(self, precision: str, r: int) -> dict:
        a = self.a
        d = self.runs / f"paper-{precision}-r{r}"
        shutil.rmtree(d, ignore_errors=True)
        m = run_measured(peers.nmtkit_tool("nmt-train") + [
            self.real_prep, "--arch", "rnnsearch-50", "--save-dir", d,
            "--max-updates", a.paper_warmup + a.paper_updates, "--log-every", 1, "--valid-every", 10 ** 9,
            "--valid-bleu-sentences", 0, "--seed", 1, "--force", "--keep-last", 1,
        ] + (["--bf16"] if precision == "bf16" else []), env=peers.quiet_env(), log_path=d.parent / f"{d.name}.log")
        res = peers.nmtkit_tokens_per_s(d / "train.jsonl", a.paper_warmup)
        res.update(wall_s=m.wall_s, rss_kb=m.max_rss_kb)
        shutil.copyfile(d / "train.jsonl", d.parent / f"{d.name}.jsonl")
        shutil.rmtree(d, ignore_errors=True)  # ~1 GB of checkpoint (weights + Adadelta state)
        return res


# Adam as the peer trains; Adadelta as the paper did (nmt-train's defaults: ε 1e-6, ρ 0.95, clip 1)
OPTIMIZER_OPTIONS = {"adam": ["--optimizer", "adam", "--lr", "0.001", "--clip-norm", "0"],
                     "adadelta": ["--optimizer", "adadelta"]}


def small_part(s: Session, out: list[str], ceilings: dict) -> list[Goal]:
    __import__("torch")  # (nmtkit.models needs it)

    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import build_model, get_config

    a = s.a
    s.setup_small()
    variants = [v for v in a.variants if v != "onmt" or s.onmt_bin is not None]
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(a.repeats):
        these = [v for v in variants if v != "nmtkit-adadelta" or r < a.adadelta_repeats]
        order = these[r % len(these):] + these[: r % len(these)] if these else []
        for v in order:
            log(f"small, repeat {r + 1}/{a.repeats}: {v} ({a.updates} updates)")
            if v == "onmt":
                res = s.run_onmt(r)
            else:
                res = s.run_nmtkit(r, v.split("-", 1)[1])
            res["order"] = len([x for x in results.values() for _ in x])
            results[v].append(res)
            log(f"  → {res['tok_s']:,.0f} target tokens/s, {res['tok_per_update']:,.0f} tokens/update, peak RSS "
                f"{peers.fmt_mb(res['rss_kb'])}, {res['wall_s']:.0f} s wall")

    vocab_note = ""
    small_params = small_flops = None
    if s.synth_prep is not None:
        data = PreparedData.open(str(s.synth_prep))
        sv, tv = len(data.vocab(data.source_lang)), len(data.vocab(data.target_lang))
        vocab_note = f"nmtkit vocabularies {sv:,} / {tv:,} entries (all training types + 4 specials)"
        small_params = sum(p.numel() for p in build_model("rnnsearch-small", sv, tv).parameters())
        cfg = get_config("rnnsearch-small", src_vocab_size=sv, tgt_vocab_size=tv)
        sched = scheduled_lengths(s.synth_prep, "rnnsearch-small", a.skip, a.updates - a.skip)
        small_flops = train_flops_per_target_token(cfg, sched)
        sched_tok = sum(sum(t) for _, t in sched) / len(sched)
        vocab_note += (f"; nmtkit's schedule puts {sched_tok:,.0f} target tokens in each measured update "
                       "(a check of the tok/update column)")
    onmt_vocab = ""
    if s.onmt_bin is not None:
        n = [peers._line_count(s.work / "onmt-vocab" / f"vocab.{x}") for x in ("src", "tgt")]
        onmt_vocab = f"; OpenNMT-py vocabularies {n[0]:,} / {n[1]:,} words + its specials"

    out += ["", f"Part small: the peers' synthetic corpus ({peers.SYNTH_PAIRS['train']:,} pairs, 10–30 source words), "
                f"batch 80, {a.updates} updates, {a.repeats} interleaved repeat(s)"
                + (f" (nmtkit-adadelta in {min(a.adadelta_repeats, a.repeats)})" if "nmtkit-adadelta" in a.variants
                   and a.adadelta_repeats < a.repeats else ""),
            "-" * 100,
            f"Target tokens/s = real (non-padding, </s> included) target tokens per second of training over updates "
            f"{a.skip + 1}–{a.updates} (the first {a.skip} excluded); median (min–max) over repeats. "
            f"{vocab_note}{onmt_vocab}."]
    if a.onmt_bucket_size:
        out.append(f"NOTE: OpenNMT-py bucket_size set to {a.onmt_bucket_size:,} (not its default): smoke settings.")
    if s.onmt_bin is None and "onmt" in a.variants:
        out.append(f"OpenNMT-py SKIPPED: {s.onmt_reason}")
    desc = {
        "onmt": ("OpenNMT-py 3.5.1", "brnn GRU 2×128, GRU dec 256, mlp attn, input feed", "Adam 1e-3, no clip"),
        "nmtkit-adam": ("nmtkit", "rnnsearch-small, paper GRU (2×256 enc)", "Adam 1e-3, no clip"),
        "nmtkit-adadelta": ("nmtkit", "rnnsearch-small, paper GRU (2×256 enc)", "Adadelta, clip 1 (paper)"),
        "nmtkit-adam-bf16": ("nmtkit --bf16", "rnnsearch-small, paper GRU (2×256 enc)", "Adam 1e-3, no clip"),
    }
    rows = []
    for v, rs in results.items():
        if not rs:
            continue
        params = rs[0].get("params") if v == "onmt" else small_params
        rows.append([desc[v][0], desc[v][1], desc[v][2], f"{params / 1e6:.2f}M" if params else "?",
                     f"{median([x['tok_s'] for x in rs]):,.0f}", spread([x["tok_s"] for x in rs]),
                     f"{median([x['tok_per_update'] for x in rs]):,.0f}",
                     peers.fmt_mb(median([x["rss_kb"] for x in rs])), f"{median([x['wall_s'] for x in rs]):.0f} s"])
    out += [""] + table(["system", "model", "optimizer", "params", "tok/s", "(min–max)", "tok/update", "peak RSS",
                         "wall"], rows, "lllrrrrrr")
    out.append("(wall: the whole process, start-up, data loading and checkpoint saving included)")
    out += ["", "Runs in the order made: " + "; ".join(
        f"{v} {x['tok_s']:,.0f}" for v, x in sorted(((v, x) for v, rs in results.items() for x in rs),
                                                      key=lambda vx: vx[1]["order"]))]
    goals = []
    if results.get("onmt") and results.get("nmtkit-adam"):
        ratio = median([x["tok_s"] for x in results["nmtkit-adam"]]) / median([x["tok_s"] for x in results["onmt"]])
        pairs = [n["tok_s"] / o["tok_s"] for n, o in zip(results["nmtkit-adam"], results["onmt"])]
        out += ["", f"nmtkit (Adam) / OpenNMT-py: {ratio:.2f}× (ratio of medians); per repeat: "
                    + ", ".join(f"{p:.2f}×" for p in pairs) + f" (median {median(pairs):.2f}×)"]
        if results.get("nmtkit-adadelta"):
            r2 = median([x["tok_s"] for x in results["nmtkit-adadelta"]]) / median([x["tok_s"] for x in results["onmt"]])
            out.append(f"nmtkit (Adadelta, the paper's recipe) / OpenNMT-py: {r2:.2f}× (ratio of medians)")
        goals.append(Goal("training, small model: nmtkit (paper GRU, Adam) / OpenNMT-py 3.5.1 target tokens/s",
                          ratio, 1.5, "×"))
    if results.get("nmtkit-adam") and results.get("nmtkit-adam-bf16"):
        pairs = [b["tok_s"] / f["tok_s"] for f, b in zip(results["nmtkit-adam"], results["nmtkit-adam-bf16"])]
        out.append("nmtkit bf16 autocast / fp32 (Adam): per repeat " + ", ".join(f"{p:.2f}×" for p in pairs)
                   + f" (median {median(pairs):.2f}×)")
    if small_flops:
        def share(v: str, rs: list[dict]) -> str:  # (each run against the ceiling of its own precision)
            p = "bf16" if v.endswith("-bf16") else "fp32"
            rate = median([x["tok_s"] for x in rs]) * small_flops / 1e9
            return (f"; {v}: {rate:.1f} GFLOP/s = {100 * rate / ceilings[p]['best']:.0f}% of the measured {p} "
                    f"matmul rate ({ceilings[p]['best']:,.0f} GFLOP/s)")
        out.append(f"rnnsearch-small: {small_flops / 1e6:.1f} MFLOP per target token (training, formula in the "
                   f"script; vocabulary {cfg.tgt_vocab_size:,})"
                   + "".join(share(v, rs) for v, rs in results.items() if v.startswith("nmtkit") and rs))
    return goals


def paper_part(s: Session, out: list[str], ceilings: dict) -> list[Goal]:
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import count_weights, get_config

    a = s.a
    if a.fresh:
        shutil.rmtree(s.work / f"prep-hansards{a.hansards_lines // 1000}k-v{peers.REAL_VOCAB}", ignore_errors=True)
    s.real_prep = peers.prepare_real(s.work, a.hansards_lines)
    data = PreparedData.open(str(s.real_prep))
    sv, tv = len(data.vocab(data.source_lang)), len(data.vocab(data.target_lang))
    cfg = get_config("rnnsearch-50", src_vocab_size=sv, tgt_vocab_size=tv)
    lengths = scheduled_lengths(s.real_prep, "rnnsearch-50", a.paper_warmup, a.paper_updates)
    flops = train_flops_per_target_token(cfg, lengths)
    mean_tgt = sum(sum(t) for _, t in lengths) / sum(len(t) for _, t in lengths)
    mean_src = sum(sum(x) for x, _ in lengths) / sum(len(x) for x, _ in lengths)
    results: dict[str, list[dict]] = {p: [] for p in a.precisions}
    order: list[dict] = []
    for r in range(a.paper_repeats):
        for p in (a.precisions if r % 2 == 0 else a.precisions[::-1]):
            log(f"paper size, repeat {r + 1}/{a.paper_repeats}: rnnsearch-50 {p} "
                f"({a.paper_warmup} + {a.paper_updates} updates)")
            res = s.run_paper(p, r)
            results[p].append(res)
            order.append(dict(res, precision=p))
            log(f"  → {res['tok_s']:,.0f} target tokens/s, peak RSS {peers.fmt_mb(res['rss_kb'])}, "
                f"{res['wall_s']:.0f} s wall")
    try:
        from nmtkit.models import build_model

        weights = count_weights(build_model("rnnsearch-50", sv, tv))
    except Exception:  # noqa: BLE001  (only a label)
        weights = None
    u = macs_per_unit(cfg)
    out += ["", f"Part paper: rnnsearch-50 (m=620, n=1000, n'=1000, l=500), vocabularies {sv:,} / {tv:,}, "
                f"the first {a.hansards_lines:,} Hansards pairs (≤ 50 tokens a side), batch 80, Adadelta",
            "-" * 100,
            f"Target tokens/s over updates {a.paper_warmup + 1}–{a.paper_warmup + a.paper_updates} "
            f"({a.paper_warmup} warm-up updates excluded); measured batches: mean source {mean_src:.1f}, target "
            f"{mean_tgt:.1f} tokens (with </s>), {sum(sum(t) for _, t in lengths) / len(lengths):,.0f} target tokens "
            "per update (schedule)" + (f"; {weights:,} weights excluding biases" if weights else "") + ".",
            f"Forward multiply-adds: encoder {u['encoder_per_src_token'] / 1e6:.2f}M per source token, decoder "
            f"{u['decoder_per_tgt_token'] / 1e6:.2f}M per target token, attention {u['attention_per_pair']:,} per "
            f"(target, source) pair → training FLOPs per target token = {flops / 1e6:.1f} MFLOP "
            "(3 × 2 × multiply-adds; formula in the script).",
            f"CPU matmul ({a.matmul_size}×{a.matmul_size}, best of 8 calls, the faster of torch.matmul and oneDNN): "
            + ", ".join(f"{p} {c['best']:,.0f} GFLOP/s by {c['by']} (median {c['median']:,.0f})"
                        for p, c in ceilings.items())
            + " → ceilings " + " and ".join(f"{c['best'] * 1e9 / flops:,.0f} ({p})" for p, c in ceilings.items())
            + " target tokens/s" + ("" if "bf16" in ceilings else " (bf16: emulated on this CPU, not measured)")
            + "."]
    out.append("Runs in the order made: " + "; ".join(f"{x['precision']} {x['tok_s']:,.0f}" for x in order))
    rows = []
    goals = []
    for p, rs in results.items():
        if not rs:
            continue
        tok = median([x["tok_s"] for x in rs])
        ceil = ceilings[p]["best"]
        achieved = tok * flops / 1e9
        rows.append([p if p == "fp32" else "bf16 autocast", f"{tok:,.0f}", spread([x["tok_s"] for x in rs]),
                     f"{median([x['tok_per_update'] for x in rs]):,.0f}", f"{achieved:,.0f}", f"{100 * achieved / ceil:.0f}%", f"{ceil * 1e9 / flops:,.0f}",
                     peers.fmt_mb(median([x["rss_kb"] for x in rs])), f"{median([x['wall_s'] for x in rs]):.0f} s"])
        goals.append(Goal(f"rnnsearch-50 training, {p}: target tokens/s", tok, 550 if p == "fp32" else 1000))
    out += [""] + table(["precision", "tok/s", "(min–max)", "tok/update", "GFLOP/s", "of matmul", "ceiling tok/s",
                         "peak RSS", "wall"], rows)
    return goals


def quality_part(s: Session, out: list[str]) -> list[Goal]:
    """fp32 against bf16 autocast: the same run (seed, batches, optimizer) validated along the way."""
    import json

    a = s.a
    if getattr(s, "synth_prep", None) is None:
        s.synth_data = peers.make_synthetic_corpus(s.work)
        s.synth_prep = peers.prepare_synthetic(s.work, s.synth_data)
    every = max(a.quality_updates // 3, 1)
    curves, walls = {}, {}
    for p in ("fp32", "bf16"):
        d = s.runs / f"quality-{p}"
        shutil.rmtree(d, ignore_errors=True)
        log(f"quality: rnnsearch-small {p}, {a.quality_updates} updates, validation every {every}")
        m = run_measured(peers.nmtkit_tool("nmt-train") + [
            s.synth_prep, "--arch", "rnnsearch-small", "--save-dir", d, "--max-updates", a.quality_updates,
            "--valid-every", every, "--valid-bleu-sentences", 500, "--log-every", every, "--seed", 1, "--force",
            "--keep-last", 1] + OPTIMIZER_OPTIONS[a.quality_optimizer] + (["--bf16"] if p == "bf16" else []),
            env=peers.quiet_env(),
            log_path=d.parent / f"{d.name}.log")
        with open(d / "train.jsonl", encoding="utf-8") as f:
            curves[p] = [r for r in map(json.loads, f) if r.get("type") == "valid"]
        walls[p] = m.wall_s
        shutil.copyfile(d / "train.jsonl", d.parent / f"{d.name}.jsonl")
        shutil.rmtree(d, ignore_errors=True)
    rows = [[f"{x['update']:,}", f"{x['valid_loss']:.4f}", f"{y['valid_loss']:.4f}",
             f"{100 * (y['valid_loss'] - x['valid_loss']) / x['valid_loss']:+.2f}%",
             f"{x.get('valid_bleu', float('nan')):.2f}", f"{y.get('valid_bleu', float('nan')):.2f}"]
            for x, y in zip(curves["fp32"], curves["bf16"])]
    recipe = ("the paper's recipe (Adadelta, clip 1)" if a.quality_optimizer == "adadelta"
              else "Adam 1e-3, no clip (the small part's)")
    out += ["", f"Part quality: fp32 against bf16 autocast, rnnsearch-small on the synthetic corpus, {recipe}, "
                f"seed 1, {a.quality_updates} updates", "-" * 100,
            "The same run twice, only the precision differs: validation cross-entropy per token on the whole dev set "
            "(1,000 pairs) and greedy BLEU (tokenised) on its first 500 sentences. "
            f"Wall: fp32 {walls['fp32']:.0f} s, bf16 {walls['bf16']:.0f} s.", ""]
    out += table(["update", "fp32 valid loss", "bf16 valid loss", "difference", "fp32 BLEU", "bf16 BLEU"], rows)
    if not rows:
        return []
    last_x, last_y = curves["fp32"][-1], curves["bf16"][-1]
    # the goal is stated as "validation quality unchanged": within 2% of fp32's validation loss
    closeness = 100 - abs(100 * (last_y["valid_loss"] - last_x["valid_loss"]) / last_x["valid_loss"])
    return [Goal("bf16 validation loss within 2% of fp32's after the same updates (100 − |difference| in %)",
                 closeness, 98.0)]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(args)
    title = "nmtkit training benchmark" + (" (QUICK SMOKE RUN: not comparable)" if a.quick else "")
    out = peers.start_report("bench_train.py", title, args, a.allow_dirty)
    if out is None:
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    out.append(f"OpenNMT-py venv: {a.onmt_venv}; work dir: {a.work}")
    s = Session(a)
    goals: list[Goal] = []
    try:
        log("measuring matmul GFLOP/s")
        precisions = ("fp32", "bf16") if a.bf16_native else ("fp32",)
        ceilings = {p: matmul_gflops(a.matmul_size, p) for p in precisions}
        if "small" in a.parts:
            goals += small_part(s, out, ceilings)
        if "paper" in a.parts:
            # measured again next to the paper-size runs (this VM drifts for minutes at a time): the best of both
            # is the ceiling
            log("measuring matmul GFLOP/s again")
            again = {p: matmul_gflops(a.matmul_size, p) for p in precisions}
            ceilings = {p: again[p] if again[p]["best"] > ceilings[p]["best"] else ceilings[p] for p in again}
            goals += paper_part(s, out, ceilings)
        if "quality" in a.parts:
            goals += quality_part(s, out)
    except BenchError as e:
        return peers.fail_report(out, a.out, e)
    return peers.finish_report(out, goals, 3, a.out, t0)


if __name__ == "__main__":
    sys.exit(main())
