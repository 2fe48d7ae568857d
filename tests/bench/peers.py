"""Shared helpers of the side-by-side benchmarks (``bench_train.py``, ``bench_translate.py``): not a test module.

- where things are: the checkout, the peer material (``../shared/peers``: the synthetic corpus script, the
  OpenNMT-py yaml template, the measured figures), the real data (``$NMTKIT_DATA`` or ``../shared/data``), the
  OpenNMT-py virtual environment (``--onmt-venv``, default ``/work/peers/onmt-venv``: see the install recipe in
  ``../shared/peers/README.md``; absent → the peer is skipped with a clear message) and the work directory
  (default ``/tmp/nmtkit-bench``), where corpora, prepared directories and models are cached between runs;
- the synthetic 20k-pair corpus (``make_corpus.py``), prepared for nmtkit (``nmt-prepare --no-normalize``, 8,000-word
  shortlists: the whitespace-tokenised words go through Moses tokenisation unchanged, checked) and for OpenNMT-py
  (``onmt_build_vocab`` with the template's 8,000-word vocabularies), so both see the same sentences and the same
  ~7,900-word vocabularies;
- a real corpus with 30,000-word shortlists for paper-size models (the first lines of the Hansards, news-test-2014
  as its test split);
- :func:`run_measured`: run a command, returning its wall time and the peak RSS of the child (``/usr/bin/time -v``
  when present, else ``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process);
- parsers for the two tools' training logs (the README's counting rule: real target tokens per second after the
  first N updates), a median, a small tokenised BLEU, system facts for the report header.

Only the standard library (and numpy/torch, imported lazily by the callers) is used.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
PEERS_DIR = Path(os.environ.get("NMTKIT_PEERS", REPO.parent / "shared" / "peers"))
DEFAULT_WORK = Path(os.environ.get("NMTKIT_BENCH_WORK", "/tmp/nmtkit-bench"))
DEFAULT_ONMT_VENV = Path(os.environ.get("NMTKIT_ONMT_VENV", "/work/peers/onmt-venv"))
ONMT_VERSION = "3.5.1"

SYNTH_PAIRS = {"train": 20000, "dev": 500, "test": 1000}
SYNTH_VOCAB = 8000  # the peers' README: 8,000-word vocabularies (both tools then hold all ~7,900 types)
REAL_VOCAB = 30000  # the paper's shortlists

if str(REPO) not in sys.path:  # the benchmarks use this checkout's nmtkit, installed or not
    sys.path.insert(0, str(REPO))
# ... and so do the tools they run (bin/ has no sys.path of its own)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def checkout_env(checkout: str | Path) -> dict:
    """The environment that makes a checkout's bin/ tools import that checkout's nmtkit (a git worktree's, for the
    A/B benchmarks), not the installed one."""
    return {"PYTHONPATH": str(checkout)}


class BenchError(RuntimeError):
    """A step of a benchmark failed (the message says which, with the end of its log)."""


# -- reporting ------------------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def data_root() -> Path | None:
    for c in (os.environ.get("NMTKIT_DATA"), REPO.parent / "shared" / "data"):
        if c and Path(c, "wmt14", "newstest2014.en").is_file():
            return Path(c)
    return None


def spread_sets(prefixes: dict[str, Path], n: int, work: Path, tag: str) -> dict[str, tuple[Path, list, list]]:
    """name -> (a file ``WORK/TAG-NAME-N.en`` of n lines spread evenly over ``PREFIX.en``, or all of them with n = 0;
    those source lines; their references from ``PREFIX.fr``): the sets the decoding benchmarks measure on."""
    out = {}
    for name, prefix in prefixes.items():
        en = Path(f"{prefix}.en").read_text(encoding="utf-8").splitlines()
        fr = Path(f"{prefix}.fr").read_text(encoding="utf-8").splitlines()
        keep = list(range(0, len(en), max(1, len(en) // n)))[:n] if n else list(range(len(en)))
        src = work / f"{tag}-{name.replace('/', '-')}-{n}.en"
        src.write_text("".join(en[i] + "\n" for i in keep), encoding="utf-8")
        out[name] = (src, [en[i] for i in keep], [fr[i] for i in keep])
    return out


def median(values):
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return "(1 run)"
    return f"({min(values):,.0f}–{max(values):,.0f})"


def fmt_mb(kb: float | None) -> str:
    return "-" if kb is None else f"{kb / 1024:,.0f} MB"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def git_describe() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True,
                             timeout=20)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def commit_of(rev: str) -> str:
    """The full commit ``rev`` names in this checkout."""
    return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()


def worktree(work: Path, rev: str, prefix: str = "ab") -> Path:
    """A checkout of ``rev`` (a commit) under the work directory, ``PREFIX-<commit>``, made once."""
    sha = commit_of(rev)
    path = work / f"{prefix}-{sha[:12]}"
    if not (path / "bin" / "nmt-train").is_file():
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "worktree", "add", "--force", "--detach", str(path), sha], cwd=REPO, check=True,
                       capture_output=True)
    return path


def clean_tree() -> bool | None:
    """Whether this checkout's tracked files are as committed (a figure counts only from a clean commit); None
    where it is no git checkout (or git cannot say): then no commit names what was measured."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if out.returncode else not out.stdout.strip()


