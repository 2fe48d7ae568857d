"""The decoding workers' pool (nmtkit/translate/pool.py) as a server uses it (``restart``): several threads wait
for their batches at once, one of them reading every worker's replies; a worker that dies is noticed at once by
that reader, whichever worker it was waiting on when it began."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from conftest import wait_until
from nmtkit.errors import WorkerError
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import SourceBatch
from nmtkit.translate.pool import DecodePool
from nmtkit.translate.translator import Translator


def test_a_worker_killed_while_the_reader_waits_on_another_fails_its_batch_at_once(trained):
    # (before: the reading thread watched only the workers busy when it began to wait, so the death of the worker
    # given the second batch went unseen until the first batch ended -- in nmt-serve, a 504 instead of a 500)
    _, ckpt = trained
    slow = DecodeConfig(beam=50, min_length_ratio=3, max_len_a=3)  # (each hypothesis runs to 3 × its source)
    with Translator([ckpt], slow, workers=1) as tr:
        setup = tr.setup
    pool = DecodePool([ckpt], 2, 1, "cpu", setup, restart=True)
    results: dict = {}

    def collect(name: str, ticket: int) -> None:
        try:
            results[name] = pool.result(ticket)
        except WorkerError as e:
            results[name] = e

    try:
        batch = SourceBatch([np.arange(5, 25)] * 200)  # (200 lines of 20 tokens: seconds of decoding)
        first = threading.Thread(target=collect, args=("first", pool.submit(batch)), daemon=True)
        first.start()
        wait_until(lambda: pool._reading, 60, "a thread to wait in select for the first batch")
        second = threading.Thread(target=collect, args=("second", pool.submit(batch)), daemon=True)
        second.start()
        victim = pool.pids[1]  # (the first batch went to worker 0; the second to the idle worker 1)
        os.kill(victim, signal.SIGKILL)
        second.join(timeout=120)
        error = results["second"]
        assert isinstance(error, WorkerError), error
        assert f"decoding worker 1 (pid {victim}) stopped unexpectedly with exit code -9" in str(error)
        assert "first" not in results  # (noticed while worker 0 still decodes, not once it has answered)
    finally:
        pool.close(kill=True)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cancelled_batches_stop_in_the_worker_or_never_reach_it_and_the_next_is_decoded(trained):
    """nmt-serve's stop for a batch whose requests all timed out (nmtkit/translate/stopping.py): the batch decoding
    in the worker stops before its next step, one still queued here is never sent, and the worker goes on with the
    batch behind them."""
    from nmtkit.translate.stopping import Cancelled

    _, ckpt = trained
    slow = DecodeConfig(beam=50, min_length_ratio=5, max_len_a=5)
    with Translator([ckpt], slow, workers=1) as tr:
        setup = tr.setup
    pool = DecodePool([ckpt], 1, 1, "cpu", setup)
    try:
        idle = _cpu_s(pool.pids[0])
        long = pool.submit(SourceBatch([np.arange(5, 25)] * 400))  # (a minute or more of decoding)
        cheap = pool.submit(SourceBatch([np.arange(5, 10)]), (DecodeConfig(beam=2), False))  # (behind it, in the worker)
        queued = pool.submit(SourceBatch([np.arange(5, 25)] * 400))  # (held here: the worker has two already)
        wait_until(lambda: _cpu_s(pool.pids[0]) > idle + 0.5, 60, "the worker to decode the long batch")
        pool.cancel([long, queued])
        for ticket in (queued, long):
            with pytest.raises(Cancelled):
                pool.result(ticket)
        assert len(pool.result(cheap)) == 1 and pool.pending == 0
    finally:
        pool.close(kill=True)


def test_a_stop_ends_the_search_in_this_process_before_its_next_step(trained):
    from nmtkit.translate.decoding import decode_batch
    from nmtkit.translate.stopping import Cancelled

    _, ckpt = trained
    with Translator([ckpt], DecodeConfig(beam=4, min_length_ratio=5, max_len_a=5), workers=1) as tr:
        asked = []
        with pytest.raises(Cancelled):
            decode_batch(tr.models, SourceBatch([np.arange(5, 25)] * 4), "cpu", tr.setup,
                         lambda: asked.append(1) or len(asked) > 3)
        assert len(asked) == 4  # (three steps taken; the fourth was not)
        assert len(decode_batch(tr.models, SourceBatch([np.arange(5, 10)]), "cpu", tr.setup, lambda: False)) == 1
