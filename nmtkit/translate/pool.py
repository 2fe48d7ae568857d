"""Decoding in worker processes (``nmt-translate --workers N``, on CPU).

On a CPU, N processes with T/N threads each decode more sentences per second than one process with T threads: a
step of beam search is many small operations (the attention's, the GRU's, top-k, the bookkeeping) that do not
split well over threads, while separate batches in separate processes keep every core busy (measured on two
cores: tests/bench/results/bench_translate.txt).

:class:`DecodePool` starts N worker processes (``python -c`` running :func:`worker_main`: a fresh interpreter,
nothing inherited from the parent's torch thread pools, and no re-import of the caller's main script as
multiprocessing's ``spawn`` would do; ``nmtkit.parallel.Mapper``, which serves nmt-prepare and nmt-select, forks,
which is not safe once torch's thread pools run); each loads the checkpoints itself. The parent submits batches (source id
arrays) and collects each batch's hypotheses by ticket, so the caller decides the order:
:class:`nmtkit.translate.translator.Translator` submits whole windows ahead and gives results back in input order. Each
worker gets at most ``DEPTH`` batches at a time, so a fast worker takes more of them.

Protocol: length-prefixed pickles over the worker's stdin and a duplicate of its stdout (its own stdout and
prints go to stderr). Only the parent and its own children speak it. Workers run in their own session, so Ctrl-C
in a terminal reaches only the parent, which stops them; a worker whose parent dies reads end-of-file and exits.
A worker that dies (killed, out of memory) is reported as an error naming it, never waited for forever.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from nmtkit.errors import InputError, WorkerError

if TYPE_CHECKING:  # (the parent needs no torch to start workers)
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.decoding import DecodeSetup, SourceBatch

DEPTH = 2  # batches handed to one worker at a time
_HEADER = struct.Struct(">Q")


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # end of file: the other side is gone
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> Any:
    """One message, or EOFError when the other side has closed (or died)."""
    header = _read_exactly(fd, _HEADER.size)
    data = None if header is None else _read_exactly(fd, _HEADER.unpack(header)[0])
    if data is None:
        raise EOFError
    return pickle.loads(data)


# -- the worker side --------------------------------------------------------------------------------------------------

def worker_main() -> None:
    """Run in a worker process: read the set-up, load the models, then decode batches until end of input."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr, not into the protocol
    in_fd = 0
    import torch

    from nmtkit.runtime import IDLE_TRIM_S, trim_heap, tune_malloc
    from nmtkit.translate.decoding import build_models, decode_batch

    tune_malloc()
    try:
        setup = _receive(in_fd)
    except EOFError:
        return
    torch.set_num_threads(setup["threads"])
    try:
        models = build_models(setup["checkpoints"], setup["device"], backend=setup["backend"])
    except Exception as e:  # noqa: BLE001   reported by the parent as its own error
        _send(out_fd, ("error", None, f"{type(e).__name__}: {e}"))
        return
    _send(out_fd, ("ready", None, None))
    tasks: deque = deque()
    arrived = threading.Condition()

    def read_tasks() -> None:  # always drain stdin, so the parent never blocks writing to us
        while True:
            try:
                task = _receive(in_fd)
            except EOFError:
                task = None
            with arrived:
                tasks.append(task)
                arrived.notify()
            if task is None:
                return

    threading.Thread(target=read_tasks, daemon=True).start()
    while True:
        with arrived:
            if not arrived.wait_for(lambda: tasks, timeout=IDLE_TRIM_S):
                trim_heap()  # idle: the heap kept for the next batch goes back until work comes
                arrived.wait_for(lambda: tasks)
            task = tasks.popleft()
        if task is None:
            return
        ticket, batch, settings = task
        try:  # (a batch may bring its own decoding settings: a server's requests do)
            decode_setup = setup["setup"] if settings is None else setup["setup"].configured(*settings)
            reply = ("done", ticket, decode_batch(models, batch, setup["device"], decode_setup))
        except Exception as e:  # noqa: BLE001
            reply = ("failed", ticket, f"{type(e).__name__}: {e}")
        try:
            _send(out_fd, reply)
        except BrokenPipeError:
            return


# -- the parent side --------------------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, rank: int, setup: dict):
        # the parent's module search path, in its order: the worker imports the same nmtkit (and torch) as the
        # parent, also when the parent's caller changed sys.path in the process
        path = os.pathsep.join(p for p in sys.path if p)
        self.name = f"decoding worker {rank}"
        self.proc = subprocess.Popen([sys.executable, "-c", "import nmtkit.translate.pool as d; d.worker_main()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": path})
        self.in_fd, self.out_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.outstanding = 0
        _send(self.in_fd, setup)

    def died(self) -> WorkerError:
        code = self.proc.wait()
        return WorkerError(f"{self.name} (pid {self.proc.pid}) stopped unexpectedly with exit code {code} "
                            "(killed, or out of memory?)")


