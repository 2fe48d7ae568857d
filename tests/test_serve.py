"""nmt-serve: a real server process on 127.0.0.1, real HTTP, the tiny RNNsearch trained on real Multi30K pairs.

Each route and error code; the same text as nmt-translate for the same lines and options (beam, n-best, prefix,
alignments, sampling); concurrent clients each get their own lines back, decoded in shared batches; a full queue
is 503 and a long wait 504; /health answers during a long batch; SIGTERM answers the requests in flight and exits
0; a checkpoint that cannot be served is one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, lines_of, wait_until

SERVE = [sys.executable, str(REPO / "bin" / "nmt-serve")]
TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# nmt-serve saying on standard error when a request's lines join the queue ("test hook: queued N line(s)") and when a
# batch goes to decoding ("test hook: decoding N line(s)"), which nothing shows from outside: the tests that must
# send something while requests wait, or while a batch decodes, wait for these lines, not for a guessed time.  And
# when a batch is cut ("test hook: formed N line(s) at T ..."), by the server's own clock: when, after which batch's
# end, whether lines it could take were left waiting, and when its requests arrived (as the batcher stamped them), for
# :func:`assert_batches_keep_the_quiet_rule`.  Otherwise it is the command itself (bin/nmt-serve run as __main__).
SERVE_HOOKS = textwrap.dedent("""
    import runpy, sys, time
    from nmtkit.serve import batcher

    def say(line):
        sys.stderr.write(f"test hook: {line}\\n")
        sys.stderr.flush()

    class Queue(list):
        def append(self, job):
            super().append(job)
            say(f"queued {len(job.request.lines)} line(s)")

    init, form, decode = batcher.Batcher.__init__, batcher.Batcher._form, batcher.Batcher._decode

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.queue = Queue()

    async def _form(self):
        batch, lines = await form(self)  # (no wait between its cut and here: the queue is as the cut left it)
        if batch:
            cut = time.monotonic()
            jobs = [item[0] if isinstance(item, tuple) else item for item in batch]  # (a job, or a part of one)
            key = jobs[0].request.key
            full = any(job.request.key == key for job in self.queue)  # (lines it could take left waiting)
            say(f"formed {lines} line(s) at {cut!r} after {self._freed!r} key {hash(key)} full {full}: "
                + " ".join(repr(job.arrived) for job in jobs))
        return batch, lines

    async def _decode(self, batch, lines, *args, **kwargs):
        say(f"decoding {lines} line(s)")
        return await decode(self, batch, lines, *args, **kwargs)

    batcher.Batcher.__init__, batcher.Batcher._form, batcher.Batcher._decode = __init__, _form, _decode
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


