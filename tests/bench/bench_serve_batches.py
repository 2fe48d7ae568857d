#!/usr/bin/env python3
"""How nmt-serve batches clients that send again as soon as they are answered (#36): the batch sizes it logs.

    python tests/bench/bench_serve_batches.py -m runs/quickstart/recipe/model/checkpoint_last.pt [--tree DIR]

Starts ``bin/nmt-serve`` of ``--tree`` (a checkout; default this one: give an older one, e.g. a ``git worktree``,
to compare) with its request log, sends the bench's lines (tests/bench/bench_serve.py: the Hansards test sittings
and news-test-2014, alternating; beam 12) from each number of clients in ``--requests``, each client its own lines one
request at a time, and prints the sentences a second and how many requests were decoded in a batch of each size
(the server's log line: "batch of N"); with ``--empty N``, also what the HTTP side costs the server a request.
Run it alone.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import peers  # (tests/bench/peers.py)
from bench_serve import bench_lines, post, wait_healthy  # (the bench's lines and requests: one line, beam 12)

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--tree", default=str(REPO), help="the checkout whose nmt-serve runs")
    p.add_argument("--requests", default="1:60,16:30", help="clients:requests each, comma-separated")
    p.add_argument("--threads", default="2")
    p.add_argument("--workers", default="1")
    p.add_argument("--empty", type=int, default=0,
                   help="then this many requests of no line ({\"src\": []}, nothing decoded), one at a time, each "
                        "on a new connection: the server's CPU time per request (its HTTP side)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_serve_batches.py", "nmt-serve: the batches of clients that send again at once",
                              args, a.allow_dirty)
    if head is None:
        return 2
    lines = bench_lines()
    tree = Path(a.tree).resolve()
    commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print("\n".join(head) + "\n")
    print(f"bench_serve_batches, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: nmt-serve of {tree} (git "
          f"{commit.stdout.strip()}), --threads {a.threads} --workers {a.workers}, defaults otherwise; beam 12")
    server = subprocess.Popen([sys.executable, tree / "bin" / "nmt-serve", "-m", a.model, "--port", "0", "--threads",
                               a.threads, "--workers", a.workers], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(tree)})
    url = re.search(r"(http://\S+/)", server.stderr.readline()).group(1)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(iter(server.stderr.readline, "")), daemon=True).start()

    def send(line: str) -> None:
        post(url, line)

    wait_healthy(url)
    send(lines[0])
    try:
        for spec in a.requests.split(","):
            clients, each = map(int, spec.split(":"))
            per = len(lines) // clients
            time.sleep(1.0)
            seen = len(log)
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(lambda k: [send(lines[(k * per + r) % len(lines)]) for r in range(each)],
                              range(clients)))
            rate = clients * each / (time.perf_counter() - start)
            time.sleep(0.5)
            sizes = collections.Counter(int(m.group(1)) for x in log[seen:]
                                        if (m := re.search(r"POST /translate 200 .*batch of (\d+)", x)))
            print(f"{clients:3d} client(s) x {each} requests: {rate:6.2f} sentences/s; requests by the size of their "
                  f"batch: {', '.join(f'{n} x {size}' for size, n in sorted(sizes.items()))}", flush=True)
        if a.empty:
            clock = os.sysconf("SC_CLK_TCK")

            def cpu() -> float:  # (the server's user + system time, seconds)
                fields = open(f"/proc/{server.pid}/stat").read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / clock

            body = b'{"src": [], "beam": 12}'
            before, start = cpu(), time.perf_counter()
            for _ in range(a.empty):
                request = urllib.request.Request(url + "translate", data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=60) as r:
                    r.read()
            print(f"{a.empty} requests of no line: {1000 * (cpu() - before) / a.empty:.2f} ms of the server's CPU "
                  f"each, {1000 * (time.perf_counter() - start) / a.empty:.2f} ms each on the wall clock")
    finally:
        server.terminate()
        server.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
