#!/usr/bin/env python3
"""The pieces behind this project's speed notes, each against what it replaced (about three minutes)::

    python tests/bench/bench_kernels.py        # writes tests/bench/results/bench_kernels.txt

1. Output-layer products with V not a multiple of 8 against V padded to one (``nmtkit.models.fast.matmul.padded_vocab``):
   a beam-12 step of the small model (960 hypotheses × 128 → V = 7,897, one thread) and the paper-size training
   forward product (1,511 targets × 500 → V = 30,004, torch's default threads).
2. ``nmtkit.translate.search.top_k`` against ``torch.topk`` over beam search's candidates (80 sentences × 12 · 7,897,
   k = 24, one thread).
3. The paper-size training backward products whose result is m = 620 or l = 500 wide, against the same with the
   dimension padded to 624 / 504 (``nmtkit.models.fast.matmul.aligned_linear`` and the fused loss; the "now" column
   includes slicing the result back): ∂L/∂x and ∂L/∂W_stack of the encoder's input projections (3,000 source
   positions, both directions: 6n = 6,000), ∂L/∂t and ∂L/∂W_o of the output layer (1,511 targets, V = 30,008).
4. The paper-size encoder (m = 620, n = 1000, both directions; forward and backward) over the real source lengths
   of ``bench_train.py``'s first measured paper-size minibatches (the prepared Hansards of its paper part, made
   and cached in the work directory when missing): padded to each batch's longest sentence, as before
   (``SourceEncoder.forward``), against packed (``forward_packed``, ``nmtkit.models.fast.packed``); with the share of
   the padded source positions that are padding.

5. The recurrences' per-step products through oneDNN (``nmtkit.models.fast.matmul.Multiplier``, the weight reordered
   once) against torch's default GEMM (``torch.mm``, MKL in this wheel): the decoder's at the paper's batch of 80,
   forwards and backwards, and in bf16 too.
6. One Adadelta update of rnnsearch-50's 80M weights (30k vocabularies), with random gradients everywhere and with
   the embeddings' gradients zero outside ``USED_WORDS`` rows, as a minibatch leaves them: ``torch.optim.Adadelta``
   against ``nmtkit.train.adadelta.Adadelta`` with torch's operations block by block
   (``NMTKIT_BACKEND=fast:no-kernels``; rows without gradient only decayed; the same values bit for bit), and that
   against its compiled kernel (``nmtkit.kernels``, adadelta.c; the same values to float32 rounding).

7. The bf16 training loss's three products (``nmtkit.models.fast.output``: logits t W_oᵀ, ∂L/∂t = (p − y) W_o,
   ∂L/∂W_o = (p − y)ᵀ t, with V' = 30,008 and l' = 504) at N target rows, against N rounded up to a multiple
   of 8 with zero rows (as the loss now does; the extra rows' results are not used), for token counts of real
   Hansards minibatches.
8. Stop 17's smaller items, each against the torch code it replaced (``nmtkit.models.fast.activations``,
   ``nmtkit.kernels.to_bf16``): the GRUs' candidate tanh over a packed step's (2, 80, 1,000) block, ``tanh_``
   (2σ(2x) − 1) against torch's tanh; the maxout over a paper-size batch (1,511 × 2l = 1,000, forward and
   backward), ``pairwise_max`` against ``amax`` over pairs; the bf16 copy of a backward pass's transposed weight
   (Wcatᵀ, 1,000 × 3,000 from a float32 3,000 × 1,000), the C kernel against torch's cast and contiguous copy;
   W_o (30,004 × 500) cast into its padded bf16 copy (30,008 × 504), the kernel against torch's copy.
9. The paper-size attentive decoder (``nmtkit.models.fast.fused.attentive_decoder``, forward and backward, bf16
   autocast and float32) over ``bench_train.py``'s first measured paper-size minibatches (the encoder part's):
   each step's attention as torch ops in row groups (the speed policy's ``attention_kernel`` off) against the C kernel
   (nmtkit/kernels/attention.c).
10. The same decoder with the attention as torch ops (no C kernel: ``NMTKIT_BACKEND=fast:no-kernels``, or a
   machine without a compiler): σ(2 (W_a s_{i-1} + U_a h_j)) kept for every step against recomputed in the
   backward (the speed policy's ``recompute_min_elements``), bf16 and float32, at paper size (above the threshold)
   and at the small preset's (n = n' = 256, its minibatches: below it); with the size of the σ tensor that keeping
   stores for the largest of the batches.
11. ``nmtkit.runtime.tune_malloc`` (freed memory kept in the process) against glibc's defaults, each in a fresh
   process: a log_softmax over a batch's logits (640 targets × V = 30,000, 73 MiB, a new output each call) and a
   fill of a newly allocated 73 MiB tensor.

Each figure is the median of interleaved repeats (milliseconds per call); the machine should be quiet.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

REPEATS = 7


def timed(fn, repeats: int = REPEATS) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def interleaved(cases: dict, rounds: int = 3) -> dict[str, float]:
    """Median ms per call of each case, the cases alternating round by round."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            times[k] += timed(fn)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].rstrip(":"))
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    import torch

    from nmtkit.runtime import tune_malloc
    from nmtkit.models.fast.matmul import padded_vocab, round_up
    from nmtkit.translate.search import top_k

    tune_malloc()
    t0 = time.time()
    out = peers.start_report("bench_kernels.py", "nmtkit kernel benchmark", args, a.allow_dirty)
    if out is None:
        return 2
    default_threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    rows = []

    def product_case(name, N, l, V, threads):
        torch.set_num_threads(threads)
        t = torch.randn(N, l, generator=g)
        W, b = torch.randn(V, l, generator=g) * 0.1, torch.zeros(V)
        Wp, bp = padded_vocab(W, b, 0.0)
        peers.log(f"{name}: V = {V} against {Wp.shape[0]}")
        r = interleaved({"plain": lambda: torch.addmm(b, t, W.t()),
                         "padded": lambda: torch.addmm(bp, t, Wp.t())[:, :V].contiguous()})
        rows.append([name, f"{threads}", f"V = {V:,}: {r['plain']:.1f}", f"V' = {Wp.shape[0]:,} (+ copy to V): "
                     f"{r['padded']:.1f}", f"{r['plain'] / r['padded']:.2f}×"])

    product_case("beam-12 step W_o t (960 × 128)", 960, 128, 7897, 1)
    product_case("training W_o t (1,511 × 500)", 1511, 500, 30004, default_threads)

    torch.set_num_threads(1)
    x = torch.log_softmax(torch.randn(80 * 12, 7897, generator=g) * 3, -1).view(80, -1)
    x += torch.randn(80, 1, generator=g)
    peers.log("top-k over (80, 12 · 7,897)")
    r = interleaved({"topk": lambda: x.topk(24, dim=1), "top_k": lambda: top_k(x, 24)})
    assert torch.equal(top_k(x, 24)[0], x.topk(24, dim=1).values)
    rows.append(["top 24 of (80, 12 · 7,897)", "1", f"torch.topk: {r['topk']:.1f}", f"search.top_k: {r['top_k']:.1f}",
                 f"{r['topk'] / r['top_k']:.2f}×"])

    torch.set_num_threads(default_threads)

    def backward_case(name, a_shape, b_shape, k):
        """a (·, K) @ b (K, k) against the same with k padded to a multiple of 8 (zero columns of b)."""
        a, b = torch.randn(*a_shape, generator=g), torch.randn(*b_shape, generator=g)
        kp = round_up(k)
        b_pad = torch.cat([b, b.new_zeros(b.shape[0], kp - k)], dim=1)
        peers.log(f"{name}: {k} against {kp}")
        r = interleaved({"plain": lambda: a @ b, "padded": lambda: (a @ b_pad)[:, :k].contiguous()})
        rows.append([name, f"{default_threads}", f"{k}: {r['plain']:.1f}", f"{kp} (+ slice to {k}): "
                     f"{r['padded']:.1f}", f"{r['plain'] / r['padded']:.2f}×"])

    N_src, N_tgt, V = 3000, 1511, 30008
    backward_case("∂L/∂x = ∂L/∂gx W_stack (3,000 × 6,000)", (N_src, 6000), (6000, 620), 620)
    backward_case("∂L/∂W_stack = ∂L/∂gxᵀ x (6,000 × 3,000)", (6000, N_src), (N_src, 620), 620)
    backward_case("∂L/∂t = (p − y) W_o (1,511 × 30,008)", (N_tgt, V), (V, 500), 500)
    backward_case("∂L/∂W_o = (p − y)ᵀ t (30,008 × 1,511)", (V, N_tgt), (N_tgt, 500), 500)

    def loss_rows_case(N):
        """The fused loss's three bf16 products at N rows against round_up(N) rows (zero rows of t)."""
        Np = round_up(N)
        W = (torch.randn(V, 504, generator=g) * 0.1).bfloat16()
        cases = {}
        for key, n in (("plain", N), ("padded", Np)):
            t, z = torch.randn(n, 504, generator=g).bfloat16(), torch.randn(n, V, generator=g).bfloat16()
            cases[key] = lambda t=t, z=z: (t @ W.t(), z @ W, z.t() @ t)
        peers.log(f"bf16 loss products: N = {N} against {Np}")
        r = interleaved(cases, rounds=2)
        rows.append(["bf16 loss products: t W_oᵀ, (p − y) W_o, (p − y)ᵀ t (V' = 30,008)", f"{default_threads}",
                     f"N = {N:,}: {r['plain']:.0f}", f"N' = {Np:,}: {r['padded']:.0f}",
                     f"{r['plain'] / r['padded']:.2f}×"])

    encoder_case(rows, default_threads)
    onednn_cases(rows, g, default_threads)
    adadelta_case(rows, default_threads)
    for N in LOSS_ROWS:
        loss_rows_case(N)
    small_items_cases(rows, g, default_threads)
    attention_case(rows, default_threads)
    malloc_cases(rows, default_threads)

    out += ["", f"Median milliseconds per call over interleaved repeats ({REPEATS} per round).", ""]
    out += peers.table(["what", "threads", "before", "now", "speed-up"], rows, align="lrrrr")
    out.append(f"\nload average at end: {peers.load_average()}; total time {(time.time() - t0) / 60:.1f} min")
    return peers.fail_report(out, peers.RESULTS_DIR / "bench_kernels.txt", None)