class Server:
    """``nmt-serve`` started on a free port; its standard error collected as it runs.  ``hooks``: with the lines of
    SERVE_HOOKS, for :meth:`wait_for_log`."""

    def __init__(self, ckpt: str, *options: str, hooks: bool = False):
        command = [sys.executable, "-c", SERVE_HOOKS, *SERVE[1:]] if hooks else SERVE
        self.ckpt = ckpt
        self.proc = subprocess.Popen([*command, "-m", ckpt, "--port", "0", "--threads", "1", *options],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
        self.lines: list[str] = []
        first = self.proc.stderr.readline()
        self.lines.append(first)
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+/)", first)
        if not match:
            self.proc.kill()
            raise AssertionError(f"no address in {first!r}: {self.proc.stderr.read()}")
        self.url = match.group(1)
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")),
                                        daemon=True)
        self._reader.start()

    def call(self, path: str, body=None, raw: bytes | None = None, method: str | None = None,
             timeout: float = 120) -> tuple:
        """(status, JSON body, headers: case-insensitive) of one request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers

    def ready(self, timeout: float = 120) -> list[int]:
        """Poll /health until it says ok; the statuses seen."""
        seen = []

        def ok() -> bool:
            status, body, _ = self.call("/health")
            seen.append(status)
            if status == 200:
                assert body == {"status": "ok"}
                return True
            assert (status, body) == (503, {"status": "loading"})
            return False

        wait_until(ok, timeout, lambda: f"the server to be ready: {''.join(self.lines)}", interval=0.05)
        return seen

    def wait_for_log(self, pattern: str, count: int = 1, start: int = 0, timeout: float = 120) -> None:
        """Wait until ``count`` lines of the server's standard error, from its line ``start`` on, match ``pattern``
        (a regular expression)."""
        wait_until(lambda: sum(bool(re.search(pattern, line)) for line in self.lines[start:]) >= count, timeout,
                   lambda: f"{count} line(s) matching {pattern!r} from the server: {''.join(self.lines[start:])}")

    def logged(self, n: int, timeout: float = 60) -> None:
        """Wait until the request log holds ``n`` answered translations (each request's line is written once its
        response has gone out: a client can read its answer before it)."""
        wait_until(lambda: len(self.batches()) >= n, timeout,
                   lambda: f"{n} translations in the request log: {''.join(self.lines)}")

    def translate(self, lines, **options) -> list[dict]:
        status, body, _ = self.call("/translate", {"src": lines, **options})
        assert status == 200, body
        assert len(body["translations"]) == len(lines)
        return body["translations"]

    def batches(self) -> list[int]:
        """The size of the batch of each request answered so far, from the request log."""
        return [int(m.group(1)) for line in self.lines
                if (m := re.search(r"POST /translate 200 .*batch of (\d+)", line))]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return code


@pytest.fixture(scope="module")
def ckpt(trained):
    return trained[1]


@pytest.fixture(scope="module")
def server(ckpt):
    s = Server(ckpt, "--batch-wait-ms", "20", hooks=True)
    s.seen = s.ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def lines(data_dir):
    found = lines_of(data_dir / "multi30k" / "val.en", 12)
    return found[:5] + [""] + found[5:]  # (an empty line is a line too)


def nmt_translate(ckpt, tmp_path, lines, *options, prefixes=None) -> dict[str, str]:
    """nmt-translate's outputs for the same lines: {"text", "nbest", "alignments"} as their files hold them."""
    src = tmp_path / "in.en"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    args = [*TRANSLATE, "-m", ckpt, "-i", str(src), "-o", str(tmp_path / "out.fr"), "--threads", "1",
            "--workers", "1", *options]
    if prefixes is not None:
        (tmp_path / "prefix.fr").write_text("".join(x + "\n" for x in prefixes), encoding="utf-8")
        args += ["--prefix", str(tmp_path / "prefix.fr")]
    proc = subprocess.run(args, capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return {name: (tmp_path / file).read_text(encoding="utf-8") if (tmp_path / file).exists() else ""
            for name, file in (("text", "out.fr"), ("nbest", "out.nbest"), ("alignments", "out.align"))}


# -- routes --------------------------------------------------------------------------------------------------------

def test_health_is_503_until_loaded_then_models_and_the_schema(server, ckpt):
    assert server.seen[0] == 503 and server.seen[-1] == 200  # (it listens before torch is even imported)
    status, models, _ = server.call("/models")
    assert status == 200 and models["ensemble"] == 1 and models["attention"] is True
    (m,) = models["models"]
    assert (m["path"], m["arch"], m["source_lang"], m["target_lang"]) == (ckpt, "rnnsearch", "en", "fr")
    assert m["vocab_sizes"]["src"] > 100 and m["updates"] == 150 and "lowercase" in m["preprocessing"]["src"]
    status, schema, _ = server.call("/openapi.json")
    from dataclasses import fields

    from nmtkit.translate.config import DecodeConfig

    props = schema["components"]["schemas"]["Request"]["properties"]
    assert status == 200 and schema["openapi"].startswith("3.1")
    assert {f.name for f in fields(DecodeConfig)} | {"src", "prefix", "alignment", "attention", "terms"} == set(props)
    assert props["beam"]["default"] == 12 and props["beam"]["type"] == "integer"
    assert props["alignment_method"]["enum"] == ["attention", "posterior"]
    status, body, _ = server.call("/nope")
    assert (status, body) == (404, {"error": "no route /nope"})
    status, body, _ = server.call("/translate")
    assert (status, body) == (405, {"error": "GET is not allowed on /translate"})


# -- the same text as nmt-translate --------------------------------------------------------------------------------

def test_translations_are_nmt_translates(server, ckpt, lines, tmp_path):
    got = server.translate(lines)
    want = nmt_translate(ckpt, tmp_path, lines)["text"].splitlines()
    assert [r["tgt"] for r in got] == want and got[5]["tgt"] == "" and len(set(want)) >= 4  # (not one line for all)
    assert all(isinstance(r["score"], float) and "nbest" not in r and "alignment" not in r for r in got)
    # n-best, alignments and the beam: the n-best list as the Moses file has it
    got = server.translate(lines, beam=5, nbest=3, alignment=True)
    files = nmt_translate(ckpt, tmp_path, lines, "--beam", "5", "--nbest", "3", "--nbest-file",
                          str(tmp_path / "out.nbest"), "--alignments", str(tmp_path / "out.align"))
    nbest = [x.split(" ||| ") for x in files["nbest"].splitlines()]
    assert [(int(k), text) for k, text, _, _ in nbest] == [(i, h["tgt"]) for i, r in enumerate(got) for h in r["nbest"]]
    assert [r["tgt"] for r in got] == [r["nbest"][0]["tgt"] for r in got]
    assert [r["alignment"] for r in got] == files["alignments"].splitlines()
    assert any(len(r["nbest"]) == 3 for r in got)
    # the links from the alignment posterior: nmt-translate's, the same translations
    posterior = server.translate(lines, beam=5, alignment=True, alignment_method="posterior")
    files = nmt_translate(ckpt, tmp_path, lines, "--beam", "5", "--alignments", str(tmp_path / "out.align"),
                          "--alignment-method", "posterior")
    assert [r["alignment"] for r in posterior] == files["alignments"].splitlines()
    assert [r["tgt"] for r in posterior] == [r["tgt"] for r in got]
    assert [r["alignment"] for r in posterior] != [r["alignment"] for r in got]
    # <unk> replaced by the most attended source word: nmt-translate's text
    plain = server.translate(lines, beam=5, nbest=2)
    replaced = server.translate(lines, beam=5, nbest=2, replace_unk=True)
    files = nmt_translate(ckpt, tmp_path, lines, "--beam", "5", "--nbest", "2", "--nbest-file",
                          str(tmp_path / "out.nbest"), "--replace-unk")
    assert [h["tgt"] for r in replaced for h in r["nbest"]] == [
        x.split(" ||| ")[1] for x in files["nbest"].splitlines()]
    assert not any("<unk>" in h["tgt"] for r in replaced for h in r["nbest"])
    assert sum(h["tgt"].count("<unk>") for r in plain for h in r["nbest"]) >= 3  # (the test means something)


def test_prefixes_attention_and_sampling_are_nmt_translates(server, ckpt, lines, tmp_path):
    prefixes = ["Un homme" if k % 2 else "" for k in range(len(lines))]
    got = server.translate(lines, prefix=prefixes)
    assert [r["tgt"] for r in got] == nmt_translate(ckpt, tmp_path, lines, prefixes=prefixes)["text"].splitlines()
    assert all(r["tgt"].startswith("Un homme") for k, r in enumerate(got) if k % 2)
    got = server.translate(lines, sampling="topk:5", seed=3, nbest=2)
    want = nmt_translate(ckpt, tmp_path, lines, "--sampling", "topk:5", "--seed", "3", "--nbest", "2", "--nbest-file",
                         str(tmp_path / "out.nbest"))["nbest"].splitlines()
    assert [h["tgt"] for r in got for h in r["nbest"]] == [x.split(" ||| ")[1] for x in want]
    got = server.translate(lines[:3], attention=True)
    for r in got:
        a = r["attention"]
        assert a["src"][-1] == "</s>" and a["tgt"][-1] == "</s>" and len(a["weights"]) == len(a["tgt"])
        assert all(len(row) == len(a["src"]) and abs(sum(row) - 1) < 1e-3 for row in a["weights"])


def each_client_one_line(ckpt, data_dir, tmp_path, n: int, *options: str) -> list[int]:
    """``n`` clients at once, each sending its own line to a server started with ``options``: each gets
    nmt-translate's translation of its line; -> the size of each request's batch."""
    lines = lines_of(data_dir / "multi30k" / "val.en", n)
    assert len(set(lines)) == n
    want = nmt_translate(ckpt, tmp_path, lines)["text"].splitlines()
    s = Server(ckpt, *options)
    try:
        s.ready()
        with ThreadPoolExecutor(n) as pool:
            got = list(pool.map(lambda line: s.translate([line])[0]["tgt"], lines))
        assert got == want
    finally:
        assert s.stop() == 0
    return s.batches()


def test_concurrent_clients_each_get_their_own_lines_in_shared_batches(ckpt, data_dir, tmp_path):
    batches = each_client_one_line(ckpt, data_dir, tmp_path, 50, "--batch-wait-ms", "200", "--max-batch", "16")
    assert len(batches) == 50 and max(batches) > 1 and max(batches) <= 16  # decoded together, never past the cap


def assert_batches_keep_the_quiet_rule(server: Server, wait: float, start: int = 0) -> list[int]:
    """Every batch the server cut (from its line ``start`` on: SERVE_HOOKS' lines) was cut as nmtkit/serve/batcher.py
    says, by the server's own clock: full (lines it could take were left waiting), or once no line came for ``wait``
    seconds after its latest, or QUIET_CAP times ``wait`` after its wait began (its first request's arrival, or the
    previous batch's end if later).  Exact however busy the machine: requests are stamped, and batches cut, on the
    server's one event loop.  A client's pace, which a busy machine does not keep, decides what the batches are;
    this checks them against the arrivals the server saw.  -> the batches' sizes."""
    from nmtkit.serve.batcher import QUIET_CAP

    sizes = []
    for line in server.lines[start:]:
        m = re.match(r"test hook: formed (\d+) line\(s\) at (\S+) after (\S+) key \S+ full (True|False): (.*)$",
                     line.strip())
        if m:
            cut, freed, stamps = float(m[2]), float(m[3]), [float(x) for x in m[5].split()]
            began = max(min(stamps), freed)
            quiet = min(began + QUIET_CAP * wait, max(began, max(stamps)) + wait)
            assert m[4] == "True" or cut >= quiet, (f"a batch of {m[1]} line(s) was cut {quiet - cut:.3f} s before "
                                                    f"its quiet time: {''.join(server.lines[start:])}")
            sizes.append(int(m[1]))
    return sizes


def test_a_batch_waits_while_lines_keep_coming_and_for_the_clients_it_just_answered(ckpt, lines, tmp_path):
    """--batch-wait-ms is a quiet time: a batch forms while lines keep arriving less than that apart (up to ten
    times it in all), and a batch that has just been answered gives its clients that long to send again before
    the lines that waited meanwhile are decoded without them.  (Timing from the head's arrival alone split 16
    clients in lock-step into batches of 10 and 6 for good: tests/bench/results/bench_serve.txt.)  The clients keep
    a pace (the sleeps: the pace under test, not a wait for something); the batches are checked against the
    arrivals the server saw (assert_batches_keep_the_quiet_rule), so a busy machine that breaks the pace changes
    the batches the rule asks for, never the outcome."""
    want = nmt_translate(ckpt, tmp_path, lines)["text"].splitlines()
    s = Server(ckpt, "--batch-wait-ms", "400", "--max-batch", "100", hooks=True)
    try:
        s.ready()

        # six lines 150 ms apart (900 ms from the first to the last, more than the wait): one batch where the
        # server saw that pace
        with ThreadPoolExecutor(6) as pool:
            futures = []
            for k in range(6):
                futures.append(pool.submit(s.translate, [lines[k]]))
                time.sleep(0.15)  # (the pace under test, not a wait for something)
            assert [f.result()[0]["tgt"] for f in futures] == want[:6]
        s.logged(6)
        assert sum(assert_batches_keep_the_quiet_rule(s, 0.4)) == 6
        # sixty lines 120 ms apart (7.2 s): a batch goes at ten times the wait (4 s) at the latest, not after the
        # last line (only a server stalled for seconds could miss that)
        first = len(s.lines)
        with ThreadPoolExecutor(60) as pool:
            futures = []
            for k in range(60):
                futures.append(pool.submit(s.translate, [lines[k % len(lines)]]))
                time.sleep(0.12)  # (the pace under test)
            assert [f.result()[0]["tgt"] for f in futures] == [want[k % len(lines)] for k in range(60)]
        s.logged(66)
        spread = assert_batches_keep_the_quiet_rule(s, 0.4, start=first)
        assert sum(spread) == 60 and len(spread) >= 2
        # a line that waits while a long batch decodes is decoded with the line the long batch's client sends next
        # (where that client sent it within the wait, by the server's clock)
        heavy = {"src": [" ".join(lines[:4])] * 20, "prefix": [" ".join(["un homme"] * 60)] * 20, "beam": 48}
        done = {}

        def long_then_next():
            done["long"] = s.call("/translate", heavy)
            done["next"] = s.translate([lines[7]])

        client = threading.Thread(target=long_then_next)
        start = len(s.lines)
        client.start()
        s.wait_for_log(r"^test hook: decoding 20 line", start=start)  # (the long batch decodes)
        waited = s.translate([lines[8]])
        client.join()
        assert done["long"][0] == 200 and "next" in done
        assert [waited[0]["tgt"], done["next"][0]["tgt"]] == [want[8], want[7]]
        s.logged(69)
        assert sum(assert_batches_keep_the_quiet_rule(s, 0.4, start=start)) == 22
    finally:
        assert s.stop() == 0
    assert sum(assert_batches_keep_the_quiet_rule(s, 0.4)) == 6 + 60 + 22


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of any of its threads: the workers start on the loading thread)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:  # (a thread that ended meanwhile)
            pass
    return out


