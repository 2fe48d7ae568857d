"""The HTTP side of ``nmt-serve``: a Starlette application (ASGI; uvicorn serves it, nmtkit/serve/server.py).

Routes (one table, :data:`nmtkit.serve.openapi.ENDPOINTS`, makes both these and the paths of the OpenAPI schema at
``GET /openapi.json``, whose decoding options are written from :class:`nmtkit.translate.config.DecodeConfig`):

- ``GET /``: a page to translate with, drawing each sentence's soft alignment (``static/index.html``: one file, no
  CDN, so that it works offline).
- ``GET /health``: 200 ``{"status": "ok"}`` once the model is loaded and a warm-up batch has been decoded; before,
  503 ``{"status": "loading"}`` with ``Retry-After``.
- ``GET /models``: what is loaded (architecture, languages, config, vocabulary sizes, preprocessing, updates).
- ``POST /translate``: ``{"src": [lines], ...}`` → ``{"translations": [one result per line, in order]}``
  (nmtkit/serve/service.py).
- Errors are ``{"error": "<one line>"}``: 400 for JSON that is malformed or of the wrong shape or types, 404 and 405
  for an unknown route or method, 413 for more than ``--max-lines`` lines or ``--max-chars`` characters or a request
  that would cost more than a limit allows, known before it is queued (nmtkit/serve/limits.py: ``--max-beam``,
  ``--max-nbest``, ``--max-target-len``, ``--max-attention-cells``), 503 with ``Retry-After`` while loading or when
  the queue is full, 504 when a request waited longer than ``--timeout``.  An error a request causes inside the
  server is its 500 and one log line naming it; the traceback is logged at debug level only.

One log line per request: method, path, status, milliseconds, and for a translation its lines, the lines of the
batch they were decoded in (the largest, and how many batches when a request was decoded in several), and the
milliseconds queued and decoding.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request as HTTPRequest
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from nmtkit.errors import InputError
from nmtkit.serve.batcher import Batcher, Overloaded
from nmtkit.serve.config import ServeConfig
from nmtkit.serve.guard import guard
from nmtkit.serve.limits import TooCostly, cost
from nmtkit.serve.openapi import ENDPOINTS, schema
from nmtkit.serve.service import TranslationService, read_request

log = logging.getLogger("nmtkit.serve")
BODY_SLACK = 65_536  # bytes of JSON a request may hold beside its lines' text (4 bytes a character at most)


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    # (a message may quote a request's lone surrogate, "\ud800", which has no UTF-8: escaped, not a 500)
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class State:
    """What the routes share: the service once loaded (None before), the batcher, and why loading failed."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.service: TranslationService | None = None
        self.batcher: Batcher | None = None


