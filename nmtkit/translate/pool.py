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

The protocol and the worker's loop are in :mod:`nmtkit.translate.worker`. Workers run in their own session, so
Ctrl-C in a terminal reaches only the parent, which stops them; a worker whose parent dies reads end-of-file and
exits.
A worker that dies (killed, out of memory) is reported as an error naming it, never waited for forever.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from nmtkit.errors import InputError, WorkerError
from nmtkit.translate.stopping import Cancelled
from nmtkit.translate.worker import receive, send

if TYPE_CHECKING:  # (the parent needs no torch to start workers)
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.decoding import DecodeSetup, SourceBatch

log = logging.getLogger("nmtkit.translate")
DEPTH = 2  # batches handed to one worker at a time
# -- the parent side --------------------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, rank: int, setup: dict):
        # the parent's module search path, in its order: the worker imports the same nmtkit (and torch) as the
        # parent, also when the parent's caller changed sys.path in the process
        path = os.pathsep.join(p for p in sys.path if p)
        self.rank, self.name = rank, f"decoding worker {rank}"
        self.proc = subprocess.Popen([sys.executable, "-c", "import nmtkit.translate.worker as w; w.worker_main()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": path})
        self.in_fd, self.out_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.tickets: set[int] = set()  # the batches handed to it whose results have not come back
        send(self.in_fd, setup)

    @property
    def outstanding(self) -> int:
        return len(self.tickets)

    def loaded(self) -> None:
        """Wait until it has loaded the checkpoints (or raise why it could not)."""
        try:
            kind, _, message = receive(self.out_fd)
        except EOFError:
            raise self.died() from None
        if kind == "error":
            raise InputError(f"{self.name} could not load the checkpoint(s): {message}")

    def died(self) -> WorkerError:
        try:
            code = self.proc.wait(timeout=10)  # (its output ended: it has exited, or is exiting)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return WorkerError(f"{self.name} (pid {self.proc.pid}) stopped unexpectedly with exit code {code} "
                           "(killed, or out of memory?)")

    def release(self) -> None:
        """Close its pipes (it has exited, or is told to by end of input) and reap it if it has exited."""
        self.proc.poll()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class DecodePool:
    """``workers`` processes of ``threads`` torch threads each, decoding batches with
    ``nmtkit.translate.decoding.decode_batch(models, batch, device, setup)`` (``setup``: the
    :class:`~nmtkit.translate.decoding.DecodeSetup` sent once; a batch may bring other decoding settings).

    Thread-safe: several threads may submit batches and wait for their own results at once (``nmt-serve`` decodes
    several batches at a time); one of the waiting threads reads the workers' replies for all of them.  A batch that
    fails in its worker raises :class:`WorkerError` in the thread that asks for its result, and only there.

    A worker that dies (killed, out of memory) is an error for whoever reads next -- or, with ``restart`` (a
    server, which must go on), only for the batches it held: a new worker is started in its place on a thread of
    its own (loading the checkpoints takes seconds; meanwhile the others take the batches), and :attr:`complete`
    is false until it is ready."""

    def __init__(self, checkpoints: list[str], workers: int, threads: int, device: str, setup: DecodeSetup,
                 backend: str | None = None, restart: bool = False):
        self._setup = {"checkpoints": [str(p) for p in checkpoints], "device": str(device), "threads": threads,
                       "setup": setup, "backend": backend}
        self._size, self._restart = workers, restart
        self._workers: list[_Worker] = []
        self._starting: dict[int, _Worker | None] = {}  # rank -> the replacement being started (None: not yet)
        self._dead: list[_Worker] = []  # (their pipes are closed once no thread waits on them in select)
        self._queue: deque[tuple[int, SourceBatch, tuple | None]] = deque()
        self._done: dict[int, Any] = {}
        self._open: set[int] = set()  # tickets submitted and not yet collected or discarded
        self._discarded: set[int] = set()  # tickets whose results nobody will collect
        self._next = 0
        self._lock = threading.Condition()
        self._reading = False  # (a thread is reading replies: the others wait for it to hand theirs over)
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()  # (a replacement ready wakes the reader from its select)
        try:
            self._workers = [_Worker(k, self._setup) for k in range(workers)]
            for w in self._workers:  # every worker has loaded the checkpoints, or says why it could not
                w.loaded()
        except BaseException:
            self.close(kill=True)
            raise

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        with self._lock:
            return [w.proc.pid for w in self._workers]

    @property
    def pending(self) -> int:
        """Batches submitted whose results have not been collected."""
        return len(self._open)

    @property
    def complete(self) -> bool:
        """Whether every worker is there and alive (with ``restart``, a dead one found here is replaced).  Never
        waits long for the lock: a server's event loop asks."""
        workers = list(self._workers)
        dead = [w for w in workers if w.proc.poll() is not None]
        if dead and self._restart and self._lock.acquire(timeout=0.05):
            try:
                for w in dead:
                    if w in self._workers and not self._closing:
                        self._lost(w)
            finally:
                self._lock.release()
        return not self._closing and not dead and len(workers) == self._size

    def submit(self, batch: SourceBatch, settings: tuple[DecodeConfig, bool] | None = None) -> int:
        """Queue one batch, with its own decoding settings and whether to keep the attention (None: the set-up's);
        returns its ticket for :meth:`result`."""
        with self._lock:
            if self._closing:
                raise WorkerError("the decoding workers were stopped")
            ticket, self._next = self._next, self._next + 1
            self._open.add(ticket)
            self._queue.append((ticket, batch, settings))
            self._dispatch()
        return ticket

    def ready(self, ticket: int) -> bool:
        """Whether the batch's result has arrived (collects what has, without waiting)."""
        with self._lock:
            if ticket not in self._done and not self._reading:
                self._read(self._wait_readable(block=False))
                self._bury()
            return ticket in self._done

    def result(self, ticket: int):
        """The batch's hypotheses (as ``decode_batch`` returns them), waiting for them if need be."""
        with self._lock:
            while ticket not in self._done:
                if self._closing:
                    self._open.discard(ticket)
                    raise WorkerError("the decoding workers were stopped")
                if self._reading or not any(w.tickets for w in self._workers):
                    # another thread reads (it wakes us when a reply came), or no worker holds a batch: the ticket
                    # waits for a replacement worker (it wakes us when it takes the queue)
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
                    self._bury()
                    self._lock.notify_all()
            self._open.discard(ticket)
            kind, payload = self._done.pop(ticket)
        if kind == "failed":
            raise WorkerError(payload)
        if kind == "cancelled":
            raise Cancelled("the decoding was stopped: nobody waits for its result")
        return payload

    def cancel(self, tickets) -> None:
        """Stop decoding these batches (:mod:`nmtkit.translate.stopping`): one not yet handed to a worker is
        dropped, a worker stops the others before their next search step; :meth:`result` raises
        :class:`~nmtkit.translate.stopping.Cancelled` for each (unless it came back first)."""
        with self._lock:
            tickets = set(tickets) & self._open
            for item in self._queue:
                if item[0] in tickets:
                    self._done[item[0]] = ("cancelled", None)
            self._queue = deque(item for item in self._queue if item[0] not in tickets)
            for w in self._workers:
                for ticket in w.tickets & tickets:
                    try:
                        send(w.in_fd, ("cancel", ticket))
                    except BrokenPipeError:  # (it died: its batches fail once that is found)
                        break
            self._lock.notify_all()
            if self._reading and self._wake_w >= 0:  # (a reader waiting for a ticket dropped from the queue)
                os.write(self._wake_w, b"!")

    def discard(self, tickets) -> None:
        """Forget batches whose results will not be collected (their request failed): their results are dropped,
        now or when they come."""
        with self._lock:
            queued = {item[0] for item in self._queue}
            for t in tickets:
                if t not in self._open:  # (collected already)
                    continue
                if t in self._done or t in queued:  # (arrived; or not handed to a worker: never decoded)
                    self._done.pop(t, None)
                    self._open.discard(t)
                else:  # (at a worker: dropped when it comes)
                    self._discarded.add(t)
            self._queue = deque(item for item in self._queue if item[0] in self._open)

    def _dispatch(self) -> None:
        for w in sorted(self._workers, key=lambda w: w.outstanding):
            while self._queue and w.outstanding < DEPTH and w in self._workers:
                try:
                    send(w.in_fd, ("decode", *self._queue[0]))
                except BrokenPipeError:  # (it died: its end of the pipe is closed)
                    self._lost(w)
                    continue
                w.tickets.add(self._queue.popleft()[0])
                if w.outstanding == 1 and self._reading and self._wake_w >= 0:
                    # a reader in select watches the workers that were busy when it began: this one joins them, or
                    # its death would go unseen until the others answer (a killed worker's request got 504, not 500)
                    os.write(self._wake_w, b"!")

    def _wait_readable(self, block: bool = True) -> list[_Worker]:
        """The busy workers with a reply to read (waiting for one, or for a replacement's start, with ``block``)."""
        busy = {w.out_fd: w for w in self._workers if w.outstanding}
        if not busy:
            return []
        wake = [self._wake_r] if self._wake_r >= 0 else []
        readable, _, _ = select.select([*busy, *wake], [], [], None if block else 0)
        if self._wake_r in readable:
            os.read(self._wake_r, 4096)
        return [busy[fd] for fd in readable if fd in busy]

    def _read(self, ready: list[_Worker]) -> None:
        """Read one reply from each of ``ready`` (under the lock), then hand the workers more batches."""
        for w in ready:
            if w not in self._workers:  # (found dead meanwhile)
                continue
            try:
                kind, ticket, payload = receive(w.out_fd)
            except EOFError:
                self._lost(w)
                continue
            w.tickets.discard(ticket)
            if ticket in self._discarded:
                self._discarded.discard(ticket)
                self._open.discard(ticket)
                continue
            self._done[ticket] = (kind, payload) if kind in ("done", "cancelled") else \
                ("failed", f"decoding failed in {w.name}: {payload}")
        self._dispatch()

    def _lost(self, w: _Worker) -> None:
        """A worker died (under the lock): the batches it held fail; without ``restart`` that is an error here,
        with it a replacement starts."""
        self._workers.remove(w)
        self._dead.append(w)
        error = w.died()
        for ticket in w.tickets:
            if ticket in self._discarded:
                self._discarded.discard(ticket)
                self._open.discard(ticket)
            else:
                self._done[ticket] = ("failed", str(error))
        w.tickets.clear()
        self._lock.notify_all()
        if not self._restart or self._closing:
            if not self._restart:
                raise error
            return
        log.error("%s; starting a new one", error)
        self._starting[w.rank] = None
        threading.Thread(target=self._replace, args=(w.rank,), name=f"nmt-{w.name.replace(' ', '-')}",
                         daemon=True).start()

    def _replace(self, rank: int) -> None:
        """Start a worker in place of the dead ``rank`` (on its own thread), trying again while it cannot."""
        for attempt in itertools.count():
            w = None
            try:
                w = _Worker(rank, self._setup)  # (not under the lock: sending the set-up waits for its start)
                with self._lock:
                    self._starting[rank] = w
                    if self._closing:
                        w.proc.kill()
                w.loaded()
            except (OSError, WorkerError, InputError) as e:
                with self._lock:
                    if w is not None:
                        w.proc.kill()
                        self._dead.append(w)
                    if self._closing:
                        del self._starting[rank]
                        self._bury()
                        return
                    self._starting[rank] = None
                    self._bury()
                log.error("decoding worker %d could not be started again (%s); trying again", rank, e)
                time.sleep(min(30, 2 ** attempt))
                continue
            with self._lock:
                del self._starting[rank]
                if self._closing:
                    w.proc.kill()
                    self._dead.append(w)
                    self._bury()
                    return
                self._workers.append(w)
                log.info("%s (pid %d) started in place of the one that died", w.name, w.proc.pid)
                self._dispatch()
                self._lock.notify_all()
                os.write(self._wake_w, b"!")  # (a reader in select waits on the others' pipes only)
            return

    def _bury(self) -> None:
        """Close the pipes of dead workers (under the lock, when no thread waits on them)."""
        if self._reading:
            return
        for w in self._dead:
            w.release()
        self._dead = []
        if self._closing and not self._starting and self._wake_r >= 0:  # (the wake-up pipe's last use is over)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def close(self, kill: bool = False) -> None:
        """Stop the workers: let idle ones exit, or kill them (``kill``, or with batches still pending, e.g. after
        Ctrl-C or when the reader stopped early; a thread waiting for a result then gets a :class:`WorkerError`)."""
        with self._lock:
            self._closing = True
            kill = kill or self.pending > 0
            workers = self._workers + [w for w in self._starting.values() if w is not None]
            for w in workers:
                if kill:
                    w.proc.kill()
                try:
                    w.proc.stdin.close()  # end of input: an idle worker exits
                except OSError:
                    pass
            self._lock.notify_all()
            if self._wake_w >= 0:
                os.write(self._wake_w, b"!")
        for w in workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        with self._lock:
            self._dead += workers
            self._workers = []
            self._bury()  # (else the reader does, once it wakes)
