"""Shared fixtures: where the real data lives, and tiny corpora written by the tests themselves.

Real data is found through ``$NMTKIT_DATA`` or ``../shared/data`` next to the checkout. When it is absent the
tests that need it are skipped with the reason, except under CI (``CI=true``), where absent data is a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the tools the tests run (bin/, python -m ...) import this checkout's nmtkit, whatever else is installed
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
# Under pytest-xdist (``-n 2``: one worker a core) each worker and every process it starts computes on one thread
# unless a test asks for more: two workers of two OpenMP threads each on two cores would spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"
    import torch as _torch

    _torch.set_num_threads(1)


def _data_root() -> Path | None:
    candidates = [os.environ.get("NMTKIT_DATA"), REPO.parent / "shared" / "data"]
    for c in candidates:
        if c and Path(c, "wmt14", "newstest2014.en").is_file():
            return Path(c)
    return None


# (docs/formats.rst's "Data" section says what the data is and where it comes from; the README has no such section)
DATA_MISSING = ("real data not found: set $NMTKIT_DATA or place the shared data at ../shared/data (see "
                "docs/formats.rst, section 'Data'; python -m nmtkit.datasets --list names the corpora)")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real data (WMT news-test, Hansards, Tatoeba, ...)."""
    root = _data_root()
    if root is None:
        msg = DATA_MISSING
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " -- under CI absent data is a failure")
        pytest.skip(msg)
    return root


def lines_of(path, n=None) -> list[str]:
    """The first n lines of a text file (all with None), without their newlines."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


def wait_until(predicate, timeout: float, what, interval: float = 0.02):
    """Call ``predicate`` every ``interval`` seconds until it gives something true, and return that; fail at the
    deadline, ``timeout`` seconds on, saying what was waited for (``what``: a string, or a function giving one,
    e.g. with a process's output).  The tests wait on the thing itself -- a file, a log line, a process's end --
    never on a sleep of a guessed length, which a loaded machine outlasts; the deadline only bounds a failure.
    ``predicate`` may fail itself to stop early (an assertion that the process waited on still runs)."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what() if callable(what) else what}; it did not happen")
        time.sleep(interval)


_PHARAOH_LINK = re.compile(r"(\d+)-(\d+)")


def pharaoh_links(line: str) -> list[tuple[int, int]]:
    """The links of one line of Pharaoh alignments as the tools write them, ``i-j`` (0-based) separated by spaces,
    in the order written: [(i, j), ...].  Anything else is a failure naming it (nmtkit.align.parse_pharaoh reads
    the gold files' wider format, ``i-j-P`` and ``i?j`` too, into sets; a tool's output must be plain links)."""
    links = []
    for link in line.split():
        m = _PHARAOH_LINK.fullmatch(link)
        assert m, f"{link!r} is not a Pharaoh link i-j (in {line!r})"
        links.append((int(m[1]), int(m[2])))
    return links


def train_tiny(data, save_dir, **settings) -> str:
    """Train rnnsearch-tiny with Adam 0.01 on one torch thread (``settings`` override the rest); returns the path of
    its last checkpoint."""
    import torch

    from nmtkit.train.trainer import TrainConfig, train

    cfg = {**dict(arch="rnnsearch-tiny", optimizer="adam", lr=0.01, batch_size=40, log_every=50), **settings}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(data=str(data), save_dir=str(save_dir), **cfg))
    finally:
        torch.set_num_threads(threads)
    return str(Path(save_dir) / "checkpoint_last.pt")


