"""Data parallelism under ``torchrun`` (``WORLD_SIZE`` > 1): what the processes of one training run exchange.

Every process takes an interleaved share of each minibatch (``ids[rank::world]``), and the gradients are summed
across processes before clipping, so N processes compute the update one process computes for the same total batch.
Only the lead process (rank 0) validates, logs and saves; it learns every process's RNG states for the checkpoint,
and tells the others the run's status and the schedule's state after a validation.  With one process (``world`` 1)
every call here returns at once.
"""

from __future__ import annotations

import ctypes
import os
import pickle
from collections.abc import Iterable

import torch


class Processes:
    """This process's place in the run: ``world`` processes, this one ``rank``, on ``device``."""

    def __init__(self, device_name: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("nccl" if device_name.startswith("cuda") else "gloo")
        self.device = torch.device(device_name)
        self._buffers: dict[str, torch.Tensor] = {}  # (what collective calls are given: see close)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)  # (NCCL's calls run on this device)

    def close(self) -> None:
        """Leave the process group (data parallel; nothing with one process).

        Nothing waits here: every tensor this class hands to a collective call is one of its buffers, which Python
        never frees (:meth:`_buffer`).  gloo's worker threads drop their references to a call's tensors after the
        caller has returned, and the process group, with its threads, is not always freed by
        ``destroy_process_group`` (after a training run it lives on until the process ends).  Had such a tensor's
        Python object died first, the thread's release would need the GIL, and a thread that asks for the GIL while
        the interpreter exits is ended by unwinding, which C++ answers with "terminate called without an active
        exception" (SIGABRT, in some runs of tests/test_faults.py's torchrun test, when a 50 ms sleep here was the
        remedy).  With buffers that outlive the interpreter, a worker's release is only a count going down.  That
        alone did not stop every abort (tests/bench/results/soak_torchrun.txt, run 1: 1 in 100): nmt-train's
        data-parallel processes also end without the interpreter's shutdown (nmtkit/cli/train.py; run 2: 0 in 100).
        A Python program of its own that trains under torchrun should end the same way (``os._exit`` once its
        files are closed)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def _buffer(self, name: str, numel: int, dtype: torch.dtype, exact: bool = False) -> torch.Tensor:
        """The buffer ``name`` of at least ``numel`` elements (exactly, with ``exact``) for collective calls, made on
        first use and when it must grow (doubling, so that every process, asking for the same sizes, has the same
        sizes).  Python never frees it: a reference is taken that nothing gives back (see :meth:`close`)."""
        t = self._buffers.get(name)
        if t is None or t.dtype != dtype or (t.numel() != numel if exact else t.numel() < numel):
            size = numel if exact or t is None or t.dtype != dtype else max(numel, 2 * t.numel())
            t = torch.zeros(max(size, 1), dtype=dtype, device=self.device)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))  # (kept past the interpreter's exit, on purpose)
            self._buffers[name] = t
        return t

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every process's ``data`` (a collective call: all processes make it), through buffers (see :meth:`close`)."""
        import torch.distributed as dist

        size = self._buffer("size", 1, torch.int64)
        size.fill_(len(data))
        sizes = [self._buffer(f"size{r}", 1, torch.int64) for r in range(self.world)]
        dist.all_gather(sizes, size)
        lengths = [int(s.item()) for s in sizes]
        mine = self._buffer("gather", max(lengths), torch.uint8)
        if data:
            mine[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        outs = [self._buffer(f"gather{r}", mine.numel(), torch.uint8, exact=True) for r in range(self.world)]
        dist.all_gather(outs, mine)
        return [out[:n].cpu().numpy().tobytes() for out, n in zip(outs, lengths)]

    def _broadcast_bytes(self, data: bytes) -> bytes:
        """The lead's ``data`` (a collective call: all processes make it; the others' ``data`` is ignored)."""
        import torch.distributed as dist

        size = self._buffer("size", 1, torch.int64)
        size.fill_(len(data))
        dist.broadcast(size, src=0)
        n = int(size.item())
        buf = self._buffer("broadcast", n, torch.uint8)
        if self.rank == 0 and n:
            buf[:n].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, src=0)
        return buf[:n].cpu().numpy().tobytes()

    def all_reduce_grads(self, parameters: Iterable[torch.Tensor], nll_sum, ntok):
        """Sum gradients, NLL and token counts over processes in one collective call (one process: as given)."""
        if self.world == 1:
            return nll_sum, ntok
        import torch.distributed as dist

        parameters = list(parameters)
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:  # (row-sparse embedding gradients: summed dense)
                p.grad = p.grad.to_dense()
        grads = [p.grad for p in parameters]
        flat = self._buffer("grads", sum(g.numel() for g in grads) + 2, grads[0].dtype, exact=True)
        torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([float(nll_sum), float(ntok)], dtype=flat.dtype,
                                                                   device=flat.device)], out=flat)
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
        return flat[-2].item(), int(flat[-1].item())

    def rng_state(self) -> dict:
        """This process's RNG states (torch's, and the device's on CUDA)."""
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return rng

    def gather_rngs(self) -> list | None:
        """Every process's RNG states, for the lead's checkpoint (a collective call: all processes make it); None
        with one process."""
        if self.world == 1:
            return None
        import torch.distributed as dist

        mine = pickle.dumps({k: v.cpu().numpy().tobytes() for k, v in self.rng_state().items()})
        return [{k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in pickle.loads(data).items()}
                for data in self._all_gather_bytes(mine)]

    def agree_to_stop(self, stop: bool, elapsed: float) -> tuple[bool, float]:
        """Stop when any process would (every process must agree, or the collective calls would hang), and the
        time trained as the slowest process has it (a time budget's schedule must give every process one rate)."""
        if self.world == 1:
            return stop, elapsed
        import torch.distributed as dist

        both = self._buffer("stop", 2, torch.float64)  # (NCCL: CUDA tensors)
        both.copy_(torch.tensor([float(stop), elapsed], dtype=torch.float64))
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return bool(both[0].item()), float(both[1].item())

    def broadcast_status(self, status: str, schedule, elapsed: float) -> tuple[str, float]:
        """The lead's status after a validation, its schedule's state (plateau's decays come from its
        validations) and its time trained (which counts the validation), to every process."""
        if self.world == 1:
            return status, elapsed
        import torch.distributed as dist

        box = pickle.loads(self._broadcast_bytes(pickle.dumps([status, schedule.state_dict(), elapsed])))
        schedule.load_state_dict(box[1])
        return box[0], box[2]
