"""The decoding workers' pool (nmtkit/translate/pool.py) as a server uses it (``restart``): several threads wait
for their batches at once, one of them reading every worker's replies; a worker that dies is noticed at once by
that reader, whichever worker it was waiting on when it began."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np

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