USED_WORDS = 1000  # rows of an embedding a minibatch uses (Hansards, first 23: 93–1,247 distinct words, mean ~530)
ENCODER_BATCHES = 4  # the first measured minibatches of bench_train.py's paper part
# target tokens of Hansards minibatches (bench_train.py's paper part; 1,511 its mean per update)
LOSS_ROWS = (1015, 1406, 1511, 2037)


def encoder_case(rows: list, threads: int) -> None:
    import torch

    from bench_train import scheduled_lengths
    from nmtkit.models.encoder import SourceEncoder
    from nmtkit.models.fast.packed import packing

    prep = peers.prepare_real(peers.DEFAULT_WORK)
    lengths = [torch.tensor(src) for src, _ in scheduled_lengths(prep, "rnnsearch-50", 3, ENCODER_BATCHES)]
    padded_positions = sum(len(L) * int(L.max()) for L in lengths)
    real_positions = sum(int(L.sum()) for L in lengths)
    torch.manual_seed(0)
    enc = SourceEncoder(620, 1000, bidirectional=True)
    cases = []
    for L in lengths:
        B, Tx = len(L), int(L.max())
        mask = torch.arange(Tx).unsqueeze(0) < L.unsqueeze(1)  # (B, Tx)
        x = torch.randn(B, Tx, 620).masked_fill(~mask.unsqueeze(-1), 0.0)  # embedded source, zero at padding
        pack = packing(L, Tx)
        x_packed = x.view(B * Tx, -1)[pack.fwd_index]
        w = torch.randn(B, Tx, 2000)  # a loss weighting every annotation, for a backward pass
        cases.append((L, mask, x.transpose(0, 1).contiguous(), pack, x_packed, w))

    def padded():
        for L, mask, x, _, _, w in cases:
            (enc(x, L, mask).annotations * w).sum().backward()

    def packed():
        for _, _, _, pack, x_packed, w in cases:
            (enc.forward_packed(x_packed, pack).annotations * w).sum().backward()

    peers.log(f"encoder over {ENCODER_BATCHES} Hansards minibatches: padded against packed")
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(3):
        times["padded"] += timed(padded, repeats=1)
        times["packed"] += timed(packed, repeats=1)
    r = {k: statistics.median(v) for k, v in times.items()}
    rows.append([f"encoder fwd+bwd, {ENCODER_BATCHES} Hansards batches of 80 "
                 f"({100 * (1 - real_positions / padded_positions):.0f}% of source positions padding)",
                 f"{threads}", f"padded: {r['padded']:.0f}", f"packed: {r['packed']:.0f}",
                 f"{r['padded'] / r['packed']:.2f}×"])


