"""What a training run shows while it runs: a tqdm bar on a terminal (updates, epoch, loss, target tokens per
second, updates to the next validation), periodic log lines otherwise (every ``log_every`` updates)."""

from __future__ import annotations

import logging
import sys

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
