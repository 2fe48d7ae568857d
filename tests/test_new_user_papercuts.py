"""What a new user met (#57 item 13), each on real runs of the tools: ``--keep-last 1`` keeps one numbered checkpoint
even where the run ends off the save grid; ``nmt-prepare`` says how far it is; ``nmt-translate -i FILE`` shows the
file's line count as its total; ``nmt-align --plot-dir`` says where its plots went and skips, in one line, a
figure too large to draw; the tests' skip reason names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nmtkit.data import checkpoint

from conftest import REPO, DATA_MISSING, fault_train_cfg, run_tool

pytestmark = pytest.mark.usefixtures("restore_threads")


def _numbered(run: Path) -> list[str]:
    return sorted(p.name for p in run.glob("checkpoint[0-9]*.pt"))


# -- --keep-last -----------------------------------------------------------------------------------------------------

def test_keep_last_1_keeps_one_numbered_checkpoint_when_the_run_ends_off_the_grid(small, tmp_path, caplog):
    """The quick start's run ends at its time budget between two validations; that last validation beats the
    scheduled ones (the rate is annealed), and checkpoint1000.pt (83 MB) stayed beside the last one.  (Here the
    limit is --max-updates 3 with validations every 2.)"""
    from nmtkit.train.trainer import train

    run = tmp_path / "run"
    common = dict(valid_every=2, valid_bleu_sentences=0, best_metric="loss", keep_last=1)
    assert train(fault_train_cfg(small, run, max_updates=3, **common))["status"] == "done"
    state = checkpoint.load(run / "checkpoint_last.pt")["train"]["state"]
    assert (state["update"], state["best_update"], state["best_saved_update"]) == (3, 2, 3)  # (what leaked it)
    assert _numbered(run) == ["checkpoint3.pt"]
    assert (run / "checkpoint_best.pt").samefile(run / "checkpoint3.pt")
    assert (run / "checkpoint_last.pt").samefile(run / "checkpoint3.pt")
    # a resume past that limit goes on; checkpoint_best.pt stays what it holds until a validation beats it
    with caplog.at_level("WARNING"):
        summary = train(fault_train_cfg(small, run, max_updates=4, resume=True, **common))
    assert summary["update"] == 4 and _numbered(run) == ["checkpoint4.pt"]
    assert "checkpoint_best.pt stays checkpoint3.pt" in caplog.text and "(--keep-last)" in caplog.text
    best = checkpoint.load(run / "checkpoint_best.pt")["train"]["state"]
    assert best["update"] in (3, 4) and summary["best_update"] == best["update"]


# -- progress ---------------------------------------------------------------------------------------------------------

def test_nmt_prepare_says_each_step_on_stderr(data_dir, tmp_path):
    """The quick start's nmt-prepare ran four minutes without a word (it was --quiet, and said nothing until a
    split was done): each of its five steps now says when it starts."""
    from conftest import lines_of

    for lang in ("en", "fr"):
        (tmp_path / f"train.{lang}").write_text("\n".join(lines_of(data_dir / "multi30k" / f"train.{lang}", 200))
                                                + "\n", encoding="utf-8")
    res = run_tool("nmt-prepare", "-s", "en", "-t", "fr", "--train", tmp_path / "train", "--dest", tmp_path / "data",
                   "--bpe-merges", 50)
    assert res.returncode == 0, res.stderr
    steps = re.findall(r"nmtkit\.prepare \| (step \d/5: [^\n]*)", res.stderr)
    assert [s[:8] for s in steps] == [f"step {k}/5" for k in range(1, 6)], res.stderr
    assert steps[0] == "step 1/5: tokenising train (1 worker)" and "learning 50 joint BPE merges" in steps[1]
    assert "train: 200 pairs read and tokenised" in res.stderr
    quiet = run_tool("nmt-prepare", "-s", "en", "-t", "fr", "--train", tmp_path / "train", "--dest", tmp_path / "q",
                     "--bpe-merges", 50, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_a_long_pass_says_how_far_it_is_at_most_every_interval(caplog):
    """progress.Ticker, off a terminal: a log line when ``interval`` seconds have passed since the last one (the
    clock is the test's), none between, none under --quiet."""
    import logging

    from nmtkit.progress import Ticker

    now = [0.0]
    log = logging.getLogger("nmtkit.test-ticker")
    with caplog.at_level(logging.INFO, logger=log.name):
        with Ticker(log, "train: tokenising", "pairs", total=1000, interval=15, clock=lambda: now[0]) as ticker:
            for k in range(1, 101):
                now[0] = k * 0.5  # (two pairs a second: a line every 30 pairs)
                ticker.update()
    assert [r.getMessage() for r in caplog.records] == [f"train: tokenising: {n} pairs of 1,000 so far"
                                                        for n in (30, 60, 90)]
    caplog.clear()
    log.setLevel(logging.WARNING)
    try:
        with Ticker(log, "quiet", clock=lambda: now[0]) as ticker:
            now[0] += 100
            ticker.update()
    finally:
        log.setLevel(logging.NOTSET)
    assert caplog.records == []


def _on_a_terminal(args: list, timeout: float = 300) -> str:
    """A tool run with its stderr on a pseudo-terminal of 120 columns (where tqdm draws its bar): what it wrote
    there."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # (EIO: every end of the terminal's other side is closed)
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        assert proc.wait(timeout=timeout) == 0, b"".join(chunks)[-3000:]
    return b"".join(chunks).decode("utf-8", "replace")


def test_nmt_translate_shows_the_files_line_count_and_the_lines_read(small_model, tmp_path):
    """A bar of "0line" until the first window was decoded: the bar's total is now the file's line count, and it
    says it is reading and decoding until lines come out, then how many it has read."""
    source = tmp_path / "in.en"
    source.write_text("".join(f"a man number {k} is walking .\n" for k in range(23)), encoding="utf-8")
    shown = _on_a_terminal([REPO / "bin" / "nmt-translate", "-m", small_model, "-i", source, "-o", tmp_path / "out",
                            "--beam", 2, "--threads", 1])
    assert "/23 " in shown and "23/23 " in shown, shown[-2000:]
    assert "reading, decoding the first lines" in shown and "read 23" in shown, shown[-2000:]
    assert len((tmp_path / "out").read_text(encoding="utf-8").splitlines()) == 23


# -- nmt-align --plot-dir --------------------------------------------------------------------------------------------

def test_nmt_align_says_where_its_plots_went_and_skips_a_line_too_long_to_draw(small_model, tmp_path):
    """One 420-word line took nmt-align to 2.3 GB drawing its figure, and nothing said where the plots went."""
    from nmtkit.plots import MAX_PLOT_WORDS

    long_src = " ".join(["a man is walking ."] * 30)  # (150 words: a figure of some 650 MB)
    long_tgt = " ".join(["un homme marche ."] * 30)
    (tmp_path / "s.en").write_text(f"a man is walking .\n{long_src}\na dog runs .\n", encoding="utf-8")
    (tmp_path / "t.fr").write_text(f"un homme marche .\n{long_tgt}\nun chien court .\n", encoding="utf-8")
    plots = tmp_path / "plots"
    res = run_tool("nmt-align", "-m", small_model, "-s", tmp_path / "s.en", "-t", tmp_path / "t.fr", "--tokenized",
                   "--plot-dir", plots, "--pharaoh", tmp_path / "out.align")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-2] == (f"nmt-align: not plotted: line 2 (more than {MAX_PLOT_WORDS} words on a side: such a "
                         "figure takes gigabytes of memory to draw)"), res.stderr
    assert lines[-1] == f"nmt-align: 2 attention plots in {plots} (index.tsv lists them)", res.stderr
    assert sorted(p.name for p in plots.iterdir()) == ["0001.png", "0003.png", "index.tsv"]
    assert [row.split("\t")[0] for row in (plots / "index.tsv").read_text(encoding="utf-8").splitlines()] == [
        "line", "1", "3"]
    assert len((tmp_path / "out.align").read_text(encoding="utf-8").splitlines()) == 3  # (its links are written)


# -- the skip reason -------------------------------------------------------------------------------------------------

def test_the_skip_reason_for_absent_data_points_at_a_section_that_exists():
    doc, section = re.search(r"see (docs/\S+), section '([^']+)'", DATA_MISSING).groups()
    text = (REPO / doc).read_text(encoding="utf-8").splitlines()
    assert any(line == section and set(text[k + 1]) <= {"-", "=", "~"} and text[k + 1]
               for k, line in enumerate(text[:-1])), (doc, section)
    assert "README" not in DATA_MISSING
