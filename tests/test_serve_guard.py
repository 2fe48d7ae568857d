"""nmt-serve's connections and who may use it (#57 items 2, 3, 6), on real servers on 127.0.0.1 with real sockets.

Connections that send nothing, half their headers or half their body are closed after ``--read-timeout`` (408
where part of a request came); one past ``--max-connections`` is answered 503 at the socket; when the process runs
out of file descriptors, asyncio's flood of ``socket.accept() out of system resource`` is logged once a second with
a count.  A request naming another Host (DNS rebinding), or sent by a page of another origin than the server's
(a ``text/plain`` POST: no preflight), is refused before it is decoded; ``--cors-origin`` lets a named origin in.
``--api-key`` (here from ``$NMT_SERVE_API_KEY``, not the command line) guards every route but /health and the page,
which asks for the key in a real browser.  A non-loopback ``--host`` is warned about."""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import time
import urllib.error
import urllib.request
from unittest import mock

import pytest

from conftest import wait_until
from test_serve import ENV, SERVE, Server, _browser

KEY = "s2-test-key-0123456789"
APP = "http://app.example"  # an origin named by --cors-origin


@pytest.fixture(scope="module")
def ckpt(trained):
    return trained[1]


@pytest.fixture(scope="module")
def server(ckpt):
    """Short deadlines; one origin let in; the test hooks say when lines join the queue."""
    s = Server(ckpt, "--read-timeout", "2", "--cors-origin", APP, hooks=True)
    s.ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def keyed(ckpt):
    """An API key from the environment, four connections at most, named hosts; deadlines out of the way."""
    with mock.patch.dict(Server.__init__.__globals__["ENV"], {"NMT_SERVE_API_KEY": KEY}):  # (its environment)
        s = Server(ckpt, "--max-connections", "4", "--read-timeout", "600", "--allowed-hosts",
                   "translate.example,*.corp.example")
    s.ready()
    yield s
    assert s.stop() == 0


def _port(s: Server) -> int:
    return int(re.search(r":(\d+)/$", s.url).group(1))


def _raw(s: Server, data: bytes, timeout: float = 60) -> bytes:
    """What the server answers to ``data`` sent on a new connection, until it closes it."""
    with socket.create_connection(("127.0.0.1", _port(s)), timeout=timeout) as c:
        c.sendall(data)
        return _until_closed(c)


def _until_closed(c: socket.socket) -> bytes:
    got = b""
    while chunk := c.recv(65536):
        got += chunk
    return got


