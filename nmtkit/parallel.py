"""An ordered, bounded-memory parallel map over chunks of a stream (shared by ``nmt-prepare`` and ``nmt-select``).

:class:`Mapper` cuts a stream of items into chunks of :data:`CHUNK` items and applies a chunk function to each,
either in this process (1 worker) or in a process pool; results come back in input order and are the same either
way, since the chunks are the same. At most two chunks per worker are in flight, so memory stays bounded however
long the stream is (unlike ``Pool.imap``, whose feeder reads ahead freely).

Chunk functions find their per-process state (tokenisers, models) in a module-level dict that an initializer
fills: the initializer runs once in this process first, even for a pool, so that a setting that cannot be loaded
fails once, here, instead of killing pool workers that multiprocessing would respawn forever (a hang). Under the
``fork`` start method the initializer's arguments are inherited, not pickled, so large read-only arrays (language
models) are shared copy-on-write between the workers.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

CHUNK = 1000  # items per unit of parallel work


def chunks(items: Iterable, size: int = CHUNK) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _child_init(initializer: Callable[..., None], initargs: tuple) -> None:
    # The parent handles Ctrl-C and SIGTERM and tears the pool down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    initializer(*initargs)


class Mapper:
    """Applies chunk functions in-process (1 worker) or in an ordered process pool; same results either way.

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
        self.pool = None

    def __enter__(self) -> Mapper:
        self.initializer(*self.initargs)
        if self.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ctx.Pool(self.workers, initializer=_child_init, initargs=(self.initializer, self.initargs))
        return self

    def map_chunks(self, func: Callable[[list], object], items: Iterable) -> Iterator:
        """``func(chunk)`` for consecutive chunks of ``items``, one result per chunk, in input order."""
        if self.pool is None:
            for chunk in chunks(items, self.chunk_size):
                yield func(chunk)
            return
        pending: deque = deque()
        for chunk in chunks(items, self.chunk_size):
            pending.append(self.pool.apply_async(func, (chunk,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def map(self, func: Callable[[list], Iterable], items: Iterable) -> Iterator:
        """Like :meth:`map_chunks` for a ``func`` that returns one result per item: the results, flattened."""
        for results in self.map_chunks(func, items):
            yield from results

    def __exit__(self, exc_type, *exc) -> None:
        if self.pool is not None:
            if exc_type is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None
