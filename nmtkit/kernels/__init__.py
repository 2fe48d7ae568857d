"""Fused CPU kernels in C, for training speed: compiled on first use, called through ctypes.

Some of a training step's work is a chain of elementwise operations over arrays far larger than the caches.  As
torch ops, each operation is one more pass over memory, or over a cache-sized block (nmtkit/train/adadelta.py).  In C
the chain becomes one loop.  And some copies -- casts of transposed matrices -- torch does with a slow strided loop:

- ``adadelta``: the optimizer's update (adadelta.c): about 12 torch ops per parameter block become one pass that
  reads θ, g, E[g²], E[Δθ²] and writes three of them once;
- ``attend_forward`` / ``attend_backward``: one step of the RNNsearch attention (attention.c), the chain of
  torch ops over (B, Tx, n') of models/fast/fused.py in one visit of each sentence's real source positions;
- ``to_bf16``: a float32 matrix with any strides cast to bfloat16 (cast.c), in tiles that stay in the cache --
  the backward pass's transposed weights, which torch casts with a slow strided copy, and W_o cast straight into
  its padded copy (models/fast/matmul.py).

**Build.**  The C files are compiled by the system's C compiler (``$CC``, else ``cc``) with
``-O3 -march=native -fopenmp`` into ``$NMTKIT_CACHE/kernels/`` (``~/.cache/nmtkit`` by default; when that is not
writable, a directory of the user's own in the system's temporary directory, mode 0700, used only if nobody else
can write to it).  The file is named by a hash of the sources, the compiler, the flags and the CPU: a change of
any of them builds anew, and later processes reuse the file (a build takes well under a second; a cached file
that does not load is built once more).  The library links the OpenMP runtime that torch has already loaded (the
same ``libgomp.so.1`` in torch's Linux wheels), so its threads are torch's (``torch.get_num_threads()``); where
loading it would bring a second OpenMP runtime into the process, it is not used.

**Fallback.**  Without a C compiler, when the build fails, or with ``NMTKIT_BACKEND=fast:no-kernels`` in the
environment, ``available()`` is False and the callers run their torch code, which computes the same values up to
float32 rounding (tests compare both paths); a failed build warns once.  The kernels take float32 CPU tensors only
(``adadelta`` contiguous ones; the attention kernel also bf16 C_stack h_j and int64 lengths, and wants the last
dimension contiguous): other dtypes and CUDA always take the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

from nmtkit.runtime import default_cache_dir, fast_switches

SOURCES = ("adadelta.c", "attention.c", "cast.c")
# -fno-trapping-math: without it GCC keeps the clamps of exp_clamped as branches (a comparison may trap on a
# signalling NaN) and the σ loops of attention.c stay scalar (the attention kernels of a training update: 108 ms in
# tests/bench/results/bench_profile.txt, 32 ms with it in bench_profile-candidates.txt); nmtkit never reads
# floating-point traps
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-std=c11",
         "-shared", "-fPIC")

BUILD_TIMEOUT = 120  # seconds for the compiler (a build takes well under one)

_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "nmt_adadelta": [_P, _P, _P, _P, _I64, _F, _F, _F, _F, _INT, _F, _INT],
    "nmt_cast_bf16": [_P, _I64, _I64, _I64, _I64, _P, _I64, _INT],
    "nmt_attend_forward": [_P, _I64, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _P, _P, _I64, _INT, _P, _I64, _I64,
                           _I64, _INT, _P, _I64, _P, _I64, _I64, _INT],
    "nmt_attend_backward": [_P, _I64, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _P, _P, _I64, _P, _I64, _INT, _P,
                            _I64, _I64, _I64, _INT, _P, _I64, _P, _I64, _I64, _P, _P, _I64, _INT],
}


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    return default_cache_dir() / "kernels"


def _private_dir(folder: Path) -> bool:
    """Whether ``folder`` (created if missing, mode 0700) is a real directory of ours that nobody else can write:
    a library found in a shared place such as /tmp could otherwise be someone else's."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _folders() -> list[Path]:
    """Where the library may be cached: ``$NMTKIT_CACHE/kernels``, else a private directory in the system's
    temporary directory (POSIX only: elsewhere no fallback)."""
    folders = [_cache_dir()]
    if hasattr(os, "getuid"):
        tmp = Path(tempfile.gettempdir()) / f"nmtkit-kernels-{os.getuid()}"
        if _private_dir(tmp):
            folders.append(tmp)
    return folders


