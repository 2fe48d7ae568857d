#!/usr/bin/env python3
"""Decoding controls on news-test-2014 with one trained model: BLEU of each setting, and what its outputs look like.

    python tests/bench/bench_decoding.py --model runs/quality/nmtkit/model/checkpoint_last.pt \\
        > tests/bench/results/bench_decoding.txt

Each setting is one ``nmt-translate`` run (beam 12, batch 80, default options otherwise) over all 3,003 sentences,
scored with sacreBLEU against the raw references; beside BLEU and chrF, the output length against the reference,
the share of lines with a repeated word trigram and ``<unk>`` per line (``bench_quality.diagnostics``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from bench_quality import DATA, REPO, _bleu, diagnostics  # noqa: E402

SETTINGS = {
    "default": [],
    "coverage penalty 0.2": ["--coverage-penalty", "0.2"],
    "coverage penalty 0.5": ["--coverage-penalty", "0.5"],
    "lenpen 0 (raw log-probability)": ["--lenpen", "0"],
    "max length 1.25 x source + 5": ["--max-len-a", "1.25", "--max-len-b", "5"],
}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_decoding.py", "nmtkit decoding settings on news-test-2014", args, a.allow_dirty)
    if head is None:
        return 2
    print("\n".join(head) + "\n")
    src, ref = DATA / "wmt14" / "newstest2014.en", DATA / "wmt14" / "newstest2014.fr"
    print(f"news-test-2014 (3,003 sentences), {a.model}; beam 12, batch 80; sacreBLEU on detokenised output\n")
    print(f"{'setting':34} {'BLEU':>6} {'chrF':>6} {'len':>5} {'loops':>6} {'unk':>5} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in SETTINGS.items():
            out = Path(tmp) / "hyp.fr"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", a.model, "-i", str(src),
                            "-o", str(out), "--beam", "12", "--batch-size", "80", "--threads", str(a.threads), "-q",
                            *options], check=True)
            wall = time.perf_counter() - t0
            s, d = _bleu(out, ref), diagnostics(out, ref)
            print(f"{name:34} {s['bleu']:>6.2f} {s['chrf']:>6.2f} {d['ratio']:>5.2f} {100 * d['loops']:>5.0f}% "
                  f"{d['unk']:>5.1f} {wall:>7.0f}", flush=True)
    print("\nlen: output / reference length (13a tokens, <unk> as one); loops: lines with a repeated word trigram")
    return 0


if __name__ == "__main__":
    sys.exit(main())
