"""Batching across clients: the lines of concurrent requests are decoded together.

A request's lines wait in one queue, in arrival order.  The batch is formed around the request at its head: it
takes, in order, the waiting requests with the same settings (:attr:`nmtkit.serve.service.Request.key`: decoding
options, and whether attention is needed) until they hold ``max_batch`` lines.  It is decoded as soon as it holds
them, or once no line it could take has arrived for ``wait`` seconds -- counted from the head's arrival, or from
the moment the previous batch was decoded if that is later -- but at most ``QUIET_CAP`` times ``wait`` after that
moment (a large ``wait`` can so come near a request's timeout).  Marian's ``--queue-timeout`` counts from the
head's arrival alone; so did this batcher, and clients that send their next line as soon as they are answered fell
into lock-step: a batch that ended sent its clients back, the first of them started the wait, the stragglers missed
it and formed a second, smaller batch behind it, and so for good (16 clients: batches of 10 and 6 in turn;
tests/bench/results/bench_serve.txt).  Waiting for a quiet moment, and giving the clients of the batch just decoded
the time to come back, keeps them in one batch.  A request of more lines than ``max_batch`` is a batch of its own.
Requests with other settings wait for a later batch.  Decoding runs on threads of its own, so the event loop goes on
answering (``/health`` during a long batch) and queueing; each request gets back exactly its own lines.
With ``concurrency`` > 1 (``nmt-serve --workers``: decoding processes) that many batches are decoded at once, each
on a thread that hands it to the workers; the next batch forms while they decode, from what waits meanwhile, and
while several are free a batch takes only its share of the lines waiting (16 lines, two free: 8 each), so that
clients in one batch do not leave the other processes idle.  (Continuous batching -- lines joining the running
search between its steps -- lost to this at every load, tests/bench/results/bench_serve.txt; its code is on the
git tag retired/continuous-batching.)

A request that would make the queue hold more than ``max_queue`` lines is refused at once (:class:`Overloaded`);
one that waits longer than its timeout gets :class:`asyncio.TimeoutError` and its lines leave the queue if they have
not been taken into a batch yet (a batch being decoded is not interrupted; its result for that request is dropped).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nmtkit.runtime import IDLE_TRIM_S, trim_heap
from nmtkit.serve.service import Request, TranslationService


QUIET_CAP = 10  # a batch waits for more lines at most this many times ``wait`` in all


class Overloaded(Exception):
    """The queue cannot take the request's lines now."""


@dataclass
class Outcome:
    """A request's results and how they were made (for its log line)."""

    results: list[dict]
    batch_lines: int  # lines of the batch its lines were decoded in
    queue_ms: float  # from arrival to the start of that batch
    decode_ms: float  # the batch's decoding


@dataclass
class _Job:
    request: Request
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # (its client stopped waiting: nothing to hand it)


class Batcher:
    def __init__(self, service: TranslationService, max_batch: int, wait: float, max_queue: int,
                 concurrency: int = 1):
        self.service, self.max_batch, self.wait, self.max_queue = service, max_batch, wait, max_queue
        self.queue: list[_Job] = []
        self.queued_lines = 0
        self._changed: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None  # batches that may be decoding at once
        self.concurrency = concurrency
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="nmt-serve-decode")
        self._task: asyncio.Task | None = None
        self._decoding: set[asyncio.Future] = set()
        self._freed = 0.0  # (time.monotonic) when the latest batch was decoded (its clients may send again soon)
        self._busy = 0  # batches being decoded

    def start(self) -> None:
        """Start forming and decoding batches (in the running event loop)."""
        self._changed = asyncio.Event()
        self._slots = asyncio.Semaphore(self.concurrency)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nmt-serve-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._decoding:  # (the batches being decoded finish; their clients may still be waiting)
            await asyncio.wait(self._decoding)
        self._executor.shutdown(wait=True)

    async def translate(self, request: Request, timeout: float) -> Outcome:
        """The request's results once its batch is decoded (:class:`Overloaded`, :class:`asyncio.TimeoutError`)."""
        if not request.lines:
            return Outcome([], 0, 0.0, 0.0)
        n = len(request.lines)
        if self.queued_lines + n > self.max_queue:
            raise Overloaded(f"the queue holds {self.queued_lines} lines of at most {self.max_queue}")
        job = _Job(request, asyncio.get_running_loop().create_future())
        self.queue.append(job)
        self.queued_lines += n
        self._changed.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            job.abandoned = True
            self._drop(job)
            raise

    def _drop(self, job: _Job) -> None:
        if job in self.queue:
            self.queue.remove(job)
            self.queued_lines -= len(job.request.lines)
            self._changed.set()  # (a batch forming around it stops waiting)

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()  # a batch forms once it can be decoded: it takes what waits until then
            try:
                batch, lines = await self._form()
            except BaseException:
                self._slots.release()
                raise
            if not batch:
                self._slots.release()
                continue
            self._busy += 1
            task = asyncio.get_running_loop().create_task(self._decode(batch, lines))
            self._decoding.add(task)
            task.add_done_callback(self._decoding.discard)

    async def _form(self) -> tuple[list[_Job], int]:
        """The next batch, taken off the queue (empty when its head timed out while it formed)."""
        while not self.queue:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), IDLE_TRIM_S)
            except asyncio.TimeoutError:  # idle: the freed heap goes back (decoding in this process keeps it)
                if not self._decoding:
                    await asyncio.get_running_loop().run_in_executor(self._executor, trim_heap)
                await self._changed.wait()
        head = self.queue[0]
        key = head.request.key
        start = max(head.arrived, self._freed)  # (a line that waited for a batch to finish waits from then on)
        while head in self.queue and self._lines(key) < self.max_batch:
            now = time.monotonic()
            # (the latest line it could take: lines with other settings do not hold it back)
            last = max(job.arrived for job in self.queue if job.request.key == key)
            left = min(start + QUIET_CAP * self.wait, max(start, last) + self.wait) - now
            if left <= 0:
                break
            await _set_within(self._changed, left)
        if head not in self.queue:  # (it timed out while its batch formed)
            return [], 0
        # (with several decoding processes free, a batch takes its share of the lines waiting: they all decode)
        free = max(1, self.concurrency - self._busy)
        most = min(self.max_batch, -(-self._lines(key) // free))
        batch, lines = [], 0
        for job in list(self.queue):
            if job.request.key != key:
                continue
            if batch and lines + len(job.request.lines) > most:
                break
            batch.append(job)
            lines += len(job.request.lines)
        for job in batch:
            self._drop(job)
        return batch, lines

    async def _decode(self, batch: list[_Job], lines: int) -> None:
        """Decode one batch on a thread of the executor and hand each request its results."""
        start = time.monotonic()
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.service.translate,
                                                                       [job.request for job in batch])
        except Exception as e:  # (the error of these requests: the server goes on)
            for job in batch:
                if not job.abandoned:
                    job.future.set_exception(e)
            return
        finally:
            self._freed = time.monotonic()
            self._busy -= 1
            self._slots.release()
        decode_ms = (time.monotonic() - start) * 1000
        for job, result in zip(batch, results):
            if not job.abandoned:
                job.future.set_result(Outcome(result, lines, (start - job.arrived) * 1000, decode_ms))

    def _lines(self, key) -> int:
        return sum(len(job.request.lines) for job in self.queue if job.request.key == key)


async def _set_within(event: asyncio.Event, timeout: float | None) -> bool:
    """Clear ``event``, then wait until it is set again (True) or ``timeout`` seconds pass (False; None: no limit)."""
    event.clear()
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return False