@pytest.fixture
def restore_threads():
    """torch's thread count as it was before the test (training sets it from --threads)."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def tiny_multi30k_run(data_dir, root, **settings) -> Path:
    """60 Multi30K pairs (10 for validation) prepared under ``root`` with shortlists of 50 and 60 words, and the tiny
    RNNsearch trained on them for 2 updates of batches of 16 on one thread (``settings`` add to or override the
    training's); returns the run's directory, ``root/run``."""
    import torch

    from nmtkit.prepare import PrepareConfig, prepare
    from nmtkit.train.trainer import TrainConfig, train

    for split, name, n in (("train", "train", 60), ("valid", "val", 10)):
        for lang in ("en", "fr"):
            with open(data_dir / "multi30k" / f"{name}.{lang}", encoding="utf-8") as f:
                (root / f"{split}.{lang}").write_text("".join(itertools.islice(f, n)), encoding="utf-8")
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / "data"), valid=str(root / "valid"),
                          src_vocab_size=50, tgt_vocab_size=60))
    cfg = {**dict(arch="rnnsearch-tiny", batch_size=16, pool_batches=2, max_updates=2, valid_every=2,
                  valid_bleu_sentences=0, threads=1), **settings}
    threads = torch.get_num_threads()
    try:
        train(TrainConfig(data=str(root / "data"), save_dir=str(root / "run"), **cfg))
    finally:
        torch.set_num_threads(threads)
    return root / "run"


@pytest.fixture(scope="session")
def trained(data_dir, tmp_path_factory):
    """A tiny RNNsearch trained for a minute on 1,500 real Multi30K pairs: (its root directory, its checkpoint).
    Shared by the translation and decoding tests."""
    from nmtkit.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("translate")
    for lang in ("en", "fr"):
        lines = lines_of(data_dir / "multi30k" / f"train.{lang}", 1500)
        (root / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (root / f"valid.{lang}").write_text("\n".join(lines_of(data_dir / "multi30k" / f"val.{lang}", 50)) + "\n",
                                            encoding="utf-8")
    prepare(PrepareConfig("en", "fr", train=[str(root / "train")], valid=str(root / "valid"), dest=str(root / "data"),
                          src_vocab_size=800, tgt_vocab_size=800, max_len=30))
    return root, train_tiny(root / "data", root / "run", max_updates=150, valid_every=150, valid_bleu_sentences=0)


@pytest.fixture
def bin_dir() -> Path:
    return REPO / "bin"


@pytest.fixture(scope="session")
def kenlm():
    """KenLM's Python module (the ``test`` extra), the independent yardstick of nmt-select's language models."""
    try:
        import kenlm as module
    except ImportError:
        msg = "kenlm is not installed (pip install kenlm, or pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " -- under CI it is part of the test extra")
        pytest.skip(msg)
    return module


@pytest.fixture(autouse=True)
def speed_policy():
    """The fast paths' speed policy (nmtkit/models/fast/policy.py) with every path taken at every size: the oneDNN
    per-step products, the attention's row groups and its recomputed σ, and Adadelta's shortcut for rows without
    gradient start at the paper's sizes, and the tests' tiny models take them too, so that every test -- training on
    real files, resuming -- exercises them.  A test changes the policy for its remaining part by calling the fixture
    (``speed_policy(attention_kernel=False)``); it is set back after the test."""
    from nmtkit.models.fast.policy import override

    with contextlib.ExitStack() as stack:
        stack.enter_context(override(onednn_min_weight=0, group_min_elements=0, recompute_min_elements=0,
                                     sparse_min_rows=0))
        yield lambda **changes: stack.enter_context(override(**changes))


@pytest.fixture(scope="session")
def native_kernels():
    """nmtkit.kernels with its compiled library available (a C compiler is needed): skipped with the reason when
    it is not, except under CI, where it is a failure (CI machines have gcc)."""
    import warnings

    from nmtkit import kernels

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = kernels.available()
    if not ok:
        msg = "nmtkit's C kernels are unavailable: " + "; ".join(str(w.message) for w in caught)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " -- under CI they must build")
        pytest.skip(msg)
    return kernels


# -- tiny models and batches (the model tests, the reference's, the CUDA ones) ------------------------------------
ARCHS = ["rnnsearch", "rnnencdec"]
V_SRC, V_TGT = 23, 29


def tiny(arch: str, **overrides):
    """A tiny model of ``arch`` (V_SRC, V_TGT words), the same weights every call."""
    import torch

    from nmtkit.models import build_model

    torch.manual_seed(0)
    return build_model(f"{arch}-tiny", V_SRC, V_TGT, **overrides)


def randomize_(model, std: float = 0.3, seed: int = 1):
    """The paper's init makes attention uniform (v_a = 0) and outputs tiny; tests need every path to matter."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model


def reference_gru(gx, U_zr, U, s0=None):
    """``reference.gru_step`` over a sequence whose input side is given: gx (T, B, 3n) = [W_z x; W_r x; W x] + b
    at every step (what the fast recurrences take), U_zr (2n, n), U (n, n), s0 (B, n) or None -> (T, B, n).  The
    reference reads x through W_z, W_r, W: here x = gx, and each W selects its third of it."""
    import torch

    from nmtkit.models.reference import gru_step

    n = U.shape[0]
    eye = torch.eye(3 * n, dtype=gx.dtype)
    zero = gx.new_zeros(n)
    P = {"W_z": eye[:n], "W_r": eye[n:2 * n], "W": eye[2 * n:], "U_z": U_zr[:n], "U_r": U_zr[n:], "U": U,
         "b_z": zero, "b_r": zero, "b": zero}
    s = gx.new_zeros(gx.shape[1], n) if s0 is None else s0
    states = []
    for gx_t in gx:
        s = gru_step(P, "", gx_t, s)  # (B, n)
        states.append(s)
    return torch.stack(states)


def make_batch(src_lens, tgt_lens, seed=2):
    """Right-padded source (ending in </s>) and target in/out, as the data pipeline gives them."""
    import torch

    from nmtkit.data.vocab import BOS, EOS, PAD

    g = torch.Generator().manual_seed(seed)
    B, Tx, Ty = len(src_lens), max(src_lens), max(tgt_lens) + 1
    src = torch.full((B, Tx), PAD, dtype=torch.long)
    tgt = torch.full((B, Ty + 1), PAD, dtype=torch.long)
    for b, (ls, lt) in enumerate(zip(src_lens, tgt_lens)):
        src[b, : ls - 1] = torch.randint(4, V_SRC, (ls - 1,), generator=g)
        src[b, ls - 1] = EOS
        tgt[b, 0] = BOS
        tgt[b, 1 : lt + 1] = torch.randint(4, V_TGT, (lt,), generator=g)
        tgt[b, lt + 1] = EOS
    return src, torch.tensor(src_lens), tgt[:, :-1], tgt[:, 1:]


# -- the training tests' corpora and helpers (test_train*.py, test_resume.py, test_adadelta.py, test_*_faults.py) --

def head_lines(src, dst, stop: int, start: int = 0) -> None:
    """Lines ``start`` to ``stop`` (0-based, ``stop`` excluded) of the text file ``src``, written to ``dst``."""
    with open(src, encoding="utf-8") as f:
        Path(dst).write_text("".join(itertools.islice(f, start, stop)), encoding="utf-8")


@pytest.fixture(scope="session")
def multi30k_200(data_dir, tmp_path_factory):
    """The first 200 training and 20 validation pairs of Multi30K, as raw text (``train.*``, ``valid.*``)."""
    root = tmp_path_factory.mktemp("raw")
    for lang in ("en", "fr"):
        head_lines(data_dir / "multi30k" / f"train.{lang}", root / f"train.{lang}", 200)
        head_lines(data_dir / "multi30k" / f"val.{lang}", root / f"valid.{lang}", 20)
    return root


@pytest.fixture(scope="session")
def small(multi30k_200, tmp_path_factory):
    """Those 200 real pairs prepared with joint BPE (150 merges) and small shortlists (120 and 130 entries); the
    tests only read it."""
    from nmtkit.prepare import PrepareConfig, prepare

    dest = tmp_path_factory.mktemp("small") / "data"
    prepare(PrepareConfig("en", "fr", [str(multi30k_200 / "train")], str(dest), valid=str(multi30k_200 / "valid"),
                          src_vocab_size=120, tgt_vocab_size=130, bpe_merges=150))
    return dest


@pytest.fixture(scope="session")
def overfit_data(data_dir, tmp_path_factory):
    """32 short real pairs (at most 7 words a side; at most 10 tokens after tokenisation), full vocabularies."""
    from nmtkit.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("overfit")
    with open(data_dir / "multi30k" / "train.en", encoding="utf-8") as fe, \
         open(data_dir / "multi30k" / "train.fr", encoding="utf-8") as ff:
        pairs = [(e, f) for e, f in zip(fe, ff) if len(e.split()) <= 7 and len(f.split()) <= 7][:32]
    assert len(pairs) == 32
    (root / "train.en").write_text("".join(e for e, _ in pairs), encoding="utf-8")
    (root / "train.fr").write_text("".join(f for _, f in pairs), encoding="utf-8")
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(root / "data"), max_len=10))
    return root / "data"


