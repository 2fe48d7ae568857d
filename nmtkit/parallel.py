"""An ordered, bounded-memory parallel map over chunks of a stream (shared by ``nmt-prepare`` and ``nmt-select``).

:class:`Mapper` cuts a stream of items into chunks of :data:`CHUNK` items and applies a chunk function to each,
either in this process (1 worker) or in worker processes; results come back in input order and are the same either
way, since the chunks are the same. Chunk ``k`` goes to worker ``k mod N`` and at most two chunks per worker are in
flight, so memory stays bounded however long the stream is (unlike ``Pool.imap``, whose feeder reads ahead freely).

Chunk functions find their per-process state (tokenisers, models) in a module-level dict that an initializer
fills: the initializer runs once in this process first, so that a setting that cannot be loaded fails once, here,
not in every worker. Under the ``fork`` start method the initializer's arguments are inherited, not pickled, so
large read-only arrays (language models) are shared copy-on-write between the workers.

The workers are this module's own, not ``multiprocessing.Pool``'s: each has its own pipe to the parent, fed by a
thread of the parent's, and shares no lock with the others, so the parent can always tear them down.
``Pool.terminate()`` kills its workers and then waits for its task thread, which can be blocked for ever on a shared
queue lock that a killed worker held, or on a pipe nobody reads any more (a chunk is larger than a pipe's buffer);
``nmt-prepare --workers 2`` once hung under Ctrl-C in CI inside such a teardown (not reproduced here since). Here an
interrupted or failed map kills the workers and returns; a worker that dies (killed, out of memory) is a :class:`~nmtkit.errors.WorkerError`, never waited for.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

from nmtkit.errors import WorkerError

CHUNK = 1000  # items per unit of parallel work
DEPTH = 2  # chunks in flight per worker


def chunks(items: Iterable, size: int = CHUNK) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _worker_main(conn, initializer: Callable[..., None], initargs: tuple, inherited: list) -> None:
    """A worker's life: apply the chunk functions the parent sends, one ``(ok, value)`` reply per chunk."""
    # The parent handles Ctrl-C and SIGTERM and tears the workers down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for c in inherited:  # (fork: the parent's ends of the pipes, so that a parent that dies is seen to go)
        c.close()
    initializer(*initargs)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if task is None:
            return
        func, chunk = task
        try:
            reply = (True, func(chunk))
        except Exception as e:  # raised again in the parent
            reply = (False, e)
        try:
            conn.send(reply)  # (pickled whole before anything is written)
        except OSError:
            return  # the parent is gone
        except Exception as e:  # the result or the exception could not be pickled
            conn.send((False, WorkerError(f"a worker's result could not be sent back: {e}")))


class _Worker:
    """One worker process, its pipe, and the thread that feeds it (so that a send never blocks the reader)."""

    def __init__(self, ctx, index: int, initializer, initargs: tuple, inherited: list | None):
        self.index = index
        self.conn, child = ctx.Pipe(duplex=True)
        inherited = [] if inherited is None else [*inherited, self.conn]  # (None: spawn, nothing is inherited)
        self.process = ctx.Process(target=_worker_main, args=(child, initializer, initargs, inherited),
                                   name=f"nmtkit-worker-{index}", daemon=True)
        self.process.start()
        child.close()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=self._send_all, name=f"nmtkit-sender-{index}", daemon=True)

    def _send_all(self) -> None:
        while True:
            task = self.outbox.get()
            try:
                self.conn.send(task)
            except (OSError, ValueError):
                return  # the worker is gone: receive() reports it
            if task is None:
                return

    def receive(self):
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise WorkerError(f"worker process {self.index + 1} (pid {self.process.pid}) died"
                              f" (exit code {self.process.exitcode})") from None
        if not ok:
            raise value
        return value


class Mapper:
    """Applies chunk functions in-process (1 worker) or in worker processes; same results either way.

    >>> with Mapper(1, lambda: None) as m:
    ...     list(m.map(lambda chunk: [x * 2 for x in chunk], range(3)))
    [0, 2, 4]
    """

    def __init__(self, workers: int, initializer: Callable[..., None], initargs: tuple = (),
                 chunk_size: int = CHUNK):
        self.workers = workers
        self.initializer = initializer
        self.initargs = initargs
        self.chunk_size = chunk_size
        self._pool: list[_Worker] = []
        self._in_flight = 0  # chunks sent whose results were not received

    def __enter__(self) -> Mapper:
        self.initializer(*self.initargs)
        if self.workers > 1:
            fork = "fork" in multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if fork else "spawn")
            try:
                for i in range(self.workers):  # every process first, then the threads (no fork beside a thread)
                    inherited = [w.conn for w in self._pool] if fork else None
                    self._pool.append(_Worker(ctx, i, self.initializer, self.initargs, inherited))
                for w in self._pool:
                    w.sender.start()
            except BaseException:
                self._abort()
                raise
        return self

    def map_chunks(self, func: Callable[[list], object], items: Iterable) -> Iterator:
        """``func(chunk)`` for consecutive chunks of ``items``, one result per chunk, in input order."""
        if not self._pool:
            for chunk in chunks(items, self.chunk_size):
                yield func(chunk)
            return
        pending: deque[_Worker] = deque()  # the worker of each chunk in flight, oldest first
        for k, chunk in enumerate(chunks(items, self.chunk_size)):
            worker = self._pool[k % len(self._pool)]
            worker.outbox.put((func, chunk))
            pending.append(worker)
            self._in_flight += 1
            if len(pending) >= DEPTH * len(self._pool):
                yield self._receive(pending.popleft())
        while pending:
            yield self._receive(pending.popleft())

    def _receive(self, worker: _Worker):
        result = worker.receive()
        self._in_flight -= 1
        return result

    def map(self, func: Callable[[list], Iterable], items: Iterable) -> Iterator:
        """Like :meth:`map_chunks` for a ``func`` that returns one result per item: the results, flattened."""
        for results in self.map_chunks(func, items):
            yield from results

    def _close(self) -> None:
        """The normal end: every worker finishes what it was sent and exits."""
        for w in self._pool:
            w.outbox.put(None)
        for w in self._pool:
            w.process.join()
            w.sender.join()
            w.conn.close()
        self._pool = []

    def _abort(self) -> None:
        """An interrupted or failed map (or one left before its end): kill the workers now, their work is not
        wanted."""
        for w in self._pool:  # (every worker in the list was started)
            w.process.kill()
        for w in self._pool:
            w.process.join()
            w.outbox.put(None)  # a sender still waiting for work ends; one blocked in a send gets EPIPE
            if w.sender.is_alive():
                w.sender.join(timeout=5)
            w.conn.close()
        self._pool = []

    def __exit__(self, exc_type, *exc) -> None:
        if self._pool:
            if exc_type is None and not self._in_flight:
                self._close()
            else:
                self._abort()
