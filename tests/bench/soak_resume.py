"""Randomised soak of exact resume: N SIGKILLs at random instants of a tiny training, each followed by ``--resume``.

One uninterrupted ``nmt-train`` run of the tiny RNNsearch on 200 real Multi30K pairs (patience, dropout, keep-last 1,
validation BLEU, a validation every 3 updates) is the reference.  The same run is then started again in another save
directory and killed with SIGKILL at a random instant (anywhere: mid-update, mid-validation, mid-checkpoint save,
between the links), resumed with ``--resume``, killed again, … ``--kills`` times, and finally let run to its end.  Each
*lineage* (a run from its fresh start to its end, however often killed and resumed) ends with its final weights,
optimizer state and run state compared tensor by tensor with the reference's, and its ``checkpoint_best.pt``
with the reference's; then a new lineage starts, until ``--kills`` kills have been made.

    python tests/bench/soak_resume.py --kills 50 > tests/bench/results/soak_resume.txt

A kill that lands before the first checkpoint exists leaves nothing to resume: that attempt starts the run afresh
(``--force``), as a user would.  Only the kills that land between a lineage's first and last checkpoint count
towards ``--kills`` (those are the ones a resume must get right); the others are made and printed too, marked
"not counted".  Every kill and what it left is printed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)

TRAIN = ["-a", "rnnsearch-tiny", "-o", "dropout=0.3", "--batch-size", "16", "--pool-batches", "2",
         "--valid-every", "3", "--valid-bleu-sentences", "4", "--best-metric", "loss", "--patience", "4",
         "--keep-last", "1", "--max-updates", "60", "--threads", "1", "-q"]


def _prepare(root: Path) -> Path:
    from nmtkit.prepare import PrepareConfig, prepare

    for lang in ("en", "fr"):
        with open(DATA / "multi30k" / f"train.{lang}", encoding="utf-8") as f:
            (root / f"train.{lang}").write_text("".join(itertools.islice(f, 200)), encoding="utf-8")
        with open(DATA / "multi30k" / f"val.{lang}", encoding="utf-8") as f:
            (root / f"valid.{lang}").write_text("".join(itertools.islice(f, 20)), encoding="utf-8")
    dest = root / "data"
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(dest), valid=str(root / "valid"),
                          src_vocab_size=120, tgt_vocab_size=130, bpe_merges=150))
    return dest


def _command(data: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "bin" / "nmt-train"), str(data), "--save-dir", str(run), *TRAIN, *extra]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def _compare(a_path: Path, b_path: Path) -> list[str]:
    """What differs between two checkpoints: weights, optimizer state, run state (empty: identical)."""
    from nmtkit.data import checkpoint

    return checkpoint.differences(checkpoint.load(a_path), checkpoint.load(b_path))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50,
                   help="kills that land between a lineage's first and last checkpoint (the others are made too, "
                        "and listed, but not counted)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-delay", type=float, default=0.0,
                   help="kill within this many seconds of a start [measured: the reference run's wall time]")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("soak_resume.py", "nmtkit: SIGKILLs at random instants of a training, each resumed",
                              args, a.allow_dirty)
    if head is None:
        return 2
    print("\n".join(head) + "\n", flush=True)
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix="nmtkit-soak-"))
    data = _prepare(root)
    t0 = time.perf_counter()
    ref = subprocess.run(_command(data, root / "reference"), env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if ref.returncode != 0:
        raise SystemExit(f"soak_resume: the reference run failed: {ref.stderr}")
    print(f"reference: {' '.join(TRAIN)}; {wall:.1f} s wall")
    delay = a.max_delay or wall
    final_update = _update_of(root / "reference" / "checkpoint_last.pt")
    run = root / "soaked"
    kills = fresh = outside = 0
    lineage, in_lineage, compared = 1, 0, 0  # a lineage: one run from its fresh start to its end, however killed
    failures = []

    def check_lineage(end: str) -> None:
        nonlocal compared
        diffs = _compare(root / "reference" / "checkpoint_last.pt", run / "checkpoint_last.pt")
        best = _compare(root / "reference" / "checkpoint_best.pt", run / "checkpoint_best.pt")
        verdict = "identical" if not diffs and not best else f"DIFFERS: {', '.join(diffs + best)}"
        print(f"lineage {lineage}: {in_lineage} kills, {end}; final update {_update_of(run / 'checkpoint_last.pt')}; "
              f"checkpoint_last.pt and checkpoint_best.pt against the uninterrupted run's: {verdict}")
        compared += in_lineage
        if diffs or best:
            failures.append(lineage)

    while kills < a.kills:
        has_last = (run / "checkpoint_last.pt").exists() or any(run.glob("checkpoint[0-9]*.pt"))
        extra = ["--resume"] if has_last else ["--force"]
        fresh += not has_last
        proc = subprocess.Popen(_command(data, run, *extra), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        at = rng.uniform(0.5, delay)  # (python and torch take ~1.5 s to start: earlier kills find nothing to do)
        try:
            proc.wait(timeout=at)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            update = _update_of(run / "checkpoint_last.pt")
            # (it counts when it landed with a checkpoint to resume from and before the run's last one was saved)
            counts = update is not None and update < final_update
            kills += counts
            outside += not counts
            in_lineage += 1
            where = (f"kill {kills:3d}" if counts else "not counted") + f" after {at:5.2f} s ({' '.join(extra)})"
            print(f"{where}: checkpoint_last at update {update}, hidden leftovers: "
                  f"{sorted(n for n in os.listdir(run) if n.startswith('.')) if run.exists() else '-'}"
                  + ("" if counts else " (before the first checkpoint or after the last)"))
            continue
        err = proc.stderr.read()
        if proc.returncode != 0:
            raise SystemExit(f"soak_resume: a resumed run failed ({proc.returncode}): {err}")
        check_lineage("then it ran to its end")
        lineage, in_lineage = lineage + 1, 0
        for old in run.glob("checkpoint*.pt"):  # (a finished run would only be resumed as finished: a new one)
            old.unlink()
    final = subprocess.run(_command(data, run, "--resume"), env=_env(), capture_output=True, text=True)
    if final.returncode != 0:
        raise SystemExit(f"soak_resume: the last resume failed: {final.stderr}")
    check_lineage("then a last --resume to its end")
    print(f"\n{kills} SIGKILLs between a lineage's first and last checkpoint, and {outside} more outside them, in "
          f"{lineage} lineages ({fresh} starts found no checkpoint: started afresh); reference's final update "
          f"{final_update}; {compared} kills covered by a comparison; lineages that differ: {failures or 'none'}")
    if failures:
        raise SystemExit(1)
    return 0


def _update_of(path: Path):
    if not path.exists():
        return None
    from nmtkit.data import checkpoint

    return checkpoint.load(path)["train"]["state"]["update"]


if __name__ == "__main__":
    sys.exit(main())