def _request(method: str, path: str, host: str, headers: dict | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", f"Content-Length: {len(body)}",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _status_and_body(response: bytes) -> tuple[int, dict, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body), head.decode("latin-1").lower()


def _queued(s: Server) -> int:
    return sum("test hook: queued" in line for line in s.lines)


# -- connections --------------------------------------------------------------------------------------------------

def test_silent_and_half_sent_connections_are_closed_after_the_read_timeout(server):
    """Six connections: one that sends nothing, two with half their headers, one with half its body, one kept alive
    after its answer, one pipelining a whole request behind a half one: each is closed by the server (a read returns
    end of file) within --read-timeout and a little, where before they stayed open for good."""
    port = _port(server)
    health = _request("GET", "/health", f"127.0.0.1:{port}").replace(b"Connection: close\r\n", b"")
    sends = {
        "nothing": b"",
        "half the headers": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "one header line": b"POST /translate HTTP/1.1\r\n",
        "half the body": _request("POST", "/translate", f"127.0.0.1:{port}",
                                  {"Content-Type": "application/json"}, b'{"src": ["a dog"]}')[:-6],
        "kept alive": health,
        "a request behind": health + b"GET /health HTTP/1.1\r\nHost: 127",
    }
    conns = {}
    for name, data in sends.items():
        conns[name] = socket.create_connection(("127.0.0.1", port), timeout=120)
        conns[name].sendall(data)
    start = time.monotonic()
    got = {}
    try:
        for name, c in conns.items():
            got[name] = _until_closed(c)  # (blocks until the server closes; the socket timeout bounds a failure)
    finally:
        for c in conns.values():
            c.close()
    took = time.monotonic() - start
    assert took < 60, took
    assert got["nothing"] == b""
    for name in ("half the headers", "one header line"):
        status, body, head = _status_and_body(got[name])
        assert status == 408 and "connection: close" in head
        assert body == {"error": "the request's headers did not arrive within 2 s (--read-timeout)"}
    status, body, _ = _status_and_body(got["half the body"])
    assert (status, body) == (408, {"error": "the request's body did not arrive within 2 s (--read-timeout)"})
    assert got["kept alive"].startswith(b"HTTP/1.1 200") and got["kept alive"].count(b"HTTP/1.1") == 1
    assert got["a request behind"].count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 408" in got["a request behind"]
    server.wait_for_log(r"headers did not arrive within 2 s", count=3)
    assert server.call("/health")[0] == 200


def test_a_connection_past_max_connections_is_answered_503_and_closed(keyed):
    """--max-connections 4: four idle connections are held; the fifth (and a hundred more) get 503 at once and are
    closed; once the four close, a request is answered again.  The refusals are logged once a second, with a
    count."""
    port = _port(keyed)
    start = len(keyed.lines)
    held = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(4)]
    try:
        for c in held:  # (each is accepted: the server has answered one request on it, and keeps it)
            c.sendall(_request("GET", "/health", f"127.0.0.1:{port}").replace(b"Connection: close\r\n", b""))
            assert c.recv(65536).startswith(b"HTTP/1.1 200")
        for _ in range(101):  # (answered before anything is read: a client that has sent nothing reads it whole)
            status, body, head = _status_and_body(_raw(keyed, b""))
            assert (status, body) == (503, {"error": "too many connections: at most 4 (--max-connections)"})
            assert "retry-after: 1" in head
    finally:
        for c in held:
            c.close()
    wait_until(lambda: keyed.call("/health")[0] == 200, 60, "the server to answer once the four closed")

    def refusals() -> tuple[int, int]:
        """(lines saying a refusal, refusals they count: one, or the count of those left out)"""
        said = [line for line in keyed.lines[start:] if "refused a connection: 4 are open (--max-connections)" in line]
        counts = [re.search(r"\((\d+) more like it in the last 1 s\)", line) for line in said]
        return len(said), sum(int(m.group(1)) if m else 1 for m in counts)

    wait_until(lambda: refusals()[1] == 101, 60, lambda: f"101 refusals counted in the log: {refusals()}")
    assert refusals()[0] < 50


def test_running_out_of_file_descriptors_is_logged_once_a_second_with_a_count(keyed):
    """The server may open only a few more files than it holds (its soft limit lowered from outside): sixty
    connections make asyncio fail to accept -- up to 2,048 times a wake-up, each with a traceback, before.  Its
    log says it once, then once a second with the count; raised again, the limit lets the server answer."""
    pid = keyed.proc.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    start = len(keyed.lines)
    conns = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + 2, hard))
        conns = [socket.create_connection(("127.0.0.1", _port(keyed)), timeout=120) for _ in range(60)]
        keyed.wait_for_log(r"socket\.accept\(\) out of system resource \(\d+ more like it in the last 1 s\)",
                           start=start)
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        for c in conns:
            c.close()
    wait_until(lambda: keyed.call("/health")[0] == 200, 60, "the server to answer again")
    said = [line for line in keyed.lines[start:] if "out of system resource" in line]
    counted = sum(int(m.group(1)) for line in said if (m := re.search(r"\((\d+) more like it", line)))
    assert counted >= 100 and len(said) <= 2 + counted / 100, said


# -- hosts and origins --------------------------------------------------------------------------------------------