def system_header(title: str, argv: list[str]) -> list[str]:
    """The lines every result file starts with: date, machine, versions, threads, load, command."""
    import torch

    return [
        title,
        "=" * len(title),
        f"date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads; Python {platform.python_version()}",
        f"nmtkit: {git_describe()} ({REPO})",
        f"load average at start (1, 5, 15 min): {load_average()}",
        "command: " + " ".join(shlex.quote(a) for a in [Path(sys.executable).name] + argv),
    ]


def start_report(script: str, title: str, argv: list[str], allow_dirty: bool) -> list[str] | None:
    """A results file's first lines (:func:`system_header`, the script named), or None with the reason on stderr
    where the tree has uncommitted changes and ``allow_dirty`` is not given (a figure counts only from a clean
    commit); a dirty trial's report says in its first line that it is no evidence."""
    out = system_header(title, [f"tests/bench/{script}"] + list(argv))
    out.insert(2, f"script: tests/bench/{script}")
    clean = clean_tree()
    if not clean:
        problem = "the tree has uncommitted changes: commit them first" if clean is False else \
            f"{REPO} is no git checkout (or git cannot read it): measure a clone"
        if not allow_dirty:
            print(f"{script}: {problem} (a figure counts only from a clean commit), or --allow-dirty for a trial "
                  "whose report says it is no evidence", file=sys.stderr)
            return None
        out.insert(0, "DIRTY TREE: a trial run, not evidence" if clean is False else
                   "NO COMMIT: measured outside a git checkout, a trial run, not evidence")
    return out


