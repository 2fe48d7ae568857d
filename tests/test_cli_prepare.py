"""bin/nmt-prepare as a user runs it: bad inputs, existing destinations, signals, --help.

Every bad input must give a non-zero exit code, one error line on stderr that names the file (and line, when there
is one) and the problem, nothing on stdout, and leave nothing behind: no DEST when there was none, an existing DEST
unchanged, no temporary siblings.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "bin" / "nmt-prepare"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| nmtkit")


def nmt_prepare(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(BIN), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def error_line(result) -> str:
    """The single error line of a failed run (progress log lines aside); fails on anything else."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr, result.stderr
    others = [line for line in result.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(others) == 1, result.stderr
    assert others[0].startswith("nmt-prepare: error: "), others[0]
    return others[0][len("nmt-prepare: error: "):]


def snapshot(directory: Path) -> dict:
    """Every path below ``directory`` (hidden ones included) with its bytes and modification time."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = Path(root, name)
            out[str(p.relative_to(directory))] = (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
    return out


def write(path: Path, lines, raw: bytes | None = None) -> Path:
    path.write_bytes(raw if raw is not None else ("\n".join(lines) + "\n").encode("utf-8"))
    return path


EN = ["The cat sleeps.", "A dog barks.", "It rains today.", "We eat bread.", "She reads a book."]
FR = ["Le chat dort.", "Un chien aboie.", "Il pleut aujourd'hui.", "Nous mangeons du pain.", "Elle lit un livre."]


@pytest.fixture
def corpus(tmp_path):
    """A tiny valid corpus in tmp_path/in/; tests write bad variants beside it. DEST is tmp_path/out."""
    d = tmp_path / "in"
    d.mkdir()
    write(d / "ok.en", EN)
    write(d / "ok.fr", FR)
    return d


def run_bad(tmp_path, *args, dest_exists=False, timeout=120):
    """Run with a bad input; check the one-line error and that nothing was left behind. Returns the message."""
    dest = tmp_path / "out"
    before = snapshot(tmp_path)
    r = nmt_prepare("-s", "en", "-t", "fr", "--dest", dest, *args, timeout=timeout)
    msg = error_line(r)
    assert snapshot(tmp_path) == before  # no DEST, no temporary sibling, an existing DEST untouched
    assert dest.exists() == dest_exists
    return msg


# -- bad inputs ------------------------------------------------------------------------------------------------


def test_different_line_counts_say_which_file_has_how_many(tmp_path, corpus):
    write(corpus / "short.en", EN)
    write(corpus / "short.fr", FR[:3])
    msg = run_bad(tmp_path, "--train", corpus / "short")
    assert msg.startswith(f"{corpus / 'short.fr'}: has 3 ")
    assert f"{corpus / 'short.en'} has 5" in msg and "line counts" in msg


def test_different_line_counts_in_a_test_split_leave_nothing_behind(tmp_path, corpus):
    # The training split is complete (and written to the temporary directory) before the test split fails.
    write(corpus / "long.en", EN + ["One more."])
    write(corpus / "long.fr", FR)
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--test", corpus / "ok", "--test", corpus / "long")
    assert msg.startswith(f"{corpus / 'long.fr'}: has 5 ") and f"{corpus / 'long.en'} has 6" in msg


def test_invalid_utf8_names_the_line(tmp_path, corpus):
    write(corpus / "bad.en", EN)
    write(corpus / "bad.fr", None, raw=b"Le chat dort.\nUn chien aboie.\nIl pleut \xe0 Paris.\nx\ny\n")
    msg = run_bad(tmp_path, "--train", corpus / "bad")
    assert msg.startswith(f"{corpus / 'bad.fr'}:3: ") and "invalid UTF-8" in msg


def test_invalid_utf8_deep_in_a_file_with_two_workers(tmp_path, corpus):
    n, bad_line = 2600, 2345  # beyond the first chunks, handed out to the worker pool
    write(corpus / "big.en", [f"Sentence number {i}." for i in range(n)])
    lines = [f"Phrase numéro {i}.".encode() for i in range(n)]
    lines[bad_line - 1] = b"caf\xc3 au lait"
    write(corpus / "big.fr", None, raw=b"\n".join(lines) + b"\n")
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--valid", corpus / "big", "--workers", 2)
    assert msg.startswith(f"{corpus / 'big.fr'}:{bad_line}: ") and "invalid UTF-8" in msg


def test_missing_files(tmp_path, corpus):
    write(corpus / "half.en", EN)
    msg = run_bad(tmp_path, "--train", corpus / "half")
    assert msg.startswith(f"{corpus / 'half'}: no fr file") and "half.fr" in msg
    msg = run_bad(tmp_path, "--train", f"{corpus / 'ok.en'},{corpus / 'nope.fr'}")
    assert msg == f"{corpus / 'nope.fr'}: no such file"
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--bpe-codes", corpus / "nope.codes")
    assert msg.startswith(f"{corpus / 'nope.codes'}: no such file")


SGML_HEAD = '<{kind} setid="t" srclang="any">\n<doc docid="d1" genre="news">\n'


def _sgml(path, kind, texts, ids):
    segs = "".join(f'<seg id="{i}">{t}</seg>\n' for i, t in zip(ids, texts))
    path.write_text(SGML_HEAD.format(kind=kind) + segs + f"</doc>\n</{kind}>\n", encoding="utf-8")
    return path


def test_sgml_with_mismatched_seg_ids(tmp_path, corpus):
    src = _sgml(corpus / "t-src.en.sgm", "srcset", EN, [1, 2, 3, 4, 5])
    ref = _sgml(corpus / "t-ref.fr.sgm", "refset", FR, [1, 2, 4, 3, 5])
    msg = run_bad(tmp_path, "--train", f"{src},{ref}")
    assert msg.startswith(f"{ref}:5: ")  # physical line 5 holds the third <seg>
    assert 'id="4"' in msg and 'id="3"' in msg and str(src) in msg


def test_real_sgml_with_one_changed_seg_id(tmp_path, corpus, data_dir):
    sgm = data_dir / "wmt14" / "sgm"
    lines = (sgm / "newstest2014-fren-ref.fr.sgm").read_bytes().split(b"\n")
    target = [i for i, line in enumerate(lines) if line.startswith(b"<seg ")][1500]
    lines[target] = re.sub(rb'id="\d+"', b'id="9999"', lines[target])
    ref = write(corpus / "ref.fr.sgm", None, raw=b"\n".join(lines))
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--test", f"{sgm / 'newstest2014-fren-src.en.sgm'},{ref}")
    assert msg.startswith(f"{ref}:{target + 1}: ") and 'id="9999"' in msg


def test_truncated_gzip(tmp_path, corpus):
    data = gzip.compress("".join(f"Sentence {i}.\n" for i in range(3000)).encode())
    write(corpus / "gz.en.gz", None, raw=data[: len(data) // 2])
    write(corpus / "gz.fr", [f"Phrase {i}." for i in range(3000)])
    msg = run_bad(tmp_path, "--train", corpus / "gz")
    assert msg.startswith(f"{corpus / 'gz.en.gz'}:") and "cannot read" in msg


def test_corrupt_gzip(tmp_path, corpus):
    data = bytearray(gzip.compress(("Hello world.\n" * 3000).encode()))
    data[20] ^= 0xFF
    data[30] ^= 0xFF
    write(corpus / "gz.en.gz", None, raw=bytes(data))
    write(corpus / "gz.fr", ["Bonjour."] * 3000)
    msg = run_bad(tmp_path, "--train", corpus / "gz")
    assert msg.startswith(f"{corpus / 'gz.en.gz'}:") and "cannot read" in msg


def test_bpe_merges_with_bpe_codes(tmp_path, corpus):
    write(corpus / "codes", ["#version: 0.2", "t h"])
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--bpe-merges", 10, "--bpe-codes", corpus / "codes")
    assert "--bpe-merges" in msg and "--bpe-codes" in msg


def test_bad_bpe_codes_file_is_a_one_line_error_not_a_hang(tmp_path, corpus):
    # subword-nmt reports a bad codes file with sys.exit(); in a pool worker that used to respawn forever.
    write(corpus / "bad.codes", ["#version: 0.2", "T h", "not a merge"])
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--bpe-codes", corpus / "bad.codes", "--workers", 2,
                  timeout=60)
    assert msg.startswith(f"{corpus / 'bad.codes'}:3: ")
    write(corpus / "empty.codes", ["#version: 0.2"])  # no merge at all
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--bpe-codes", corpus / "empty.codes", timeout=60)
    assert msg.startswith(f"{corpus / 'empty.codes'}:2: ")


def test_bpe_merges_when_no_merge_can_be_learned(tmp_path, corpus):
    write(corpus / "one.en", ["Xyz."])  # every symbol pair occurs once: subword-nmt learns no merge
    write(corpus / "one.fr", ["Qwv."])
    for workers in (1, 2):
        msg = run_bad(tmp_path, "--train", corpus / "one", "--bpe-merges", 10, "--workers", workers, timeout=60)
        assert msg.startswith(f"{corpus / 'one.en'}: no BPE merge could be learned")


@pytest.mark.parametrize("args,needle", [
    (["-s", "en", "-t", "en"], "two different"),
    (["--max-len", "0"], "--max-len"),
    (["--src-vocab-size", "0"], "--src-vocab-size"),
    (["--workers", "0"], "--workers"),
])
def test_bad_option_values(tmp_path, corpus, args, needle):
    msg = run_bad(tmp_path, "--train", corpus / "ok", *args)
    assert needle in msg


def test_vocab_from_refuses_the_vocabulary_sizes_it_would_ignore(tmp_path, corpus):
    assert nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--dest", tmp_path / "base",
                       "--src-vocab-size", "20").returncode == 0
    for option in ("--src-vocab-size", "--tgt-vocab-size"):
        msg = run_bad(tmp_path, "--train", corpus / "ok", "--vocab-from", tmp_path / "base", option, "100")
        assert msg == f"--vocab-from brings its directory's vocabularies, of their own sizes; drop {option}"


# -- the validation set: a model scores each of its pairs whole ---------------------------------------------------


def test_an_empty_valid_set_is_refused(tmp_path, corpus):
    write(corpus / "empty.en", None, raw=b"")
    write(corpus / "empty.fr", None, raw=b"")
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--valid", corpus / "empty")
    assert msg == f"{corpus / 'empty.en'}: is empty: a validation set needs at least one pair"


def test_a_valid_line_too_long_to_score_whole_is_refused_and_the_longest_allowed_is_not(tmp_path, corpus):
    """Validation's teacher forcing holds a source x target attention matrix per pair: a 200,000-word line asked
    for a terabyte at the first validation, after the training before it.  1,000 model tokens a side is the most."""
    def words(n):
        return " ".join(f"w{i}" for i in range(n))  # (n Moses tokens, n model tokens without subwords)

    write(corpus / "long.en", EN)
    write(corpus / "long.fr", FR[:2] + [words(1001)] + FR[3:])
    msg = run_bad(tmp_path, "--train", corpus / "ok", "--valid", corpus / "long")
    assert msg == (f"{corpus / 'long.fr'}:3: is 1,001 model tokens long, more than the 1,000 a validation pair may "
                   "have (validation scores and decodes each pair whole): shorten or remove it")
    write(corpus / "edge.en", EN[:4] + [words(1000)])
    write(corpus / "edge.fr", FR)
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--valid", corpus / "edge", "--dest",
                    tmp_path / "edge")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "edge" / "valid.tok.en").read_text(encoding="utf-8").splitlines()[4] == words(1000)


def test_dest_that_is_a_file_is_a_usage_error(tmp_path, corpus):
    write(tmp_path / "out", ["not a directory"])
    before = snapshot(tmp_path)
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--dest", tmp_path / "out")
    assert r.returncode == 2 and str(tmp_path / "out") in r.stderr and "is a file" in r.stderr
    assert snapshot(tmp_path) == before


def test_failure_removes_parents_it_created(tmp_path, corpus):
    write(corpus / "bad.en", EN[:2])
    write(corpus / "bad.fr", FR[:3])
    before = snapshot(tmp_path)
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "bad", "--dest", tmp_path / "a" / "b" / "out")
    error_line(r)
    assert snapshot(tmp_path) == before


def test_usage_error_exits_2(tmp_path, corpus):
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok")  # no --dest
    assert r.returncode == 2 and "--dest" in r.stderr and r.stdout == ""
    assert os.listdir(tmp_path) == ["in"]


# -- existing destinations ---------------------------------------------------------------------------------------


def test_existing_prepared_dest_is_refused_without_force_and_replaced_with_it(tmp_path, corpus):
    dest = tmp_path / "out"
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--dest", dest, "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert (dest / "manifest.json").is_file()

    msg = run_bad(tmp_path, "--train", corpus / "ok", dest_exists=True)
    assert msg == f"{dest}: already holds a prepared corpus; use --force to replace it"

    write(corpus / "two.en", EN[:2])
    write(corpus / "two.fr", FR[:2])
    (dest / "stale.txt").write_text("from an earlier run")
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "two", "--dest", dest, "--force")
    assert r.returncode == 0, r.stderr
    assert not (dest / "stale.txt").exists()  # replaced, not merged
    assert (dest / "train.tok.en").read_text(encoding="utf-8") == "The cat sleeps .\nA dog barks .\n"
    assert sorted(os.listdir(tmp_path)) == ["in", "out"]  # no temporary or old siblings


def test_force_never_replaces_a_directory_that_is_not_a_prepared_corpus(tmp_path, corpus):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "thesis.tex").write_text("years of work")
    for extra in ([], ["--force"]):
        msg = run_bad(tmp_path, "--train", corpus / "ok", *extra, dest_exists=True)
        assert msg.startswith(f"{dest}: already holds files")


def test_force_failing_run_keeps_the_old_corpus(tmp_path, corpus):
    dest = tmp_path / "out"
    assert nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--dest", dest, "-q").returncode == 0
    write(corpus / "bad.en", EN)
    write(corpus / "bad.fr", FR[:4])
    run_bad(tmp_path, "--train", corpus / "bad", "--force", dest_exists=True)


# -- success, quietness, --help ----------------------------------------------------------------------------------


TRICKY_EN = ["one\rtwo", "a\u2028b", "c\x85d", "e\x0cf", "g\x1ch", "", "i\u2029j", "The end."]
TRICKY_FR = ["un\rdeux", "A\u2028B", "C\x85D", "E\x0cF", "G\x1cH", "vide", "I\u2029J", "La fin."]


def test_success_keeps_line_counts_and_writes_nothing_to_stdout(tmp_path, corpus):
    write(corpus / "tricky.en", TRICKY_EN)
    write(corpus / "tricky.fr", TRICKY_FR)
    dest = tmp_path / "out"
    r = nmt_prepare("-s", "en", "-t", "fr", "--train", corpus / "ok", "--valid", corpus / "tricky", "--test",
                    corpus / "tricky", "--train", corpus / "tricky", "--dest", dest, "--workers", 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert all(LOG_LINE.match(line) for line in r.stderr.splitlines()) and "13 pairs in" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["in", "out"]
    for split in ("valid", "test"):
        for lang in ("en", "fr"):
            tok = (dest / f"{split}.tok.{lang}").read_bytes().decode("utf-8").split("\n")
            assert len(tok) == len(TRICKY_EN) + 1 and tok[-1] == ""
            idx = (dest / f"{split}.{lang}.idx").read_bytes()
            assert int.from_bytes(idx[16:24], "little") == len(TRICKY_EN)  # sentences in the binarized corpus
        assert (dest / f"{split}.tok.en").read_text(encoding="utf-8").split("\n")[1] == "a b"
    # Train: 5 + 8 lines, one pair with an empty side removed (line 5 + 6 = 11 of the concatenation).
    kept = (dest / "train.kept").read_text().split()
    assert len(kept) == 12 and "11" not in kept


def test_help_works_and_does_not_import_torch():
    r = nmt_prepare("--help")
    assert r.returncode == 0
    for option in ("--source-lang", "--train", "--valid", "--test", "--dest", "--bpe-merges", "--bpe-codes",
                   "--workers", "--force", "--max-len", "--lowercase"):
        assert option in r.stdout
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from nmtkit.cli import prepare\n"
            "r = CliRunner().invoke(prepare.main, ['--help'])\n"
            "assert r.exit_code == 0 and '--bpe-merges' in r.output, r.output\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr


# -- signals ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big(data_dir, tmp_path_factory):
    """The first 100,000 Hansards pairs as plain text: a run that takes tens of seconds."""
    d = tmp_path_factory.mktemp("big")
    for lang in ("en", "fr"):
        with gzip.open(data_dir / "hansards" / f"train.{lang}.gz", "rb") as f, open(d / f"big.{lang}", "wb") as out:
            for i, line in enumerate(f):
                if i == 100_000:
                    break
                out.write(line)
    return d / "big"


def _processes_mentioning(needle: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle.encode() in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_run_leaves_nothing(tmp_path, big, sig, workers):
    dest = tmp_path / f"out-{sig.name}-{workers}"
    proc = subprocess.Popen(
        [sys.executable, str(BIN), "-s", "en", "-t", "fr", "--train", str(big), "--dest", str(dest),
         "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # A shell may start background jobs with SIGINT ignored; a user's Ctrl-C reaches a default handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        def begun():  # the run has begun: its temporary directory is there
            if any(n.startswith(f".{dest.name}.") for n in os.listdir(tmp_path)):
                return True
            assert proc.poll() is None, "the run did not start"
            return False

        wait_until(begun, 60, f"nmt-prepare to create {tmp_path}/.{dest.name}.* (the run did not start)")
        # (deliberate, not a wait for something: the signal comes a second into the run, in the middle of its work,
        # not as it creates its directory; the run is longer than that, as the next line checks)
        time.sleep(1.0)
        assert proc.poll() is None, "the run ended before the signal"
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal reaches the whole process group, workers included
        else:
            proc.send_signal(sig)  # kill PID
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out == ""
    others = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    assert others == ["nmt-prepare: interrupted; no partial output was left behind"], err
    assert os.listdir(tmp_path) == []  # no DEST, no temporary directory
    wait_until(lambda: _processes_mentioning(str(dest)) == [], 30,  # no worker process left running
               lambda: f"the workers to exit (pids still running: {_processes_mentioning(str(dest))})")