def test_worker_processes_decode_batches_at_once_with_each_requests_settings(ckpt, data_dir, tmp_path):
    """``--workers 2``: two decoding processes, each a batch at a time.  40 concurrent clients, half asking for
    beam 12 and half for beam 3 with an n-gram block, each get nmt-translate's translation for their settings, in
    batches of at most --max-batch; the two workers are the server's children while it runs, and after SIGTERM
    the server exits 0 and they are gone."""
    lines = lines_of(data_dir / "multi30k" / "val.en", 40)
    plain = nmt_translate(ckpt, tmp_path, lines)["text"].splitlines()
    blocked = nmt_translate(ckpt, tmp_path, lines, "--beam", "3", "--no-repeat-ngram", "2")["text"].splitlines()
    assert plain != blocked
    s = Server(ckpt, "--workers", "2", "--threads", "2", "--batch-wait-ms", "30", "--max-batch", "6")
    try:
        s.ready()
        workers = _children(s.proc.pid)
        assert len(workers) == 2

        def one(k):
            if k % 2:
                return s.translate([lines[k]], beam=3, no_repeat_ngram=2)[0]["tgt"]
            return s.translate([lines[k]])[0]["tgt"]

        with ThreadPoolExecutor(40) as pool:
            got = list(pool.map(one, range(40)))
        assert got == [blocked[k] if k % 2 else plain[k] for k in range(40)]
    finally:
        assert s.stop() == 0
    batches = s.batches()
    assert len(batches) == 40 and max(batches) > 1 and max(batches) <= 6
    assert "Traceback" not in "".join(s.lines)
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/status").read().count("zombie")