def _build(rebuild: bool = False) -> Path:
    """The compiled library's path, building it when no cached one matches, or anew with ``rebuild`` (raises
    RuntimeError or OSError on failure)."""
    cc = shlex.split(os.environ.get("CC") or "cc")  # (it may carry arguments: "ccache gcc")
    if not cc or shutil.which(cc[0]) is None:
        raise RuntimeError(f"no C compiler ({' '.join(cc)!r} is not on PATH)")
    version = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=True,
                             timeout=BUILD_TIMEOUT).stdout
    here = Path(__file__).parent
    key = hashlib.sha256()
    for part in (" ".join(cc), version, " ".join(FLAGS), _cpu_id(), platform.machine()):
        key.update(part.encode() + b"\0")
    for name in SOURCES:
        key.update((here / name).read_bytes())
    name = f"nmtkit-kernels-{key.hexdigest()[:16]}.so"
    for folder in _folders():
        target = folder / name
        if target.exists() and not rebuild:
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=folder)
        except OSError:
            continue
        os.close(fd)
        try:
            done = subprocess.run([*cc, *FLAGS, *(str(here / s) for s in SOURCES), "-o", tmp, "-lm"],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise RuntimeError(f"{' '.join(cc)} failed: {last}")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o755 & ~umask)  # (mkstemp made it 0600: readable by others sharing the cache)
            os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
    raise RuntimeError("no writable directory for the compiled kernels")


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtime libraries mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[-1] for line in f if re.search(r"/lib(g|i)?omp[^/]*\.so", line)}
    except OSError:
        return set()


def _load(path: Path):
    lib = ctypes.CDLL(str(path))
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    return lib


@functools.cache
def _library():
    if "no-kernels" in fast_switches():
        return None
    try:
        before = _openmp_runtimes()
        try:
            lib = _load(_build())
        except (OSError, AttributeError):  # a damaged cached file (or an old one): built once more
            lib = _load(_build(rebuild=True))
        added = _openmp_runtimes() - before
        if before and added:  # its own OpenMP runtime beside torch's: two thread pools fighting for the cores
            raise RuntimeError(f"it loaded a second OpenMP runtime ({', '.join(sorted(added))})")
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


def to_bf16(src: Tensor, out: Tensor | None = None) -> Tensor:
    """A 2-D float32 CPU tensor with any strides (a transposed view, a slice) cast to bfloat16 (cast.c): into
    ``out`` (bfloat16, src's shape, rows contiguous: a slice of a padded buffer, say) when given, else into a new
    contiguous tensor.  Rounded as torch rounds (to nearest, ties to even); a NaN stays NaN (its payload may
    differ from torch's)."""
    if src.dim() != 2 or src.dtype != torch.float32 or src.device.type != "cpu":
        raise ValueError("to_bf16 kernel: src must be a 2-D float32 CPU tensor")
    if out is None:
        out = torch.empty(src.shape, dtype=torch.bfloat16)
    elif out.dtype != torch.bfloat16 or out.shape != src.shape or out.device.type != "cpu" or (
            out.shape[1] > 1 and out.stride(1) != 1) or (out.shape[0] > 1 and out.stride(0) < out.shape[1]):
        raise ValueError("to_bf16 kernel: out must be a bfloat16 CPU tensor of src's shape with contiguous, "
                         "non-overlapping rows")
    if src.numel():
        _library().nmt_cast_bf16(src.data_ptr(), src.shape[0], src.shape[1], src.stride(0), src.stride(1),
                                 out.data_ptr(), out.stride(0), torch.get_num_threads())
    return out


