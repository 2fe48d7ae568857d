"""nmtkit.kernels: the compiled C kernels -- built once per machine and reused, a clean fallback without a compiler,
and the Adadelta kernel's values against torch's and against float64 arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from nmtkit import kernels
from nmtkit.train import adadelta

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """kernels with its library forgotten, its cache in tmp_path; forgotten again afterwards, so that the other
    tests load the usual one."""
    monkeypatch.setenv("NMTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NMTKIT_BACKEND", raising=False)
    kernels._library.cache_clear()
    yield tmp_path / "cache" / "kernels"
    kernels._library.cache_clear()


def test_built_once_into_the_cache_and_reused(fresh_library, native_kernels):
    assert kernels.available()
    built = list(fresh_library.iterdir())
    assert len(built) == 1 and built[0].name.startswith("nmtkit-kernels-") and built[0].suffix == ".so"
    stamp = built[0].stat().st_mtime_ns
    kernels._library.cache_clear()  # a new process, in effect
    assert kernels.available()
    assert list(fresh_library.iterdir()) == built and built[0].stat().st_mtime_ns == stamp  # not rebuilt


def test_a_changed_source_or_compiler_builds_anew(fresh_library, native_kernels, monkeypatch):
    assert kernels.available()
    monkeypatch.setattr(kernels, "FLAGS", kernels.FLAGS + ("-DNMTKIT_TEST_FLAG=1",))
    kernels._library.cache_clear()
    assert kernels.available()
    assert len(list(fresh_library.iterdir())) == 2  # the two builds side by side, no temporary file left


def test_without_a_compiler_warns_once_and_falls_back(fresh_library, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.warns(RuntimeWarning, match="C kernels unavailable.*no C compiler.*slower torch code"):
        assert not kernels.available()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert not kernels.available() and not kernels.usable(torch.zeros(3))
    # Adadelta still works: torch's blocked operations, torch's values exactly
    ref = [torch.nn.Parameter(torch.randn(50, 3))]
    ours = [torch.nn.Parameter(ref[0].detach().clone())]
    opt_ref, opt_ours = torch.optim.Adadelta(ref), adadelta.Adadelta(ours)
    for _ in range(3):
        ref[0].grad = torch.randn(50, 3)
        ours[0].grad = ref[0].grad.clone()
        opt_ref.step()
        opt_ours.step()
    assert torch.equal(ref[0], ours[0])


def test_a_failed_build_leaves_no_file(fresh_library, monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "fake cc 1.0" && exit 0\n'
                    "echo 'cc: error: pretend failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(RuntimeWarning, match="pretend failure"):
        assert not kernels.available()
    assert not fresh_library.exists() or not list(fresh_library.iterdir())


def test_a_damaged_cached_library_is_built_again(fresh_library, native_kernels):
    assert kernels.available()
    (built,) = fresh_library.iterdir()
    good = built.read_bytes()
    damaged = built.with_suffix(".damaged")  # (a new file in its place: this process still maps the old one)
    damaged.write_bytes(b"not a shared library")
    os.replace(damaged, built)
    # a new process (this one would get its loaded library back from the dynamic linker, by name): no warning,
    # the file rebuilt and loaded
    code = "import warnings; warnings.simplefilter('error'); from nmtkit import kernels; assert kernels.available()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert built.read_bytes() == good and built.stat().st_mode & 0o444 == 0o444  # readable by all who share it


def test_a_compiler_command_with_arguments(fresh_library, native_kernels, monkeypatch):
    monkeypatch.setenv("CC", "cc -DNMTKIT_TEST_DEFINE=1")  # as "ccache gcc" would be
    assert kernels.available()
    assert len(list(fresh_library.iterdir())) == 1


def test_the_temporary_fallback_must_be_private(fresh_library, native_kernels, monkeypatch, tmp_path):
    """When $NMTKIT_CACHE cannot be used, the library goes to <tmp>/nmtkit-kernels-<uid> -- only if that directory
    is the user's own and nobody else can write to it (else a library planted there would be loaded)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    monkeypatch.setenv("NMTKIT_CACHE", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"nmtkit-kernels-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="no writable directory"):
        assert not kernels.available()
    assert not list(shared.iterdir())
    shared.chmod(0o700)
    kernels._library.cache_clear()
    assert kernels.available()
    assert len(list(shared.iterdir())) == 1


def test_switched_off_by_the_environment(fresh_library, monkeypatch):
    monkeypatch.setenv("NMTKIT_BACKEND", "fast:no-onednn,no-kernels")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels.available()
    assert not fresh_library.exists()


