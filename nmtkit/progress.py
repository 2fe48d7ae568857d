"""What a long run shows while it runs: a tqdm bar on a terminal, periodic log lines otherwise.  A training run
(:class:`Progress`): updates, epoch, loss, target tokens per second, updates to the next validation, a log line
every ``log_every`` updates.  A long pass over a corpus (:class:`Ticker`, ``nmt-prepare``'s steps): how many lines
it has done, a log line at most every ``interval`` seconds.  ``nmt-translate``'s bar over a file
(:func:`count_lines`) has the file's line count as its total."""

from __future__ import annotations

import logging
import os
import sys
import time

from tqdm import tqdm

log = logging.getLogger("nmtkit.train")


class Progress:
    """A tqdm bar on a terminal; periodic log lines otherwise."""

    def __init__(self, lead: bool, cfg):
        """lead: whether this process reports (the first of a distributed run); cfg: the TrainConfig."""
        self.cfg = cfg
        self.bar = None
        self.lead = lead
        if lead and sys.stderr.isatty():
            self.bar = tqdm(total=cfg.max_updates or None, unit="upd", dynamic_ncols=True)

    def step(self, st, loss: float, tok_s: float) -> None:
        """After an update: ``loss`` and ``tok_s`` are the means over the updates since the last log record."""
        if not self.lead:
            return
        to_valid = -st.update % self.cfg.valid_every  # (0: this update validates)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"epoch {st.epoch + 1} loss {loss:.3f} {tok_s:,.0f} tok/s valid in {to_valid}")
        elif st.update % self.cfg.log_every == 0:
            log.info("update %d epoch %d: loss %.4f, %.0f target tokens/s, %s", st.update, st.epoch + 1, loss, tok_s,
                     f"validation in {to_valid} updates" if to_valid else "validating")

    def write(self, text: str) -> None:
        if not self.lead:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Ticker:
    """A long pass over a corpus's lines, shown as it goes: a tqdm bar on a terminal, else a log line to ``log`` at
    most every ``interval`` seconds ("train: tokenising: 150,000 pairs so far"), so that a run under a script (the quick
    start's ``nmt-prepare``) is never silent for minutes.  Nothing at all where ``log`` does not report INFO
    (``--quiet``).  ``clock`` is the time source (tests give their own)."""

    def __init__(self, log: logging.Logger, what: str, unit: str = "pairs", total: int | None = None,
                 interval: float = 15.0, clock=time.monotonic):
        self.log, self.what, self.unit, self.total = log, what, unit, total
        self.interval, self.clock, self.done = interval, clock, 0
        self.shown = self.clock()
        self.bar = None
        if log.isEnabledFor(logging.INFO) and sys.stderr.isatty():
            self.bar = tqdm(total=total, desc=what, unit=f" {unit}", unit_scale=True, dynamic_ncols=True, leave=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.clock() - self.shown >= self.interval and self.log.isEnabledFor(logging.INFO):
            self.shown = self.clock()
            of = f" of {self.total:,}" if self.total else ""
            self.log.info("%s: %s %s%s so far", self.what, f"{self.done:,}", self.unit, of)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def count_lines(path: str) -> int | None:
    """The number of lines of a regular file (as ``read_input`` splits them: on b"\\n", a last line without one
    counted), read in 1 MB blocks; None for a pipe, a terminal or what cannot be read (no total is shown)."""
    try:
        if not os.path.isfile(path):
            return None
        count, last = 0, b"\n"
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                count += block.count(b"\n")
                last = block[-1:]
        return count + (last != b"\n")
    except OSError:
        return None


def translation_bar(path: str) -> tqdm:
    """``nmt-translate``'s bar on a terminal: its total is the input file's line count (none for a pipe), and until
    the first lines come out of the decoder -- a window of them is decoded at once -- it says so, then how many
    lines have been read (:func:`reading`)."""
    bar = tqdm(total=None if path == "-" else count_lines(path), unit="line", dynamic_ncols=True)
    bar.set_postfix_str("reading, decoding the first lines")
    return bar


def reading(lines, bar: tqdm | None, every: int = 100):
    """``lines`` as they are, the bar (if any) saying how many were read: every ``every`` lines and at the end."""
    n = 0
    for n, line in enumerate(lines, start=1):
        if bar is not None and n % every == 0:
            bar.set_postfix_str(f"read {n:,}")
        yield line
    if bar is not None:
        bar.set_postfix_str(f"read {n:,}")