def onednn_cases(rows: list, g, threads: int) -> None:
    import torch

    from nmtkit.models.fast.matmul import Multiplier, onednn

    if not onednn(torch.zeros(1)):
        peers.log("no oneDNN products in this torch build: part 5 skipped")
        return
    for name, (M, K, N), dtype in [("per step: [2 W_a; U_z; U_r] s_{i-1}", (80, 1000, 3000), torch.float32),
                                   ("per step: U [r ∘ s]", (80, 1000, 1000), torch.float32),
                                   ("per step, backward: [2 W_a; U_z; U_r]ᵀ ∂", (80, 3000, 1000), torch.float32),
                                   ("per step, bf16: [2 W_a; U_z; U_r] s_{i-1}", (80, 1000, 3000), torch.bfloat16)]:
        x, W = torch.randn(M, K, generator=g).to(dtype), (torch.randn(N, K, generator=g) * 0.03).to(dtype)
        WT, by_W = W.t(), Multiplier(W)
        peers.log(f"{name} ({M} × {K} → {N}, {dtype}): torch.mm against Multiplier")
        r = interleaved({"torch": lambda: x @ WT, "onednn": lambda: by_W.product(x)})
        rows.append([f"{name} ({M} × {K} → {N}{', bf16' if dtype == torch.bfloat16 else ''})", f"{threads}",
                     f"torch.mm: {r['torch']:.2f}", f"Multiplier: {r['onednn']:.2f}",
                     f"{r['torch'] / r['onednn']:.2f}×"])


