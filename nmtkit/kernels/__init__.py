"""Fused CPU kernels in C, for training speed: compiled on first use, called through ctypes.

Some of a training step's work is a chain of elementwise operations over arrays far larger than the caches.  As
torch ops, each operation is one more pass over memory, or over a cache-sized block (nmtkit/adadelta.py).  In C
the chain becomes one loop:

- ``adadelta``: the optimizer's update (adadelta.c): about 12 torch ops per parameter block become one pass that
  reads θ, g, E[g²], E[Δθ²] and writes three of them once.

**Build.**  The C files are compiled by the system's C compiler (``$CC``, else ``cc``) with
``-O3 -march=native -fopenmp`` into ``$NMTKIT_CACHE/kernels/`` (``~/.cache/nmtkit`` by default; a directory in
the system's temporary directory when that is not writable).  The file is named by a hash of the sources, the
compiler, the flags and the CPU: a change of any of them builds anew, and later processes reuse the file (a
build takes well under a second).  The library links the OpenMP runtime that torch has already loaded (the same
``libgomp.so.1``), so its threads are torch's (``torch.get_num_threads()``).

**Fallback.**  Without a C compiler, when the build fails, or with ``NMTKIT_KERNELS=0`` in the environment,
``available()`` is False and the callers run their torch code, which computes the same values up to float32
rounding (tests compare both paths); a failed build warns once.  The kernels take contiguous float32 CPU tensors
only: other dtypes and CUDA always take the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

SOURCES = ("adadelta.c",)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-std=c11", "-shared",
         "-fPIC")

_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "nmt_adadelta": [_P, _P, _P, _P, _I64, _F, _F, _F, _F, _INT, _F, _INT],
}


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    from nmtkit.datasets.download import default_cache_dir

    return default_cache_dir() / "kernels"


def _build() -> Path:
    """The compiled library's path, building it when no cached one matches (raises on failure)."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} is not on PATH)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    here = Path(__file__).parent
    key = hashlib.sha256()
    for part in (cc, version, " ".join(FLAGS), _cpu_id(), platform.machine()):
        key.update(part.encode() + b"\0")
    for name in SOURCES:
        key.update((here / name).read_bytes())
    name = f"nmtkit-kernels-{key.hexdigest()[:16]}.so"
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"nmtkit-kernels-{os.getuid()}"):
        target = folder / name
        if target.exists():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        except OSError:
            continue
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, *(str(here / s) for s in SOURCES), "-o", tmp, "-lm"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise RuntimeError(f"{cc} failed: {last}")
            os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
    raise RuntimeError("no writable directory for the compiled kernels")


@functools.cache
def _library():
    if os.environ.get("NMTKIT_KERNELS", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, None
        return lib
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
        warnings.warn(f"nmtkit: fused C kernels unavailable ({e}); training uses the slower torch code",
                      RuntimeWarning, stacklevel=3)
        return None


def available() -> bool:
    """Whether the compiled kernels can be used (built or found in the cache on the first call)."""
    return _library() is not None


def usable(*tensors: Tensor) -> bool:
    """Whether the kernels take these tensors: all float32 on the CPU, and the kernels ``available()``."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and available()


def adadelta(p: Tensor, g: Tensor, sq: Tensor, acc: Tensor, lr: float, rho: float, eps: float,
             scale: float | None = None) -> None:
    """One Adadelta update of p from g (times ``scale``) in place in p, sq = E[g²], acc = E[Δθ²]: contiguous
    float32 CPU tensors of one size (adadelta.c)."""
    for t in (p, g, sq, acc):
        if not t.is_contiguous() or t.numel() != p.numel():
            raise ValueError("adadelta kernel: operands must be contiguous and of one size")
    _library().nmt_adadelta(p.data_ptr(), g.data_ptr(), sq.data_ptr(), acc.data_ptr(), p.numel(), lr, rho,
                            1 - rho, eps, scale is not None, 1.0 if scale is None else scale,
                            torch.get_num_threads())

