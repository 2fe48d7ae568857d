#!/usr/bin/env python3
"""bf16 training where the CPU has AMX: the hour's training at this commit against an older one (issue 55, part 2).

One command (about 20 minutes on two cores; run it alone, from a clean commit -- a dirty tree is refused)::

    python tests/bench/bench_bf16_rows.py --baseline 1e85d58     # writes tests/bench/results/bench_bf16_rows.txt

What it measures: ``nmt-train`` with the hour's model and data (``rnnsearch-small``, the 'budget' recipe, 150,000
Hansards pairs and a 16,000-unit SentencePiece vocabulary: ``peers.prepare_hour``), ``--threads 2``, for
``--updates`` updates, in three runs per repeat: the baseline commit in bf16, this commit in bf16, and this commit
in fp32 (the precision ``one-hour.sh`` would otherwise choose).  Target tokens/s over the updates after the
``--skip``-th (from the JSON log), median and range over ``--repeats`` interleaved repeats, the runs' order
rotated from one repeat to the next.  Repeat r trains with seed r in all three runs, so that the baseline's bf16
run and this commit's see the same batches: their losses differ by rounding only.  Quality beside the speed: the
training loss of the last logged updates and the validation loss (the hour's 500 validation pairs) after the last
update (``--updates 2000 --repeats 2 --runs baseline-bf16,this-bf16``: issue 55's check of the loss at 2,000
updates and two seeds).  The process's peak memory beside them (oneDNN now keeps more compiled products).

The baseline runs from a git worktree of it in the work directory.  On a CPU without native bf16 the bf16 runs are
emulated and meaningless: the script refuses.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, table  # noqa: E402

RUNS = (("baseline", "bf16"), ("this", "bf16"), ("this", "fp32"))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="1e85d58", help="the commit compared against [1e85d58]")
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--skip", type=int, default=100,
                   help="updates not counted (start-up, the first shapes compiled) [100]")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--runs", default=",".join(f"{t}-{p}" for t, p in RUNS),
                   help="which of the three runs, comma-separated [all: baseline-bf16,this-bf16,this-fp32]")
    p.add_argument("--work", type=Path, default=Path("/tmp/nmtkit-bench"))
    p.add_argument("--out", type=Path, default=peers.RESULTS_DIR / "bench_bf16_rows.txt")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    return p.parse_args(argv)


def train_once(checkout: Path, prep: Path, runs: Path, name: str, a, prec: str, seed: int) -> dict:
    d = runs / name
    shutil.rmtree(d, ignore_errors=True)
    cmd = [sys.executable, checkout / "bin" / "nmt-train", prep, "--arch", "rnnsearch-small", "--recipe", "budget",
           "--max-updates", a.updates, "--save-dir", d, "--valid-every", a.updates, "--valid-bleu-sentences", 0,
           "--log-every", 10, "--keep-last", 1, "--seed", seed, "--threads", 2, "--force"] + (
               ["--bf16"] if prec == "bf16" else [])
    m = peers.run_measured(cmd, env={**peers.quiet_env(), **peers.checkout_env(checkout)},
                           log_path=runs / f"{name}.log")
    got = peers.nmtkit_tokens_per_s(d / "train.jsonl", a.skip)
    records = [json.loads(x) for x in (d / "train.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    valid = [r for r in records if r.get("type") == "valid"]
    if not valid or "valid_loss" not in valid[-1]:
        raise BenchError(f"{d}/train.jsonl: no validation loss after update {a.updates}")
    shutil.rmtree(d, ignore_errors=True)
    return {"tok_s": got["tok_s"], "loss": got["loss"], "valid": valid[-1]["valid_loss"], "rss": m.max_rss_kb}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    t0 = time.time()
    out = peers.start_report("bench_bf16_rows.py", "bf16 training where the CPU has AMX: this commit against an "
                             "older one", argv, a.allow_dirty)
    if out is None:
        return 2
    try:
        import torch

        from nmtkit.device import bf16_is_native

        if not bf16_is_native(torch.device("cpu")):
            raise BenchError("this CPU has no native bf16 (AVX-512 BF16 or AMX): the bf16 runs would be emulated")
        head, base_sha = peers.commit_of("HEAD"), peers.commit_of(a.baseline)
        trees = {"baseline": peers.worktree(a.work, base_sha, "tree"), "this": peers.REPO}
        out.append(f"commits: this {head[:12]}, baseline {base_sha[:12]}; CPU flags: "
                   f"{' '.join(f for f in ('avx512_bf16', 'amx_bf16') if f in Path('/proc/cpuinfo').read_text())}")
        prep = peers.prepare_hour(a.work)
        runs = a.work / "bf16-rows-runs"
        runs.mkdir(parents=True, exist_ok=True)
        chosen = tuple(run for run in RUNS if f"{run[0]}-{run[1]}" in a.runs.split(","))
        if ("baseline", "bf16") not in chosen or ("this", "bf16") not in chosen:
            raise BenchError("--runs must hold baseline-bf16 and this-bf16 (every figure is a ratio to the first)")
        got: dict = {run: [] for run in chosen}
        for r in range(a.repeats):
            order = chosen[r % len(chosen):] + chosen[: r % len(chosen)]
            for tree, prec in order:
                g = train_once(trees[tree], prep, runs, f"{tree}-{prec}-{r}", a, prec, seed=r + 1)
                got[tree, prec].append(g)
                log(f"repeat {r + 1} {tree} {prec}: {g['tok_s']:,.0f} tok/s, loss {g['loss']:.4f}, valid "
                    f"{g['valid']:.4f}")
        base = median([g["tok_s"] for g in got["baseline", "bf16"]])
        out += ["", f"Training: rnnsearch-small, the hour's data, --threads 2; target tokens/s over updates "
                f"{a.skip + 1}–{a.updates}, median (min–max) of {a.repeats} interleaved repeats (seed r in repeat "
                f"r); the training loss of the last 10 updates and the validation loss after update {a.updates} "
                "(medians)", ""]
        rows = []
        for tree, prec in chosen:
            v = [g["tok_s"] for g in got[tree, prec]]
            rows.append([tree, prec, f"{median(v):,.0f}", peers.spread(v), f"{median(v) / base:.2f}×",
                         f"{median([g['loss'] for g in got[tree, prec]]):.4f}",
                         f"{median([g['valid'] for g in got[tree, prec]]):.4f}",
                         peers.fmt_mb(median([g["rss"] or 0 for g in got[tree, prec]]) or None)])
        out += table(["commit", "precision", "tok/s", "(min–max)", "of baseline bf16", "train loss", "valid loss",
                      "peak RSS"], rows, "llrrrrrr")
        out.append("Every run, in the order made (tok/s, valid loss): " + "; ".join(
            f"{t} {p}: " + ", ".join(f"{g['tok_s']:,.0f} {g['valid']:.4f}" for g in got[t, p]) for t, p in chosen))
        pairs = [(n["tok_s"] / b["tok_s"], n["valid"] - b["valid"])
                 for n, b in zip(got["this", "bf16"], got["baseline", "bf16"])]
        out.append("this bf16 / baseline bf16, per repeat (same seed): " + ", ".join(
            f"{x:.2f}× (valid loss {d:+.4f})" for x, d in pairs))
        this_bf16 = median([g["tok_s"] for g in got["this", "bf16"]])
        goals = [Goal("this commit's bf16 training against the baseline's, ×", this_bf16 / base, 1.0, "×")]
        if ("this", "fp32") in got:
            goals.append(Goal("this commit's bf16 training against its fp32 (one-hour.sh's bf16 choice), ×",
                              this_bf16 / median([g["tok_s"] for g in got["this", "fp32"]]), 1.0, "×"))
    except (BenchError, OSError) as e:
        return peers.fail_report(out, a.out, e)
    return peers.finish_report(out, goals, 55, a.out, t0)


if __name__ == "__main__":
    sys.exit(main())