def test_lines_that_arrive_together_are_shared_among_the_free_worker_processes(ckpt, data_dir, tmp_path):
    """``--workers 2``: sixteen lines that arrive together are decoded as two batches of eight, one in each worker,
    not as one batch of sixteen beside an idle worker; each line gets nmt-translate's translation."""
    batches = each_client_one_line(ckpt, data_dir, tmp_path, 16, "--workers", "2", "--threads", "2",
                                   "--batch-wait-ms", "300", "--max-batch", "32")
    assert batches == [8] * 16


# -- bad input and overload ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, status, message", [
    (b"{not json", 400, "the body is not JSON"),
    (b'["A dog."]', 400, "the request must be a JSON object with \"src\""),
    (b'{"text": ["A dog."]}', 400, "the request has no \"src\""),
    (b'{"src": "A dog."}', 400, "\"src\" must be a list of strings"),
    (b'{"src": ["A dog.", 3]}', 400, "\"src\" must be a list of strings"),
    (b'{"src": ["A dog.\\nA cat."]}', 400, "\"src\"[0] holds a line break"),
    (b'{"src": ["A dog."], "beem": 5}', 400, "unknown decoding setting 'beem'"),
    (b'{"src": ["A dog."], "beam": 0}', 400, "need beam >= 1"),
    (b'{"src": ["A dog."], "beam": "5"}', 400, "--beam must be a whole number"),
    (b'{"src": ["A dog."], "prefix": ["Un"]}', 200, None),
    (b'{"src": ["A dog."], "prefix": []}', 400, "\"prefix\" must have one entry per line"),
    (b'{"src": ["A dog."], "alignment": 1}', 400, "\"alignment\" must be true or false"),
    (b'{"src": ["A dog."], "alignment": true, "alignment_method": "viterbi"}', 400,
     "--alignment-method must be attention or posterior (got 'viterbi')"),
    (b'{"src": ["A dog."], "attention": true, "alignment_method": "posterior"}', 400,
     "\"alignment_method\": \"posterior\" says how the alignment is made: ask for it with \"alignment\": true"),
    (b'{"src": ["A dog."], "replace_unk": true}', 200, None),
    # a decoding setting that was removed: why, and what to use instead (nmtkit/translate/retired.py)
    (b'{"src": ["A dog."], "replace_unk": true, "replace_unk_by": "attention"}', 400,
     "\"replace_unk_by\": removed: the posterior lost on every set (bench_replace_unk.txt); --replace-unk uses the "
     "attention"),
    (b'{"src": ["A dog."], "no_repeat_ngram": 3, "block_numbers": true}', 400,
     "\"block_numbers\": removed: it blocked numbers' tokens and lost numbers (tests/bench/results/bench_recipe.txt); "
     "--no-repeat-ngram leaves numbers free"),
    (b'{"src": ["A dog."], "source_numbers": true, "missing_numbers": 0.5}', 400,
     "\"missing_numbers\": removed: it changed no line (bench_recipe.txt); use --all-numbers"),
    (b'{"src": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", '
     b'"t", "u"]}', 413, "21 lines: at most 20 a request (--max-lines)"),
    (b'{"src": ["' + b"x" * 301 + b'"]}', 413, "301 characters: at most 300 a request (--max-chars)"),
    (b'{"src": ["' + b"x" * 100000 + b'"]}', 413, "a body of 100013 bytes: at most 66736 (--max-chars)"),
])
def test_bad_input_is_one_line_and_the_server_goes_on(ckpt, raw, status, message, limited):
    got, body, _ = limited.call("/translate", raw=raw)
    assert got == status, body
    if message is not None:
        assert set(body) == {"error"} and message in body["error"] and "\n" not in body["error"]
    assert limited.call("/health")[0] == 200


