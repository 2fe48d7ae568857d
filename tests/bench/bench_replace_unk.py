#!/usr/bin/env python3
"""What ``nmt-translate --replace-unk`` gains, by the attention and by the alignment posterior.

    python tests/bench/bench_replace_unk.py -m MODEL.pt --out DIR [--jobs 2] [--bootstrap 1000] \\
        NAME=SOURCE,REFERENCE ... [-- MORE nmt-translate OPTIONS, e.g. --beam 12 --no-repeat-ngram 4]

For each test set, ``nmt-translate`` three times, as a user runs it: without replacement (``<unk>`` left in the
text), with ``--replace-unk`` (``attention``: the most attended source word, as Luong et al. 2015, fairseq and
OpenNMT-py) and with ``--replace-unk`` reading the alignment posterior instead (``posterior``: the source word of
the largest posterior at the ``<unk>``, :func:`unk_posteriors` here, nmtkit.posterior.forced_posterior at the
``<unk>`` rows; nmt-translate's ``--replace-unk-by posterior`` until it was removed for losing on every set, this
script's figures in tests/bench/results/bench_replace_unk.txt).  The beam search is the same in all three; only the
words written for ``<unk>`` differ.  Then, on the detokenised text the user reads:

- sacreBLEU and chrF with signatures (``nmt-score``), paired bootstrap of each replacement against none, and of the
  posterior against the attention;
- each ``<unk>`` of the unreplaced text and what each method wrote in its place (found by aligning the unreplaced
  and replaced texts' Moses tokens): how many of those words the reference line has ("copied right", clipped as
  BLEU clips: a word the reference has once counts once), and the lines where a source word is written for two
  adjacent ``<unk>``s ("doubled": "Munnich Munnich" for "Lee Munnich").

Translations are run ``--jobs`` at a time, one thread each; the seconds are wall clock (say whether the machine was
idle).  Outputs and reports go under ``--out``; with ``--reuse`` the translations already there are scored again
(their seconds read from the report.json there).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)

VARIANTS = {"none": [], "attention": ["--replace-unk"], "posterior": ["--replace-unk"]}
BY_POSTERIOR = "--nmt-translate-by-posterior"  # (first argument: this script runs nmt-translate, as by_posterior)
PLACEHOLDER = "UNKPLACEHOLDER"  # (what "<unk>" is tokenised as: one token, in no reference)


def translate(model: str, source: str, out: Path, variant: str, extra: list[str]) -> float:
    start = time.monotonic()
    tool = [str(REPO / "bin" / "nmt-translate")]
    if variant == "posterior":  # (decoding in this process, where by_posterior's translator decodes)
        tool, extra = [str(Path(__file__).resolve()), BY_POSTERIOR], [*extra, "--workers", "1"]
    subprocess.run([sys.executable, *tool, "-m", model, "-i", source, "-o", str(out), "--threads", "1", "-q", *extra,
                    *VARIANTS[variant]], check=True)
    return time.monotonic() - start


def unk_posteriors(models: list, sources: list, hyps: list, device, nbest: int) -> None:
    """In place: each of the first ``nbest`` hypotheses of a sentence (those written) that has an ``<unk>`` gets,
    as the weights ``--replace-unk`` reads (its ``attention``), nmtkit.posterior.forced_posterior computed at its
    ``<unk>``s only (the attention elsewhere; an ensemble's mean; in float32) -- what nmtkit/translate/decoding.py's
    add_unk_posteriors gave ``--replace-unk-by posterior``."""
    import numpy as np
    import torch

    from nmtkit.data.vocab import UNK
    from nmtkit.posterior import forced_posterior

    todo = [(k, h) for k, sentence in enumerate(hyps) for h in sentence[:nbest] if UNK in h.tokens]
    if not todo:
        return
    src = [sources[k] for k, _ in todo]
    tgt = [np.asarray(h.tokens, dtype=np.int64) for _, h in todo]
    total = None
    with torch.autocast(torch.device(device).type, enabled=False):  # (float32 under --bf16 too)
        for model in models:
            post = forced_posterior(model, src, tgt, batch_size=len(todo), device=device, words=(UNK,))
            total = post if total is None else [a + b for a, b in zip(total, post)]
    for (_, h), p in zip(todo, total):
        h.attention = (p / len(models)).astype(np.float32)


def by_posterior(argv: list[str]) -> None:
    """``nmt-translate ARGV`` (with ``--replace-unk``, decoding in this process) whose ``<unk>``s are replaced by
    the source word of the alignment posterior (:func:`unk_posteriors` on each batch's hypotheses)."""
    from nmtkit.cli.translate import main as nmt_translate
    from nmtkit.translate import translator

    class ByPosterior(translator.Translator):
        def _decode(self, batch):
            hyps = super()._decode(batch)
            unk_posteriors(self.models, [p.ids for p in batch], hyps, self.device, self.decode.nbest)
            return hyps

    translator.Translator = ByPosterior  # (the one nmt-translate builds)
    nmt_translate(argv, prog_name="nmt-translate")


def score(reference: str, source: str, names: list[str], files: list[Path], bootstrap: int) -> dict:
    args = [sys.executable, str(REPO / "bin" / "nmt-score"), "-r", reference, "-s", source, "--json",
            "--bootstrap", str(bootstrap), "--metrics", "BLEU,chrF"]
    for name in names:
        args += ["-n", name]
    proc = subprocess.run(args + [str(f) for f in files], check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)


def replacements(plain: list[str], replaced: list[str], reference: list[str]) -> tuple[int, int, int]:
    """(<unk>s replaced, how many of the words written the reference line has, clipped; pairs of adjacent <unk>s
    given the same word): the unreplaced and replaced lines Moses-tokenised and aligned token by token; what stands
    where the unreplaced text has ``<unk>`` is its replacement."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang="fr")
    words = lambda line: tok.tokenize(line, escape=False)  # noqa: E731
    total = right = doubled = 0
    for a, b, ref in zip(plain, replaced, reference):
        if "<unk>" not in a:
            continue
        x, y = words(a.replace("<unk>", f" {PLACEHOLDER} ")), words(b)
        left = Counter(words(ref))  # (clipped as BLEU clips: a word the reference has once is right once)
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, x, y, autojunk=False).get_opcodes():
            unks = x[i1:i2].count(PLACEHOLDER)
            if op == "equal" or not unks:
                continue
            total += unks
            if i2 - i1 == j2 - j1:  # (one word for each: adjacent <unk>s written as one word twice)
                doubled += sum(x[i] == x[i + 1] == PLACEHOLDER and y[j1 + i - i1] == y[j1 + i - i1 + 1]
                               for i in range(i1, i2 - 1))
            hits = 0
            for w in (w for w in y[j1:j2] if w not in x[i1:i2]):
                if left[w] > 0:
                    left[w] -= 1
                    hits += 1
            right += min(unks, hits)
    return total, right, doubled


def _system(report: dict, name: str) -> dict:
    return next(s for s in report["systems"] if s["name"] == name)


def _p_value(report: dict, name: str) -> float | None:
    """The BLEU paired bootstrap's p-value of system ``name`` against the report's first."""
    bleu = next(b for b in report["bootstrap"] if b["metric"] == "BLEU")
    return next(s for s in bleu["systems"] if s["name"] == name)["p_value"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--reuse", action="store_true", help="score the translations already under --out again")
    p.add_argument("sets", nargs="+", metavar="NAME=SOURCE,REFERENCE")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(argv)
    head = peers.start_report("bench_replace_unk.py", "nmtkit: what nmt-translate --replace-unk gains", command,
                              a.allow_dirty)
    if head is None:
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = []
    for spec in a.sets:
        name, _, files = spec.partition("=")
        source, _, reference = files.partition(",")
        sets.append((name, source, reference))
    jobs = [(name, source, variant) for name, source, _ in sets for variant in VARIANTS]
    seconds = {}
    if a.reuse:
        earlier = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        for name, _, variant in jobs:
            if (out / f"{name}.{variant}.fr").exists():
                seconds[name, variant] = earlier.get(name, {}).get(variant, {}).get("seconds")
        jobs = [job for job in jobs if (job[0], job[2]) not in seconds]
    with ThreadPoolExecutor(a.jobs) as pool:
        done = {job: pool.submit(translate, a.model, job[1], out / f"{job[0]}.{job[2]}.fr", job[2], extra)
                for job in jobs}
        for job, future in done.items():
            seconds[job[0], job[2]] = future.result()
    print("\n".join(head) + "\n")
    print(f"model {a.model}; nmt-translate {' '.join(extra)} --threads 1, {a.jobs} at a time")
    report = {}
    for name, source, reference in sets:
        files = [out / f"{name}.{v}.fr" for v in VARIANTS]
        against_none = score(reference, source, list(VARIANTS), files, a.bootstrap)
        head_to_head = score(reference, source, ["attention", "posterior"], files[1:], a.bootstrap)
        texts = {v: f.read_text(encoding="utf-8").splitlines() for v, f in zip(VARIANTS, files)}
        with open(reference, encoding="utf-8") as f:
            ref = f.read().splitlines()
        unk_lines = sum("<unk>" in line for line in texts["none"])
        print(f"\n{name}: {len(ref):,} lines, {unk_lines:,} of them with <unk> unreplaced")
        print(f"  {'':10} {'BLEU':>6} {'chrF':>6}  {'p vs none':>9}  {'<unk> replaced':>14}  {'copied right':>12}"
              f"  {'doubled':>7}  {'seconds':>7}")
        report[name] = {"scores": against_none, "posterior_vs_attention": head_to_head}
        for v in VARIANTS:
            bleu, chrf = (_system(against_none, v)["scores"][m]["score"] for m in ("BLEU", "chrF"))
            p_value = _p_value(against_none, v)
            total, right, doubled = replacements(texts["none"], texts[v], ref) if v != "none" else (0, 0, 0)
            share = f"{right / total:.1%}" if total else "-"
            p_text = f"{p_value:.3f}" if p_value is not None else "-"
            took = seconds[name, v]
            print(f"  {v:10} {bleu:6.2f} {chrf:6.2f}  {p_text:>9}  {total:14,}  {right:6,} {share:>5}  {doubled:7,}"
                  f"  {'-' if took is None else f'{took:.0f}':>7}")
            report[name][v] = {"BLEU": bleu, "chrF": chrf, "p_vs_none": p_value, "replaced": total,
                               "copied_right": right, "doubled": doubled, "seconds": took}
        print(f"  posterior against attention: paired bootstrap p = {_p_value(head_to_head, 'posterior'):.3f}")
        print(f"  BLEU: {against_none['metrics']['BLEU']['signature']}; bootstrap "
              f"{against_none['bootstrap'][0]['signature']}")
        sys.stdout.flush()
    with open(out / "report.json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1:2] == [BY_POSTERIOR]:
        by_posterior(sys.argv[2:])
    else:
        sys.exit(main())