def adadelta_case(rows: list, threads: int) -> None:
    import copy

    import torch

    from nmtkit import kernels
    from nmtkit.train.adadelta import Adadelta
    from nmtkit.models import build_model

    torch.manual_seed(0)
    model = build_model("rnnsearch-50", src_vocab_size=30004, tgt_vocab_size=30004)
    blocked_twin, compiled_twin = copy.deepcopy(model), copy.deepcopy(model)
    n = sum(p.numel() for p in model.parameters())
    opts = dict(lr=1.0, rho=0.95, eps=1e-6)
    ref = torch.optim.Adadelta(model.parameters(), **opts)
    blocked, compiled = Adadelta(blocked_twin.parameters(), **opts), Adadelta(compiled_twin.parameters(), **opts)
    if not kernels.available():
        raise SystemExit("bench_kernels: nmtkit's C kernels are unavailable (no C compiler?)")
    real_available = kernels.available

    def blocked_step():
        kernels.available = lambda: False  # torch's operations, block by block
        try:
            blocked.step()
        finally:
            kernels.available = real_available

    for case in ("dense", "minibatch"):
        # dense: every gradient entry random; minibatch: the embeddings' gradients zero outside USED_WORDS random
        # rows each, as a minibatch leaves them (the other weights' gradients are dense in training too)
        for (name, p), q, r in zip(model.named_parameters(), blocked_twin.parameters(), compiled_twin.parameters()):
            p.grad = torch.randn_like(p) * 1e-3
            if case == "minibatch" and name in ("E_src", "E_tgt"):
                p.grad *= torch.zeros(p.shape[0], 1).index_fill_(0, torch.randperm(p.shape[0])[:USED_WORDS], 1.0)
            q.grad, r.grad = p.grad.clone(), p.grad.clone()
        peers.log(f"Adadelta over rnnsearch-50 ({case} gradients): torch against blocked against compiled")
        r = interleaved({"torch": ref.step, "blocked": blocked_step, "compiled": compiled.step}, rounds=2)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), blocked_twin.parameters()))
        # (float32 rounding apart, over the 16 updates of each optimizer: within 1e-5 of each weight's scale)
        assert all(float((p - q).detach().abs().max()) <= 1e-5 * float(p.detach().abs().max())
                   for p, q in zip(model.parameters(), compiled_twin.parameters()))
        what = "random gradients" if case == "dense" else f"embeddings' gradients in {USED_WORDS:,} rows"
        rows.append([f"Adadelta update, rnnsearch-50 ({n / 1e6:.1f}M weights, {what}; the same values)",
                     f"{threads}", f"torch.optim: {r['torch']:.0f}", f"blocked: {r['blocked']:.0f}",
                     f"{r['torch'] / r['blocked']:.2f}×"])
        rows.append([f"Adadelta update, rnnsearch-50 ({what}; float32 rounding apart)", f"{threads}",
                     f"blocked: {r['blocked']:.0f}", f"compiled: {r['compiled']:.0f}",
                     f"{r['blocked'] / r['compiled']:.2f}×"])