@pytest.fixture(scope="module")
def limited(ckpt):
    s = Server(ckpt, "--max-lines", "20", "--max-chars", "300")
    s.ready()
    yield s
    assert s.stop() == 0


def test_a_full_queue_is_503_with_retry_after_and_a_long_wait_504(ckpt, lines):
    s = Server(ckpt, "--max-batch", "100", "--batch-wait-ms", "3000", "--max-queue", "5", "--max-lines", "5",
               "--timeout", "20", hooks=True)
    try:
        s.ready()
        with ThreadPoolExecutor(2) as pool:
            a = pool.submit(s.translate, lines[:3])
            b = pool.submit(s.translate, lines[3:5])
            s.wait_for_log(r"^test hook: queued", count=2)  # (both wait in the queue: 5 lines, the most it holds)
            status, body, headers = s.call("/translate", {"src": lines[7:8]})
            assert (status, headers.get("Retry-After")) == (503, "1") and "too busy" in body["error"]
            assert len(a.result()) == 3 and len(b.result()) == 2  # then decoded together
    finally:
        assert s.stop() == 0
    assert any("batch of 5" in line for line in s.lines)
    s = Server(ckpt, "--batch-wait-ms", "5000", "--timeout", "1")
    try:
        s.ready()
        status, body, _ = s.call("/translate", {"src": lines[:2]})
        assert (status, body) == (504, {"error": "no translation within 1 s (--timeout)"})
        assert s.call("/health")[0] == 200
    finally:
        assert s.stop() == 0


