#!/usr/bin/env python3
"""Training and decoding beside other work: target tokens/s of nmt-train and lines/s of nmt-translate idle, beside
one busy core at nice 0 and beside one at nice 19, this commit against an older one (issue 55, part 3).

One command (about 25 minutes on two cores; run it alone, from a clean commit -- a dirty tree is refused)::

    python tests/bench/bench_steady.py                       # writes tests/bench/results/bench_steady.txt
    python tests/bench/bench_steady.py --baseline 0c0678f --repeats 3 --updates 60

The busy core is ``python -c 'while True: pass'``, started before the measured command and killed after it.
Both commits run from their own checkouts (the older one a git worktree in the work directory), each with the
options its ``examples/one-hour.sh`` gives: the older one ``--threads 2``, this one its default.  Runs are
interleaved: every repeat goes through the loads, and at each load through both commits, their order swapped
from one repeat to the next.

- **Training**: the hour's model and data (``rnnsearch-small``, the 'budget' recipe; 150,000 Hansards pairs drawn
  at random, a joint SentencePiece vocabulary of 16,000 units, pairs of at most 36 pieces: ``peers.prepare_hour``),
  bf16 where the CPU has it natively, else fp32, as ``one-hour.sh`` chooses; ``--updates`` updates, target tokens/s
  over those after the 10th from the JSON log (the start-up, the first updates' allocations excluded; the thread
  trials of this commit included).  Its quality beside it: the training loss of the last 10 updates (the same
  batches at every load: a change of thread count rounds differently, nothing more).
- **Decoding**: ``--lines`` lines spread evenly over ``hansards/test`` through ``nmt-translate`` with ``one-hour.sh``'s
  options (beam 12, no repeated 4-gram, numbers from the source), on a model trained by this script once
  (``--model-updates`` updates of the same recipe, cached; or ``--model``); lines/s over the whole process (the
  start-up included), and the output's sacreBLEU against the reference beside it.  An input of fewer lines than a
  window (640) is decoded in the nmt-translate process with its threads (the path the thread count changes);
  a longer one goes to single-threaded worker processes (``--big-lines``: that path, measured the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, table  # noqa: E402

LOADS = ("idle", "busy core, nice 0", "busy core, nice 19")
DECODE_OPTIONS = ["--beam", "12", "--no-repeat-ngram", "4", "--source-numbers", "--all-numbers"]
SKIP = 10  # updates not counted: start-up, the first allocations


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="0c0678f", help="the commit compared against (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--updates", type=int, default=60, help="updates per training run (the first 10 not counted)")
    p.add_argument("--lines", type=int, default=300, help="lines decoded per run (in-process decoding)")
    p.add_argument("--big-lines", type=int, default=0, help="also decode this many lines (worker processes)")
    p.add_argument("--model", type=Path, help="the checkpoint to decode with (default: trained once here)")
    p.add_argument("--model-updates", type=int, default=800)
    p.add_argument("--parts", default="train,decode")
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK)
    p.add_argument("--out", type=Path, default=peers.RESULTS_DIR / "bench_steady.txt")
    p.add_argument("--allow-dirty", action="store_true", help="run on a dirty tree (the report says it is no "
                   "evidence)")
    return p.parse_args(argv)


class Busy:
    """One busy core (``python -c 'while True: pass'``) at a nice level, for the time of a ``with`` block."""

    def __init__(self, load: str):
        self.nice = None if load == "idle" else (19 if "19" in load else 0)

    def __enter__(self):
        self.proc = None
        if self.nice is not None:
            nice = self.nice
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                         preexec_fn=lambda: os.nice(nice))
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def precision() -> str:
    import torch

    from nmtkit.device import bf16_is_native

    return "bf16" if bf16_is_native(torch.device("cpu")) else "fp32"


def train_cmd(checkout: Path, prep: Path, save: Path, updates: int, threads: list, prec: str) -> list:
    return [sys.executable, checkout / "bin" / "nmt-train", prep, "--arch", "rnnsearch-small", "--recipe", "budget",
            "--max-updates", updates, "--save-dir", save, "--valid-every", 10 ** 9, "--valid-bleu-sentences", 0,
            "--log-every", 10, "--keep-last", 1, "--seed", 1, "--force"] + threads + (
                ["--bf16"] if prec == "bf16" else [])


def train_once(checkout: Path, prep: Path, runs: Path, name: str, updates: int, threads: list, prec: str) -> dict:
    d = runs / name
    shutil.rmtree(d, ignore_errors=True)
    m = peers.run_measured(train_cmd(checkout, prep, d, updates, threads, prec),
                           env={**peers.quiet_env(), **peers.checkout_env(checkout)}, log_path=runs / f"{name}.log")
    got = peers.nmtkit_tokens_per_s(d / "train.jsonl", SKIP)
    records = [json.loads(x) for x in (d / "train.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    last = [r for r in records if r.get("type") == "train"][-1]
    changes = [line for line in m.output.splitlines() if "thread(s) instead of" in line]
    shutil.rmtree(d, ignore_errors=True)
    return {"tok_s": got["tok_s"], "loss": last["loss"], "changes": len(changes)}


def decode_once(checkout: Path, model: Path, src: Path, ref: list[str], out: Path, threads: list) -> dict:
    import sacrebleu

    cmd = [sys.executable, checkout / "bin" / "nmt-translate", "-m", model, "--quiet"] + DECODE_OPTIONS + threads
    env = {**os.environ, **peers.quiet_env(), **peers.checkout_env(checkout)}
    wall, hyp = peers.translate_timed(cmd, src, out, len(ref), env)
    return {"lines_s": len(hyp) / wall, "bleu": sacrebleu.corpus_bleu(hyp, [ref]).score}


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    out = peers.start_report("bench_steady.py", "nmtkit beside other work: training and decoding idle and beside one "
                             "busy core", sys.argv[1:] if argv is None else argv, a.allow_dirty)
    if out is None:
        return 2
    head = peers.commit_of("HEAD")
    try:
        base_sha = peers.commit_of(a.baseline)
        base = peers.worktree(a.work, base_sha, "tree")
        trees = {"baseline": (base, base_sha, ["--threads", "2"]), "this": (peers.REPO, head, [])}
        out.append(f"commits: this {head[:12]} (its default threads), baseline {base_sha[:12]} (--threads 2, "
                   "as its one-hour.sh)")
        prep = peers.prepare_hour(a.work)
        prec = precision()
        runs = a.work / "steady-runs"
        runs.mkdir(parents=True, exist_ok=True)
        parts = a.parts.split(",")
        train: dict = {(t, ld): [] for t in trees for ld in LOADS}
        decode: dict = {(t, ld, n): [] for t in trees for ld in LOADS for n in (a.lines, a.big_lines) if n}
        model = a.model
        if "decode" in parts and model is None:
            model = a.work / f"steady-model-{a.model_updates}" / "checkpoint_last.pt"
            if not model.is_file():
                log(f"training the decoding model: {a.model_updates} updates")
                d = model.parent
                peers.run_measured(train_cmd(peers.REPO, prep, d, a.model_updates, ["--threads", "2"], prec),
                                   env=peers.quiet_env(), log_path=a.work / "logs" / "steady-model.log")
        root = peers.data_root()
        sources = {}
        test = {lang: (root / "hansards" / f"test.{lang}").read_text(encoding="utf-8").splitlines()
                for lang in ("en", "fr")}
        for n in (a.lines, a.big_lines):
            if n:  # n lines spread evenly over the two sittings (their first lines are all headings)
                keep = range(0, len(test["en"]), max(1, len(test["en"]) // n))[:n]
                src = a.work / f"steady-test{n}.en"
                src.write_text("".join(test["en"][i] + "\n" for i in keep), encoding="utf-8")
                sources[n] = (src, [test["fr"][i] for i in keep])
        order = list(trees)
        for r in range(a.repeats):
            for load in LOADS:
                for t in (order if r % 2 == 0 else order[::-1]):
                    checkout, _, threads = trees[t]
                    if "train" in parts:
                        with Busy(load):
                            got = train_once(checkout, prep, runs, f"{t}-{r}", a.updates, threads, prec)
                        train[t, load].append(got)
                        log(f"repeat {r + 1} {load} {t}: train {got['tok_s']:,.0f} tok/s, loss {got['loss']:.4f}, "
                            f"{got['changes']} change(s) of threads")
                    if "decode" in parts:
                        for n, (src, ref) in sources.items():
                            with Busy(load):
                                got = decode_once(checkout, model, src, ref, runs / f"{t}-{n}.fr", threads)
                            decode[t, load, n].append(got)
                            log(f"repeat {r + 1} {load} {t}: decode {n} lines {got['lines_s']:.1f} lines/s, "
                                f"BLEU {got['bleu']:.2f}")
        goals = []
        if "train" in parts:
            out += ["", f"Training: rnnsearch-small, {prec}, the hour's data; target tokens/s over updates "
                    f"{SKIP + 1}–{a.updates}; median (min–max) of {a.repeats} interleaved repeats; the share of "
                    "the same commit's idle median; the last 10 updates' training loss (median)", ""]
            rows = []
            for t in trees:
                idle = median([g["tok_s"] for g in train[t, "idle"]])
                for load in LOADS:
                    v = [g["tok_s"] for g in train[t, load]]
                    rows.append([t, load, f"{median(v):,.0f}", peers.spread(v), f"{median(v) / idle:.0%}",
                                 f"{median([g['loss'] for g in train[t, load]]):.4f}",
                                 " ".join(str(g["changes"]) for g in train[t, load])])
            out += table(["commit", "load", "tok/s", "(min–max)", "of idle", "loss", "thread changes"], rows,
                         "llrrrrl")
            out.append("Every run, in the order made: " + "; ".join(
                f"{t}/{ld}: " + ", ".join(f"{g['tok_s']:,.0f}" for g in train[t, ld]) for t in trees for ld in LOADS))
            idle_new, idle_old = (median([g["tok_s"] for g in train[t, "idle"]]) for t in ("this", "baseline"))
            goals.append(Goal("training beside a busy core (nice 0), % of its idle rate",
                              100 * median([g["tok_s"] for g in train["this", LOADS[1]]]) / idle_new, 40, "%"))
            goals.append(Goal("training idle, % of the baseline's idle rate (no loss when idle)",
                              100 * idle_new / idle_old, 97, "%"))
        if "decode" in parts:
            out += ["", f"Decoding: nmt-translate {' '.join(DECODE_OPTIONS)} on lines spread over hansards/test, "
                    f"model {model} ({prec} training); lines/s over the whole process, median (min–max) of "
                    f"{a.repeats}; sacreBLEU of the output", ""]
            rows = []
            for t in trees:
                for n in (a.lines, a.big_lines):
                    if not n:
                        continue
                    idle = median([g["lines_s"] for g in decode[t, "idle", n]])
                    for load in LOADS:
                        v = [g["lines_s"] for g in decode[t, load, n]]
                        bleu = median([g["bleu"] for g in decode[t, load, n]])
                        rows.append([t, n, load, f"{median(v):.1f}", f"({min(v):.1f}–{max(v):.1f})",
                                     f"{median(v) / idle:.0%}", f"{bleu:.2f}"])
            out += table(["commit", "lines", "load", "lines/s", "(min–max)", "of idle", "BLEU"], rows, "lrlrrrr")
            v = decode["this", LOADS[1], a.lines]
            goals.append(Goal(f"decoding {a.lines} lines beside a busy core (nice 0), % of its idle rate",
                              100 * median([g["lines_s"] for g in v]) /
                              median([g["lines_s"] for g in decode["this", "idle", a.lines]]), 40, "%"))
        return peers.finish_report(out, goals, 55, a.out, t0)
    except BenchError as e:
        return peers.fail_report(out, a.out, e)


if __name__ == "__main__":
    sys.exit(main())
