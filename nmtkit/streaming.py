"""Windows of input lines for a translator in a shell pipeline: full windows while lines flow, and what has arrived
as soon as the input stalls.

``nmt-translate`` sorts a window of lines by length to batch them, so it must read ahead; but a user typing, or a
pipeline that sends one line and waits for its translation, must get each translation without sending more.  A
reader thread moves the lines into a queue; :func:`windows` takes up to ``size`` of them, and gives a partial
window as soon as no further line arrives within ``stall`` seconds.  Each window comes with ``stalled``: no line was
waiting after it, so the translator should finish (not queue) what it has before reading on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

STALL_S = 0.05  # how long an idle input is waited for before a partial window goes (well under a person's notice)
_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def _pump(lines: Iterable, q: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in lines:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        q.put(_END)
    except BaseException as e:  # (a bad input line: raised again in the consumer, in order)
        q.put(_Failure(e))


def windows(lines: Iterable, size: int, stall: float = STALL_S) -> Iterator[tuple[list, bool]]:
    """(window, stalled) pairs covering ``lines`` in order; every window holds 1 to ``size`` items."""
    q: queue.Queue = queue.Queue(maxsize=max(4 * size, 64))  # (bounded: a huge input is not read into memory)
    stop = threading.Event()
    reader = threading.Thread(target=_pump, args=(lines, q, stop), daemon=True, name="nmtkit-input")
    reader.start()

    def take(timeout: float | None):
        return q.get(timeout=timeout) if timeout is not None else q.get()

    try:
        item = take(None)
        while item is not _END:
            if isinstance(item, _Failure):  # (raised after every line before it has gone out)
                raise item.error
            window, item = [item], None
            waited = False  # (a stall already seen: no second wait for it)
            while len(window) < size:  # the rest of the window, while lines come without a stall
                try:
                    item = take(stall)
                except queue.Empty:
                    waited = True
                    break
                if item is _END or isinstance(item, _Failure):
                    break
                window.append(item)
                item = None
            if item is None and not waited:  # a full window: is another line waiting?
                try:
                    item = take(stall)
                except queue.Empty:
                    item = None
            stalled = item is None or item is _END or isinstance(item, _Failure)
            yield window, stalled
            if item is None:
                item = take(None)
    finally:
        stop.set()