def test_health_answers_while_a_long_batch_decodes(server, lines):
    # (a long forced prefix: every hypothesis runs its 120 words through the model, whatever the model would say)
    heavy = {"src": [" ".join(lines[:4])] * 20, "prefix": [" ".join(["un homme"] * 60)] * 20, "beam": 48}
    done = {}

    def post():
        done["translate"] = (server.call("/translate", heavy), time.monotonic())

    thread = threading.Thread(target=post)
    start = len(server.lines)
    thread.start()
    server.wait_for_log(r"^test hook: decoding 20 line", start=start)  # (the long batch decodes)
    status = server.call("/health")[0]
    answered = time.monotonic()
    pending = "translate" not in done
    thread.join()
    assert status == 200 and done["translate"][0][0] == 200
    assert pending and answered < done["translate"][1]  # (the batch was still decoding: not a vacuous test)


def test_a_line_that_comes_while_a_batch_decodes_waits_for_it(ckpt, lines, tmp_path):
    """A long batch is decoding (forced 120-word prefixes); a one-line request with the same settings comes 0.3 s
    later: it waits for the long batch (static batching; continuous batching, which let it join the running search,
    lost at every load: tests/bench/results/bench_serve.txt), then gets nmt-translate's text."""
    want = nmt_translate(ckpt, tmp_path, lines[:1], "--beam", "48")["text"].splitlines()
    s = Server(ckpt, "--batch-wait-ms", "20", hooks=True)
    try:
        s.ready()
        heavy = {"src": [" ".join(lines[:4])] * 20, "prefix": [" ".join(["un homme"] * 60)] * 20, "beam": 48}
        done = {}

        def post(name, body):
            done[name] = (s.call("/translate", body), time.monotonic())

        long = threading.Thread(target=post, args=("long", heavy))
        long.start()
        s.wait_for_log(r"^test hook: decoding 20 line")  # (the long batch decodes)
        post("short", {"src": lines[:1], "beam": 48})
        long.join()
    finally:
        assert s.stop() == 0
    assert done["long"][0][0] == 200 and done["short"][0][0] == 200
    assert [t["tgt"] for t in done["short"][0][1]["translations"]] == want
    assert done["short"][1] > done["long"][1]


