#!/usr/bin/env python3
"""Where a model trained on short pairs loses: validation perplexity and attention by sentence length.

    python tests/bench/bench_length.py --data runs/q/hans16k --model runs/quality/nmtkit/model/checkpoint_last.pt \\
        [--onmt-log runs/quality/onmt/log.txt] [--hyps nmtkit=runs/quality/nmtkit onmt=runs/quality/onmt]

For the validation split of a prepared directory (every pair, also those longer than the training limit), in
teacher forcing with the checkpoint in eval mode:

- perplexity of the pairs whose sides are all within ``--limit`` tokens (what the model trained on) and of the
  longer ones, overall and by target position (0-9, 10-19, ...);
- the attention's entropy (nats), the largest weight and the mean argmax position at the first five target steps,
  for short and long sources.

With ``--onmt-log``, OpenNMT-py's own validation perplexity on the same split (from its training log). With
``--hyps``, BLEU by source length on news-test-2014 and hansards/test of each toolkit's hypothesis files
(``nmt-score --by-length``), side by side.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
# the tools it runs import this checkout's nmtkit (bin/ has no sys.path of its own)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)

TESTS = {"newstest2014": ("wmt14/newstest2014.en", "wmt14/newstest2014.fr"),
         "hansards-test": ("hansards/test.en", "hansards/test.fr")}


@torch.no_grad()
def measure(data: str, model_path: str, limit: int) -> list[str]:
    from nmtkit.data import checkpoint
    from nmtkit.data.batching import collate
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import build_from_checkpoint

    model = build_from_checkpoint(checkpoint.load(model_path)).eval()
    prepared = PreparedData.open(data)
    src, tgt = prepared.corpus("valid", prepared.source_lang), prepared.corpus("valid", prepared.target_lang)
    nll: dict[tuple[str, int], list[float]] = {}
    attn: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    counts = {"short": 0, "long": 0}
    for i in range(len(src)):
        b = collate(src, tgt, np.asarray([i]))
        kind = "long" if max(src.sizes[i], tgt.sizes[i]) > limit else "short"
        counts[kind] += 1
        logp = torch.log_softmax(model(b.src, b.src_lens, b.tgt_in).float(), dim=-1)[0]  # (Ty, V)
        for pos, v in enumerate((-logp.gather(1, b.tgt_out[0][:, None]).squeeze(1)).tolist()):
            nll.setdefault((kind, min(pos // 10, 5)), []).append(v)
        if model.arch != "rnnsearch":
            continue
        enc = model.prepare_decoding(model.encode(b.src, b.src_lens))
        state, T = model.init_decoder(enc), int(b.src_lens[0])
        for t, y in enumerate(b.tgt_in[0].tolist()[:5]):
            _, state, alpha = model.decode_step(torch.tensor([y]), state, enc)
            a = alpha[0, :T]
            attn.setdefault((kind, t), []).append((float(-(a * a.clamp_min(1e-12).log()).sum()), float(a.max()),
                                                   float(a.argmax())))
    lines = [f"validation split of {data}: {counts['short']} pairs within {limit} tokens a side (as trained), "
             f"{counts['long']} longer; {model_path}", "",
             f"{'':8} {'pairs':>6} {'tokens':>7} {'ppl':>7}   ppl by target position: "
             + " ".join(f"{f'{10 * k}-{10 * k + 9}' if k < 5 else '50+':>7}" for k in range(6))]
    for kind in ("short", "long"):
        allv = [v for (k, _), vs in nll.items() if k == kind for v in vs]
        by_pos = [nll.get((kind, k)) for k in range(6)]
        lines.append(f"{kind:8} {counts[kind]:>6} {len(allv):>7} {math.exp(np.mean(allv)):>7.2f}   "
                     + " " * 24 + " ".join(f"{math.exp(np.mean(v)):>7.2f}" if v else f"{'-':>7}" for v in by_pos))
    everything = [v for vs in nll.values() for v in vs]
    lines.append(f"{'all':8} {sum(counts.values()):>6} {len(everything):>7} {math.exp(np.mean(everything)):>7.2f}")
    if attn:
        lines += ["", "attention at the first target steps (mean over sentences): entropy nats / largest weight / "
                      "argmax source position"]
        for kind in ("short", "long"):
            cells = []
            for t in range(5):
                v = np.array(attn[(kind, t)])
                cells.append(f"step {t + 1}: {v[:, 0].mean():.2f} / {v[:, 1].mean():.2f} / {v[:, 2].mean():.1f}")
            lines.append(f"{kind:8} " + "   ".join(cells))
        v_a = model.state_dict()["attention.v_a"]
        lines.append(f"v_a: L1 norm {float(v_a.abs().sum()):.2f} (additive scores e_ij = v_a' tanh(...) lie within "
                     "plus or minus it)")
    return lines


def by_length(hyps: dict[str, str]) -> list[str]:
    lines = []
    for test, (src, ref) in TESTS.items():
        files = [(name, Path(d) / f"{test}.hyp.fr") for name, d in hyps.items()]
        files = [(n, f) for n, f in files if f.is_file()]
        if not files:
            continue
        cmd = [sys.executable, str(REPO / "bin" / "nmt-score"), "-r", str(DATA / ref), "-s", str(DATA / src),
               "--by-length", "--metrics", "BLEU", "-q", *(str(f) for _, f in files)]
        for name, _ in files:
            cmd += ["-n", name]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        lines += ["", f"BLEU by source length, {test} (nmt-score --by-length):", out.rstrip()]
    return lines


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--limit", type=int, default=30, help="the training pairs' length limit")
    p.add_argument("--onmt-log", help="OpenNMT-py's training log, for its validation perplexity")
    p.add_argument("--hyps", nargs="*", default=[], metavar="NAME=DIR", help="DIR/{newstest2014,hansards-test}.hyp.fr")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    torch.set_num_threads(a.threads)
    head = peers.start_report("bench_length.py", "nmtkit: where a model trained on short pairs loses", args,
                              a.allow_dirty)
    if head is None:
        return 2
    lines = head + [""] + measure(a.data, a.model, a.limit)
    if a.onmt_log:
        found = re.findall(r"Validation perplexity: ([\d.]+)", Path(a.onmt_log).read_text(encoding="utf-8"))
        if found:
            lines.append(f"OpenNMT-py's own validation perplexity on the same split (all pairs): {found[-1]}")
    lines += by_length(dict(x.split("=", 1) for x in a.hyps))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
