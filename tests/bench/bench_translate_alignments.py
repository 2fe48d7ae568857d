#!/usr/bin/env python3
"""What ``nmt-translate --alignments --alignment-method posterior`` costs and gains over the attention's links,
measured through the command a user runs (run alone on an idle machine):

    python tests/bench/bench_translate_alignments.py -m MODEL --test test.en --lines 500 \\
        --trial-e trial.e --trial-f trial.f --gold trial.align --gold-order tgt-src [--threads 2]

- **Cost**: ``--test``'s first ``--lines`` lines translated with ``--alignments`` by each method (wall clock of
  the whole command, checkpoint loading included, best of ``--repeat``); the translations must be identical, and
  how many lines' links differ is counted.
- **Gain**: the trial pairs translated with the trial's French as ``--prefix`` (``--tokenized``: the gold links
  count those words), so that the translation begins with the reference; the links of its first words (the
  reference's) held against the gold links (AER, precision, recall).  The trial text is given recased as the
  cpu-scale recipe gives it to a cased model (``examples/steps.py recase``), its ``<s snum=...>`` wrappers removed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)
TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
METHODS = ("attention", "posterior")


def translate(model, src, out_dir: Path, method: str, threads: int, *more: str) -> tuple[float, list[str], list[str]]:
    out, links = out_dir / f"{method}.out", out_dir / f"{method}.align"
    start = time.monotonic()
    proc = subprocess.run([*TRANSLATE, "-m", model, "-i", str(src), "-o", str(out), "--alignments", str(links),
                           "--alignment-method", method, "--threads", str(threads), "-q", *more],
                          capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode:
        raise SystemExit(f"nmt-translate failed: {proc.stderr.strip()}")
    return seconds, out.read_text(encoding="utf-8").splitlines(), links.read_text(encoding="utf-8").splitlines()


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--test", required=True, help="source lines to time the two methods on")
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--trial-e", required=True)
    p.add_argument("--trial-f", required=True)
    p.add_argument("--gold", required=True)
    p.add_argument("--gold-order", default="tgt-src", choices=["src-tgt", "tgt-src"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_translate_alignments.py", "nmt-translate --alignments: attention against "
                              "posterior", args, a.allow_dirty)
    if head is None:
        return 2
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    from nmtkit.align import alignment_error, load_gold, read_text

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        test = d / "test.en"
        with open(a.test, encoding="utf-8") as f:
            test.write_text("".join(line for _, line in zip(range(a.lines), f)), encoding="utf-8")
        print("\n".join(head) + "\n")
        print(f"nmt-translate --alignments on the first {a.lines} lines of {a.test} ({a.model}, {a.threads} "
              f"thread(s), wall clock of the command, best of {a.repeat})")
        runs = {}
        for method in METHODS:
            times = []
            for _ in range(a.repeat):
                seconds, out, links = translate(a.model, test, d, method, a.threads)
                times.append(seconds)
            runs[method] = (min(times), out, links)
            print(f"  {method:9}  {min(times):6.1f} s  {len(out) / min(times):6.1f} lines/s")
        if runs["attention"][1] != runs["posterior"][1]:
            raise SystemExit("the translations differ between the two methods")
        differ = sum(x != y for x, y in zip(runs["attention"][2], runs["posterior"][2]))
        print(f"  the same translations; the links of {differ} of {len(runs['posterior'][2])} lines differ")

        src, ref = read_text(a.trial_e), read_text(a.trial_f)
        (d / "trial.e").write_text("".join(s.text + "\n" for s in src), encoding="utf-8")
        (d / "trial.f").write_text("".join(s.text + "\n" for s in ref), encoding="utf-8")
        gold = load_gold(a.gold, "auto", a.gold_order, src)
        print(f"\nthe {len(src)} pairs of {a.trial_e} / {a.trial_f}, translated with the French as --prefix "
              f"(--tokenized); the links of the prefix's words against {a.gold}")
        for method in METHODS:
            _, out, links = translate(a.model, d / "trial.e", d, method, a.threads, "--tokenized", "--prefix",
                                      str(d / "trial.f"))
            hyps = []
            for r, line, text in zip(ref, links, out):
                if not text.startswith(r.text):
                    raise SystemExit(f"a translation does not begin with its prefix: {text!r}")
                m = len(r.text.split())
                hyps.append({(i, j) for i, j in (map(int, x.split("-")) for x in line.split()) if j < m})
            s = alignment_error(hyps, gold)
            print(f"  {method:9}  AER {s.aer:.3f}  precision {s.precision:.3f}  recall {s.recall:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
