"""nmtkit.parallel.Mapper: ordered results, errors raised in the parent, and a teardown that never waits forever.

The teardown tests run the mapper in a child interpreter with a timeout, so that a hang is a failure, not a stuck
suite: chunks far larger than a pipe's buffer (64 KiB) and slow workers are the case where
``multiprocessing.Pool.terminate()`` could wait forever (nmt-prepare under Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from nmtkit.parallel import Mapper

from conftest import wait_until

_state: dict = {}


def _init(offset: int) -> None:
    _state["offset"] = offset


def _shift(chunk: list[int]) -> list[int]:
    return [x + _state["offset"] for x in chunk]


def _sum_and_pid(chunk: list[int]) -> tuple[int, int]:
    return sum(chunk), os.getpid()


def _fail_on_13(chunk: list[int]) -> list[int]:
    if 13 in chunk:
        raise ValueError("thirteen in this chunk")
    return chunk


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_back_in_input_order_with_the_workers_state(workers):
    with Mapper(workers, _init, (100,), chunk_size=7) as m:
        assert list(m.map(_shift, range(1000))) == [x + 100 for x in range(1000)]
        # a second map on the same workers, and one result per chunk from map_chunks
        sums = list(m.map_chunks(_sum_and_pid, range(50)))
    assert [s for s, _ in sums] == [sum(range(i, min(i + 7, 50))) for i in range(0, 50, 7)]
    pids = {p for _, p in sums}
    assert (pids == {os.getpid()}) if workers == 1 else (os.getpid() not in pids and len(pids) == workers)


def test_an_error_in_a_worker_is_raised_in_the_parent_and_the_workers_are_gone():
    m = Mapper(2, _init, (0,), chunk_size=5)
    with pytest.raises(ValueError, match="thirteen in this chunk"):
        with m:
            workers = [w.process for w in m._pool]
            list(m.map(_fail_on_13, range(100)))
    assert all(not p.is_alive() for p in workers)


def test_an_empty_stream_gives_nothing():
    with Mapper(2, _init, (0,)) as m:
        assert list(m.map(_shift, [])) == []


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


_PRELUDE = """
    import os, sys, time
    from nmtkit.parallel import Mapper

    def init():
        pass

    def slow_echo(chunk):  # a big result, slowly: the workers are busy and the pipes full
        time.sleep(0.05)
        return chunk

    BIG = ["x" * 400] * 1000  # one chunk: ~400 KB pickled, many times a pipe's buffer
"""


def test_leaving_a_map_midway_kills_the_workers_and_returns_at_once():
    r = _run(_PRELUDE + """
    for attempt in range(20):
        t = time.monotonic()
        try:
            with Mapper(2, init, chunk_size=1000) as m:
                procs = [w.process for w in m._pool]
                for i, _ in enumerate(m.map_chunks(slow_echo, (s for _ in range(100) for s in BIG))):
                    if i == attempt % 5:
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        assert time.monotonic() - t < 10, "the teardown took too long"
        assert not any(p.is_alive() for p in procs), "a worker outlived the map"
    # a generator abandoned without an exception: the workers are stopped, not waited for
    with Mapper(2, init, chunk_size=1000) as m:
        procs = [w.process for w in m._pool]
        it = m.map_chunks(slow_echo, (s for _ in range(100) for s in BIG))
        next(it)
    assert not any(p.is_alive() for p in procs)
    print("ok")
    """)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


def test_a_worker_that_dies_is_an_error_naming_it_not_a_hang():
    r = _run(_PRELUDE + """
    import signal
    from nmtkit.errors import WorkerError
    try:
        with Mapper(2, init, chunk_size=1000) as m:
            victim = m._pool[1].process
            for i, _ in enumerate(m.map_chunks(slow_echo, (s for _ in range(100) for s in BIG))):
                if i == 2:
                    os.kill(victim.pid, signal.SIGKILL)
    except WorkerError as e:
        print(e)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("worker process 2 (pid ") and r.stdout.endswith("died (exit code -9)\n"), r.stdout


def test_workers_whose_parent_is_killed_exit():
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_PRELUDE + """
    with Mapper(2, init, chunk_size=1000) as m:
        print(*[w.process.pid for w in m._pool], flush=True)
        for i, _ in enumerate(m.map_chunks(slow_echo, (s for _ in range(100000) for s in BIG))):
            if i == 0:
                print("mapping", flush=True)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        assert proc.stdout.readline() == "mapping\n"  # (a result came back: the map is under way, the workers busy)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: not [p for p in pids if _running(p)], 20,
                   "the workers to exit after their parent was killed (workers outlived their killed parent)",
                   interval=0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # (a zombie has exited; only its entry is left)
    except OSError:
        return False

