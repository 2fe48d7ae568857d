"""``nmt-serve``'s connections, below HTTP: how long a client may take to send a request, how many may be open at
once, and the file descriptors they need; and a log that says a repeated error once a second, with a count.

Why here and not in uvicorn's settings: uvicorn closes a connection that stays idle after an answer
(``timeout_keep_alive``), but a connection that sends nothing at all, or half its headers, or half its body, it
keeps for good -- issue #57 reports six such sockets open for as long as its red team watched, and 21,000 of them
using up the file descriptors.  Its ``limit_concurrency`` answers 503 to the *requests* past the limit, but keeps every
connection open.  :func:`protocol` is its HTTP/1.1 protocol (h11's, whichever parser is installed) with a deadline
for each request's headers and a limit on open connections, each answered at the socket; the body's deadline is
kept where the route reads it (:class:`nmtkit.serve.guard.Guard`), so that it is answered as a route's error.

When the descriptors run out anyway (another process's limit, a lower ``ulimit -n``), asyncio logs
``socket.accept() out of system resource`` with a traceback up to 2,048 times for each wake-up of the listening
socket (its accept loop goes on after the error): 1.4 million lines in 25 s, issue #57 reports.
:class:`RepeatFilter` lets one line of a kind through a second and counts the others.
"""

from __future__ import annotations

import logging
import resource
import threading
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("nmtkit.serve")
SPARE_FILES = 128  # descriptors beside the connections: the listening socket, the model's files, worker pipes, logs


def _raw(status: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with a one-line JSON error, written at the socket (no request read)."""
    body = ('{"error": "%s"}' % message).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\nretry-after: 1\r\n\r\n").encode() + body


def protocol(read_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, bounded: a request's headers must have arrived within ``read_timeout`` seconds of
    the connection's opening or of the previous answer on it, or the connection is closed (with a 408 where part of
    them came; an idle keep-alive connection just closes; its body has as long again, counted where the route reads
    it: :class:`nmtkit.serve.guard.Guard`); and a connection past ``max_connections`` open is answered 503 and
    closed at once, before it is read."""

    class Bounded(H11Protocol):
        _deadline: object = None  # (asyncio.TimerHandle) the current request's

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.connections.discard(self)  # (it is not counted while it closes)
                log.warning("refused a connection: %d are open (--max-connections)", max_connections)
                transport.write(_raw("503 Service Unavailable",
                                     f"too many connections: at most {max_connections} (--max-connections)"))
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # its headers have arrived (or the connection is done): the route runs

        def on_response_complete(self) -> None:
            super().on_response_complete()  # (starts the next request of a pipeline, if one came)
            self._unset_keepalive_if_required()  # (uvicorn's idle timer: this deadline does its work, and more)
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(read_timeout, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # part of the headers came (an idle keep-alive connection just closes)
                self.transport.write(_raw("408 Request Timeout", f"the request's headers did not arrive within "
                                                                 f"{read_timeout:g} s (--read-timeout)"))
                log.warning("closed a connection from %s: its request's headers did not arrive within %g s "
                            "(--read-timeout)", "%s:%d" % self.client if self.client else "?", read_timeout)
            self.transport.close()

    return Bounded


def raise_file_limit(max_connections: int) -> int:
    """Let this process open a descriptor for each of ``max_connections`` connections and :data:`SPARE_FILES` more
    (raising its soft limit up to the hard one: ``ulimit -n`` is often 1,024); the connections it can hold, which is
    less where the hard limit is lower, with a warning."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        fits = max(1, soft - SPARE_FILES)
        log.warning("this process may open %d files (ulimit -n): at most %d connections, not %d (--max-connections)",
                    soft, fits, max_connections)
        return fits
    return max_connections


class RepeatFilter(logging.Filter):
    """A logging filter that lets through, of the warnings and errors that read the same, the first, then at most
    one line a ``period`` (seconds) while they go on: ``<the first line of the message> (N more like it in the last
    1 s)``.  Info lines (one a request) pass as they are."""

    def __init__(self, period: float = 1.0):
        super().__init__()
        self.period = period
        self._seen: dict[tuple, list] = {}  # (logger, level, text) -> [since, left out since, its timer or None]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "repeat_count", None) is not None:
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or (now - seen[0] >= self.period and not seen[1]):
                if len(self._seen) > 1000:  # (a bounded memory of what was said)
                    self._seen = {k: v for k, v in self._seen.items() if v[1] or now - v[0] < self.period}
                self._seen[key] = [now, 0, None]
                return True
            seen[1] += 1
            if seen[2] is None:  # (the count is said at the end of the period, also when nothing follows)
                seen[2] = threading.Timer(max(0.0, seen[0] + self.period - now), self._say, (key,))
                seen[2].daemon = True
                seen[2].start()
            return False

    def _say(self, key: tuple) -> None:
        name, level, text = key
        with self._lock:
            seen = self._seen[key]
            count, seen[0], seen[1], seen[2] = seen[1], time.monotonic(), 0, None
        if count:
            logging.getLogger(name).log(level, "%s (%d more like it in the last %g s)", text.splitlines()[0], count,
                                        self.period, extra={"repeat_count": count})


REPEATING = ("asyncio", "uvicorn.error", "nmtkit.serve")  # the loggers whose errors can come in floods


def filter_repeats() -> RepeatFilter:
    """Install one :class:`RepeatFilter` on the loggers of :data:`REPEATING` (once; it is returned)."""
    for name in REPEATING:
        for f in logging.getLogger(name).filters:
            if isinstance(f, RepeatFilter):
                return f
    repeat = RepeatFilter()
    for name in REPEATING:
        logging.getLogger(name).addFilter(repeat)
    return repeat