def small_items_cases(rows: list, g, threads: int) -> None:
    import torch

    from nmtkit import kernels
    from nmtkit.models.fast import matmul
    from nmtkit.models.fast.activations import pairwise_max, tanh_

    x = torch.randn(2, 80, 1000, generator=g) * 2
    h = torch.empty_like(x)
    peers.log("GRU candidate tanh: torch against tanh_")
    r = interleaved({"torch": lambda: torch.tanh(x, out=h), "now": lambda: tanh_(h.copy_(x))})
    rows.append(["GRU candidate tanh, one packed step (2 × 80 × 1,000)", f"{threads}", f"torch.tanh: {r['torch']:.3f}",
                 f"2σ(2x) − 1: {r['now']:.3f}", f"{r['torch'] / r['now']:.2f}×"])

    t_tilde = torch.randn(1511, 1000, generator=g).requires_grad_()
    dt = torch.randn(1511, 500, generator=g)

    def amax_pairs():
        t_tilde.grad = None
        t_tilde.unflatten(-1, (-1, 2)).amax(dim=-1).backward(dt)

    def pairs_now():
        t_tilde.grad = None
        pairwise_max(t_tilde).backward(dt)

    peers.log("maxout forward and backward: amax against pairwise_max")
    r = interleaved({"torch": amax_pairs, "now": pairs_now})
    rows.append(["maxout forward + backward (1,511 × 1,000 → 500)", f"{threads}", f"amax: {r['torch']:.2f}",
                 f"pairwise_max: {r['now']:.2f}", f"{r['torch'] / r['now']:.2f}×"])

    if not kernels.available():
        raise SystemExit("bench_kernels: nmtkit's C kernels are unavailable (no C compiler?)")
    W = torch.randn(3000, 1000, generator=g)
    assert torch.equal(kernels.to_bf16(W.t()), W.t().to(torch.bfloat16).contiguous())
    peers.log("transposed weight to bf16: torch against the kernel")
    r = interleaved({"torch": lambda: W.t().to(torch.bfloat16).contiguous(), "now": lambda: kernels.to_bf16(W.t())})
    rows.append(["backward's Wcatᵀ to bf16, contiguous (1,000 × 3,000)", f"{threads}", f"torch: {r['torch']:.2f}",
                 f"cast.c: {r['now']:.2f}", f"{r['torch'] / r['now']:.2f}×"])

    W_o, b_y = torch.randn(30004, 500, generator=g) * 0.1, torch.zeros(30004)

    def padded_torch():
        W2 = W_o.new_zeros(30008, 504, dtype=torch.bfloat16)
        W2[:30004, :500] = W_o
        return W2

    assert torch.equal(padded_torch(), matmul.padded_vocab(W_o, b_y, 0.0, columns=True, dtype=torch.bfloat16)[0])
    peers.log("W_o into its padded bf16 copy: torch against the kernel")
    r = interleaved({"torch": padded_torch,
                     "now": lambda: matmul.padded_vocab(W_o, b_y, 0.0, columns=True, dtype=torch.bfloat16)})
    rows.append(["W_o to bf16, padded (30,004 × 500 → 30,008 × 504)", f"{threads}", f"torch: {r['torch']:.2f}",
                 f"cast.c: {r['now']:.2f}", f"{r['torch'] / r['now']:.2f}×"])