# -- shutdown and start-up -----------------------------------------------------------------------------------------

def test_sigterm_answers_the_requests_in_flight_then_exits_0(ckpt, lines, tmp_path):
    want = nmt_translate(ckpt, tmp_path, lines[:3])["text"].splitlines()
    s = Server(ckpt, "--batch-wait-ms", "1500", hooks=True)
    s.ready()
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(s.translate, [line]) for line in lines[:3]]
        s.wait_for_log(r"^test hook: queued", count=3)  # (they wait for their batch)
        s.proc.send_signal(signal.SIGTERM)
        got = [f.result()[0]["tgt"] for f in futures]
    assert got == want
    assert s.stop() == 0
    log = "".join(s.lines)
    assert "Traceback" not in log and log.count("POST /translate 200") == 3
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(s.url + "health", timeout=5)


@pytest.mark.parametrize("option", [["--batching", "continuous"], ["--join-wait-ms", "50"], ["--batching"]])
def test_continuous_batchings_options_are_refused_in_one_line(ckpt, option):
    """Continuous batching was removed (it lost to static batching at every load): its options are refused before
    the server loads or listens, in one line that says so and where its code is, exit code 2."""
    proc = subprocess.run([*SERVE, "-m", ckpt, "--port", "0", *option], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"nmt-serve: error: {option[0]}: removed: continuous batching lost to static batching at every load "
        "(bench_serve.txt); it lives on git tag retired/continuous-batching"]