def make_app(cfg: ServeConfig, load: Callable[[], TranslationService],
             on_failure: Callable[[BaseException], None]) -> Starlette:
    """The application.  ``load`` (run on a thread after the server started listening) gives the service with its
    warm-up done; if it raises, ``on_failure`` is told (the server then stops)."""
    state = State(cfg)

    @asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()

        async def start() -> None:
            try:
                service = await loop.run_in_executor(None, load)
            except BaseException as e:  # (one line for the user; the server stops)
                on_failure(e)
                return
            state.batcher = Batcher(service, cfg.max_batch, cfg.batch_wait_ms / 1000, cfg.max_queue,
                                    service.concurrency, cfg.batch_work)
            state.batcher.start()
            state.service = service
            log.info("ready: %s", ", ".join(m["path"] for m in service.describe()["models"]))

        starting = loop.create_task(start())
        yield
        starting.cancel()
        if state.batcher is not None:
            await state.batcher.close()
        if state.service is not None:
            state.service.close()

    async def health(request: HTTPRequest) -> JSONResponse:
        if state.service is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
        if not state.service.translator.workers_ready:  # (a decoding worker died; its replacement is loading)
            return JSONResponse({"status": "restarting a decoding worker"}, status_code=503,
                                headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    async def models(request: HTTPRequest) -> JSONResponse:
        if state.service is None:
            return error(503, "the model is loading", {"Retry-After": "1"})
        return JSONResponse(state.service.describe())

    async def openapi(request: HTTPRequest) -> JSONResponse:
        return JSONResponse(schema(cfg))

    page = (resources.files("nmtkit.serve") / "static" / "index.html").read_text(encoding="utf-8")

    async def index(request: HTTPRequest) -> HTMLResponse:
        return HTMLResponse(page)

    async def translate(request: HTTPRequest) -> JSONResponse:
        body = await _read_body(request, cfg.max_chars * 4 + BODY_SLACK)
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return error(400, f"the body is not JSON: {e}")
        try:
            req = read_request(parsed, cfg.decoding_defaults)
        except InputError as e:
            return error(400, str(e))
        if len(req.lines) > cfg.max_lines:
            return error(413, f"{len(req.lines)} lines: at most {cfg.max_lines} a request (--max-lines)")
        if req.chars > cfg.max_chars:
            return error(413, f"{req.chars} characters: at most {cfg.max_chars} a request (--max-chars)")
        if state.service is None:
            return error(503, "the model is loading", {"Retry-After": "1"})
        try:  # (read as the translator reads it, off the event loop: what it may cost, before it is queued)
            needs = await asyncio.get_running_loop().run_in_executor(None, _checked_cost, req, state.service, cfg)
        except TooCostly as e:
            return error(413, str(e))
        except InputError as e:
            return error(400, str(e))
        try:
            outcome = await state.batcher.translate(req, cfg.timeout, needs.work)
        except Overloaded as e:
            return error(503, f"too busy: {e}; try again", {"Retry-After": "1"})
        except asyncio.TimeoutError:
            return error(504, f"no translation within {cfg.timeout:g} s (--timeout)")
        except InputError as e:
            return error(400, str(e))
        request.scope.setdefault("nmtkit", {}).update(
            lines=len(req.lines), batch=outcome.batch_lines, queue_ms=outcome.queue_ms, decode_ms=outcome.decode_ms,
            batches=outcome.batches)
        return JSONResponse({"translations": outcome.results})

    async def http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}",
                   413: exc.detail}.get(exc.status_code, exc.detail)
        return error(exc.status_code, str(message), getattr(exc, "headers", None))

    async def server_error(request: HTTPRequest, exc: Exception) -> JSONResponse:
        message = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
        log.error("%s %s failed: %s", request.method, request.url.path, message)  # (the request, one line)
        log.debug("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, message)

    handlers = {"index": index, "health": health, "models": models, "openapi": openapi, "translate": translate}
    app = Starlette(routes=[Route(e.path, handlers[e.handler], methods=[e.method.upper()]) for e in ENDPOINTS],
                    exception_handlers={HTTPException: http_error, Exception: server_error}, lifespan=lifespan)
    return RequestLog(guard(app, cfg))  # (hosts, origins, API key: nmtkit/serve/guard.py)


def _checked_cost(req, service, cfg):
    """What a request may cost (nmtkit/serve/limits.py), once its settings are known to make a translator (its
    glossary compiled: a term the model cannot write is the request's 400, not its batch's failure)."""
    service.check(req)
    return cost(req, service.translator, cfg)


async def _read_body(request: HTTPRequest, limit: int) -> bytes:
    """The request's body, refused with 413 past ``limit`` bytes (before more is read)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HTTPException(413, f"a body of {int(length)} bytes: at most {limit} (--max-chars)")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"a body of more than {limit} bytes (--max-chars)")
            chunks.append(chunk)
    except ClientDisconnect:  # (the client's doing, not a fault of the server: no 500, no error in the log)
        raise HTTPException(400, "the client closed the connection before it sent its whole body") from None
    return b"".join(chunks)


class RequestLog:
    """ASGI middleware: one log line per HTTP request, when its response has started."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), []

        async def sending(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:  # (Starlette answers 500 and logs it with server_error, then raises it again for the
            if not status:  # ASGI server, which would log its traceback: it ends here)
                raise
        finally:
            extra = scope.get("nmtkit", {})
            several = f" ({extra['batches']} batches)" if extra.get("batches", 1) > 1 else ""
            detail = (f"; {extra['lines']} lines, batch of {extra['batch']}{several}, queued {extra['queue_ms']:.0f} "
                      f"ms, decoded {extra['decode_ms']:.0f} ms") if extra else ""
            log.info("%s %s %s %.0f ms%s", scope["method"], scope["path"], status[0] if status else "-",
                     (time.monotonic() - start) * 1000, detail)
