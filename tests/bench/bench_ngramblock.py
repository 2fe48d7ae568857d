#!/usr/bin/env python3
"""What the repeated-n-gram block costs in beam search, and which way of computing it to keep.

    taskset -c 1 python tests/bench/bench_ngramblock.py --model runs/small/checkpoint_last.pt \\
        >> tests/bench/results/bench_ngramblock.txt

The first ``--lines`` lines of ``--input`` (default: Hansards dev) decoded with ``Translator`` (beam 12, batches of
64, one process, ``--threads`` torch threads) three ways, in ``--repeats`` rounds, each round in another order (so
that no way always runs first): the block off; on (``-n``, default 3) as ``nmtkit/translate/ngramblock.py``'s
``ban_repeats`` computes it (the last n−1 tokens against every earlier window of the (hypotheses, t) token tensor,
one ``scatter_reduce``); and on as fairseq does (``ban_repeats_dict`` below: per hypothesis a dict from (n−1)-gram
to the tokens that followed it, rebuilt from the token lists at every step). Printed: each way's best wall time,
the seconds spent inside the block function itself (timed around every call, so less sensitive to the rest of the
machine), its calls, the lines with a repeated token trigram, and whether the two ways' translations are identical
(they must be: then the rest of the decoding is the same work, and only the time in the block differs).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from nmtkit.data.vocab import EOS
from nmtkit.translate import search
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.ngramblock import ban_repeats
from nmtkit.translate.translator import Translator

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)


def ban_repeats_dict(logp: torch.Tensor, history: torch.Tensor, n: int) -> None:
    """``ngramblock.ban_repeats`` the way fairseq does it (``_no_repeat_ngram``): for each hypothesis a dict from
    (n−1)-gram to the tokens that followed it, built from its token list each step, and a look-up of its last n−1
    tokens; the bans written with one indexed assignment."""
    R, t = history.shape
    if n < 1 or t < n:
        return
    rows, cols = [], []
    for r, toks in enumerate(history.tolist()):
        seen: dict[tuple[int, ...], list[int]] = {}
        for i in range(t - n + 1):
            seen.setdefault(tuple(toks[i: i + n - 1]), []).append(toks[i + n - 1])
        for v in seen.get(tuple(toks[t - n + 1:]), ()):
            if v != EOS:
                rows.append(r)
                cols.append(v)
    if rows:
        logp[torch.tensor(rows, device=logp.device), torch.tensor(cols, device=logp.device)] = -math.inf


def _timed(fn, clock: list[float]):
    def wrapper(logp, history, n):
        t0 = time.perf_counter()
        fn(logp, history, n)
        clock[0] += time.perf_counter() - t0
        clock[1] += 1
    return wrapper


def _repeats(tokens: list[str], n: int = 3) -> bool:
    grams = [tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--input", default=str(DATA / "hansards" / "dev.en"))
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--beam", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("-n", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    torch.set_num_threads(a.threads)
    head = peers.start_report("bench_ngramblock.py", "nmtkit: what the repeated-n-gram block costs beam search",
                              args, a.allow_dirty)
    if head is None:
        return 2
    with open(a.input, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(a.lines)]
    ways = {"off": (0, ban_repeats), "tensor (kept)": (a.n, ban_repeats), "dict (fairseq)": (a.n, ban_repeats_dict)}
    best = {w: math.inf for w in ways}
    inside: dict[str, list[float]] = {}
    outputs: dict[str, list[str]] = {}
    load0 = os.getloadavg()
    t_all = time.perf_counter()
    names = list(ways)
    for r in range(a.repeats):
        for name in names[r % 3:] + names[: r % 3]:  # each round in another order: no way always runs first
            n, fn = ways[name]
            clock = [0.0, 0]
            search.ban_repeats = _timed(fn, clock)
            tr = Translator([a.model], DecodeConfig(beam=a.beam, no_repeat_ngram=n), batch_size=a.batch_size,
                            workers=1, threads=a.threads, tokenized=True)
            t0 = time.perf_counter()
            outputs[name] = tr.translate_lines(lines)
            best[name] = min(best[name], time.perf_counter() - t0)
            inside[name] = clock
    search.ban_repeats = ban_repeats
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print("\n".join(head) + "\n")
    print(f"{a.lines} lines of {a.input}, {a.model};\nbeam {a.beam}, batch {a.batch_size}, {a.threads} torch "
          f"thread(s), n = {a.n}, best of {a.repeats};\nmain at {rev}, load average {load0[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after, {time.perf_counter() - t_all:.0f} s in all\n")
    print(f"{'block':16} {'wall s':>8} {'vs off':>7} {'in block s':>11} {'calls':>6} {'loops':>6}")
    for name in ways:
        loops = sum(_repeats(x.split()) for x in outputs[name])
        print(f"{name:16} {best[name]:>8.1f} {best[name] / best['off']:>7.3f} {inside[name][0]:>11.2f} "
              f"{inside[name][1]:>6} {loops:>6}")
    print(f"\nthe two ways' translations identical: {outputs['tensor (kept)'] == outputs['dict (fairseq)']}")
    print("loops: lines with a repeated token trigram (tokenised output)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