def train_cfg(data, save_dir, **kw):
    """A TrainConfig of rnnsearch-tiny in batches of 16, pools of 2, validating every 4 updates (BLEU on 4
    sentences), a log record every update, one thread; ``kw`` override."""
    from nmtkit.train.config import TrainConfig

    base = dict(arch="rnnsearch-tiny", batch_size=16, pool_batches=2, valid_every=4, valid_bleu_sentences=4,
                valid_batch_size=20, log_every=1, threads=1)
    base.update(kw)
    return TrainConfig(data=str(data), save_dir=str(save_dir), **base)


@pytest.fixture(scope="session")
def finished_run(small, tmp_path_factory):
    """A save directory holding the checkpoints of a 4-update run on ``small`` (the tests only read it)."""
    import torch

    from nmtkit.train.trainer import train

    run = tmp_path_factory.mktemp("finished") / "run"
    threads = torch.get_num_threads()
    try:
        train(train_cfg(small, run, max_updates=4, valid_every=2, valid_bleu_sentences=0))
    finally:
        torch.set_num_threads(threads)
    return run


def nmt_train_env() -> dict:
    """The environment of an nmt-train process started by a test: one thread, this checkout, no torchrun."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def run_nmt_train(*args, timeout: float = 120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(REPO / "bin" / "nmt-train"), *map(str, args)], capture_output=True,
                          text=True, env=nmt_train_env(), timeout=timeout)


def load_state(path) -> dict:
    from nmtkit.data import checkpoint

    return checkpoint.load(path)["train"]["state"]


def assert_same(a, b, where="") -> None:
    """Deep equality of checkpoint parts; tensors bit for bit."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, where


