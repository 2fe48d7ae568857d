"""Batching across clients: the lines of concurrent requests are decoded together.

A request's lines wait in one queue, in arrival order.  The batch is formed around the request at its head: it
takes, in order (the least served first, below), the waiting requests with the same settings
(:attr:`nmtkit.serve.service.Request.key`: decoding options, and whether attention is needed) until they hold
``max_batch`` lines.  It is decoded as soon as it holds them (or lines whose work fills ``budget``, below), or once
no line it could take has arrived for ``wait`` seconds -- counted from the head's arrival, or from the moment the
previous batch was decoded if that is later -- but at most ``QUIET_CAP`` times ``wait`` after that moment (a
large ``wait`` can so come near a request's timeout).  Marian's ``--queue-timeout`` counts from the head's arrival
alone; so did this batcher, and clients that send their next line as soon as they are answered fell into
lock-step: a batch that ended sent its clients back, the first of them started the wait, the stragglers missed it
and formed a second, smaller batch behind it, and so for good (16 clients: batches of 10 and 6 in turn;
tests/bench/results/bench_serve.txt).  Waiting for a quiet moment, and giving the clients of the batch just decoded
the time to come back, keeps them in one batch.  A request of more lines than ``max_batch`` is decoded that many
lines a batch.  Requests with other settings wait for a later batch.  Decoding runs on threads of its own, so the
event loop goes on answering (``/health`` during a long batch) and queueing; each request gets back exactly its own
lines.
With ``concurrency`` > 1 (``nmt-serve --workers``: decoding processes) that many batches are decoded at once, each
on a thread that hands it to the workers; the next batch forms while they decode, from what waits meanwhile, and
while several are free a batch takes only its share of the lines waiting (16 lines, two free: 8 each), so that
clients in one batch do not leave the other processes idle.  (Continuous batching -- lines joining the running
search between its steps -- lost to this at every load, tests/bench/results/bench_serve.txt; its code is on the
git tag retired/continuous-batching.)

What a batch may cost is bounded too: each line comes with its *work*, hypotheses × the target tokens its settings
allow (nmtkit/serve/limits.py, measured before it was queued), and a batch takes lines while they fit in
``budget`` (``--batch-work``; its first line whatever it costs).  A request of more is decoded a few lines a batch,
and the queue serves the requests that have had the least work decoded first, in arrival order among equals: a
one-line request that comes while a long one is decoding waits for one batch of it at most, not for all of it
(before, issue #57 reports, a 45,000-word prefix at beam 50 held the engine for the whole ``--timeout`` and every
other client got 504).  A request's parts are numbered on from the lines before them
(:meth:`nmtkit.serve.service.Request.part`), so that sampling draws the same.  A batch that fails is decoded again
a request at a time, so that one request's line that breaks the decoding fails that request alone, never its
neighbours.

A request that would make the queue hold more than ``max_queue`` lines is refused at once (:class:`Overloaded`);
one that waits longer than its timeout gets :class:`asyncio.TimeoutError` and its lines leave the queue, those of it
not yet taken into a batch never decoded.  A batch being decoded whose requests have all timed out is stopped
before its next search step, on a thread of this process or in a worker (:mod:`nmtkit.translate.stopping`): a
request that gave up holds the engine for one step, not for the rest of its batch (before: up to ``budget``'s work).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nmtkit.runtime import IDLE_TRIM_S, trim_heap
from nmtkit.serve.service import Request, TranslationService
from nmtkit.translate.stopping import Cancelled, Stop

log = logging.getLogger("nmtkit.serve")
QUIET_CAP = 10  # a batch waits for more lines at most this many times ``wait`` in all


class Overloaded(Exception):
    """The queue cannot take the request's lines now."""


@dataclass
class Outcome:
    """A request's results and how they were made (for its log line)."""

    results: list[dict]
    batch_lines: int  # lines of the (largest) batch its lines were decoded in
    queue_ms: float  # from arrival to the start of its first batch
    decode_ms: float  # its batches' decoding
    batches: int = 1  # the batches its lines were decoded in


