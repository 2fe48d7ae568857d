"""Soak of data-parallel shutdown: N two-process ``torchrun`` trainings, each of which must end cleanly.

Each run trains the tiny RNNsearch for a few updates on 200 real Multi30K pairs with two gloo processes, validating
(and so gathering every process's RNG states and broadcasting the lead's status) at every other update, and must exit
0 with nothing on stderr that says a process was aborted ("terminate called", "Aborted", a signal, a traceback).  It
checks ``Processes.close`` (nmtkit/train/distributed.py): the interpreter's exit while gloo's threads still hold a
collective call's tensors once ended some runs with SIGABRT.  A loaded machine is the harder test: run it beside other
work as well as alone.

    python tests/bench/soak_torchrun.py --runs 100 > tests/bench/results/soak_torchrun.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
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
BAD = re.compile(r"terminate called|Aborted|core dumped|Traceback|SIGABRT|SIGSEGV|exitcode\s*:\s*-?[1-9]")


def _prepare(root: Path) -> Path:
    from nmtkit.prepare import PrepareConfig, prepare

    for lang in ("en", "fr"):
        for name, dest, n in (("train", "train", 200), ("val", "valid", 20)):
            lines = (DATA / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (root / f"{dest}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / "data"), valid=str(root / "valid"),
                          src_vocab_size=120, tgt_vocab_size=130, bpe_merges=150))
    return root / "data"


def _cores_on() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--updates", type=int, default=4)
    p.add_argument("--cores", metavar="DIR", help="run each job in DIR/run-N with core dumps on, and keep the failed "
                   "runs' directories (a core for gdb: gdb python DIR/run-N/core*, then thread apply all bt)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args()
    head = peers.start_report("soak_torchrun.py", "nmtkit: two-process torchrun trainings that must end cleanly",
                              sys.argv[1:], a.allow_dirty)
    if head is None:
        return 2
    print("\n".join(head) + "\n")
    print(f"soak_torchrun: {a.runs} runs of 2 gloo processes, {a.updates} updates each, validating every 2; "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.2f}")
    failures = 0
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        data = _prepare(Path(tmp))
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        # (PYTHONFAULTHANDLER: an aborted process prints every Python thread's stack, the main thread's too)
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
        for i in range(1, a.runs + 1):
            cwd = None
            if a.cores:
                cwd = Path(a.cores) / f"run-{i}"
                cwd.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                                  "2", "--master_addr", "127.0.0.1", "--master_port", str(_port()),
                                  str(REPO / "bin" / "nmt-train"), str(data), "-a", "rnnsearch-tiny", "--save-dir",
                                  str(Path(tmp) / "run"), "--force", "--batch-size", "15", "--valid-every", "2",
                                  "--valid-bleu-sentences", "4", "--max-updates", str(a.updates), "--threads", "1",
                                  "-q"], capture_output=True, text=True, timeout=600, env=env, cwd=cwd,
                                 preexec_fn=_cores_on if a.cores else None)
            walls.append(time.perf_counter() - t0)
            bad = [line for line in res.stderr.splitlines() if BAD.search(line)]
            if res.returncode != 0 or bad:
                failures += 1
                print(f"run {i}: exit {res.returncode}; " + " | ".join(bad[:3] or res.stderr.splitlines()[-3:]))
                if cwd is not None:
                    (cwd / "stderr.txt").write_text(res.stderr, encoding="utf-8")
                else:
                    print("  " + "\n  ".join(res.stderr.splitlines()[-40:]))
            else:
                if cwd is not None:
                    shutil.rmtree(cwd)
                if i % 10 == 0:
                    print(f"run {i}: clean so far ({failures} failed); {sum(walls) / len(walls):.1f} s a run")
            sys.stdout.flush()
    print(f"\n{a.runs - failures} of {a.runs} runs ended cleanly, {failures} failed; "
          f"{sum(walls) / len(walls):.1f} s a run; load average at the end {os.getloadavg()[0]:.2f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