def write_report(lines: list[str], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def finish_report(out: list[str], goals: list, issue: int, path: Path, t0: float) -> int:
    """The goal lines and the closing load average, then the report written to ``path`` and printed; exit code 0."""
    out += ["", f"Goals (../shared/peers/README.md, issue {issue}):"] + [g.line() for g in goals]
    out.append(f"\nload average at end: {load_average()}; total time {(time.time() - t0) / 60:.1f} min")
    return fail_report(out, path, None)


def fail_report(out: list[str], path: Path, error: Exception | None) -> int:
    """Write (and print) the report, with the error that stopped it if any; the exit code."""
    if error is not None:
        out += ["", f"FAILED: {error}"]
    write_report(out, path)
    print("\n".join(out))
    if error is None:
        log(f"written {path}")
    return 0 if error is None else 1


def table(headers: list[str], rows: list[list], align: str | None = None) -> list[str]:
    """A plain-text table (``align``: one of l/r per column; default: first left, rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return out


# -- running and measuring ----------------------------------------------------------------------------------------

@dataclass
class Measured:
    """One finished command: exit code, wall seconds (parent side, start-up included), child peak RSS (KiB)."""

    cmd: list[str]
    rc: int
    wall_s: float
    max_rss_kb: float | None
    output: str  # stdout + stderr, interleaved
    log_path: Path | None = None


_RUSAGE_WRAPPER = (
    "import json, resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "json.dump({'rc': rc, 'max_rss_kb': ru.ru_maxrss}, open(sys.argv[1], 'w'))\n"
    "sys.exit(rc)\n"
)


def run_measured(cmd: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
                 log_path: str | Path | None = None, check: bool = True, timeout: float | None = None
                 ) -> Measured:
    """Run ``cmd``; wall time and the child's peak RSS. Output goes to ``log_path`` (or a temporary file)."""
    cmd = [str(c) for c in cmd]
    full_env = dict(os.environ)
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="nmtkit-bench-") as tmp:
        stats = Path(tmp, "stats")
        if os.access("/usr/bin/time", os.X_OK):
            wrapped = ["/usr/bin/time", "-v", "-o", str(stats)] + cmd
        else:
            wrapped = [sys.executable, "-c", _RUSAGE_WRAPPER, str(stats)] + cmd
        out_path = Path(log_path) if log_path else Path(tmp, "output")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(out_path, "wb") as out:
            try:
                rc = subprocess.run(wrapped, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = -9
        wall = time.perf_counter() - t0
        max_rss = None
        if stats.is_file():
            text = stats.read_text(encoding="utf-8", errors="replace")
            if wrapped[0] == "/usr/bin/time":
                m = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", text)
                max_rss = float(m.group(1)) if m else None
            else:
                try:
                    max_rss = float(json.loads(text)["max_rss_kb"])
                except (ValueError, KeyError):
                    pass
        output = out_path.read_text(encoding="utf-8", errors="replace")
    result = Measured(cmd, rc, wall, max_rss, output, Path(log_path) if log_path else None)
    if check and rc != 0:
        tail = "\n".join(output.splitlines()[-25:])
        where = f" (log: {log_path})" if log_path else ""
        raise BenchError(f"command failed with exit code {rc}{where}: {' '.join(cmd)}\n{tail}")
    return result


def nmtkit_tool(name: str) -> list[str]:
    """The command of an nmtkit tool from this checkout (its bin/ script; this module puts the checkout on
    PYTHONPATH)."""
    return [sys.executable, str(REPO / "bin" / name)]


def quiet_env() -> dict:
    return {"PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}


# -- the synthetic corpus -----------------------------------------------------------------------------------------

def proc_kib(pid: int, file: str, field: str) -> float | None:
    """A ``field: N kB`` value of /proc/PID/FILE (Linux), or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kb(pid: int) -> float | None:
    """A live process's peak resident set size so far (VmHWM, KiB)."""
    return proc_kib(pid, "status", "VmHWM")


def _line_count(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def make_synthetic_corpus(work: Path) -> Path:
    """The peers' seeded synthetic corpus in ``work/synth-data`` (train/dev/test .src/.tgt, plus dev100)."""
    out = work / "synth-data"
    want = {f"{s}.{side}": n for s, n in SYNTH_PAIRS.items() for side in ("src", "tgt")}
    if not all((out / f).is_file() and _line_count(out / f) == n for f, n in want.items()):
        script = PEERS_DIR / "make_corpus.py"
        if not script.is_file():
            raise BenchError(f"the corpus script {script} is missing (set $NMTKIT_PEERS to the peers folder)")
        log(f"making the synthetic corpus in {out}")
        tmp = work / "synth-data.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        run_measured([sys.executable, script, tmp])
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    for side in ("src", "tgt"):  # the template validates on dev100 (OpenNMT-py never does here: valid_steps 100000)
        with open(out / f"dev.{side}", encoding="utf-8") as f, open(out / f"dev100.{side}", "w", encoding="utf-8") as g:
            g.writelines(line for _, line in zip(range(100), f))
    return out


def _prepared_ok(dest: Path) -> bool:
    if not (dest / "manifest.json").is_file():
        return False
    try:
        from nmtkit.data.manifest import PreparedData

        PreparedData.open(str(dest))
        return True
    except Exception:  # another format version, a half-written directory: rebuild
        return False


def prepare_synthetic(work: Path, data: Path) -> Path:
    """The synthetic corpus as an nmtkit prepared directory with 8,000-word shortlists (cached)."""
    dest = work / "prep-synth-v8000"
    if not _prepared_ok(dest):
        log(f"nmt-prepare: synthetic corpus → {dest}")
        run_measured(nmtkit_tool("nmt-prepare") + [
            "-s", "src", "-t", "tgt", "--train", data / "train", "--valid", data / "dev", "--test", data / "test",
            "--src-vocab-size", SYNTH_VOCAB, "--tgt-vocab-size", SYNTH_VOCAB, "--no-normalize", "--workers", "2",
            "--dest", dest, "--force", "--quiet"], env=quiet_env(), log_path=work / "logs" / "prepare-synth.log")
        for split, raw in (("train", "train"), ("valid", "dev"), ("test", "test")):
            for side in ("src", "tgt"):  # Moses tokenisation must leave the synthetic words alone
                a, b = (dest / f"{split}.tok.{side}").read_bytes(), (data / f"{raw}.{side}").read_bytes()
                if a != b:
                    raise BenchError(f"nmt-prepare changed the synthetic {raw}.{side}: the tools would not see the "
                                     "same sentences")
    return dest


def prepare_real(work: Path, lines: int = 150000) -> Path:
    """A real corpus with 30,000-word shortlists for paper-size models: the first ``lines`` Hansards pairs
    (training) and news-test-2014 (test split; its tokenised text is ``test.tok.en``). Cached."""
    root = data_root()
    if root is None:
        raise BenchError("real data not found: set $NMTKIT_DATA or place the shared data at ../shared/data")
    dest = work / f"prep-hansards{lines // 1000}k-v{REAL_VOCAB}"
    if _prepared_ok(dest):
        return dest
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / f"hansards-{lines // 1000}k"
    for lang in ("en", "fr"):
        path = Path(f"{prefix}.{lang}")
        if not path.is_file() or _line_count(path) != lines:
            with gzip.open(root / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8", newline="\n") as f, \
                    open(f"{path}.tmp", "w", encoding="utf-8", newline="\n") as g:
                for _, line in zip(range(lines), f):
                    g.write(line)
            os.replace(f"{path}.tmp", path)
    log(f"nmt-prepare: first {lines:,} Hansards pairs + news-test-2014, {REAL_VOCAB:,}-word shortlists → {dest}")
    run_measured(nmtkit_tool("nmt-prepare") + [
        "-s", "en", "-t", "fr", "--train", prefix, "--test", root / "wmt14" / "newstest2014",
        "--src-vocab-size", REAL_VOCAB, "--tgt-vocab-size", REAL_VOCAB, "--workers", "2", "--dest", dest,
        "--force", "--quiet"], env=quiet_env(), log_path=work / "logs" / "prepare-real.log")
    return dest


def prepare_hour(work: Path, pairs: int = 150000) -> Path:
    """The hour's prepared data at its size (``examples/one-hour.sh``'s nmt-prepare): ``pairs`` Hansards training
    pairs drawn at random (seed 1, in the file's order), a joint SentencePiece vocabulary of 16,000 units that spells
    numbers digit by digit, pairs of at most 36 pieces, 500 pairs of the dev sittings for validation and the
    test sittings as the test split. Cached."""
    import random

    root = data_root()
    if root is None:
        raise BenchError("real data not found: set $NMTKIT_DATA or place the shared data at ../shared/data")
    dest = work / f"prep-hour{pairs // 1000}k-spm16000"
    if _prepared_ok(dest):
        return dest
    work.mkdir(parents=True, exist_ok=True)
    prefix, valid = work / f"hour-{pairs // 1000}k", work / "hour-valid500"
    rows = {}
    for lang in ("en", "fr"):
        with gzip.open(root / "hansards" / f"train.{lang}.gz", "rt", encoding="utf-8", newline="\n") as f:
            rows[lang] = f.read().split("\n")[:-1]
    keep = sorted(random.Random(1).sample(range(len(rows["en"])), min(pairs, len(rows["en"]))))
    for lang in ("en", "fr"):
        Path(f"{prefix}.{lang}").write_text("".join(rows[lang][i] + "\n" for i in keep), encoding="utf-8")
        with open(root / "hansards" / f"dev.{lang}", encoding="utf-8", newline="\n") as f:
            Path(f"{valid}.{lang}").write_text("".join(line for _, line in zip(range(500), f)), encoding="utf-8")
    log(f"nmt-prepare: {pairs:,} Hansards pairs, joint SentencePiece 16,000 units, max 36 pieces → {dest}")
    run_measured(nmtkit_tool("nmt-prepare") + [
        "-s", "en", "-t", "fr", "--train", prefix, "--valid", valid, "--test", root / "hansards" / "test",
        "--spm-vocab-size", "16000", "--spm-split-digits", "--src-vocab-size", "16000", "--tgt-vocab-size", "16000",
        "--max-len", "36", "--workers", "2", "--dest", dest, "--force", "--quiet"],
        env=quiet_env(), log_path=work / "logs" / "prepare-hour.log")
    return dest


# -- nmtkit logs ----------------------------------------------------------------------------------------------------

def nmtkit_tokens_per_s(jsonl: Path, skip: int) -> dict:
    """Target tokens per second from nmt-train's JSON log, counting only updates after the first ``skip``.

    Each ``train`` record covers the updates since the previous one (``tgt_tokens_per_s`` over training-step time;
    ``elapsed`` is the cumulative training time), so a window's tokens are rate × Δelapsed."""
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()]
    train = [r for r in records if r.get("type") == "train"]
    prev_update, prev_elapsed = 0, 0.0
    tokens = seconds = 0.0
    updates = 0
    for r in train:
        dt = r["elapsed"] - prev_elapsed
        if prev_update >= skip:
            tokens += r["tgt_tokens_per_s"] * dt
            seconds += dt
            updates += r["update"] - prev_update
        prev_update, prev_elapsed = r["update"], r["elapsed"]
    if seconds <= 0:
        raise BenchError(f"{jsonl}: no training record after update {skip}")
    return {"tok_s": tokens / seconds, "updates": updates, "seconds": seconds, "tokens": tokens,
            "tok_per_update": tokens / max(updates, 1), "loss": train[-1]["loss"] if train else None}


# -- OpenNMT-py ----------------------------------------------------------------------------------------------------

def find_onmt(venv: Path) -> tuple[Path | None, str]:
    """(bin directory, '') when the OpenNMT-py venv is usable, else (None, reason)."""
    bindir = Path(venv) / "bin"
    missing = [t for t in ("python", "onmt_build_vocab", "onmt_train", "onmt_translate") if not (bindir / t).exists()]
    if missing:
        return None, (f"OpenNMT-py not found in {venv} (missing {', '.join(missing)}); install it per "
                      f"{PEERS_DIR / 'README.md'} or pass --onmt-venv")
    try:
        out = subprocess.run([str(bindir / "python"), "-c", "import onmt; print(onmt.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"OpenNMT-py in {venv} does not start: {e}"
    if out.returncode != 0:
        return None, f"OpenNMT-py in {venv} does not import: {out.stderr.strip().splitlines()[-1:]}"
    version = out.stdout.strip()
    if version != ONMT_VERSION:
        log(f"warning: OpenNMT-py {version} in {venv}, the peers' figures are for {ONMT_VERSION}")
    return bindir, ""


def onmt_env() -> dict:
    # torch >= 2.6 defaults torch.load to weights_only=True, which OpenNMT-py 3.5.1's checkpoints do not pass
    return {**quiet_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def onmt_config(work: Path, data: Path, model_dir: Path, updates: int, report_every: int = 50, workers: int = 0,
                enc_hid: int = 256, dec_hid: int = 256, bucket_size: int | None = None) -> Path:
    """Fill the peers' OpenNMT-py template (``opennmt.yaml.tmpl``) for this work dir; returns the yaml path.

    The README's model: ``enc_hid_size`` 256 (a ``brnn`` splits it: 128 per direction), decoder 256. ``workers``
    0 keeps data loading in the training process, as nmtkit does (a loader process would compete for the two
    cores). ``bucket_size`` None keeps OpenNMT-py's default (262,144 examples: the first 50 updates then include
    filling that bucket, which the counting rule excludes)."""
    text = (PEERS_DIR / "opennmt.yaml.tmpl").read_text(encoding="utf-8")
    vocab_dir = work / "onmt-vocab"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    model_dir.mkdir(parents=True, exist_ok=True)
    text = text.replace("/tmp/peers/runs/opennmt", str(vocab_dir)).replace("/tmp/peers/data", str(data))
    for key, value in (("@MODEL_DIR@", model_dir), ("@UPDATES@", updates), ("@WORKERS@", workers),
                       ("@ENC_HID@", enc_hid), ("@DEC_HID@", dec_hid)):
        text = text.replace(key, str(value))
    text, n = re.subn(r"(?m)^report_every:.*$", f"report_every: {report_every}", text)
    if n != 1:
        raise BenchError("the OpenNMT-py template has no report_every line to set")
    if bucket_size:
        text += f"bucket_size: {bucket_size}\n"
    left = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if left or "/tmp/peers" in text:
        raise BenchError(f"unfilled placeholders in the OpenNMT-py template: {left or '/tmp/peers'}")
    path = model_dir / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def onmt_build_vocab(bindir: Path, config: Path, work: Path) -> None:
    """``onmt_build_vocab`` over the whole corpus (cached in work/onmt-vocab)."""
    vocab_dir = work / "onmt-vocab"
    if (vocab_dir / "vocab.src").is_file() and (vocab_dir / "vocab.tgt").is_file():
        return
    log("onmt_build_vocab")
    run_measured([bindir / "onmt_build_vocab", "-config", config, "-n_sample", "-1"], env=onmt_env(),
                 log_path=work / "logs" / "onmt-build-vocab.log")


_ONMT_STEP = re.compile(
    r"Step\s+(\d+)(?:/\s*\d+)?;.*?sents:\s*(\d+);\s*bsz:\s*([\d.]+)/\s*([\d.]+)/\s*([\d.]+);\s*"
    r"([\d.]+)/\s*([\d.]+)\s*tok/s;\s*(\d+)\s*sec")


def onmt_tokens_per_s(log_text: str, skip: int) -> dict:
    """Target tokens per second from OpenNMT-py's training log, after the first ``skip`` updates.

    Each ``Step`` report covers the batches since the previous report: ``sents`` sentences, ``bsz`` the mean
    source/target real tokens and sentences per batch, then source/target tokens per second over that interval.
    Tokens of an interval = (sents / sentences per batch) × target tokens per batch; its time = tokens / rate."""
    tokens = seconds = 0.0
    updates, prev = 0, 0
    for m in _ONMT_STEP.finditer(log_text):
        step, sents = int(m.group(1)), float(m.group(2))
        tgt_per_batch, sents_per_batch, tgt_rate = float(m.group(4)), float(m.group(5)), float(m.group(7))
        batches = round(sents / sents_per_batch) if sents_per_batch else step - prev
        tok = batches * tgt_per_batch
        if prev >= skip and tgt_rate > 0:
            tokens += tok
            seconds += tok / tgt_rate
            updates += step - prev
        prev = step
    if seconds <= 0:
        raise BenchError(f"no OpenNMT-py training report after update {skip} in the log")
    return {"tok_s": tokens / seconds, "updates": updates, "seconds": seconds, "tokens": tokens,
            "tok_per_update": tokens / max(updates, 1)}


def onmt_params(log_text: str) -> int | None:
    m = re.search(r"number of parameters:\s*(\d+)", log_text)
    return int(m.group(1)) if m else None


# -- text ----------------------------------------------------------------------------------------------------------

def bleu(hyps: list[str], refs: list[str], max_n: int = 4) -> float:
    """Corpus BLEU on whitespace tokens (no smoothing), as multi-bleu.perl: a sanity figure, not an evaluation."""
    match, total = [0] * max_n, [0] * max_n
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h, r = h.split(), r.split()
        hyp_len += len(h)
        ref_len += len(r)
        for n in range(1, max_n + 1):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if min(match) == 0 or hyp_len == 0:
        return 0.0
    log_p = sum(math.log(m / t) for m, t in zip(match, total)) / max_n
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def translate_timed(cmd: list, src: Path, out: Path, lines: int, env: dict) -> tuple[float, list[str]]:
    """Run an ``nmt-translate`` command over ``src`` into ``out``: (its wall clock in seconds, the lines it wrote),
    or a BenchError when it fails or writes other than ``lines`` lines."""
    t0 = time.perf_counter()
    with open(src, "rb") as fin, open(out, "wb") as fout:
        rc = subprocess.run([str(c) for c in cmd], stdin=fin, stdout=fout, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - t0
    if rc.returncode:
        raise BenchError(f"nmt-translate failed ({rc.returncode}): {rc.stderr.decode(errors='replace')[-2000:]}")
    hyp = out.read_text(encoding="utf-8").splitlines()
    if len(hyp) != lines:
        raise BenchError(f"nmt-translate wrote {len(hyp)} lines for {lines}")
    return wall, hyp


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines if limit is None else lines[:limit]


@dataclass
class Goal:
    what: str
    value: float | None
    target: float
    unit: str = ""
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return f"- {self.what}: not measured"
        verdict = "MET" if self.value >= self.target else "NOT MET"
        f = ",.2f" if self.unit == "×" else ",.0f"
        return f"- {self.what}: {self.value:{f}}{self.unit} (goal ≥ {self.target:{f}}{self.unit}): {verdict}"


def kept_tokenised_pairs(prepared: Path, dest: Path) -> None:
    """The pairs a prepared corpus trains on, as Moses tokens for a peer: the ``train.tok.*`` lines that
    ``train.kept`` lists, written as ``dest/train.{en,fr}.tok`` (whole files only: temporary names, then renames),
    with the validation pairs as ``dest/dev.{en,fr}.tok``.  Done once: nothing happens when they exist."""
    if (dest / "train.fr.tok").is_file():
        return
    kept = {int(x) for x in (prepared / "train.kept").read_text().split()}
    for lang in ("en", "fr"):
        with open(prepared / f"train.tok.{lang}", encoding="utf-8") as f, \
             open(dest / f"train.{lang}.tok.part", "w", encoding="utf-8") as out:
            out.writelines(line for i, line in enumerate(f, 1) if i in kept)
        shutil.copyfile(prepared / f"valid.tok.{lang}", dest / f"dev.{lang}.tok")
    for lang in ("en", "fr"):
        os.replace(dest / f"train.{lang}.tok.part", dest / f"train.{lang}.tok")
