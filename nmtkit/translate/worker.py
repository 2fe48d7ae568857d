"""A decoding worker process (:mod:`nmtkit.translate.pool` starts them): its side of the protocol, and its loop.

Protocol: length-prefixed pickles over the worker's stdin and a duplicate of its stdout (its own stdout and
prints go to stderr).  Only the parent and its own children speak it.  The parent sends the set-up once, then
``("decode", ticket, batch, settings)`` for each batch and ``("cancel", ticket)`` for a batch nobody waits for any
more (the decoding stops before its next search step: :mod:`nmtkit.translate.stopping`); the worker answers
``("ready" | "error", None, message)`` once it has loaded the checkpoints, then ``(kind, ticket, payload)`` for each
batch, ``kind`` one of ``done`` (its hypotheses), ``failed`` (the error, one line) or ``cancelled``.  A worker whose
parent dies reads end-of-file and exits.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
from collections import deque
from typing import Any

_HEADER = struct.Struct(">Q")


def send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # end of file: the other side is gone
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> Any:
    """One message, or EOFError when the other side has closed (or died)."""
    header = _read_exactly(fd, _HEADER.size)
    data = None if header is None else _read_exactly(fd, _HEADER.unpack(header)[0])
    if data is None:
        raise EOFError
    return pickle.loads(data)


def worker_main() -> None:
    """Run in a worker process: read the set-up, load the models, then decode batches until end of input."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr, not into the protocol
    in_fd = 0
    import torch

    from nmtkit.runtime import IDLE_TRIM_S, trim_heap, tune_malloc
    from nmtkit.translate.decoding import build_models, decode_batch
    from nmtkit.translate.stopping import Cancelled

    tune_malloc()
    try:
        setup = receive(in_fd)
    except EOFError:
        return
    torch.set_num_threads(setup["threads"])
    try:
        models = build_models(setup["checkpoints"], setup["device"], backend=setup["backend"])
    except Exception as e:  # noqa: BLE001   reported by the parent as its own error
        send(out_fd, ("error", None, f"{type(e).__name__}: {e}"))
        return
    send(out_fd, ("ready", None, None))
    tasks: deque = deque()
    arrived = threading.Condition()
    cancelled: set[int] = set()  # tickets the parent no longer wants (checked between search steps)
    answered = [-1]  # the latest ticket answered (tickets come in increasing order): a later cancel of it is moot

    def read_tasks() -> None:  # always drain stdin, so the parent never blocks writing to us
        while True:
            try:
                task = receive(in_fd)
            except EOFError:
                task = None
            if task is not None and task[0] == "cancel":
                if task[1] > answered[0]:
                    cancelled.add(task[1])
                continue
            with arrived:
                tasks.append(task)
                arrived.notify()
            if task is None:
                return

    threading.Thread(target=read_tasks, daemon=True).start()
    while True:
        with arrived:
            if not arrived.wait_for(lambda: tasks, timeout=IDLE_TRIM_S):
                trim_heap()  # idle: the heap kept for the next batch goes back until work comes
                arrived.wait_for(lambda: tasks)
            task = tasks.popleft()
        if task is None:
            return
        _, ticket, batch, settings = task
        try:  # (a batch may bring its own decoding settings: a server's requests do)
            decode_setup = setup["setup"] if settings is None else setup["setup"].configured(*settings)
            reply = ("done", ticket, decode_batch(models, batch, setup["device"], decode_setup,
                                                  lambda: ticket in cancelled))
        except Cancelled:
            reply = ("cancelled", ticket, None)
        except Exception as e:  # noqa: BLE001
            reply = ("failed", ticket, f"{type(e).__name__}: {e}")
        answered[0] = ticket
        cancelled.discard(ticket)
        try:
            send(out_fd, reply)
        except BrokenPipeError:
            return
