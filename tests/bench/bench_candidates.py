#!/usr/bin/env python3
"""Decoding over candidate lists (``nmt-translate --candidates``, nmtkit/data/candidates.py): lines/s and the
output's BLEU and chrF with and without the list, on the hour's model (issue 55, part 4).

Two stages, each one command (run alone, from a clean commit -- a dirty tree is refused)::

    python tests/bench/bench_candidates.py --stage tune --model M   # bench_candidates-tune.txt (about 5 minutes)
    python tests/bench/bench_candidates.py --stage test --model M   # bench_candidates.txt (about 15 minutes)

- **tune** chooses the list's sizes (the ``common`` most frequent target words, the ``per_word`` best translations
  of each source word) on development sets only: ``--tune-lines`` lines spread evenly over ``hansards/dev`` and over
  ``newstest2013``, once each with every size of ``--sizes`` and without a list.
- **test** measures the sizes the table takes by default (``COMMON``, ``PER_WORD``) on sets the choice did not see:
  ``--lines`` lines spread over ``hansards/test`` and over ``newstest2014``, with and without the list, ``--repeats``
  interleaved repeats (their order swapped from one repeat to the next).

Every run is an ``nmt-translate`` process with the hour's options (``examples/one-hour.sh``: beam 12, no repeated
4-gram, numbers from the source) and its default threads and workers; lines/s over the whole process (start-up and
loading the table included).  The model is ``--model`` (a checkpoint trained on ``--prepared``, by default
``peers.prepare_hour``'s directory, whose ``candidates.npz`` is built here if it lacks one); its training updates and
file are in the report.  Beside each figure: sacreBLEU and chrF against the references, and the share of lines
written exactly as without the list.  Without ``--candidates`` nmt-translate decodes as the commit before the option.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, table  # noqa: E402

DECODE_OPTIONS = ["--beam", "12", "--no-repeat-ngram", "4", "--source-numbers", "--all-numbers"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=("tune", "test"), required=True)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint trained on --prepared")
    p.add_argument("--prepared", type=Path, help="its prepared directory (default: peers.prepare_hour's)")
    p.add_argument("--sizes", default="500:10,1000:20,2000:20,1000:50",
                   help="tune: the list sizes tried, COMMON:PER_WORD,... (default: %(default)s)")
    p.add_argument("--tune-lines", type=int, default=600)
    p.add_argument("--lines", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path("/tmp/nmtkit-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--allow-dirty", action="store_true")
    return p.parse_args(argv)


def sets_for(stage: str, n: int, work: Path) -> dict:
    """name -> (source file of n lines spread evenly over the set, its references)."""
    root = peers.data_root()
    names = {"tune": {"hansards/dev": root / "hansards" / "dev", "newstest2013": root / "wmt14" / "newstest2013"},
             "test": {"hansards/test": root / "hansards" / "test", "newstest2014": root / "wmt14" / "newstest2014"}}
    return {name: (src, ref) for name, (src, _, ref) in peers.spread_sets(names[stage], n, work, "cand").items()}


def list_sizes(table, src: Path, model: Path, window: int = 640, batch: int = 64) -> float:
    """About the mean list a batch decodes over: windows of 640 lines sorted by length, batches of 64, as
    nmt-translate makes them (ignoring lines cut at --max-source-len)."""
    import numpy as np

    from nmtkit.data import checkpoint
    from nmtkit.data.text import Preprocessor, TextConfig
    from nmtkit.data.vocab import Vocabulary

    payload = checkpoint.load(str(model))
    text = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
    vocab = Vocabulary(payload["vocab"]["src"])
    ids = [vocab.encode(text.subwords(text.words(line))) for line in src.read_text(encoding="utf-8").splitlines()]
    sizes = []
    for w in range(0, len(ids), window):
        chunk = sorted(ids[w: w + window], key=len)
        for b in range(0, len(chunk), batch):
            sizes.append(len(table.batch_vocab(chunk[b: b + batch])))
    return float(np.mean(sizes))


def decode_once(model: Path, src: Path, ref: list[str], out: Path, candidates: Path | None) -> dict:
    import sacrebleu

    cmd = [sys.executable, str(peers.REPO / "bin" / "nmt-translate"), "-m", str(model), "--quiet"] + DECODE_OPTIONS
    if candidates is not None:
        cmd += ["--candidates", str(candidates)]
    wall, hyp = peers.translate_timed(cmd, src, out, len(ref), {**os.environ, **peers.quiet_env()})
    return {"lines_s": len(hyp) / wall, "bleu": sacrebleu.corpus_bleu(hyp, [ref]).score,
            "chrf": sacrebleu.corpus_chrf(hyp, [ref]).score, "hyp": hyp}


def model_note(model: Path) -> str:
    import torch

    payload = torch.load(model, map_location="cpu", weights_only=True)
    train = payload.get("train") or {}
    state = train.get("state", train) if isinstance(train, dict) else {}
    return f"model: {model} ({payload.get('arch')}, {state.get('update', '?')} updates)"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    a = parse_args(args)
    t0 = time.time()
    name = "bench_candidates-tune.txt" if a.stage == "tune" else "bench_candidates.txt"
    path = a.out or peers.REPO / "tests" / "bench" / "results" / name
    out = peers.start_report("bench_candidates.py", f"nmtkit decoding over candidate lists: {a.stage}", args,
                             a.allow_dirty)
    if out is None:
        return 2
    try:
        from nmtkit.data import candidates as C
        from nmtkit.data.corpus import Corpus
        from nmtkit.data.vocab import Vocabulary

        prepared = a.prepared or peers.prepare_hour(a.work)
        table_path = prepared / C.FILE
        manifest = json.loads((prepared / "manifest.json").read_text(encoding="utf-8"))
        src_lang, tgt_lang = manifest["source_lang"], manifest["target_lang"]
        vocabs = {lang: Vocabulary.load(str(prepared / f"vocab.{lang}")).tokens for lang in (src_lang, tgt_lang)}
        if not table_path.is_file():
            log(f"building {table_path}")
            t_build = time.perf_counter()
            C.save(C.build(Corpus(prepared / f"train.{src_lang}"), Corpus(prepared / f"train.{tgt_lang}"),
                           vocabs[src_lang], vocabs[tgt_lang]), table_path)
            out.append(f"candidate table built here in {time.perf_counter() - t_build:.1f} s")
        cand = C.load(str(table_path), vocabs[src_lang], vocabs[tgt_lang])
        out.append(model_note(a.model))
        out.append(f"decoding options: {' '.join(DECODE_OPTIONS)}; nmt-translate's default threads and workers")
        runs = a.work / "cand-runs"
        runs.mkdir(parents=True, exist_ok=True)
        n = a.tune_lines if a.stage == "tune" else a.lines
        sets = sets_for(a.stage, n, a.work)
        if a.stage == "tune":
            sizes = [tuple(int(x) for x in s.split(":")) for s in a.sizes.split(",")]
            repeats = 1
        else:
            sizes = [(cand.common, cand.per_word)]
            repeats = a.repeats
        configs = [None] + sizes
        files = {}
        for c in sizes:
            f = runs / f"candidates-{c[0]}-{c[1]}.npz"
            C.save(cand.sized(*c), f)
            files[c] = f
        results: dict = {(s, c): [] for s in sets for c in configs}
        for r in range(repeats):
            for s, (src, ref) in sets.items():
                for c in (configs if r % 2 == 0 else configs[::-1]):
                    got = decode_once(a.model, src, ref, runs / "out.fr", files.get(c))
                    results[s, c].append(got)
                    log(f"repeat {r + 1} {s} {c or 'whole vocabulary'}: {got['lines_s']:.1f} lines/s, "
                        f"BLEU {got['bleu']:.2f}, chrF {got['chrf']:.2f}")
        goals = []
        for s, (src, ref) in sets.items():
            base = results[s, None]
            base_speed = median([g["lines_s"] for g in base])
            rows = []
            for c in configs:
                got = results[s, c]
                speeds = [g["lines_s"] for g in got]
                same = sum(x == y for x, y in zip(got[0]["hyp"], base[0]["hyp"])) / len(ref)
                size = f"{cand.tgt_size:,} (all)" if c is None else f"{list_sizes(cand.sized(*c), src, a.model):,.0f}"
                rows.append(["whole vocabulary" if c is None else f"{c[0]} common + {c[1]} a word", size,
                             f"{median(speeds):.1f} ({min(speeds):.1f}–{max(speeds):.1f})",
                             f"{median(speeds) / base_speed:.2f}×", f"{got[0]['bleu']:.2f}", f"{got[0]['chrf']:.2f}",
                             f"{100 * same:.1f}%"])
                if c is not None and a.stage == "test":
                    goals.append(Goal(f"{s}: decoding speed over the list (BLEU {got[0]['bleu'] - base[0]['bleu']:+.2f}"
                                      f", chrF {got[0]['chrf'] - base[0]['chrf']:+.2f}; goal: 3× at the same BLEU)",
                                      median(speeds) / base_speed, 3.0, "×"))
            out += ["", f"{s}: {len(ref)} lines spread evenly over the set; lines/s median (min–max) of {repeats} "
                    f"run(s); BLEU, chrF of the first run; lines written as without a list", ""]
            out += table(["list", "words a batch (about)", "lines/s", "speed", "BLEU", "chrF", "same lines"], rows)
        return peers.finish_report(out, goals, 55, path, t0)
    except (BenchError, OSError, subprocess.SubprocessError, ValueError) as e:
        return peers.fail_report(out, path, e)


if __name__ == "__main__":
    sys.exit(main())
