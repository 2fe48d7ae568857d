"""The ``--device`` option of every tool: a torch device that exists on this machine, or a one-line error."""

from __future__ import annotations

from nmtkit.errors import InputError


def resolve_device(spec: str, option: str = "--device"):
    """``torch.device(spec)`` when this machine has it: ``cpu``, ``cuda``, ``cuda:N``, ``mps``; else InputError."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"{option} {spec!r} is not a device (cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise InputError(f"{option} {spec}: this machine has no usable CUDA device (torch "
                             f"{torch.__version__}, {built}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"{option} {spec}: there are only {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    elif device.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise InputError(f"{option} {spec}: this machine has no MPS device; use --device cpu")
    elif device.type != "cpu":
        raise InputError(f"{option} {spec!r}: nmtkit runs on cpu, cuda or mps devices")
    return device


def bf16_is_native(device) -> bool:
    """Whether bfloat16 arithmetic runs natively on ``device``: always on CUDA; on a CPU only with AVX-512 BF16 or
    AMX (oneDNN's test).  Elsewhere torch emulates it, many times slower than float32
    (tests/bench/results/bench_ab_train.txt, its notes)."""
    import torch

    if device.type != "cpu":
        return True
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return False


def warn_if_slow_bf16(device, log) -> None:
    """``--bf16`` where bfloat16 is emulated: say so (the run is correct, but far slower than without it)."""
    if not bf16_is_native(device):
        log.warning("--bf16 on this CPU (no AVX-512 BF16 or AMX): bfloat16 is emulated and runs many times "
                    "slower than float32; drop --bf16 here")