def test_only_float32_cpu_tensors_are_taken(native_kernels):
    assert kernels.usable(torch.zeros(3), torch.zeros(2, 2))
    assert not kernels.usable(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    assert not kernels.usable(torch.zeros(3, dtype=torch.bfloat16))


def _arrays(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=g)
    grad = torch.randn(n, generator=g) * torch.logspace(-6, 1, n)  # gradients over 7 orders of magnitude
    sq = torch.rand(n, generator=g) * 1e-4
    acc = torch.rand(n, generator=g) * 1e-6
    return p, grad, sq, acc


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("lr, rho, eps", [(1.0, 0.95, 1e-6), (0.5, 0.9, 1e-3)])
def test_adadelta_kernel_against_torch_and_float64(native_kernels, monkeypatch, scale, lr, rho, eps):
    """Three updates of 100,003 elements (a length that leaves a vector remainder): E[g²] equals torch's
    (blocked) bit for bit (where torch's addcmul uses FMA); θ and E[Δθ²] are within float32 rounding of torch's
    and of the same arithmetic in float64, and in all at least as close to float64 as torch's are."""
    n = 100_003
    ours = _arrays(n)
    torch_path = [t.clone() for t in ours]
    exact = [t.double() for t in ours]
    for k in range(3):
        g = _arrays(n, seed=k + 1)[1]
        g64 = g.double() * (1.0 if scale is None else torch.tensor(scale, dtype=torch.float32).double())
        kernels.adadelta(ours[0], g, ours[2], ours[3], lr, rho, eps, scale)
        with monkeypatch.context() as m:
            m.setattr(kernels, "available", lambda: False)
            adadelta._update(torch_path[0], g, torch_path[2], torch_path[3], lr, rho, eps,
                             None if scale is None else torch.tensor(scale))
        p, _, sq, acc = exact
        sq.mul_(rho).add_((1 - rho) * g64 * g64)
        delta = (acc + eps).sqrt() / (sq + eps).sqrt() * g64
        acc.mul_(rho).add_((1 - rho) * delta * delta)
        p.sub_(lr * delta)
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # E[g²]: torch's addcmul then rounds once, as fmaf
        assert torch.equal(ours[2], torch_path[2])
    else:
        torch.testing.assert_close(ours[2], torch_path[2], rtol=1e-6, atol=0)
    for i in (0, 3):  # θ, E[Δθ²]: within a few float32 ulps of their largest values (θ crosses zero)
        atol = 4 * torch.finfo(torch.float32).eps * float(exact[i].abs().max())
        torch.testing.assert_close(ours[i], torch_path[i], rtol=1e-6, atol=atol)
        torch.testing.assert_close(ours[i].double(), exact[i], rtol=1e-6, atol=atol)
        err_ours = (ours[i].double() - exact[i]).abs().sum()
        err_torch = (torch_path[i].double() - exact[i]).abs().sum()
        assert err_ours <= err_torch * 1.01


def test_adadelta_kernel_is_the_same_on_any_number_of_threads(native_kernels):
    """Elementwise work: the split between threads changes nothing."""
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            p, g, sq, acc = _arrays(70_001)
            kernels.adadelta(p, g, sq, acc, 1.0, 0.95, 1e-6, 0.5)
            results.append((p, sq, acc))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_adadelta_kernel_refuses_mismatched_operands(native_kernels):
    p, g, sq, acc = _arrays(12)
    with pytest.raises(ValueError, match="contiguous and of one size"):
        kernels.adadelta(p, g[:6], sq, acc, 1.0, 0.95, 1e-6)
    with pytest.raises(ValueError, match="contiguous and of one size"):
        kernels.adadelta(p.view(3, 4).t(), g, sq, acc, 1.0, 0.95, 1e-6)


def test_the_library_shares_torchs_openmp_runtime(native_kernels):
    """One OpenMP runtime in a process that runs the kernels: their threads are torch's (no second pool spinning
    beside it).  Checked in a fresh process: this one may hold others' (sentencepiece's wheel brings its own
    libgomp, for its trainer)."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps on this system")
    code = ("import torch\nfrom nmtkit import kernels\n"
            "n = 70001\np, g, sq, acc = torch.randn(n), torch.randn(n), torch.rand(n), torch.rand(n)\n"
            "kernels.adadelta(p, g, sq, acc, 1.0, 0.95, 1e-6, 0.5)\n"
            "print('\\n'.join(sorted({line.split()[-1] for line in open('/proc/self/maps')\n"
            "                          if 'libgomp' in line or 'libiomp' in line or 'libomp' in line})))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    runtimes = proc.stdout.split()
    assert len(runtimes) == 1 and "torch" in runtimes[0], runtimes


def _awkward(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """float32 values over the whole range -- normal, subnormal, ±0, ±inf, NaN, the largest -- and exact ties of
    the rounding to bfloat16 (low 16 bits 0x8000) with even and odd results."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-44, 38, rows).unsqueeze(1)
    x.view(-1)[:8] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-45, -0.0, 0.0, 3.4e38, -1e-40])
    x[1] = ((torch.arange(cols, dtype=torch.int32) + 0x3F80) << 16 | 0x8000).view(torch.float32)  # ties
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bfloat16 tensors, bit for bit, NaN where NaN (its payload aside)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(torch.int16)[~nan], b.view(torch.int16)[~nan])


