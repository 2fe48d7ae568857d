"""The decoding thread of a server that decodes in its own process: batches join the running search between steps.

:class:`nmtkit.serve.batcher.Batcher` forms batches on the event loop and hands each to :meth:`Engine.submit`.  The
engine's one thread takes what was submitted at the start of each step: a beam-search batch is begun (preprocessed
and encoded: :meth:`nmtkit.serve.service.TranslationService.begin`) and its cohorts join the search of its settings
(:class:`nmtkit.translate.continuous.ContinuousSearch`, one per setting, stepped in turn); a sampling batch is
decoded whole there and then.  When a batch's last cohort is done its results are made and handed back through the
callback given with it.  So a request does not wait for a batch in progress to finish before its lines start, nor
for the longest line of its batch to get its answer (continuous batching, as LLM servers do it; the serving story
of #36).

One thread decodes, so torch's threads are not shared between two decodings.  When idle for ``IDLE_TRIM_S`` the
thread gives the freed heap back (:func:`nmtkit.runtime.trim_heap`).  An error while a batch is begun is that
batch's alone; an error in a step fails every batch of that search (their rows were computed together), and the
engine goes on with the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nmtkit.runtime import IDLE_TRIM_S, trim_heap
from nmtkit.serve.service import Request, TranslationService
from nmtkit.translate.continuous import ContinuousSearch


@dataclass
class _Batch:
    requests: list[Request]
    deliver: Callable[[list[list[dict]] | BaseException], None]  # (called on the engine's thread)
    begun: tuple | None = None
    waiting: set = field(default_factory=set)  # ids of its cohorts not done yet


class Engine:
    def __init__(self, service: TranslationService):
        self.service = service
        self._inbox: list[_Batch] = []
        self._wake = threading.Condition()
        self._closing = False
        self._searches: dict[tuple, ContinuousSearch] = {}
        self._batches: dict[int, _Batch] = {}  # id(cohort) -> its batch
        self._thread = threading.Thread(target=self._run, name="nmt-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, requests: list[Request], deliver: Callable[[list[list[dict]] | BaseException], None]) -> None:
        """Decode ``requests`` (sharing their settings); ``deliver`` gets each request's results, or the error."""
        with self._wake:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._inbox.append(_Batch(requests, deliver))
            self._wake.notify()

    def close(self) -> None:
        """Finish what was submitted, then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        bf16 = bool(self.service.translator._options.get("bf16"))
        device = self.service.translator.device.type
        trimmed = True
        while True:
            with self._wake:
                while not self._inbox and not self._batches:
                    if self._closing:
                        return
                    if trimmed:
                        self._wake.wait()
                    elif not self._wake.wait(IDLE_TRIM_S):  # idle: the freed heap goes back to the system
                        trim_heap()
                        trimmed = True
                arrived, self._inbox = self._inbox, []
            trimmed = False
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                for batch in arrived:
                    self._begin(batch)
                for key, search in list(self._searches.items()):
                    self._step(key, search)

    def _begin(self, batch: _Batch) -> None:
        try:
            if not self.service.continuous(batch.requests):
                batch.deliver(self.service.translate(batch.requests))
                return
            batch.begun = self.service.begin(batch.requests)
        except Exception as e:  # (this batch's error: its requests get it)
            batch.deliver(e)
            return
        cohorts = [c for c in batch.begun[2] if not c.done]
        if not cohorts:
            self._end(batch)
            return
        search = self._searches.setdefault(batch.requests[0].key, ContinuousSearch(self.service.translator.models))
        for c in cohorts:
            batch.waiting.add(id(c))
            self._batches[id(c)] = batch
            search.add(c)

    def _step(self, key: tuple, search: ContinuousSearch) -> None:
        try:
            done = search.step()
        except Exception as e:  # (every batch of this search: their rows went through the step together)
            failed = {id(b): b for c in search.cohorts if (b := self._batches.pop(id(c), None)) is not None}
            del self._searches[key]
            for b in failed.values():
                b.deliver(e)
            return
        for c in done:
            batch = self._batches.pop(id(c))
            batch.waiting.discard(id(c))
            if not batch.waiting:
                self._end(batch)
        if not search.cohorts:
            del self._searches[key]

    def _end(self, batch: _Batch) -> None:
        try:
            results = self.service.end(batch.requests, batch.begun)
        except Exception as e:
            batch.deliver(e)
            return
        batch.deliver(results)