def _rows(t: Tensor, name: str, dims: int, dtypes=(torch.float32,), output: bool = False) -> None:
    """Checks that t is a CPU tensor of ``dims`` dimensions and one of ``dtypes`` (float32) whose last dimension
    is contiguous (what the C loops index with one stride per other dimension); an ``output`` also must not
    overlap itself (the threads write it row by row)."""
    if t.dtype not in dtypes or t.device.type != "cpu" or t.dim() != dims or (t.shape[-1] > 1 and t.stride(-1) != 1):
        raise ValueError(f"attention kernel: {name} must be a {dims}-D {'/'.join(map(str, dtypes))} CPU tensor, "
                         f"contiguous in its last dimension; got {tuple(t.shape)} {t.dtype} strides {t.stride()}")
    if output:
        inner = t.shape[-1]  # elements one index of the dimension before spans, from its start
        for d in range(dims - 2, -1, -1):
            if t.shape[d] > 1 and t.stride(d) < inner:
                raise ValueError(f"attention kernel: the output {name} overlaps itself (strides {t.stride()})")
            inner = t.stride(d) * (t.shape[d] - 1) + inner


def _lens(lens: Tensor, B: int) -> None:
    if lens.shape != (B,) or lens.dtype != torch.int64 or lens.device.type != "cpu" or not lens.is_contiguous():
        raise ValueError(f"attention kernel: lens must be a contiguous int64 CPU tensor of {B} lengths")


_CH_DTYPES = (torch.float32, torch.bfloat16)  # CH = C_stack h_j: a float32 or a bf16 product's result


def attend_forward(keys2: Tensor, q: Tensor, v2: Tensor, lens: Tensor, alpha: Tensor, CH: Tensor | None = None,
                   gx: Tensor | None = None, g: Tensor | None = None, per: int = 1) -> None:
    """One attention step forwards (attention.c), float32 CPU tensors: keys2 (S, Tx, n') = 2 U_a h_j of S
    sentences, q (B, n') = 2 W_a s_{i-1} for B = S · ``per`` rows (``per`` consecutive rows a sentence: beam
    search's hypotheses), v2 (n') = 2 v_a, lens (S,) int64 (the real positions are each sentence's first
    lens[s], clamped to [0, Tx]) -> α_i written into alpha (B, Tx) (0 at padding; 0 in a row without real
    positions) and, when CH (S, Tx, 3n) = C_stack h_j is given (float32 or bfloat16), g = gx + Σ_j α_ij CH_j into
    g (B, 3n).  The outputs must not overlap the inputs."""
    _rows(keys2, "keys2", 3)
    S, Tx, na = keys2.shape
    B = S * per
    for t, name, dims in ((q, "q", 2), (v2, "v2", 1)):
        _rows(t, name, dims)
    _rows(alpha, "alpha", 2, output=True)
    _lens(lens, S)
    if per < 1 or q.shape != (B, na) or v2.shape != (na,) or alpha.shape != (B, Tx):
        raise ValueError("attention kernel: q, v2 or alpha do not match keys2")
    ch = (False, None, 0, 0, 0, False, None, 0, None, 0)
    if CH is not None:
        _rows(CH, "CH", 3, _CH_DTYPES)
        _rows(gx, "gx", 2)
        _rows(g, "g", 2, output=True)
        n3 = CH.shape[2]
        if CH.shape[:2] != (S, Tx) or gx.shape != (B, n3) or g.shape != (B, n3):
            raise ValueError("attention kernel: CH, gx or g do not match keys2")
        ch = (True, CH.data_ptr(), CH.stride(0), CH.stride(1), n3, CH.dtype == torch.bfloat16, gx.data_ptr(),
              gx.stride(0), g.data_ptr(), g.stride(0))
    scratch = torch.empty(B, Tx)
    _library().nmt_attend_forward(
        keys2.data_ptr(), keys2.stride(0), keys2.stride(1), q.data_ptr(), q.stride(0), v2.data_ptr(), na,
        lens.data_ptr(), B, Tx, scratch.data_ptr(), alpha.data_ptr(), alpha.stride(0), *ch, per,
        torch.get_num_threads())


