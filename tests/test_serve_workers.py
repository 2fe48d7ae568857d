"""nmt-serve's decoding processes (#57 item 5), on real servers on 127.0.0.1: a worker killed (SIGKILL, as the
out-of-memory killer does) under ``--workers 2`` fails the request it was decoding with one error line, /health says
503 until a new worker has loaded the model, and the server goes on with the same translations; SIGTERM during a
long batch ends the server within ``--timeout`` and a little, in a worker or in the server's own process (before:
136 s with ``--timeout 10``)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from conftest import lines_of, wait_until
from test_serve import Server, _children

# a long batch: the whole Multi30K validation set at beam 50, each hypothesis made to run to three times its source's
# words (about 36 s on one thread of this machine, 1 GB), not cut to a work budget (--batch-work)
LONG = ("--max-batch", "1100", "--batch-size", "1100", "--max-lines", "1100", "--max-queue", "1100",
        "--max-chars", "200000", "--batch-work", "1000000000")


def HEAVY(data_dir) -> dict:
    """Minutes of decoding (the validation set at beam 100, each hypothesis made to run to 20 times its source's
    words): far more than any timeout here."""
    return {"src": lines_of(data_dir / "multi30k" / "val.en"), "beam": 100, "min_length_ratio": 20, "max_len_a": 20}


@pytest.fixture(scope="module")
def ckpt(trained):
    return trained[1]


@pytest.fixture(scope="module")
def long_request(data_dir):
    return {"src": lines_of(data_dir / "multi30k" / "val.en"), "beam": 50, "min_length_ratio": 3, "max_len_a": 3}


def _cpu_s(pid: int) -> float:
    """The CPU time a process has used (user and system), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gone(pid: int) -> bool:
    """Whether the process has ended: a zombie whose threads have all gone (until the last one has, its files --
    the pipe its server writes to -- are still open), or no process at all."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X") and os.listdir(f"/proc/{pid}/task") == [
                str(pid)]
    except FileNotFoundError:
        return True


def _post(s: Server, body: dict, into: dict) -> threading.Thread:
    def run():
        into["answer"] = s.call("/translate", body, timeout=600)
        into["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _health(s: Server) -> int:
    return s.call("/health")[0]


@pytest.fixture(scope="module")
def pooled(ckpt):
    """Two decoding processes of one thread each; ended by the last test, with SIGTERM."""
    s = Server(ckpt, "--workers", "2", "--threads", "2", "--timeout", "10", *LONG, hooks=True)
    s.ready()
    yield s
    s.stop()


def test_a_killed_worker_fails_its_request_alone_and_a_new_one_takes_its_place(pooled, data_dir, long_request):
    s = pooled
    few = lines_of(data_dir / "multi30k" / "val.en", 8)
    want = [t["tgt"] for t in s.translate(few)]
    workers = sorted(_children(s.proc.pid))
    assert len(workers) == 2
    # the long request's lines decode in the workers: one of them, its CPU time running (half a second: decoding,
    # not an idle trim), is stopped there, so that its batch cannot end before the kill, which is then certain to
    # hit it
    idle = {pid: _cpu_s(pid) for pid in workers}
    done: dict = {}
    thread = _post(s, long_request, done)
    busy = wait_until(lambda: next((p for p in workers if _cpu_s(p) > idle[p] + 0.5), None), 120,
                      lambda: f"a worker to decode the long batch: {''.join(s.lines)}")
    os.kill(busy, signal.SIGSTOP)
    assert "answer" not in done  # (its batch is in the stopped worker, unfinished)
    os.kill(busy, signal.SIGKILL)
    thread.join(timeout=120)
    status, body, _ = done["answer"]
    assert status == 500 and set(body) == {"error"}, body
    assert f"(pid {busy}) stopped unexpectedly with exit code -9 (killed, or out of memory?)" in body["error"]
    assert "\n" not in body["error"]
    assert _health(s) == 503  # (a new worker is loading: a new interpreter, torch and the model take seconds)
    wait_until(lambda: _health(s) == 200, 120, lambda: f"/health to say ok again: {''.join(s.lines)}")
    now = sorted(_children(s.proc.pid))
    assert len(now) == 2 and busy not in now and len(set(now) & set(workers)) == 1
    assert [t["tgt"] for t in s.translate(few)] == want
    s.wait_for_log(rf"decoding worker \d \(pid {busy}\) stopped unexpectedly .*; starting a new one")
    s.wait_for_log(r"decoding worker \d \(pid \d+\) started in place of the one that died")

    # a worker that dies idle: a request sent once it has ended is answered by the other; /health notices it
    other = next(p for p in now if p in workers)
    os.kill(other, signal.SIGKILL)
    wait_until(lambda: _gone(other), 60, f"worker {other} to end")
    assert [t["tgt"] for t in s.translate(few)] == want
    seen: list[int] = []
    wait_until(lambda: seen.append(_health(s)) or seen[-1] == 200 and 503 in seen, 120,
               lambda: f"/health to say 503, then ok: {seen} {''.join(s.lines)}")
    assert len(_children(s.proc.pid)) == 2 and other not in _children(s.proc.pid)
    assert [t["tgt"] for t in s.translate(few)] == want
    log = "".join(s.lines)
    assert log.count("POST /translate 500") == 1 and log.count("starting a new one") == 2


def _a_timed_out_batch_stops(s: Server, request: dict, timeout: float, few: list[str], want: list[str],
                             batches: int) -> None:
    """``request`` (minutes of decoding) times out: its ``batches`` stop within a step or so of its 504 (the
    server says so, by its own clock), and a cheap request sent after the 504 is answered as before."""
    start = len(s.lines)
    done: dict = {}
    thread = _post(s, request, done)
    thread.join(timeout=120)
    assert done["answer"][:2] == (504, {"error": f"no translation within {timeout:g} s (--timeout)"})
    pattern = r"a batch of \d+ line\(s\) stopped after ([\d.]+) s: its requests had all timed out"
    s.wait_for_log(pattern, count=batches, start=start)
    took = [float(m.group(1)) for m in (re.search(pattern, x) for x in s.lines[start:]) if m]
    # (each batch ran from about the request's arrival: a step or two past the timeout, not its minutes of work)
    assert len(took) == batches and max(took) < timeout + 30, took
    assert [t["tgt"] for t in s.translate(few)] == want
    assert "Traceback" not in "".join(s.lines[start:])


def test_a_request_that_times_out_stops_its_batch_in_the_servers_own_process(ckpt, data_dir):
    s = Server(ckpt, "--workers", "1", "--timeout", "3", *LONG)
    try:
        s.ready()
        few = lines_of(data_dir / "multi30k" / "val.en", 8)
        want = [t["tgt"] for t in s.translate(few)]
        _a_timed_out_batch_stops(s, HEAVY(data_dir), 3, few, want, 1)
    finally:
        s.stop()


def test_a_request_that_times_out_stops_its_batches_in_the_workers(pooled, data_dir):
    few = lines_of(data_dir / "multi30k" / "val.en", 8)
    want = [t["tgt"] for t in pooled.translate(few)]
    _a_timed_out_batch_stops(pooled, HEAVY(data_dir), 10, few, want, 2)  # (a batch in each worker)


def _sigterm_during_a_long_batch(s: Server, request: dict, timeout: float) -> None:
    """SIGTERM while ``request`` decodes: the request gets its 504 at its timeout, and the server has ended a few
    seconds later (exit code 0), its workers with it, saying that it stopped the decoding."""
    children = _children(s.proc.pid)
    done: dict = {}
    cpu = {pid: _cpu_s(pid) for pid in [s.proc.pid, *children]}
    start = len(s.lines)
    thread = _post(s, request, done)
    s.wait_for_log(r"^test hook: decoding \d+ line", start=start)
    wait_until(lambda: any(_cpu_s(p) > cpu[p] + 0.5 for p in cpu), 120, "the long batch to decode")
    s.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = s.proc.wait(timeout=120)
    took = time.monotonic() - signalled
    thread.join(timeout=60)
    assert code == 0 and took < timeout + 8, took  # (the batch alone would take several times that)
    status, body, _ = done["answer"]
    assert (status, body) == (504, {"error": f"no translation within {timeout:g} s (--timeout)"})
    log = "".join(s.lines[start:])
    # (the request's 504 stops its batch, a step later; a step that outlasts the half second after the timeout
    # is stopped as before, by killing the workers or by exiting without the batch)
    assert ("its requests had all timed out" in log
            or f"still decoding {timeout:g} s after the signal to stop (--timeout): stopping the decoding" in log), log
    assert all(_gone(pid) for pid in children) and "Traceback" not in log


def test_sigterm_during_a_long_batch_in_the_servers_own_process_ends_it_within_its_timeout(ckpt, long_request):
    """--workers 1, --timeout 3: the batch (about 36 s) decodes on a thread of the server; it stops at the
    request's 504, or the server exits without it."""
    s = Server(ckpt, "--workers", "1", "--threads", "1", "--timeout", "3", *LONG, hooks=True)
    try:
        s.ready()
        _sigterm_during_a_long_batch(s, long_request, 3)
    finally:
        s.stop()


def test_sigterm_during_a_long_batch_in_the_workers_ends_the_server_within_its_timeout(pooled, long_request):
    """--workers 2, --timeout 10: the workers decoding (beam 100, about 36 s each) are killed once the timeout
    is over."""
    _sigterm_during_a_long_batch(pooled, {**long_request, "beam": 100}, 10)
