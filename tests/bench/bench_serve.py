#!/usr/bin/env python3
"""nmt-serve under load (#36): clients sending one-sentence requests to a real server on 127.0.0.1.

    python tests/bench/bench_serve.py -m runs/quickstart/recipe/model/checkpoint_last.pt \\
        > tests/bench/results/bench_serve.txt

The lines: the first ``--lines`` of the Hansards test sittings and of news-test-2014, alternating.  For 1, 4, 16 and
64 clients (threads, each with its own connection per request), each client sends ``--requests`` one-line requests
(its own lines, in turn) and the server (``--max-batch``, ``--batch-wait-ms``) decodes them with beam 12; reported:
sentences a second over the wall clock of the run, and the latency's p50, p95 and p99.  Beside them: (a) the same
lines, one request at a time (one client), and (b) ``nmt-translate`` over the same lines as one file, timed from
the start of the process (the ceiling of what batching can reach).  Every answer is checked against the
translation of its line by nmt-translate (so a line lost or mixed up with another client's shows), and the
server's resident memory is read after its warm-up and at the end.  Goals: at 16 clients at least 3x the
one-at-a-time rate and 60% of the file's; no errors and no line lost or mixed up over at least 10,000 requests;
memory growth under 10%.  Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (tests/bench/peers.py)


REST = 3.0  # seconds without requests before memory is read "at rest" (nmtkit.runtime.IDLE_TRIM_S: 1 s)


def rss_kb(pid: int) -> int:
    """The resident memory of a process and of its children (the decoding workers), summed."""
    with open(f"/proc/{pid}/status") as f:
        own = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):  # (children of any thread: the workers start on the loading one)
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += f.read().split()
        except FileNotFoundError:  # (a thread that ended meanwhile)
            pass
    return own + sum(rss_kb(int(child)) for child in children)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def bench_lines(count: int = 500) -> list[str]:
    """The first ``count`` lines of the Hansards test sittings and of news-test-2014, alternating (empty ones out)."""
    hansards = (DATA / "hansards" / "test.en").read_text(encoding="utf-8").splitlines()[:count]
    news = (DATA / "wmt14" / "newstest2014.en").read_text(encoding="utf-8").splitlines()[:count]
    return [x for pair in zip(hansards, news) for x in pair if x.strip()]


def wait_healthy(url: str) -> None:
    """Until the server at ``url`` answers /health with 200."""
    while True:
        try:
            with urllib.request.urlopen(url + "health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


def post(url: str, line: str) -> str:
    data = json.dumps({"src": [line], "beam": 12}).encode()
    request = urllib.request.Request(url + "translate", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())["translations"][0]["tgt"]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--lines", type=int, default=500, help="lines of each test set")
    p.add_argument("--requests", default="1:300,4:150,16:200,64:100", help="clients:requests each, comma-separated")
    p.add_argument("--max-batch", default="32")
    p.add_argument("--batch-wait-ms", default="5")
    p.add_argument("--threads", default="2")
    p.add_argument("--workers", default="1", help="nmt-serve --workers")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_serve.py", "nmt-serve under load", args, a.allow_dirty)
    if head is None:
        return 2

    lines = bench_lines(a.lines)
    print("\n".join(head) + "\n")
    print(f"bench_serve (tests/bench/bench_serve.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, git "
          f"{subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"model {a.model}; {len(lines)} lines (Hansards test sittings and news-test-2014, alternating); beam 12; "
          f"server --max-batch {a.max_batch} --batch-wait-ms {a.batch_wait_ms} --threads {a.threads} --workers "
          f"{a.workers}\n")

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.en"
        src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, REPO / "bin" / "nmt-translate", "-m", a.model, "-i", src, "-o",
                        Path(tmp) / "out.fr", "--beam", "12", "--threads", a.threads, "-q"], check=True, env=ENV)
        ceiling = len(lines) / (time.perf_counter() - t0)
        expected = dict(zip(lines, (Path(tmp) / "out.fr").read_text(encoding="utf-8").splitlines()))
    print(f"(b) nmt-translate, the lines as one file: {ceiling:.2f} sentences/s (process start-up included)")

    server = subprocess.Popen([sys.executable, REPO / "bin" / "nmt-serve", "-m", a.model, "--port", "0", "--threads",
                               a.threads, "--max-batch", a.max_batch, "--batch-wait-ms", a.batch_wait_ms,
                               "--workers", a.workers, "--max-queue", "10000", "-q"],
                              stderr=subprocess.PIPE, text=True, env=ENV)
    url = re.search(r"(http://\S+/)", server.stderr.readline()).group(1)
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    wait_healthy(url)
    post(url, lines[0])
    time.sleep(REST)
    rss_start = rss_kb(server.pid)
    peak = [rss_start]
    sampling = threading.Event()

    def sample() -> None:  # the most it holds under load, every 0.2 s
        while not sampling.wait(0.2):
            peak[0] = max(peak[0], rss_kb(server.pid))

    threading.Thread(target=sample, daemon=True).start()
    rows, total, wrong, errors, at_rest = [], 0, 0, 0, []
    try:
        for spec in a.requests.split(","):
            clients, each = map(int, spec.split(":"))
            latencies: list[float] = []
            results: list[tuple[str, str]] = []

            def client(k: int) -> None:
                nonlocal errors
                for r in range(each):
                    line = lines[(k * each + r) % len(lines)]
                    t = time.perf_counter()
                    try:
                        got = post(url, line)
                    except OSError:
                        errors += 1
                        continue
                    latencies.append(time.perf_counter() - t)
                    results.append((line, got))

            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(client, range(clients)))
            wall = time.perf_counter() - start
            total += clients * each
            wrong += sum(expected[line] != got for line, got in results)
            rate = len(results) / wall
            rows.append((clients, clients * each, rate, latencies))
            time.sleep(REST)  # (at rest after each load: a leak grows with every one, a working set stops growing)
            at_rest.append(rss_kb(server.pid))
            print(f"{clients:3d} client(s) x {each:4d} requests: {rate:7.2f} sentences/s; latency p50 "
                  f"{1000 * percentile(latencies, 50):7.0f} ms, p95 {1000 * percentile(latencies, 95):7.0f} ms, p99 "
                  f"{1000 * percentile(latencies, 99):7.0f} ms; then at rest {at_rest[-1] / 1024:.0f} MiB", flush=True)
        sampling.set()
        rss_end = at_rest[-1]
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
    one = next((r[2] for r in rows if r[0] == 1), None)
    sixteen = next((r[2] for r in rows if r[0] == 16), None)
    if one is not None:
        print(f"\n(a) one request at a time: {one:.2f} sentences/s")
    if sixteen is not None and one is not None:
        print(f"16 clients: {sixteen / one:.1f}x the one-at-a-time rate (goal >= 3x), {100 * sixteen / ceiling:.0f}% of "
              f"the file's (goal >= 60%)")
    print(f"{total:,} requests: {errors} errors, {wrong} answers that are not their line's nmt-translate translation "
          f"(goal: 0 and 0, over >= 10,000)")
    print(f"server resident memory (its workers' included), at rest {REST:g} s after the warm-up: {rss_start / 1024:.0f} MiB; "
          f"at rest {REST:g} s after the last request: {rss_end / 1024:.0f} MiB ({100 * (rss_end - rss_start) / rss_start:+.1f}%; "
          f"goal < 10%); the most under load: {peak[0] / 1024:.0f} MiB; exit code after SIGTERM {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
