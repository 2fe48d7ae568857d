"""What a small RNNsearch learns per update, one change at a time (issue: learning within the budget a user has).

Trains ``rnnsearch-small`` on a prepared Hansards corpus (``nmt-prepare --max-len 30``, 16,000-word vocabularies:
the peer comparison's task, ``../shared/peers/README.md``) once per *variant* -- the same data, seed, batches of 80
and number of updates, each variant changing one training setting against a base -- and records, at every
``--eval-every`` updates:

- validation perplexity (``nmt-train``'s own, on the prepared ``valid`` split),
- BLEU of greedy decoding of a fixed sample of ``hansards/test`` (sacreBLEU on detokenised output),
- AER of the attention on the Hansards trial set's gold alignments (hard links by argmax, as ``nmt-align``), beside
  the monotone diagonal's; the attention's mean entropy per target word there (in nats; a uniform α over a
  sentence of T words has log T), and its mean weight on the source's ``</s>`` (the annotation whose forward half
  →h_T summarises the whole sentence: a model that attends there uses attention as RNNencdec uses its c),

and, at the last update, BLEU with beam 12 on the same sample.  Variants run as separate processes, ``--parallel``
at a time with ``--threads`` torch threads each (the figures are per update: timing is not measured here).

    python tests/bench/bench_learning.py --data runs/q/hans16k --work runs/learning --updates 2000 \\
        --variants base,xavier --parallel 2 > tests/bench/results/bench_learning.txt

``--list`` prints the variants.  Results: one JSON per variant in ``WORK/NAME/eval.json``, and the table on stdout.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from nmtkit.translate.config import DecodeConfig

REPO = Path(__file__).resolve().parents[2]
# the tools it runs import this checkout's nmtkit (bin/ has no sys.path of its own)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)

# name -> (what it changes, nmt-train options).  "base" is the issue's measurement: B.1 init, Adam 1e-3, clip 1.
BASE = ["--arch", "rnnsearch-small", "--recipe", "paper", "--optimizer", "adam", "--lr", "0.001", "--clip-norm", "1",
        "--batch-size", "80"]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "base": ("Appendix B.1 init, Adam 1e-3, clip 1 (the issue's setting)", []),
    "xavier": ("Glorot init for every non-recurrent matrix", ["--init", "xavier"]),
    "xavier-flat": ("Glorot init, but v_a = 0 (α uniform at the start, as with B.1)", ["--init", "xavier-flat"]),
    "flat-ls0.1": ("xavier-flat + label smoothing 0.1", ["--init", "xavier-flat", "--label-smoothing", "0.1"]),
    "flat-invsqrt": ("xavier-flat + Adam 2e-3, 500 warm-up updates, inverse square root decay",
                     ["--init", "xavier-flat", "--lr", "0.002", "--lr-scheduler", "inverse-sqrt",
                      "--warmup-updates", "500"]),
    "xavier-maxout256": ("+ maxout l = 256 (no 128-unit bottleneck)", ["--init", "xavier", "-o", "maxout_dim=256"]),
    "flat-maxout256": ("xavier-flat + maxout l = 256 (no 128-unit bottleneck before the 16k-word output)",
                       ["--init", "xavier-flat", "-o", "maxout_dim=256"]),
    "flat-current": ("flat-maxout256 + the decoder state reads the current word, s_i = f(s_{i-1}, y_i, c_i) (v6, "
                     "GroundHog)", ["--init", "xavier-flat", "-o", "maxout_dim=256", "-o", "state_word=current"]),
    "flat-clip5": ("xavier-flat + clipping at 5 instead of 1", ["--init", "xavier-flat", "--clip-norm", "5"]),
    "xavier-noclip": ("+ no gradient clipping", ["--init", "xavier", "--clip-norm", "0"]),
    "xavier-clip5": ("+ clipping at 5", ["--init", "xavier", "--clip-norm", "5"]),
    "xavier-lr2e-3": ("+ Adam 2e-3", ["--init", "xavier", "--lr", "0.002"]),
    "xavier-ls0.1": ("+ label smoothing 0.1", ["--init", "xavier", "--label-smoothing", "0.1"]),
    "xavier-invsqrt": ("+ Adam 2e-3, 500 warm-up updates, inverse square root decay",
                       ["--init", "xavier", "--lr", "0.002", "--lr-scheduler", "inverse-sqrt",
                        "--warmup-updates", "500"]),
    "xavier-ema": ("+ EMA of the weights (0.999) for validation", ["--init", "xavier", "--ema-decay", "0.999"]),
    "xavier-avg4": ("+ the mean of the last 4 validations' weights (every 500 updates)",
                    ["--init", "xavier", "--average-last", "4"]),
}


# ---------------------------------------------------------------------------------------------------- evaluation
def _recase_map(vocab_tokens: list[str]) -> dict[str, str]:
    """lowercased word -> its most frequent casing in a frequency-ordered vocabulary (the trial set is lowercased,
    the model cased: 'i' -> 'I', 'canada' -> 'Canada'; same words, same count, so the gold links still apply)."""
    out: dict[str, str] = {}
    for tok in vocab_tokens:
        out.setdefault(tok.lower(), tok)
    return out


def diagonal_aer(trial: Path) -> float:
    """AER of the monotone diagonal alignment on the trial set (the baseline attention has to beat)."""
    from nmtkit.align import alignment_error, load_gold, read_text

    src, tgt = read_text(str(trial / "trial.e")), read_text(str(trial / "trial.f"))
    gold = load_gold(str(trial / "trial.align"), "auto", "tgt-src", src)
    links = []
    for s, t in zip(src, tgt):
        n, m = len(s.text.split()), len(t.text.split())
        links.append({(min(n - 1, int((j + 0.5) * n / m)), j) for j in range(m)})
    return alignment_error(links, gold).aer


def alignment_quality(ckpt: str, trial: Path) -> dict:
    """AER on the trial set's gold links (recased to the model's vocabulary) and the mean attention entropy."""
    import numpy as np

    from nmtkit.data import checkpoint
    from nmtkit.align import Aligner, alignment_error, hard_links, load_gold, read_text

    payload = checkpoint.load(ckpt)
    cases = {side: _recase_map(payload["vocab"][side]) for side in ("src", "tgt")}
    aligner = Aligner(ckpt, tokenized=True, batch_size=32)
    src, tgt = read_text(str(trial / "trial.e")), read_text(str(trial / "trial.f"))
    src_words = [[cases["src"].get(w, w) for w in s.text.split()] for s in src]
    tgt_words = [[cases["tgt"].get(w, w) for w in t.text.split()] for t in tgt]
    gold = load_gold(str(trial / "trial.align"), "auto", "tgt-src", src)
    soft = aligner.align_words(src_words, tgt_words)
    links = [hard_links(a.alpha, "argmax") for a in soft]
    ent, eos = [], []
    for a in soft:
        p = np.clip(a.alpha[:-1], 1e-12, 1.0)  # (target words, source words + </s>)
        ent.extend((-(p * np.log(p)).sum(axis=1)).tolist())
        eos.extend(a.alpha[:-1, -1].tolist())
    return {"aer": alignment_error(links, gold).aer, "entropy": float(np.mean(ent)), "eos_mass": float(np.mean(eos))}


def test_bleu(ckpt: str, sources: list[str], refs: list[str], beam: int) -> float:
    import sacrebleu

    from nmtkit.translate.translator import Translator

    tr = Translator([ckpt], DecodeConfig(beam=beam), batch_size=80, workers=1)
    try:
        hyps = [t.text for t in tr.translate(enumerate(sources, 1))]
    finally:
        tr.close()
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def sample_test(n: int, seed: int = 1) -> tuple[list[str], list[str]]:
    """A fixed sample of hansards/test: n pairs drawn with a seeded generator, in file order."""
    import numpy as np

    src = (DATA / "hansards" / "test.en").read_text(encoding="utf-8").splitlines()
    ref = (DATA / "hansards" / "test.fr").read_text(encoding="utf-8").splitlines()
    keep = sorted(np.random.default_rng(seed).choice(len(src), size=min(n, len(src)), replace=False).tolist())
    return [src[i] for i in keep], [ref[i] for i in keep]


# ------------------------------------------------------------------------------------------------------- a variant
def run_variant(name: str, a) -> dict:
    """Train one variant (unless its run is complete) and evaluate each of its checkpoints."""
    import torch

    torch.set_num_threads(a.threads)
    work = Path(a.work) / name
    _, extra = VARIANTS[name]
    last = work / "checkpoint_last.pt"
    done = (work / "eval.json").is_file() and json.loads((work / "eval.json").read_text()).get("updates") == a.updates
    if done:
        result = json.loads((work / "eval.json").read_text())
        if a.refresh_alignment:  # (the alignment figures of a finished run again: cheap, the trial set is small)
            for row in result["rows"]:
                row.update(alignment_quality(str(work / f"checkpoint{row['update']}.pt"), Path(a.trial)))
            (work / "eval.json").write_text(json.dumps(result, indent=1))
        return result
    t0 = time.time()
    if not (last.is_file() and _update_of(last) >= a.updates):
        cmd = [sys.executable, str(REPO / "bin" / "nmt-train"), a.data, *BASE, *extra, "--save-dir", str(work),
               "--max-updates", str(a.updates), "--valid-every", str(a.eval_every), "--keep-last", "1000",
               "--valid-bleu-sentences", "0", "--best-metric", "loss", "--log-every", "100",
               "--threads", str(a.threads), "--seed", str(a.seed), "-q",
               *(["--resume"] if last.is_file() else ["--force"])]
        subprocess.run(cmd, check=True)
    train_s = time.time() - t0
    valid = {r["update"]: r for r in map(json.loads, (work / "train.jsonl").read_text().splitlines())
             if r.get("type") == "valid"}
    train_ppl = {r["update"]: r["ppl"] for r in map(json.loads, (work / "train.jsonl").read_text().splitlines())
                 if r.get("type") == "train"}
    src, refs = sample_test(a.test_sample)
    rows = []
    for ckpt in sorted(glob.glob(str(work / "checkpoint[0-9]*.pt")), key=lambda p: _update_of(Path(p))):
        u = _update_of(Path(ckpt))
        row = {"update": u, "valid_ppl": valid.get(u, {}).get("valid_ppl"),
               "train_ppl": train_ppl.get(u), "bleu_greedy": test_bleu(ckpt, src, refs, 1),
               **alignment_quality(ckpt, Path(a.trial))}
        if u == a.updates:
            row["bleu_beam12"] = test_bleu(ckpt, src, refs, 12)
        rows.append(row)
        print(f"[{name}] {json.dumps(row)}", file=sys.stderr, flush=True)
    result = {"variant": name, "changes": VARIANTS[name][0], "options": extra, "updates": a.updates,
              "train_wall_s": round(train_s, 1), "rows": rows}
    (work / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def _update_of(path: Path) -> int:
    import torch

    m = re.fullmatch(r"checkpoint(\d+)\.pt", path.name)
    if m:
        return int(m.group(1))
    return torch.load(path, map_location="cpu", weights_only=True)["train"]["state"]["update"]


# ------------------------------------------------------------------------------------------------------- the table
def table(results: list[dict], diag: float, sample: int) -> str:
    lines = [f"Hansards, rnnsearch-small; base: nmt-train {' '.join(BASE)}",
             f"BLEU: on a fixed sample of {sample} hansards/test pairs (sacreBLEU, detokenised)",
             f"AER: on the 37 sentences of the Hansards trial set's gold links (monotone diagonal: {diag:.3f})",
             "entropy: mean attention entropy per target word there (nats); α(</s>): mean attention on the source's </s>",
             ""]
    head = f"{'variant':18} {'update':>6} {'train ppl':>9} {'valid ppl':>9} {'BLEU greedy':>11} {'beam 12':>7} " \
           f"{'AER':>6} {'entropy':>7} {'α(</s>)':>7}"
    for r in results:
        lines += [f"{r['variant']}: {r['changes']}  (options: {' '.join(r['options']) or 'the base'})", head]
        for row in r["rows"]:
            def f(k, fmt):
                v = row.get(k)
                ok = isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
                return format(v, fmt) if ok else "-".rjust(int(fmt.split(".")[0]))
            lines.append(f"{'':18} {row['update']:>6} {f('train_ppl', '9.1f')} {f('valid_ppl', '9.2f')} "
                         f"{f('bleu_greedy', '11.2f')} {f('bleu_beam12', '7.2f')} {f('aer', '6.3f')} "
                         f"{f('entropy', '7.3f')} {f('eos_mass', '7.3f')}")
        lines.append("")
    best = [(r["rows"][-1].get("valid_ppl") or math.inf, r["variant"]) for r in results if r["rows"]]
    if best:
        lines.append("at the last update, by validation perplexity: " +
                     ", ".join(f"{n} {p:.2f}" for p, n in sorted(best)))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="prepared Hansards directory (nmt-prepare --max-len 30, 16k vocabularies)")
    p.add_argument("--work", default=str(REPO / "runs" / "learning"))
    p.add_argument("--variants", default="base,xavier")
    p.add_argument("--updates", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--test-sample", type=int, default=500)
    p.add_argument("--trial", default=str(DATA / "hansards-trial"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--refresh-alignment", action="store_true",
                   help="recompute the alignment figures (AER, entropy, α(</s>)) of finished runs")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant in this process
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(argv)
    if a.list:
        for k, (what, opts) in VARIANTS.items():
            print(f"{k:18} {what}  [{' '.join(opts)}]")
        return 0
    if not a.data:
        p.error("--data is required")
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)} (see --list)")
    if a.one:
        print(json.dumps(run_variant(a.one, a)))
        return 0
    base_args = [a_ for a_ in (argv if argv is not None else sys.argv[1:])]
    head = peers.start_report("bench_learning.py", "nmtkit: what a small RNNsearch learns per update", base_args,
                              a.allow_dirty)
    if head is None:
        return 2
    Path(a.work).mkdir(parents=True, exist_ok=True)
    pending, running, results = list(names), [], {}
    while pending or running:
        while pending and len(running) < a.parallel:
            n = pending.pop(0)
            log = open(Path(a.work) / f"{n}.log", "a")
            running.append((n, subprocess.Popen([sys.executable, __file__, *base_args, "--one", n],
                                                stdout=subprocess.PIPE, stderr=log, text=True), log))
        time.sleep(5)
        for item in list(running):
            n, proc, log = item
            if proc.poll() is not None:
                out = proc.stdout.read()
                log.close()
                running.remove(item)
                if proc.returncode != 0:
                    sys.exit(f"bench_learning: variant {n} failed (see {Path(a.work) / (n + '.log')})")
                results[n] = json.loads(out.strip().splitlines()[-1])
    print("\n".join(head) + "\n")
    print(table([results[n] for n in names], diagonal_aer(Path(a.trial)), a.test_sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