def test_a_foreign_host_or_a_cross_origin_page_is_refused_before_decoding(server):
    """DNS rebinding: a page of attacker.example, its name now pointing at 127.0.0.1, posts text/plain as its own
    origin: the Host names attacker.example (400).  A page of evil.example posts to 127.0.0.1 (403).  Neither is
    queued for decoding; the server's own names and page, and --cors-origin's origin, are answered."""
    port = _port(server)
    body = json.dumps({"src": ["a dog runs ."]}).encode()
    text = {"Content-Type": "text/plain"}
    queued = _queued(server)
    rebound = _raw(server, _request("POST", "/translate", f"attacker.example:{port}",
                                    {**text, "Origin": f"http://attacker.example:{port}"}, body))
    status, answer, _ = _status_and_body(rebound)
    assert status == 400 and answer["error"].startswith("this server does not answer to the host 'attacker.example'")
    assert "(--allowed-hosts)" in answer["error"] and "\n" not in answer["error"]
    status, answer, _ = _status_and_body(_raw(server, _request("POST", "/translate", f"127.0.0.1:{port}",
                                                              {**text, "Origin": "http://evil.example"}, body)))
    assert (status, answer) == (403, {"error": "a request from a page of http://evil.example is refused: name its "
                                               "origin with --cors-origin to allow it"})
    preflight = _raw(server, _request("OPTIONS", "/translate", f"localhost:{port}",
                                      {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}))
    assert preflight.startswith(b"HTTP/1.1 403") and b"access-control-allow-origin" not in preflight.lower()
    assert _queued(server) == queued  # (nothing of theirs reached the queue)
    for host, origin in ((f"127.0.0.1:{port}", None), (f"localhost:{port}", f"http://localhost:{port}"),
                         (f"[::1]:{port}", None), (f"LOCALHOST:{port}", APP)):
        status, answer, head = _status_and_body(_raw(server, _request(
            "POST", "/translate", host, {**text, **({"Origin": origin} if origin else {})}, body)))
        assert status == 200 and len(answer["translations"]) == 1, (host, answer)
        assert ("access-control-allow-origin: " + APP in head) == (origin == APP)
    assert _queued(server) == queued + 4
    preflight = _raw(server, _request("OPTIONS", "/translate", f"127.0.0.1:{port}",
                                      {"Origin": APP, "Access-Control-Request-Method": "POST",
                                       "Access-Control-Request-Headers": "content-type"})).decode().lower()
    assert preflight.startswith("http/1.1 200") and f"access-control-allow-origin: {APP}" in preflight


def test_allowed_hosts_replace_the_local_names(keyed):
    """--allowed-hosts translate.example,*.corp.example: those names (and the address a connection arrived on) are
    answered; localhost, no longer named, is not."""
    port = _port(keyed)
    for host, status in ((f"translate.example:{port}", 200), (f"eu.corp.example:{port}", 200),
                         (f"127.0.0.1:{port}", 200), (f"localhost:{port}", 400), (f"corp.example:{port}", 400),
                         (f"translate.example.evil.example:{port}", 400)):
        assert _raw(keyed, _request("GET", "/health", host)).startswith(f"HTTP/1.1 {status}".encode()), host