def test_a_checkpoint_that_cannot_be_served_is_one_line(tmp_path):
    proc = subprocess.run([*SERVE, "-m", str(tmp_path / "missing.pt"), "--port", "0"], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == f"nmt-serve: error: {tmp_path / 'missing.pt'}: no such file"
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint" * 100)
    proc = subprocess.run([*SERVE, "-m", str(tmp_path / "garbage.pt"), "--port", "0", "-q"], capture_output=True,
                          text=True, env=ENV, timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "listening on" in err[0] and len(err) == 2, proc.stderr
    assert err[1].startswith(f"nmt-serve: error: {tmp_path / 'garbage.pt'}") and "Traceback" not in proc.stderr


def test_a_port_in_use_is_one_line(server, ckpt):
    port = server.url.rsplit(":", 1)[1].strip("/")
    proc = subprocess.run([*SERVE, "-m", ckpt, "--port", port], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().startswith(f"nmt-serve: error: cannot listen on 127.0.0.1:{port}")


# -- the page, in a real browser -----------------------------------------------------------------------------------

def _browser():
    """Chromium (the OS package) driven by Selenium through chromedriver; skipped with the reason when one of them
    is missing, a failure under CI (.ci/run installs them)."""
    import shutil

    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver):
        missing = ", ".join(n for n, x in (("chromium", chromium), ("chromedriver", driver), ("selenium", webdriver))
                            if not x)
        reason = f"the page test needs a browser: {missing} not installed (apt install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_the_page_translates_and_draws_the_alignment_in_a_real_browser(server, lines, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(server.url)
        assert "http" not in "".join(s.get_attribute("src") or "" for s in browser.find_elements(By.TAG_NAME, "script"))
        box = browser.find_element(By.ID, "src")
        box.clear()
        box.send_keys("\n".join(lines[:2]))
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".translation")) == 2)
        shown = [p.text for p in browser.find_elements(By.CSS_SELECTOR, ".translation")]
        api = server.translate(lines[:2], beam=12, attention=True)
        assert shown == [r["tgt"] for r in api]
        for table, r in zip(browser.find_elements(By.CSS_SELECTOR, "table.matrix"), api):
            a = r["attention"]
            assert len(table.find_elements(By.CSS_SELECTOR, "td.cell")) == len(a["tgt"]) * len(a["src"])
            assert [th.text for th in table.find_elements(By.CSS_SELECTOR, "th.src")] == a["src"]
        # pointing at the first target word highlights the source words it attended to (at least half its largest
        # weight)
        first = browser.find_elements(By.CSS_SELECTOR, "table.matrix")[0]
        ActionChains(browser).move_to_element(first.find_elements(By.CSS_SELECTOR, "th.tgt")[0]).perform()
        lit = [int(th.get_attribute("data-j")) for th in first.find_elements(By.CSS_SELECTOR, "th.src.attended")]
        row = api[0]["attention"]["weights"][0]
        expected = [j for j, w in enumerate(row) if w >= 0.5 * max(row)]
        assert lit == expected and expected
        browser.save_screenshot(str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").stat().st_size > 10_000
        # a glossary typed on the page: the translation obeys it and the page says which terms it used
        from nmtkit.data import checkpoint

        word = lines[0].split()[1].strip(".,")
        never = next(w for w in checkpoint.load(server.ckpt)["vocab"]["tgt"][4:]
                     if w.isalpha() and w not in api[0]["tgt"].split())
        browser.find_element(By.ID, "terms").send_keys(f"{word} = {never}")
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".terms")) >= 1)
        obeyed = server.translate(lines[:2], beam=12, attention=True, terms=[[word, never]])
        assert [p.text for p in browser.find_elements(By.CSS_SELECTOR, ".translation")] == [r["tgt"] for r in obeyed]
        assert never in obeyed[0]["tgt"].split()
        assert browser.find_elements(By.CSS_SELECTOR, ".terms")[0].text == f"glossary used: {word}"
    finally:
        browser.quit()