def snapshot(directory) -> dict:
    """Every file of a directory: (size, mtime in ns, sha256)."""
    import hashlib

    out = {}
    for name in sorted(os.listdir(directory)):
        p = os.path.join(directory, name)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[name] = (st.st_size, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def train_records(run) -> list[dict]:
    """The "train" records of a run's JSON-lines log, in order."""
    import json

    with open(Path(run) / "train.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["type"] == "train"]


# -- faults through the tools (test_*_faults.py) -----------------------------------------------------------------

def run_tool(tool: str, *args, stdin: str | None = None):
    """One of bin/'s tools run on ``args`` (one thread, this checkout): its CompletedProcess, text."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(REPO / "bin" / tool), *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))


def one_line_error(res, tool: str, *fragments: str) -> str:
    """``res`` (a tool's CompletedProcess) failed with exit code 1 and one line, ``TOOL: error: ...``, holding each
    fragment; -> that line."""
    assert res.returncode == 1, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), res.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _with_file_size_limit(limit: int):
    """A preexec_fn: files of this process may not grow past ``limit`` bytes (the kernel's EFBIG, as a full disk's
    ENOSPC: the write fails; SIGXFSZ ignored so that it is an error, not a kill)."""
    def apply():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run_tool_on_a_full_disk(tool: str, limit: int, *args, stdin: str | None = None):
    """As :func:`run_tool`, with the files the tool writes limited to ``limit`` bytes (a disk that fills up)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(REPO / "bin" / tool), *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300, preexec_fn=_with_file_size_limit(limit),
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))


def hidden_files(directory) -> list[str]:
    """The names in ``directory`` that start with a dot (what an interrupted output leaves), sorted."""
    return sorted(p.name for p in Path(directory).iterdir() if p.name.startswith("."))


def fault_train_cfg(data, save_dir, **kw):
    """:func:`train_cfg` validating every 2 updates (the fault tests' runs); ``kw`` override."""
    return train_cfg(data, save_dir, **{"valid_every": 2, **kw})


@pytest.fixture(scope="session")
def small_model(small, tmp_path_factory):
    """A checkpoint of 2 updates of the tiny RNNsearch on ``small`` (the tests only read it)."""
    import torch

    from nmtkit.train.trainer import train

    run = tmp_path_factory.mktemp("model")
    threads = torch.get_num_threads()
    try:
        train(fault_train_cfg(small, run, max_updates=2, valid_bleu_sentences=0))
    finally:
        torch.set_num_threads(threads)
    return run / "checkpoint_last.pt"


# -- the datasets tests' local HTTP mirror (test_datasets_*.py) -----------------------------------------------------

NEWS14 = ("wmt14/newstest2014.en", "wmt14/newstest2014.fr")


class MirrorHandler(BaseHTTPRequestHandler):
    """The requests of :func:`http_mirror`'s server."""

    timeout = 10  # a stuck client cannot hold a handler thread for long

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        srv = self.server
        path = self.path.split("?", 1)[0]
        srv.requests.append({"path": path, "range": self.headers.get("Range"),
                             "if_range": self.headers.get("If-Range")})
        if path in srv.extra:
            body = srv.extra[path]
        else:
            local = (srv.root / path.lstrip("/")).resolve()
            if not str(local).startswith(str(srv.root.resolve())) or not local.is_file():
                self.send_error(404, "Not Found")
                return
            body = local.read_bytes()
        if path in srv.corrupt:
            i = len(body) // 2
            body = body[:i] + bytes([body[i] ^ 0x20]) + body[i + 1:]
        etag = '"%s"' % hashlib.sha256(body).hexdigest()[:16]
        start = 0
        wanted = self.headers.get("Range")
        if wanted and not srv.ignore_range and self.headers.get("If-Range") in (None, etag):
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        drop = srv.drop_after.pop(path, None)  # only the first request for the file is cut short
        stall = srv.stall_after.pop(path, None)  # or stalls, as a server that stops sending does
        if drop is not None or stall is not None:
            self.wfile.write(body[start:start + (drop if drop is not None else stall)])
            self.wfile.flush()
            if stall is not None:
                srv.release.wait(60)
            self.close_connection = True
            return
        self.wfile.write(body[start:])


@contextlib.contextmanager
def http_mirror(root):
    """A local HTTP server on 127.0.0.1 (http.server in a thread, stopped on leaving, and by a timer should a test
    hang) serving ``root`` laid out as an HTTP mirror, plus in-memory files, ``srv.extra`` (path -> bytes: a
    publisher's archive).  It can corrupt a file (``srv.corrupt``, paths), drop the connection after N bytes on the
    first request for a file (``srv.drop_after``, path -> N), stall after N bytes on the first request until
    ``srv.release`` is set (``srv.stall_after``), and ignore ``Range`` headers (``srv.ignore_range``); the requests it
    got are ``srv.requests`` ({"path", "range", "if_range"}), its address ``srv.url``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), MirrorHandler)
    srv.daemon_threads = True
    srv.root = Path(root)
    srv.extra, srv.corrupt, srv.drop_after, srv.stall_after, srv.requests = {}, set(), {}, {}, []
    srv.release = threading.Event()
    srv.ignore_range = False
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(120, srv.shutdown)  # stops by itself even if the test never returns
    watchdog.daemon = True
    watchdog.start()
    try:
        yield srv
    finally:
        watchdog.cancel()
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def no_env(monkeypatch):
    """No $NMTKIT_DATA, $NMTKIT_CACHE or $NMTKIT_MIRROR_URL: nmtkit.datasets finds only what the test names."""
    for var in ("NMTKIT_DATA", "NMTKIT_CACHE", "NMTKIT_MIRROR_URL"):
        monkeypatch.delenv(var, raising=False)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def http_fetcher(server, cache: Path, **kw):
    """An nmtkit.datasets Fetcher of ``server``'s mirror (no environment, no progress bar) caching under ``cache``."""
    from nmtkit.datasets import Fetcher

    return Fetcher(cache, mirror_url=server.url, use_env=False, progress=False, timeout=10, **kw)


def cached_files(cache: Path) -> list[str]:
    """What the cache holds, but its lock files (empty: they only serialize fetches)."""
    return [str(p.relative_to(cache)) for p in files_under(cache) if not p.name.endswith(".lock")]