def test_cast_to_bf16_rounds_as_torch_for_any_strides(native_kernels):
    x = _awkward(130, 70)
    for view in (x, x.t(), x[:, 5:60], x.t()[3:50], x[::2], x[:0], x[::3, ::5], x.t()[::2, 1::3], x[:1], x[:, :1]):
        got = kernels.to_bf16(view)
        assert got.dtype == torch.bfloat16 and got.shape == view.shape and got.is_contiguous()
        assert _same_bits(got, view.to(torch.bfloat16)), view.stride()


def test_cast_to_bf16_into_a_slice_of_a_padded_buffer(native_kernels):
    x = _awkward(30, 20)
    buf = torch.full((24, 32), 7.0, dtype=torch.bfloat16)
    assert kernels.to_bf16(x.t(), out=buf[:20, :30]).data_ptr() == buf.data_ptr()
    assert _same_bits(buf[:20, :30], x.t().to(torch.bfloat16))
    assert buf[20:].eq(7).all() and buf[:, 30:].eq(7).all()  # nothing written outside the slice


def test_cast_to_bf16_refuses_what_it_cannot_take(native_kernels):
    with pytest.raises(ValueError, match="2-D float32"):
        kernels.to_bf16(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="2-D float32"):
        kernels.to_bf16(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.to_bf16(torch.zeros(3, 4), out=torch.zeros(4, 3, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="contiguous"):
        kernels.to_bf16(torch.zeros(3, 4), out=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="non-overlapping rows"):  # threads would write the same memory
        kernels.to_bf16(torch.zeros(3, 4), out=torch.zeros(1, 4, dtype=torch.bfloat16).expand(3, 4))


# ------------------------------------------------------------------------------------------------ attention.c
def _attention_case(seed: int = 0, B: int = 7, Tx: int = 9, na: int = 37, n3: int = 23, spread: float = 3.0):
    """Operands of one attention step as fused.py passes them: q, dg and the partial α row views of wider
    buffers; keys2 with values up to ±spread·5 (σ saturates at the top)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    keys2 = r(B, Tx, na) * spread
    if B and Tx:
        keys2[0, 0, :4] = torch.tensor([90.0, -90.0, 30.0, -30.0])  # beyond the exponential's clamp
    P = r(B, na + 5) * spread  # q: the first na columns of a wider product, as [2 W_a s; U_zr s]
    Di = r(B, na + n3)  # dg: the last n3 columns of D[i]; dq written into the first na
    lens = torch.randint(1, Tx + 1, (B,), generator=g) if Tx else torch.zeros(B, dtype=torch.int64)
    if B > 1:
        lens[1] = Tx
    return dict(keys2=keys2, q=P[:, :na], v2=r(na), lens=lens, CH=r(B, Tx, n3), gx=r(B, n3), Di=Di, dA=r(B, Tx),
                dkeys2=r(B, Tx, na), na=na)


def _attention_reference(c, with_dA: bool):
    """The step in float64 torch ops (the formulas of attention.c), autograd for the backward."""
    d = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in c.items()}
    na, Tx = c["na"], c["keys2"].shape[1]
    keys2, q, v2 = (d[k].clone().requires_grad_() for k in ("keys2", "q", "v2"))
    mask = torch.arange(Tx).unsqueeze(0) < c["lens"].unsqueeze(1)
    sig = torch.sigmoid(keys2 + q.unsqueeze(1))  # (B, Tx, na)
    alpha = torch.softmax((sig @ v2).masked_fill(~mask, float("-inf")), dim=-1)  # (B, Tx)
    g = d["gx"] + torch.einsum("bj,bjk->bk", alpha, d["CH"])
    loss = (g * d["Di"][:, na:]).sum() + ((alpha * d["dA"]).sum() if with_dA else 0)
    dkeys, dq, dv = torch.autograd.grad(loss, (keys2, q, v2))
    # the kernel leaves out the factor v2 in dkeys2 (fused.py applies it after the sum over steps)
    return alpha.detach(), g.detach(), d["dkeys2"] + dkeys / v2.detach(), dv, dq


@pytest.mark.parametrize("ch_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_dA", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_kernel_against_float64(native_kernels, with_dA, threads, ch_dtype):
    """attend_forward and attend_backward (attention.c) against the step's float64 torch ops: α (exactly 0 at
    padding), g = gx + Σ_j α_ij CH_j, and the backward's sums into dkeys2 and dv and its dq, on any number of
    threads, with rows of every length, scores where σ saturates, and CH in float32 or bfloat16."""
    c = _attention_case(seed=threads)
    c["CH"] = c["CH"].to(ch_dtype)
    B, Tx, na = c["keys2"].shape
    alpha_ref, g_ref, dkeys2_ref, dv_ref, dq_ref = _attention_reference(c, with_dA)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alpha, g = torch.full((B, Tx), 7.0), torch.empty(B, c["CH"].shape[2])
        kernels.attend_forward(c["keys2"], c["q"], c["v2"], c["lens"], alpha, c["CH"], c["gx"], g)
        dkeys2, dv, Di = c["dkeys2"].clone(), torch.zeros(threads, na), c["Di"].clone()
        kernels.attend_backward(c["keys2"], c["q"], c["v2"], c["lens"], alpha, c["dA"] if with_dA else None,
                                c["CH"], Di[:, na:], dkeys2, dv, Di[:, :na])
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(alpha.double(), alpha_ref, rtol=1e-5, atol=1e-7)
    assert (alpha[torch.arange(Tx).unsqueeze(0) >= c["lens"].unsqueeze(1)] == 0).all()
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dkeys2.double(), dkeys2_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dv.sum(0).double(), dv_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Di[:, :na].double(), dq_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(Di[:, na:], c["Di"][:, na:], rtol=0, atol=0)  # dg untouched


def test_attention_kernel_sigmoid_over_the_whole_range(native_kernels):
    """The kernel's σ (its own vectorised exponential) within 2.5e-7 of float64's over [−100, 100], read off
    the backward's sums: with one position per row, ∂L/∂e = α (∂L/∂α − α ∂L/∂α) = 0, so two positions of
    which the second has keys2 = −inf-like scores; dv = Σ_j ∂L/∂e_j σ_j."""
    x = torch.linspace(-100, 100, 4001)
    na = x.numel()
    keys2 = torch.stack([x, torch.zeros(na)]).unsqueeze(0)  # (1, 2, na): position 0 sweeps x, position 1 is 0
    q, v2, lens = torch.zeros(1, na), torch.zeros(na), torch.tensor([2])
    alpha = torch.empty(1, 2)
    kernels.attend_forward(keys2, q, v2, lens, alpha)
    assert torch.equal(alpha, torch.tensor([[0.5, 0.5]]))  # v2 = 0: equal scores
    CH = torch.tensor([[[1.0], [0.0]]])  # ∂L/∂α = dg · CH_j = (1, 0): ∂L/∂e = (0.25, −0.25)
    dv = torch.zeros(torch.get_num_threads(), na)
    kernels.attend_backward(keys2, q, v2, lens, alpha, None, CH, torch.ones(1, 1), torch.zeros(1, 2, na), dv,
                            torch.empty(1, na))
    want = 0.25 * torch.sigmoid(x.double()) - 0.25 * 0.5
    torch.testing.assert_close(dv.sum(0).double(), want, rtol=0, atol=0.25 * 2.5e-7)


def _attend(c, lens=None, threads=None, dA=True, bwd_threads=None, layout=lambda name, t: t):
    """Both directions of the kernel on case c (``layout`` may give any operand another memory layout); returns
    (alpha, g, dkeys2, dv rows, dq)."""
    B, Tx, na = c["keys2"].shape
    lens = c["lens"] if lens is None else lens
    L = lambda name, t: layout(name, t.clone())  # noqa: E731
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or old)
        alpha, g = L("alpha", torch.full((B, Tx), 7.0)), L("g", torch.full((B, c["CH"].shape[2]), 7.0))
        keys2, q, v2, CH = L("keys2", c["keys2"]), L("q", c["q"]), L("v2", c["v2"]), L("CH", c["CH"])
        kernels.attend_forward(keys2, q, v2, lens, alpha, CH, L("gx", c["gx"]), g)
        torch.set_num_threads(bwd_threads or threads or old)
        dkeys2, dq = L("dkeys2", c["dkeys2"]), L("dq", torch.full((B, na), 7.0))
        dv = torch.zeros(torch.get_num_threads() + 1, na)  # a row more than threads: left alone
        kernels.attend_backward(keys2, q, v2, lens, alpha, L("dA", c["dA"]) if dA else None, CH,
                                L("dg", c["Di"][:, na:]), dkeys2, dv, dq)
    finally:
        torch.set_num_threads(old)
    assert (dv[-1] == 0).all()
    return alpha, g, dkeys2, dv, dq


def _wider(name, t):
    """t as a slice of a larger buffer: every dimension strided (the last one contiguous)."""
    big = torch.full([n + 3 for n in t.shape[:-1]] + [t.shape[-1] + 5], float("nan"), dtype=t.dtype)
    view = big[tuple(slice(1, 1 + n) for n in t.shape)]
    return view.copy_(t)


def test_attention_kernel_takes_any_row_strides_and_repeats_itself_exactly(native_kernels):
    """Every operand as a slice of a wider buffer (NaN around it) gives the same bits as contiguous ones; the
    same call twice gives the same bits; and the forward on one thread with the backward on two gives the
    backward's values of two threads for everything but the per-thread rows of dv."""
    c = _attention_case(seed=4)
    plain = _attend(c, threads=2)
    for a, b in zip(plain, _attend(c, threads=2, layout=_wider)):
        assert torch.equal(a, b)
    for a, b in zip(plain, _attend(c, threads=2)):
        assert torch.equal(a, b)
    mixed = _attend(c, threads=1, bwd_threads=2)
    for k in (0, 1, 2, 4):  # α, g, dkeys2, dq: one thread per row, whatever the count
        assert torch.equal(plain[k], mixed[k])
    torch.testing.assert_close(plain[3].sum(0), mixed[3].sum(0), rtol=1e-6, atol=1e-6)


def test_attention_kernel_clamps_lengths(native_kernels):
    """Lengths outside [0, Tx] -- negative, zero, beyond Tx -- never reach outside the arrays: they count as 0
    and Tx, both ways; a row without positions gets α = 0, g = gx, ∂L/∂q = 0 and adds nothing to dkeys2."""
    c = _attention_case(seed=5)
    B, Tx, na = c["keys2"].shape
    lens = c["lens"].clone()
    lens[0], lens[2], lens[3] = Tx + 5, -2, 0
    got = _attend(c, lens=lens)
    want = _attend(c, lens=lens.clamp(0, Tx))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    alpha, g, dkeys2, _, dq = got
    for row in (2, 3):
        assert (alpha[row] == 0).all() and torch.equal(g[row], c["gx"][row]) and (dq[row] == 0).all()
        assert torch.equal(dkeys2[row], c["dkeys2"][row])
    c["lens"] = lens.clamp(min=1)  # the float64 reference's softmax needs a position per row
    ref = _attention_reference(c, True)
    torch.testing.assert_close(alpha[0].double(), ref[0][0], rtol=1e-5, atol=1e-7)


def test_attention_kernel_empty_shapes_and_nan(native_kernels):
    """No rows, or no positions (g = gx), run cleanly; a NaN score makes its row's α NaN, as torch's softmax
    does, and leaves the other rows alone."""
    c = _attention_case(seed=6, B=0)
    _attend(c)
    c = _attention_case(seed=6, Tx=0)
    alpha, g, _, _, dq = _attend(c)
    assert alpha.numel() == 0 and torch.equal(g, c["gx"]) and (dq == 0).all()
    c = _attention_case(seed=6)
    c["keys2"][1, 0, 3] = float("nan")
    alpha = _attend(c)[0]
    assert alpha[1].isnan().all() and not alpha[torch.arange(len(alpha)) != 1].isnan().any()


def test_attention_kernel_refuses_bad_operands(native_kernels):
    """Operands of the wrong dtype, shape, device or layout, and outputs that overlap themselves (the threads
    would race on them), are refused with a ValueError before any C code runs."""
    c = _attention_case()
    B, Tx, na = c["keys2"].shape
    alpha = torch.empty(B, Tx)
    ok = dict(keys2=c["keys2"], q=c["q"], v2=c["v2"], lens=c["lens"], alpha=alpha)
    for bad in (dict(keys2=c["keys2"].double()), dict(q=c["q"].t().contiguous().t()), dict(lens=c["lens"].int()),
                dict(lens=c["lens"].to("meta")), dict(lens=torch.stack([c["lens"], c["lens"]], 1)[:, 0]),
                dict(alpha=torch.empty(B, Tx + 1)), dict(alpha=torch.empty(1, Tx).expand(B, Tx)),
                dict(v2=c["v2"][:-1]), dict(keys2=c["keys2"].to("meta"))):
        with pytest.raises(ValueError, match="attention kernel"):
            kernels.attend_forward(**{**ok, **bad})
    with pytest.raises(ValueError, match="overlaps itself"):
        kernels.attend_forward(**ok, CH=c["CH"], gx=c["gx"], g=torch.empty(1, c["CH"].shape[2]).expand(B, -1))
    args = dict(keys2=c["keys2"], q=c["q"], v2=c["v2"], lens=c["lens"], alpha=alpha, dA=None, CH=c["CH"],
                dg=c["gx"], dkeys2=torch.zeros_like(c["keys2"]), dv=torch.zeros(torch.get_num_threads(), na),
                dq=torch.empty(B, na))
    kernels.attend_backward(**args)
    for bad, match in ((dict(dv=torch.zeros(1, na - 1)), "dv must be"), (dict(dg=None), "go together"),
                       (dict(dkeys2=torch.zeros(B, 1, na).expand(B, Tx, na)), "overlaps itself"),
                       (dict(dq=torch.empty(B, 1).expand(B, na)), "attention kernel")):
        with pytest.raises(ValueError, match=match):
            kernels.attend_backward(**{**args, **bad})


@pytest.mark.parametrize("K", [1, 3, 12])
def test_beam_attention_by_the_kernel_equals_torchs(native_kernels, K):
    """Beam search's α (fast backend, ``beam_alignment``): K query rows per sentence read that sentence's keys
    and length in the kernel (``per``), and give torch's alignment_for_beams' α, padding 0, with C_stack's term
    too; the decoding step takes it without autograd and gives the same step either way."""
    from nmtkit.models.attention import alignment_for_beams
    from nmtkit.models.backend import EncoderOut
    from nmtkit.models.fast.backend import beam_alignment

    from conftest import randomize_, tiny

    g = torch.Generator().manual_seed(K)
    A, Tx, na, n3 = 4, 7, 16, 10
    lens = torch.tensor([7, 3, 5, 1])
    mask = torch.arange(Tx).unsqueeze(0) < lens.unsqueeze(1)
    keys = torch.randn(A, Tx, na, generator=g)
    query = torch.randn(A * K, na, generator=g)
    v_a = torch.randn(na, generator=g)
    enc = EncoderOut(None, keys, mask, None, None)
    got = beam_alignment(query, enc, v_a, K)
    want = alignment_for_beams(query.view(A, K, na), keys, v_a, mask).view(A * K, Tx)
    assert torch.allclose(got, want, atol=1e-6) and (got[~mask.repeat_interleave(K, 0)] == 0).all()
    CH, gx = torch.randn(A, Tx, n3, generator=g), torch.randn(A * K, n3, generator=g)
    out, alpha = torch.empty(A * K, n3), torch.empty(A * K, Tx)
    native_kernels.attend_forward(2 * keys, 2 * query, 2 * v_a, lens, alpha, CH, gx, out, per=K)
    assert torch.allclose(out, gx + torch.bmm(want.view(A, K, Tx), CH).view(A * K, n3), atol=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        native_kernels.attend_forward(2 * keys, 2 * query, 2 * v_a, lens, torch.empty(A * K + 1, Tx), per=K)
    m = randomize_(tiny("rnnsearch")).eval()
    src, src_lens = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]]), torch.tensor([4, 3])
    with torch.no_grad():
        e = m.prepare_decoding(m.encode(src, src_lens))
        state = m.init_decoder(e).repeat_interleave(K, dim=0)
        y = torch.full((2 * K,), 2)
        fast = m.decode_step(y, state, e)
    with torch.enable_grad():  # (autograd: torch's path)
        plain = m.decode_step(y, state, e)
    for a, b in zip(fast, plain):
        assert torch.allclose(a, b.detach(), atol=1e-5)
