"""Recipes at equal time: train each candidate for the same seconds of wall clock, decode held-out tuning sets, score
what a user reads.  The comparisons behind the one-hour recipe (issue #33) and its decoding defaults.

    python tests/bench/bench_recipe.py run --work runs/recipe --name w16k-const --data runs/h/w16k --seconds 1200 \\
        --threads 1 --cpu 0 --train-options "--recipe fast" --tune runs/h/tune --tune runs/h/news-tune
    python tests/bench/bench_recipe.py decode --work runs/recipe --name w16k-const --tune runs/h/tune \\
        --decode-options "--beam 12 --no-repeat-ngram 4"
    python tests/bench/bench_recipe.py table --work runs/recipe >> tests/bench/results/bench_recipe.txt
    python tests/bench/bench_recipe.py numbers --source ../shared/data/hansards/dev --out runs/h/hans-numbers

``numbers`` makes a tuning set of the lines whose source has a number (for options that act only there).

``run`` trains ``rnnsearch-small`` on a prepared directory for ``--seconds`` (``nmt-train --max-time``: updates and
validations count) with the options given, then decodes each tuning set (PREFIX.en/.fr, raw text) with beam 12 and
scores the detokenised output with ``nmt-score --json`` (BLEU, chrF, TER, and the numbers carried, repeated n-grams
and ``<unk>`` per line).  ``decode`` adds another decoding of a trained run.  Every stage is cached in WORK/NAME
(``result.json``): a trained run is not trained again.  Wall-clock comparisons are evidence only when the runs had
the same conditions: alone on the machine, or each pinned to a core of its own with ``--threads 1`` (``--cpu``).
The tuning sets must not be the sets a recipe is finally reported on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)


def _run(cmd: list, log: Path, cpu: str | None = None, capture: bool = False) -> tuple[float, str]:
    """Run ``cmd`` (pinned to ``cpu`` with taskset when given), its stderr appended to ``log``; returns its wall
    time and its standard output when ``capture``."""
    cmd = [str(c) for c in cmd]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE if capture else f, stderr=f, text=True)
    return time.perf_counter() - t0, done.stdout if capture else ""


def _load(w: Path) -> dict:
    path = w / "result.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save(w: Path, result: dict) -> None:
    tmp = w / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, w / "result.json")


def decode(a, w: Path, result: dict, options: list[str]) -> None:
    """Decode every tuning set with ``options``; score with nmt-score --json; cached under the options' key."""
    model = w / "model" / "checkpoint_last.pt"
    key = " ".join(options)
    for prefix in a.tune:
        name = Path(prefix).name
        runs = result.setdefault("decodes", {}).setdefault(key, {})
        if name in runs:
            continue
        tag = f"{name}.{hashlib.sha1(key.encode()).hexdigest()[:8]}" if options != ["--beam", "12"] else name
        out = w / f"{tag}.hyp.fr"
        t, _ = _run([sys.executable, REPO / "bin" / "nmt-translate", "-m", model, "-i", f"{prefix}.en", "-o", out,
                     "--threads", a.threads, "--quiet", *options], w / "log.txt", a.cpu)
        _, report = _run([sys.executable, REPO / "bin" / "nmt-score", "-r", f"{prefix}.fr", "-s", f"{prefix}.en",
                          out, "--json", "-q"], w / "log.txt", a.cpu, capture=True)
        runs[name] = {"output": out.name, "decode_wall_s": round(t, 1), "score": json.loads(report)}
        _save(w, result)


def cmd_run(a) -> None:
    w = Path(a.work) / a.name
    w.mkdir(parents=True, exist_ok=True)
    result = _load(w)
    options = a.train_options.split()
    if result.get("train_options") != options or "updates" not in result:
        cmd = [sys.executable, REPO / "bin" / "nmt-train", a.data, "--arch", a.arch, *options,
               "--max-time", a.seconds, "--valid-every", a.valid_every, "--valid-bleu-sentences", "0",
               "--best-metric", "loss", "--threads", a.threads, "--save-dir", w / "model",
               "--resume" if (w / "model" / "checkpoint_last.pt").is_file() and a.resume else "--force", "-q"]
        wall, _ = _run(cmd, w / "log.txt", a.cpu)
        records = [json.loads(line) for line in open(w / "model" / "train.jsonl", encoding="utf-8")]
        valid = [r for r in records if r.get("type") == "valid"]
        result = {"train_options": options, "data": a.data, "arch": a.arch, "seconds": a.seconds,
                  "threads": a.threads, "cpu": a.cpu, "machine": platform.processor() or platform.machine(),
                  "updates": max(r["update"] for r in records), "train_wall_s": round(wall, 1),
                  "valid": [{k: r[k] for k in ("update", "valid_loss", "valid_ppl", "elapsed") if k in r}
                            for r in valid]}
        _save(w, result)
    decode(a, w, result, ["--beam", "12"])