def attention_case(rows: list, threads: int) -> None:
    """Parts 9 and 10: the attentive decoder at paper size (n = n' = 1,000) over Hansards minibatches, the C kernel
    against torch ops and, with torch ops, σ kept against recomputed; σ also at the small preset's size (n = n' =
    256), where the policy keeps it."""
    prep = peers.prepare_real(peers.DEFAULT_WORK)
    paper = decoder_runner(prep, "rnnsearch-50", 1000, 1000)
    compare_decoders(rows, threads, "attentive decoder", paper, {"attention_kernel": False},
                     {"attention_kernel": True}, ("torch ops", "attention.c"))
    kept, recomputed = 1 << 62, 0  # (recompute_min_elements: never, always)
    compare_decoders(rows, threads, f"attentive decoder, torch ops (σ kept: {paper.sigma_mb:,.0f} MB)", paper,
                     {"attention_kernel": False, "recompute_min_elements": kept},
                     {"attention_kernel": False, "recompute_min_elements": recomputed}, ("σ kept", "σ recomputed"))
    small = decoder_runner(prep, "rnnsearch-small", 256, 256)  # (below recompute_min_elements: σ kept)
    compare_decoders(rows, threads, f"small preset's decoder, torch ops (σ kept: {small.sigma_mb:,.0f} MB)", small,
                     {"attention_kernel": False, "recompute_min_elements": kept},
                     {"attention_kernel": False, "recompute_min_elements": recomputed}, ("σ kept", "σ recomputed"))