def test_bad_access_settings_are_one_line(ckpt):
    """Each setting is checked before the server loads or listens: one line naming the option."""
    from nmtkit.errors import InputError
    from nmtkit.serve.config import ServeConfig

    proc = subprocess.run([*SERVE, "-m", ckpt, "--port", "0", "--cors-origin", "app.example"], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert proc.returncode == 1 and proc.stderr == (
        "nmt-serve: error: --cors-origin: 'app.example' is no origin (scheme://host[:port], e.g. "
        "https://app.example.org, or '*')\n")
    for name, value, message in (("allowed_hosts", ["x.org,http://y.org/"], "--allowed-hosts: 'http://y.org/' is no"),
                                 ("allowed_hosts", ["a.*.org"], "--allowed-hosts: 'a.*.org' is no host name"),
                                 ("cors_origin", ["https://app.example/page"], "--cors-origin: 'https://app.example/"),
                                 ("read_timeout", 0.0, "--read-timeout must be a finite number above 0"),
                                 ("read_timeout", float("inf"), "--read-timeout must be a finite number above 0"),
                                 ("max_connections", 0, "--max-connections must be at least 1"),
                                 ("api_key", "two words", "--api-key must be printable ASCII without spaces"),
                                 ("api_key", "", "--api-key must be printable ASCII without spaces")):
        with pytest.raises(InputError, match=re.escape(message)):
            ServeConfig([ckpt], **{name: value})
    assert ServeConfig([ckpt], allowed_hosts=["a.org, *.b.org", "*"], cors_origin=["*", "http://x.org:8080"],
                       api_key="k3y!")


# -- the API key and the bind warning -----------------------------------------------------------------------------

def test_the_api_key_guards_every_route_but_health_and_the_page(keyed):
    """The key came from $NMT_SERVE_API_KEY: it is on no command line.  Without it, or with another, /translate,
    /models and /openapi.json are 401 (and nothing is decoded); with it, 200; /health and / need none."""
    with open(f"/proc/{keyed.proc.pid}/cmdline", "rb") as f:
        assert KEY.encode() not in f.read()
    assert keyed.call("/health")[0] == 200
    with urllib.request.urlopen(keyed.url, timeout=60) as r:
        assert r.status == 200 and b"<html" in r.read().lower()
    body = json.dumps({"src": ["a dog runs ."]}).encode()
    for path, data in (("translate", body), ("models", None), ("openapi.json", None)):
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": KEY}):
            request = urllib.request.Request(keyed.url + path, data=data, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(request, timeout=60)
            assert e.value.code == 401 and e.value.headers["WWW-Authenticate"] == "Bearer"
            assert "send 'Authorization: Bearer KEY' (nmt-serve --api-key)" in json.loads(e.value.read())["error"]
        request = urllib.request.Request(keyed.url + path, data=data, headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=120) as r:
            assert r.status == 200 and json.loads(r.read())
    assert "".join(keyed.lines).count("POST /translate 200") == 1


def test_the_page_asks_for_the_key_and_translates_in_a_real_browser(keyed):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(keyed.url)
        box = browser.find_element(By.ID, "src")
        box.clear()
        box.send_keys("a dog runs on the grass .")
        browser.find_element(By.ID, "translate").click()
        alert = WebDriverWait(browser, 60).until(lambda b: _alert(b))
        assert "API key" in alert.text
        alert.send_keys(KEY)
        alert.accept()
        WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".translation"))
        shown = browser.find_element(By.CSS_SELECTOR, ".translation").text
    finally:
        browser.quit()
    request = urllib.request.Request(keyed.url + "translate", headers={"Authorization": f"Bearer {KEY}"},
                                     data=json.dumps({"src": ["a dog runs on the grass ."], "beam": 12}).encode())
    with urllib.request.urlopen(request, timeout=120) as r:
        assert shown == json.loads(r.read())["translations"][0]["tgt"]


def _alert(browser):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = browser.switch_to.alert
        alert.text  # noqa: B018  (raises while there is none)
        return alert
    except NoAlertPresentException:
        return None


def test_a_host_beyond_this_machine_is_warned_about(ckpt, server):
    """--host 192.0.2.1 (a documentation address, on no interface here: nothing listens beyond loopback) is
    warned about before the server tries to listen; 127.0.0.1 is not."""
    proc = subprocess.run([*SERVE, "-m", ckpt, "--host", "192.0.2.1", "--port", "0"], capture_output=True,
                          text=True, env=ENV, timeout=120)
    warning, error = proc.stderr.splitlines()
    assert "WARNING" in warning and "--host 192.0.2.1: the server is open to every machine that can reach it" in warning
    assert "give it --api-key (or $NMT_SERVE_API_KEY)" in warning
    assert error.startswith("nmt-serve: error: cannot listen on 192.0.2.1:0") and proc.returncode == 1
    assert not any("open to every machine" in line for line in server.lines)