@dataclass(eq=False)  # (a request is itself: found in the queue by identity, never by comparing lines)
class _Job:
    request: Request
    future: asyncio.Future
    work: list[int]  # each line's (nmtkit/serve/limits.py)
    arrived: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # (its client stopped waiting: nothing to hand it)
    taken: int = 0  # lines handed to batches, from the first on (the others wait)
    served: int = 0  # their work (the queue serves the least served first)
    finished: int = 0  # lines whose results came back
    results: list = field(default_factory=list)
    batches: list[int] = field(default_factory=list)  # the lines of each batch that decoded some of its lines
    started: float | None = None  # (time.monotonic) when its first batch started
    decode_ms: float = 0.0

    @property
    def waiting(self) -> int:
        return len(self.request.lines) - self.taken


@dataclass(eq=False)
class _Part:
    """A request's lines ``first`` to ``stop`` (``stop`` excluded), decoded in one batch."""

    job: _Job
    first: int
    stop: int
    request: Request = field(init=False)  # (those lines as a request of their own, numbered as in the whole)

    def __post_init__(self):
        self.request = self.job.request.part(self.first, self.stop)

    @property
    def arrived(self) -> float:
        return self.job.arrived


class Batcher:
    def __init__(self, service: TranslationService, max_batch: int, wait: float, max_queue: int,
                 concurrency: int = 1, budget: int | None = None):
        self.service, self.max_batch, self.wait, self.max_queue = service, max_batch, wait, max_queue
        self.budget = budget  # the work a batch is given (None: no bound)
        self.queue: list[_Job] = []  # (requests with lines not yet taken into a batch, in arrival order)
        self.queued_lines = 0
        self._changed: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None  # batches that may be decoding at once
        self.concurrency = concurrency
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="nmt-serve-decode")
        self._task: asyncio.Task | None = None
        self._decoding: set[asyncio.Future] = set()
        self._freed = 0.0  # (time.monotonic) when the latest batch was decoded (its clients may send again soon)
        self._busy = 0  # batches being decoded
        self._running: dict[Stop, list[_Part]] = {}  # the batches being decoded, by the stop that ends each

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

    async def translate(self, request: Request, timeout: float, work: list[int] | None = None) -> Outcome:
        """The request's results once its lines are decoded (:class:`Overloaded`, :class:`asyncio.TimeoutError`);
        ``work``: each line's (nmtkit/serve/limits.py; None: nothing, as for lines that cost nothing)."""
        if not request.lines:
            return Outcome([], 0, 0.0, 0.0, 0)
        n = len(request.lines)
        if self.queued_lines + n > self.max_queue:
            raise Overloaded(f"the queue holds {self.queued_lines} lines of at most {self.max_queue}")
        job = _Job(request, asyncio.get_running_loop().create_future(), list(work) if work is not None else [0] * n)
        job.results = [None] * n
        self.queue.append(job)
        self.queued_lines += n
        self._changed.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            job.abandoned = True
            self._drop(job)  # (its lines not yet in a batch are never decoded)
            for stop, batch in list(self._running.items()):  # (its batches that nobody else waits for stop)
                if all(part.job.abandoned for part in batch):
                    # (off the event loop: cancelling in the workers takes the pool's lock)
                    asyncio.get_running_loop().run_in_executor(None, stop.set)
            raise

    def _drop(self, job: _Job) -> None:
        if job in self.queue:
            self.queue.remove(job)
            self.queued_lines -= job.waiting
            self._changed.set()  # (a batch forming around it stops waiting)

    def _order(self) -> list[_Job]:
        """The waiting requests, least served first, in arrival order among equals."""
        return sorted(self.queue, key=lambda job: job.served)

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

    async def _form(self) -> tuple[list[_Part], int]:
        """The next batch, taken off the queue, and its lines (empty when its head timed out while it formed)."""
        while not self.queue:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), IDLE_TRIM_S)
            except asyncio.TimeoutError:  # idle: the freed heap goes back (decoding in this process keeps it)
                if not self._decoding:
                    await asyncio.get_running_loop().run_in_executor(self._executor, trim_heap)
                await self._changed.wait()
        head = self._order()[0]
        key = head.request.key
        start = max(head.arrived, self._freed)  # (a line that waited for a batch to finish waits from then on)
        while head in self.queue and self._lines(key) < self.max_batch and not self._full(key):
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
        batch, lines, work = [], 0, 0
        for job in self._order():
            if job.request.key != key:
                continue
            first = stop = job.taken
            while stop < len(job.work) and (lines == 0 or (lines < most and (
                    self.budget is None or work + job.work[stop] <= self.budget))):
                work += job.work[stop]
                lines += 1
                stop += 1
            if stop > first:
                batch.append(_Part(job, first, stop))
            if stop < len(job.work):  # (its next line does not fit: the batch is full)
                break
        for part in batch:
            job = part.job
            job.taken, job.served = part.stop, job.served + sum(job.work[part.first:part.stop])
            self.queued_lines -= part.stop - part.first
            if not job.waiting:
                self.queue.remove(job)
        return batch, lines

    def _full(self, key) -> bool:
        """Whether the lines with these settings waiting would fill a batch's work."""
        return self.budget is not None and sum(sum(job.work[job.taken:]) for job in self.queue
                                               if job.request.key == key) >= self.budget

    async def _decode(self, batch: list[_Part], lines: int) -> None:
        """Decode one batch on a thread of the executor and hand each request the results of its lines."""
        start = time.monotonic()
        for part in batch:
            part.job.started = start if part.job.started is None else part.job.started
        stop = Stop()
        self._running[stop] = batch
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._translate, [part.request for part in batch], stop)
        except Exception as e:  # (the executor itself failed: the error of these requests; the server goes on)
            results = [e] * len(batch)
        finally:
            del self._running[stop]
            self._freed = time.monotonic()
            self._busy -= 1
            self._slots.release()
        decode_ms = (time.monotonic() - start) * 1000
        if stop():
            log.info("a batch of %d line(s) stopped after %.1f s: its requests had all timed out", lines,
                     decode_ms / 1000)
        for part, result in zip(batch, results):
            self._deliver(part, result, lines, decode_ms)

    def _translate(self, requests: list[Request], stop: Stop) -> list:
        """Each request's results, or the exception its lines raised: a batch that fails is decoded again a
        request at a time, so that the request whose line breaks the decoding is the only one that fails (one
        stopped, :class:`Cancelled`, is not)."""
        try:
            return self.service.translate(requests, stop)
        except Cancelled as e:
            return [e] * len(requests)
        except Exception as e:
            if len(requests) == 1:
                return [e]
            log.warning("a batch of %d requests failed (%s); decoding them one at a time", len(requests),
                        f"{type(e).__name__}: {e}".splitlines()[0])
        out = []
        for request in requests:
            try:
                out.append(self.service.translate([request], stop)[0])
            except Exception as e:
                out.append(e)
        return out

    def _deliver(self, part: _Part, result, lines: int, decode_ms: float) -> None:
        """A part of a request decoded (``result``: its lines' results, or an exception): the request's answer once
        all its lines are."""
        job = part.job
        if job.abandoned or job.future.done():
            return
        if isinstance(result, BaseException):
            self._drop(job)  # (its other lines are not decoded)
            job.future.set_exception(result)
            return
        job.results[part.first:part.stop] = result
        job.finished += part.stop - part.first
        job.batches.append(lines)
        job.decode_ms += decode_ms
        if job.finished == len(job.results):
            job.future.set_result(Outcome(job.results, max(job.batches), (job.started - job.arrived) * 1000,
                                          job.decode_ms, len(job.batches)))

    def _lines(self, key) -> int:
        return sum(job.waiting for job in self.queue if job.request.key == key)


async def _set_within(event: asyncio.Event, timeout: float | None) -> bool:
    """Clear ``event``, then wait until it is set again (True) or ``timeout`` seconds pass (False; None: no limit)."""
    event.clear()
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return False
