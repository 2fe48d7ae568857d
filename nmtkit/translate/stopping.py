"""Stopping a decoding nobody waits for any more: a :class:`Stop` handed to a translation is checked between two
steps of every search (beam search, its second search for numbers and terms, greedy decoding, sampling).  Once it
is set, the search raises :class:`Cancelled` at its next step, in this process or in a decoding worker
(:mod:`nmtkit.translate.pool` sends the worker a cancel message for each batch of the translation).

``nmt-serve`` sets it when every request of a batch has timed out (504), so that a request that gave up no longer
holds the engine for the rest of its batch (before: up to ``--batch-work``'s worth of decoding after the 504).

The check costs one context-variable read a step: the stop in force is the one :func:`stoppable` set in this
thread, so the search functions take no extra argument.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_current: ContextVar[Callable[[], bool] | None] = ContextVar("nmtkit_stop", default=None)


class Cancelled(Exception):
    """The decoding was stopped (:class:`Stop`): nobody waits for its result."""


class Stop:
    """Set once, from any thread: ``stop()`` then says True, and the hooks registered with :meth:`on_set` run
    (once each; a hook registered after the stop was set runs at once)."""

    def __init__(self):
        self._set = False
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    def __call__(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> None:
        with self._lock:
            if not self._set:
                self._hooks.append(hook)
                return
        hook()


@contextmanager
def stoppable(stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within: :func:`check` raises :class:`Cancelled` once ``stop()`` says True (None: never)."""
    token = _current.set(stop)
    try:
        yield
    finally:
        _current.reset(token)


def check() -> None:
    """Called by the searches before each step."""
    stop = _current.get()
    if stop is not None and stop():
        raise Cancelled("the decoding was stopped: nobody waits for its result")
