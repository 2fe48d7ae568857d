"""Who may use ``nmt-serve``: the host names it answers to, the web pages (origins) that may call it, and an API
key; and a warning when it listens beyond this machine.

Why a Host check on a server that listens on 127.0.0.1: any web page a user opens can make the browser send a
``text/plain`` POST to ``http://localhost:8080/translate`` (a "simple" request: no preflight asked), and by DNS
rebinding -- a name of the attacker's that first points at the attacker's server, then at 127.0.0.1 -- read the
answers as its own origin's; the browser then sends the attacker's name as ``Host``.  So a request is answered only
for the names the server is served as (``--allowed-hosts``), and a request from a page of another origin (its
``Origin`` header names another host than ``Host``) only where ``--cors-origin`` names that origin; one refused
never reaches the routes, so nothing is decoded for it.  Starlette's CORSMiddleware answers the preflight and adds
the ``Access-Control-*`` headers for the origins named, but it refuses nothing by itself (a simple request from any
origin still runs): :class:`Guard` does that, before it.

``--api-key``: every route but ``GET /health`` (a supervisor's probe) and ``GET /`` (the page, the same file for
everyone; it asks for the key when a translation is answered 401) wants ``Authorization: Bearer KEY``.

And a request's body must arrive within ``--read-timeout`` of its headers (408): the connection's protocol keeps
the headers' deadline (nmtkit/serve/connections.py), but once they are in, the route reads the body.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

log = logging.getLogger("nmtkit.serve")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")  # --host values that mean every interface
OPEN_ROUTES = {("GET", "/health"), ("HEAD", "/health"), ("GET", "/"), ("HEAD", "/")}  # no key asked
ENV_KEY = "NMT_SERVE_API_KEY"  # (the environment variable of --api-key)


def guard(app, cfg):
    """``app`` behind the checks that ``cfg`` (a :class:`~nmtkit.serve.config.ServeConfig`) asks for: the host and
    origin (:class:`Guard`), then CORS for the origins named, then the API key (:class:`KeyCheck`)."""
    inner = KeyCheck(app, cfg.api_key) if cfg.api_key else app
    if cfg.cors_origin:
        inner = CORSMiddleware(inner, allow_origins=list(cfg.cors_origin), allow_methods=["GET", "POST"],
                               allow_headers=["Authorization", "Content-Type"], max_age=600)
    return Guard(inner, hosts_of(cfg), cfg.cors_origin, cfg.read_timeout)


def _split(values) -> list[str]:
    return [v.strip().strip("[]").lower() for value in values for v in value.split(",") if v.strip()]


def hosts_of(cfg) -> list[str]:
    """The host names a request may name: ``--allowed-hosts`` (comma-separated, repeatable), or by default the
    ``--host`` address, localhost, 127.0.0.1 and ::1, and where the server listens beyond this machine this
    machine's names too.  (Besides, :class:`Guard` takes the address a connection arrived on, written as an
    address: no page of another site can send that.)"""
    if cfg.allowed_hosts:
        return _split(cfg.allowed_hosts)
    names = [*([cfg.host.lower()] if cfg.host not in WILDCARDS else []), *LOCAL_NAMES]
    if not _loopback(cfg.host):
        names += [socket.gethostname().lower(), socket.getfqdn().lower()]
    return list(dict.fromkeys(n.strip("[]") for n in names if n))


def _host_name(value: str) -> str:
    """A Host header's name, without its port (``[::1]:8080`` → ``::1``), lower case, no final dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":")[0]
    return value.rstrip(".")


def _allowed(name: str, hosts: list[str]) -> bool:
    return any(h == "*" or h == name or (h.startswith("*.") and name.endswith(h[1:])) for h in hosts)


def _netloc(origin: str) -> str:
    """``scheme://host[:port]`` → ``host:port`` (the scheme's port where none is written), for comparison."""
    try:
        parts = urlsplit(origin)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        host = parts.hostname or ""
    except ValueError:
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Guard:
    """ASGI middleware: a request whose ``Host`` is not one of ``hosts`` is 400, and one from a page of another
    origin than the server's, not named by ``origins`` (``--cors-origin``), is 403; neither reaches ``app``.  A body
    that has not arrived whole ``read_timeout`` seconds after the request's headers is 408 (the connection is
    closed): the headers' own deadline is the connection's (nmtkit/serve/connections.py)."""

    def __init__(self, app, hosts: list[str], origins: list[str], read_timeout: float | None = None):
        self.app, self.hosts, self.read_timeout = app, hosts, read_timeout
        self.origins = {o.rstrip("/").lower() for o in origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k: v for k, v in scope["headers"] if k in (b"host", b"origin")}
        host = headers.get(b"host", b"").decode("latin-1")
        name = _host_name(host)
        arrived = (scope.get("server") or ("",))[0] or ""
        if not name or not (_allowed(name, self.hosts) or name == arrived.lower()):
            return await _error(400, f"this server does not answer to the host {name or '(none)'!r}: it is served "
                                     "as " + ", ".join(self.hosts) + " (--allowed-hosts)")(scope, receive, send)
        origin = headers.get(b"origin")
        if origin is not None:
            origin = origin.decode("latin-1").rstrip("/")
            same = _netloc(origin) == _netloc("http://" + host) or _netloc(origin) == _netloc("https://" + host)
            if not same and "*" not in self.origins and origin.lower() not in self.origins:
                return await _error(403, f"a request from a page of {origin} is refused: name its origin with "
                                         "--cors-origin to allow it")(scope, receive, send)
        return await self.app(scope, self._bounded(receive), send)

    def _bounded(self, receive):
        """``receive``, raising a 408 where the body is not whole within the read timeout of the request's start
        (the route's error handler answers it; once the body is whole, waiting for a disconnect is not bounded)."""
        if self.read_timeout is None:
            return receive
        deadline = asyncio.get_running_loop().time() + self.read_timeout
        whole = False

        async def bounded():
            nonlocal whole
            if whole:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                log.warning("a request's body did not arrive within %g s (--read-timeout)", self.read_timeout)
                raise HTTPException(408, f"the request's body did not arrive within {self.read_timeout:g} s "
                                         "(--read-timeout)", headers={"Connection": "close"}) from None
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return bounded


class KeyCheck:
    """ASGI middleware: a request of any route but :data:`OPEN_ROUTES` without ``Authorization: Bearer <key>`` is
    401 and does not reach ``app`` (the key compared in constant time)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (scope["method"], scope["path"]) in OPEN_ROUTES:
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            message = ("the API key is wrong" if given else "this server wants an API key") + \
                ": send 'Authorization: Bearer KEY' (nmt-serve --api-key)"
            return await _error(401, message, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        return await self.app(scope, receive, send)


def _loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's alone: every address it resolves to is loopback
    (a name that does not resolve counts as not: listening on it fails anyway)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host or None, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def warn_if_exposed(cfg) -> None:
    """A warning when the server is to listen on an address other machines may reach (``--host 0.0.0.0``)."""
    if _loopback(cfg.host):
        return
    if cfg.api_key:
        advice = ("the API key is asked for, but it and the texts travel unencrypted over HTTP: put a TLS proxy in "
                  "front")
    else:
        advice = f"give it --api-key (or ${ENV_KEY}), or keep it on 127.0.0.1 behind a proxy"
    log.warning("--host %s: the server is open to every machine that can reach it, not only this one; %s",
                cfg.host, advice)