def cmd_decode(a) -> None:
    w = Path(a.work) / a.name
    decode(a, w, _load(w), a.decode_options.split())


def _cells(report: dict) -> str:
    """One hypothesis file's figures from nmt-score --json."""
    system = report["systems"][0]
    scores, diag = system["scores"], system["diagnostics"]
    parts = [f"BLEU {scores['BLEU']['score']:5.2f}", f"chrF {scores['chrF']['score']:5.2f}",
             f"TER {scores['TER']['score']:5.2f}"]
    if diag["numbers"]["share"] is not None:
        parts.append(f"num {100 * diag['numbers']['share']:5.1f}%")
    parts += [f"rep {100 * diag['repeats']['share']:4.1f}%", f"unk {diag['unk']['per_line']:.2f}"]
    return "  ".join(parts)


def cmd_table(a) -> None:
    work = Path(a.work)
    print(f"bench_recipe (tests/bench/bench_recipe.py) {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"git {subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
    for w in sorted(p for p in work.iterdir() if (p / "result.json").is_file()):
        r = _load(w)
        last = r.get("valid", [{}])[-1] if r.get("valid") else {}
        print(f"\n{w.name}: {r.get('data')} {r.get('arch')} {' '.join(r.get('train_options', []))}")
        print(f"  {r.get('seconds')} s budget, {r.get('threads')} thread(s) on cpu {r.get('cpu')}: {r.get('updates'):,} "
              f"updates in {r.get('train_wall_s')} s of wall clock; last validation loss "
              f"{last.get('valid_loss', float('nan')):.3f} (ppl {last.get('valid_ppl', float('nan')):.2f})")
        for key, runs in r.get("decodes", {}).items():
            for name, d in runs.items():
                print(f"  {key:32} {name:12} {_cells(d['score'])}   ({d['decode_wall_s']} s)")


def cmd_numbers(a) -> None:
    """The first ``--lines`` pairs of ``--source`` (PREFIX.en/.fr) whose English side has a number (as nmt-score
    reads them), written to ``--out`` (PREFIX): a tuning set for a decoding option that only acts on such lines."""
    from nmtkit.score.diagnostics import numbers

    src = Path(f"{a.source}.en").read_text(encoding="utf-8").splitlines()
    ref = Path(f"{a.source}.fr").read_text(encoding="utf-8").splitlines()
    keep = [(s, r) for s, r in zip(src, ref) if numbers(s, "en")][: int(a.lines)]
    for k, lang in enumerate(("en", "fr")):
        Path(f"{a.out}.{lang}").write_text("".join(pair[k] + "\n" for pair in keep), encoding="utf-8")
    print(f"{a.out}: {len(keep)} lines, {sum(len(numbers(s, 'en')) for s, _ in keep)} numbers")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("numbers", help="a tuning set of the lines with numbers")
    s.add_argument("--source", required=True, help="PREFIX of a parallel set (PREFIX.en, PREFIX.fr)")
    s.add_argument("--out", required=True)
    s.add_argument("--lines", default="500")
    for name in ("run", "decode", "table"):
        s = sub.add_parser(name)
        s.add_argument("--work", required=True)
        if name == "table":
            s.add_argument("--allow-dirty", action="store_true",
                           help="run on a tree with uncommitted changes (the report then says it is no evidence)")
            continue
        s.add_argument("--name", required=True)
        s.add_argument("--tune", action="append", default=[], help="PREFIX of a tuning set (PREFIX.en, PREFIX.fr)")
        s.add_argument("--threads", default="1")
        s.add_argument("--cpu", help="pin to these CPUs (taskset -c)")
        if name == "run":
            s.add_argument("--data", required=True)
            s.add_argument("--arch", default="rnnsearch-small")
            s.add_argument("--seconds", default="1200")
            s.add_argument("--valid-every", default="1000")
            s.add_argument("--train-options", default="--recipe fast")
            s.add_argument("--resume", action="store_true", help="continue an interrupted training")
        else:
            s.add_argument("--decode-options", required=True)
    a = p.parse_args(args)
    if a.cmd == "table":  # (the report: the results file's part for this run starts here)
        head = peers.start_report("bench_recipe.py", "nmtkit: training recipes at equal time", args, a.allow_dirty)
        if head is None:
            return 2
        print("\n".join(head) + "\n")
    {"run": cmd_run, "decode": cmd_decode, "table": cmd_table, "numbers": cmd_numbers}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