def attend_backward(keys2: Tensor, q: Tensor, v2: Tensor, lens: Tensor, alpha: Tensor, dA: Tensor | None,
                    CH: Tensor | None, dg: Tensor | None, dkeys2: Tensor, dv: Tensor, dq: Tensor) -> None:
    """One attention step backwards (attention.c), with ``attend_forward``'s keys2, q, v2, lens, alpha and CH,
    float32 CPU tensors (CH also bfloat16): from dg = ∂L/∂g_i (B, 3n) (with CH; both None where ∂L/∂g_i = 0) and
    dA (B, Tx, optional) = ∂L/∂α_i from elsewhere, accumulates Σ_i ∂L/∂e_ij σ'(…) into dkeys2 (B, Tx, n') and
    Σ_j ∂L/∂e_ij σ(…) into the rows of dv (threads, n'), one row per thread (``torch.get_num_threads()`` rows at
    least; their sum is ∂L/∂v2), and writes ∂L/∂q into dq (B, n').  The outputs must not overlap one another or
    the inputs."""
    _rows(keys2, "keys2", 3)
    B, Tx, na = keys2.shape
    threads = torch.get_num_threads()
    for t, name, dims in ((q, "q", 2), (v2, "v2", 1), (alpha, "alpha", 2)):
        _rows(t, name, dims)
    _rows(dkeys2, "dkeys2", 3, output=True)
    _rows(dq, "dq", 2, output=True)
    _lens(lens, B)
    if q.shape != (B, na) or v2.shape != (na,) or alpha.shape != (B, Tx) or dkeys2.shape != keys2.shape or \
            dq.shape != (B, na):
        raise ValueError("attention kernel: the backward's operands do not match keys2")
    if dv.dtype != torch.float32 or dv.device.type != "cpu" or not dv.is_contiguous() or dv.dim() != 2 or \
            dv.shape[0] < threads or dv.shape[1] != na:
        raise ValueError(f"attention kernel: dv must be a contiguous float32 CPU ({threads}, {na}) tensor")
    if dA is not None:
        _rows(dA, "dA", 2)
        if dA.shape != (B, Tx):
            raise ValueError("attention kernel: dA does not match keys2")
    ch = (False, None, 0, 0, 0, False, None, 0)
    if (CH is None) != (dg is None):
        raise ValueError("attention kernel: CH and dg go together")
    if CH is not None:
        _rows(CH, "CH", 3, _CH_DTYPES)
        _rows(dg, "dg", 2)
        if CH.shape[:2] != (B, Tx) or dg.shape != (B, CH.shape[2]):
            raise ValueError("attention kernel: CH or dg do not match keys2")
        ch = (True, CH.data_ptr(), CH.stride(0), CH.stride(1), CH.shape[2], CH.dtype == torch.bfloat16,
              dg.data_ptr(), dg.stride(0))
    scratch = torch.empty(B, Tx)
    _library().nmt_attend_backward(
        keys2.data_ptr(), keys2.stride(0), keys2.stride(1), q.data_ptr(), q.stride(0), v2.data_ptr(), na,
        lens.data_ptr(), B, Tx, scratch.data_ptr(), alpha.data_ptr(), alpha.stride(0),
        None if dA is None else dA.data_ptr(), 0 if dA is None else dA.stride(0), *ch, dkeys2.data_ptr(),
        dkeys2.stride(0), dkeys2.stride(1), dv.data_ptr(), dq.data_ptr(), dq.stride(0), threads)