def decoder_runner(prep, arch: str, n: int, n_a: int):
    """A function running ``fused.attentive_decoder`` forwards and backwards over the first measured minibatches
    of ``arch`` (n hidden units, n' alignment units; random weights), under a speed policy and bf16 or not."""
    import torch

    from bench_train import scheduled_lengths
    from nmtkit.models.fast import fused
    from nmtkit.models.fast.packed import packing
    from nmtkit.models.fast.policy import override

    lengths = scheduled_lengths(prep, arch, 3, ENCODER_BATCHES)
    g = torch.Generator().manual_seed(1)
    r = lambda *shape, std=0.01: (torch.randn(*shape, generator=g) * std).requires_grad_()  # noqa: E731
    weights = [r(n_a, n), r(n_a, std=0.1), r(2 * n, n), r(n, n), r(3 * n, 2 * n)]  # W_a, v_a, U_zr, U, C_stack
    cases, sigma_bytes = [], []
    for src, tgt in lengths:
        L = torch.tensor(sorted(src, reverse=True))  # nll's order: longest source first
        B, Tx, Ty = len(L), int(L.max()), max(tgt)
        mask = torch.arange(Tx).unsqueeze(0) < L.unsqueeze(1)
        covered = sum((r1 - r0) * T for r0, r1, T in fused._row_groups(mask, n_a))  # as the decoder groups rows
        sigma_bytes.append(Ty * covered * n_a * 4)  # σ kept for every step: (Ty, covered, n') float32
        H = (torch.randn(B, Tx, 2 * n, generator=g) * mask.unsqueeze(-1)).requires_grad_()
        keys = r(B, Tx, n_a, std=1.0)
        cases.append(((r(Ty, B, 3 * n, std=1.0), r(B, n, std=0.5), H, keys, mask), packing(L, Tx).fwd_index,
                      torch.randn(Ty, B, n, generator=g), torch.randn(Ty, B, 2 * n, generator=g)))

    def run(bf16: bool, policy: dict):
        with override(**policy):
            for args, real, wS, wC in cases:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    S, CTX, _ = fused.attentive_decoder(*args, *weights, real=real)
                ((S * wS).sum() + (CTX * wC).sum()).backward()

    run.sigma_mb = max(sigma_bytes) / 2**20  # the largest batch's
    return run


def compare_decoders(rows: list, threads: int, name: str, run, before: dict, now: dict, labels: tuple[str, str]):
    for bf16 in (True, False):
        dtype = "bf16" if bf16 else "float32"
        peers.log(f"{name} ({dtype}) over {ENCODER_BATCHES} Hansards minibatches: {labels[0]} against {labels[1]}")
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(3):
            times["before"] += timed(lambda: run(bf16, before), repeats=1)
            times["now"] += timed(lambda: run(bf16, now), repeats=1)
        t = {k: statistics.median(v) for k, v in times.items()}
        rows.append([f"{name} fwd+bwd ({dtype}), {ENCODER_BATCHES} Hansards batches of 80", f"{threads}",
                     f"{labels[0]}: {t['before']:.0f}", f"{labels[1]}: {t['now']:.0f}",
                     f"{t['before'] / t['now']:.2f}×"])


MALLOC_CHILD = """
import statistics, sys, time, torch
if sys.argv[1] == "tuned":
    from nmtkit.runtime import tune_malloc
    tune_malloc()
torch.set_num_threads(int(sys.argv[2]))
logits = torch.randn(640, 30000)
def timed(fn):
    fn()
    out = []
    for _ in range(15):
        t0 = time.perf_counter(); fn(); out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)
print(timed(lambda: torch.log_softmax(logits, -1)), timed(lambda: torch.empty(640 * 30000).fill_(1.0)))
"""


def malloc_cases(rows: list, threads: int) -> None:
    """Part 11: each setting in its own process (glibc's settings are the process's), alternating, 3 of each."""
    import os
    import subprocess

    peers.log("tune_malloc: log_softmax over (640, 30,000) logits and a 73 MiB fill, fresh processes")
    env = dict(os.environ, PYTHONPATH=str(peers.REPO))
    times: dict[str, list[tuple[float, float]]] = {"default": [], "tuned": []}
    for _ in range(3):
        for key in times:
            out = subprocess.run([sys.executable, "-c", MALLOC_CHILD, key, str(threads)], capture_output=True,
                                 text=True, check=True, env=env).stdout.split()
            times[key].append((float(out[0]), float(out[1])))
    for k, what in enumerate(("log_softmax over a batch's logits (640 × 30,000)", "fill of a new 73 MiB tensor")):
        before = statistics.median(t[k] for t in times["default"])
        now = statistics.median(t[k] for t in times["tuned"])
        rows.append([what, f"{threads}", f"glibc defaults: {before:.1f}", f"tune_malloc: {now:.1f}",
                     f"{before / now:.2f}×"])


if __name__ == "__main__":
    sys.exit(main())
