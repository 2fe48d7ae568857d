"""Data parallelism under ``torchrun`` (``WORLD_SIZE`` > 1): what the processes of one training run exchange.

Every process takes an interleaved share of each minibatch (``ids[rank::world]``), and the gradients are summed
across processes before clipping, so N processes compute the update one process computes for the same total batch.
Only the lead process (rank 0) validates, logs and saves; it learns every process's RNG states for the checkpoint,
and tells the others the run's status and the schedule's state after a validation.  With one process (``world`` 1)
every call here returns at once.
"""

from __future__ import annotations

import os
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
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)  # NCCL's object collectives (broadcast_object_list) use this device

    def close(self) -> None:
        """Leave the process group (data parallel; nothing with one process).

        After a training run ``destroy_process_group`` does not free gloo's process group: its threads live on until
        the process ends, and one that needs the interpreter while it shuts down is ended by unwinding, which aborts
        the process ("terminate called without an active exception", SIGABRT; a 50 ms sleep here was the remedy before).
        nmt-train's data-parallel processes therefore end without the interpreter's shutdown (nmtkit/cli/train.py,
        ``os._exit``; tests/bench/results/soak_torchrun.txt); a Python program of its own that trains under torchrun
        should end the same way once its files are closed."""
        if self.world == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

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
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([float(nll_sum), float(ntok)],
                                                                          device=grads[0].device)])
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

        states: list = [None] * self.world
        dist.all_gather_object(states, {k: v.cpu() for k, v in self.rng_state().items()})
        return states

    def agree_to_stop(self, stop: bool, elapsed: float) -> tuple[bool, float]:
        """Stop when any process would (every process must agree, or the collective calls would hang), and the
        time trained as the slowest process has it (a time budget's schedule must give every process one rate)."""
        if self.world == 1:
            return stop, elapsed
        import torch.distributed as dist

        both = torch.tensor([float(stop), elapsed], dtype=torch.float64, device=self.device)  # (NCCL: CUDA tensors)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return bool(both[0].item()), float(both[1].item())

    def broadcast_status(self, status: str, schedule, elapsed: float) -> tuple[str, float]:
        """The lead's status after a validation, its schedule's state (plateau's decays come from its
        validations) and its time trained (which counts the validation), to every process."""
        if self.world == 1:
            return status, elapsed
        import torch.distributed as dist

        box = [status, schedule.state_dict(), elapsed]
        dist.broadcast_object_list(box, src=0)
        schedule.load_state_dict(box[1])
        return box[0], box[2]