class DecodePool:
    """``workers`` processes of ``threads`` torch threads each, decoding batches with
    ``nmtkit.translate.decoding.decode_batch(models, batch, device, setup)`` (``setup``: the
    :class:`~nmtkit.translate.decoding.DecodeSetup` sent once; a batch may bring other decoding settings).

    Thread-safe: several threads may submit batches and wait for their own results at once (``nmt-serve`` decodes
    several batches at a time); one of the waiting threads reads the workers' replies for all of them.  A batch that
    fails in its worker raises :class:`WorkerError` in the thread that asks for its result, and only there."""

    def __init__(self, checkpoints: list[str], workers: int, threads: int, device: str, setup: DecodeSetup,
                 backend: str | None = None):
        setup = {"checkpoints": [str(p) for p in checkpoints], "device": str(device), "threads": threads,
                 "setup": setup, "backend": backend}
        self._workers: list[_Worker] = []
        self._queue: deque[tuple[int, SourceBatch, tuple | None]] = deque()
        self._done: dict[int, Any] = {}
        self._next = self._collected = 0
        self._lock = threading.Condition()
        self._reading = False  # (a thread is reading replies: the others wait for it to hand theirs over)
        try:
            self._workers = [_Worker(k, setup) for k in range(workers)]
            for w in self._workers:  # every worker has loaded the checkpoints, or says why it could not
                try:
                    kind, _, message = _receive(w.out_fd)
                except EOFError:
                    raise w.died() from None
                if kind == "error":
                    raise InputError(f"{w.name} could not load the checkpoint(s): {message}")
        except BaseException:
            self.close(kill=True)
            raise

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return [w.proc.pid for w in self._workers]

    @property
    def pending(self) -> int:
        """Batches submitted whose results have not been collected."""
        return self._next - self._collected

    def submit(self, batch: SourceBatch, settings: tuple[DecodeConfig, bool] | None = None) -> int:
        """Queue one batch, with its own decoding settings and whether to keep the attention (None: the set-up's);
        returns its ticket for :meth:`result`."""
        with self._lock:
            ticket, self._next = self._next, self._next + 1
            self._queue.append((ticket, batch, settings))
            self._dispatch()
        return ticket

    def ready(self, ticket: int) -> bool:
        """Whether the batch's result has arrived (collects what has, without waiting)."""
        with self._lock:
            if ticket not in self._done and not self._reading:
                self._collect(block=False)
            return ticket in self._done

    def result(self, ticket: int):
        """The batch's hypotheses (as ``decode_batch`` returns them), waiting for them if need be."""
        with self._lock:
            while ticket not in self._done:
                if self._reading:  # another thread reads: it wakes us when a reply came
                    self._lock.wait()
                    continue
                self._reading = True
                try:
                    self._lock.release()  # (others may submit while this one waits for the workers)
                    try:
                        ready = self._wait_readable()
                    finally:
                        self._lock.acquire()
                    self._read(ready)
                finally:
                    self._reading = False
                    self._lock.notify_all()
            self._collected += 1
            kind, payload = self._done.pop(ticket)
        if kind == "failed":
            raise WorkerError(payload)
        return payload

    def _dispatch(self) -> None:
        for w in sorted(self._workers, key=lambda w: w.outstanding):
            while self._queue and w.outstanding < DEPTH:
                try:
                    _send(w.in_fd, self._queue[0])
                except BrokenPipeError:  # (it died: its end of the pipe is closed)
                    raise w.died() from None
                self._queue.popleft()
                w.outstanding += 1

    def _wait_readable(self, block: bool = True) -> list[_Worker]:
        """The busy workers with a reply to read (waiting for one, with ``block``)."""
        busy = {w.out_fd: w for w in self._workers if w.outstanding}
        if not busy:
            return []
        readable, _, _ = select.select(list(busy), [], [], None if block else 0)
        return [busy[fd] for fd in readable]

    def _read(self, ready: list[_Worker]) -> None:
        """Read one reply from each of ``ready`` (under the lock), then hand the workers more batches."""
        for w in ready:
            try:
                kind, ticket, payload = _receive(w.out_fd)
            except EOFError:
                raise w.died() from None
            w.outstanding -= 1
            self._done[ticket] = ("done", payload) if kind == "done" else \
                ("failed", f"decoding failed in {w.name}: {payload}")
        self._dispatch()

    def _collect(self, block: bool) -> None:
        self._read(self._wait_readable(block))

    def close(self, kill: bool = False) -> None:
        """Stop the workers: let idle ones exit, or kill them (``kill``, or with batches still pending, e.g. after
        Ctrl-C or when the reader stopped early)."""
        kill = kill or self.pending > 0
        for w in self._workers:
            if kill:
                w.proc.kill()
            try:
                w.proc.stdin.close()  # end of input: an idle worker exits
            except OSError:
                pass
        for w in self._workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.proc.stdout.close()
        self._workers = []
