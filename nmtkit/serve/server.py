"""``nmt-serve`` as a function: :func:`serve` listens, loads the model behind the socket (``/health`` says 503
until a warm-up translation has run), answers until SIGTERM or Ctrl-C, then stops accepting, answers the requests
in flight (for up to ``--timeout`` seconds) and returns.

Why uvicorn and Starlette: an ASGI server that answers ``/health`` and queues requests on one event loop while a
batch decodes on a thread of its own (the standard library's ``http.server`` has a thread per request and no way to
batch across them), with a graceful shutdown built in; Starlette is the small framework under FastAPI, enough for
four routes, with the OpenAPI schema written from :class:`~nmtkit.translate.config.DecodeConfig` rather than from a
second description of the same options (nmtkit/serve/openapi.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from nmtkit.errors import InputError
from nmtkit.serve.config import ServeConfig
from nmtkit.serve.connections import filter_repeats, protocol, raise_file_limit
from nmtkit.serve.guard import warn_if_exposed
from nmtkit.serve.service import Request, TranslationService

log = logging.getLogger("nmtkit.serve")
# The warm-up: a whole batch (--max-batch lines) of a sentence as long as many a server is sent, so that the memory a
# full batch needs is taken before /health says ok, not by the first busy minute (tests/bench/results/bench_serve.txt
# has the memory at rest after each load, with a one-sentence warm-up and with this one).
WARM_UP = ("This is the warm-up sentence of 1995 that the server translates before it answers, as long as many "
           "of the sentences it will be sent, with a number, a name such as Ottawa and a clause or two.")


def workers(cfg: ServeConfig) -> int:
    """The decoding processes ``cfg`` asks for (``--workers 0``: on a CPU one per thread, at most 4; else 1)."""
    import torch

    t = cfg.translator
    if t.workers:
        return t.workers
    return min(t.threads or torch.get_num_threads(), 4) if t.device == "cpu" else 1


def load(cfg: ServeConfig) -> TranslationService:
    """The checkpoints loaded as nmt-translate loads them (decoded in this process, or with ``--workers`` N > 1 in
    N worker processes of threads/N threads each), and a warm-up translation of a whole batch in each."""
    import torch

    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.translator import Translator

    if cfg.translator.threads:
        torch.set_num_threads(cfg.translator.threads)
    decode = DecodeConfig.from_dict(cfg.decoding_defaults)  # (what a request that sets nothing decodes with)
    translator = Translator(list(cfg.checkpoints), decode, cfg.translator, unk_dict=cfg.unk_dict,
                            workers=workers(cfg), restart_workers=True)
    service = TranslationService(translator)
    try:  # one warm-up a worker, at once (the pool hands each to the idlest)
        with ThreadPoolExecutor(service.concurrency) as pool:
            list(pool.map(service.translate,
                          [[Request([WARM_UP] * cfg.max_batch, decode)]] * service.concurrency))
    except BaseException:
        service.close()
        raise
    return service


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: any free port), or one line saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(cfg: ServeConfig, announce=print) -> None:
    """Serve until SIGTERM or SIGINT (then answer what is in flight and return); a model that cannot be loaded is
    an :class:`InputError` after the server has stopped."""
    import uvicorn

    from nmtkit.serve.app import make_app

    cfg.check()
    filter_repeats()
    warn_if_exposed(cfg)
    sock = listen(cfg.host, cfg.port)
    failure: list[BaseException] = []
    services: list[TranslationService] = []
    server: uvicorn.Server | None = None

    def on_failure(e: BaseException) -> None:
        failure.append(e)
        server.should_exit = True

    def loaded() -> TranslationService:
        services.append(load(cfg))
        return services[-1]

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    announce(f"nmt-serve: listening on http://{shown}:{port}/ (loading the model: GET /health answers 200 when "
             "it is ready)", file=sys.stderr, flush=True)
    app = make_app(cfg, loaded, on_failure)
    server = uvicorn.Server(uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", ws="none",
        http=protocol(cfg.read_timeout, raise_file_limit(cfg.max_connections)), timeout_keep_alive=cfg.read_timeout,
        timeout_graceful_shutdown=max(1, round(cfg.timeout))))
    finished = _stop_in_time(server, cfg.timeout, services)
    # uvicorn answers SIGTERM and SIGINT with the graceful shutdown, then raises the signal again for the handler it
    # found: a no-op one here, so that a shutdown asked for is a normal end (exit 0), not an interruption
    main = threading.current_thread() is threading.main_thread()  # (signals are the main thread's only)
    handlers = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        finished.set()
        for s, h in handlers.items():
            signal.signal(s, h)
        sock.close()
    if failure:
        e = failure[0]
        if isinstance(e, InputError):
            raise e
        raise InputError(f"the model could not be loaded: {type(e).__name__}: {e}")


STOP_MARGIN_S = 2.0  # after --timeout and the decoding workers' end, how long a shutdown may still take


def _stop_in_time(server, grace: float, services: list[TranslationService]) -> threading.Event:
    """Make a shutdown that SIGTERM or Ctrl-C asks for end within ``grace`` seconds (``--timeout``) and a little:
    by then every request in flight has had its answer or its 504, and a batch whose requests all timed out stops
    before its next search step (nmtkit/serve/batcher.py), which uvicorn's graceful shutdown waits for (a long batch
    held a server 136 s after SIGTERM with ``--timeout 10``, issue #57 reports, before batches could stop).  A batch
    still decoding half a second later (a step longer than that) is ended: the decoding workers are killed (the
    batch fails; nobody waits for it), and a batch decoding in this process is left: the process exits without it.
    The event returned is to be set once the server has stopped."""
    finished, asked = threading.Event(), threading.Event()
    handle_exit = server.handle_exit

    def watch() -> None:
        if finished.wait(grace + 0.5):
            return
        log.warning("still decoding %g s after the signal to stop (--timeout): stopping the decoding", grace)
        for service in services:
            service.close()  # (kills the workers of batches still pending)
        if finished.wait(STOP_MARGIN_S):
            return
        log.warning("a batch decoding in this process cannot be stopped: exiting without it")
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(0)  # (a shutdown asked for: a normal end, as the graceful one)

    def on_signal(sig, frame) -> None:
        handle_exit(sig, frame)
        if not asked.is_set():
            asked.set()
            threading.Thread(target=watch, name="nmt-serve-stop", daemon=True).start()

    server.handle_exit = on_signal  # (uvicorn installs it as the handler of SIGTERM and SIGINT as it starts)
    return finished
