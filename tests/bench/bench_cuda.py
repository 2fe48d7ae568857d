#!/usr/bin/env python3
"""Training and decoding speed on a CUDA device (where one is lent; CI has none).

    python tests/bench/bench_cuda.py > tests/bench/results/bench_cuda.txt

Synthetic batches of random ids, batch 80, source and target 30 tokens (no padding), so the figures are upper bounds
of what real, padded batches give; training: target tokens per second over 40 updates after 5 warm-up updates,
Adadelta with clipping (the paper's recipe), float32 and bf16 autocast; decoding: beam 12 over 480 sentences of
30 random source tokens with RANDOM weights (every output runs to the length limit, 2 × 31 + 10 tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from nmtkit.models import build_model  # noqa: E402
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.search import beam_search  # noqa: E402


def train_speed(arch: str, V: int, bf16: bool, B: int = 80, T: int = 30, updates: int = 40) -> tuple[float, float]:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = build_model(arch, V, V).to(dev)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-6)
    src = torch.randint(4, V, (B, T), device=dev)
    lens = torch.full((B,), T, device=dev)
    tgt_in = torch.randint(4, V, (B, T), device=dev)
    tgt_in[:, 0] = 2
    tgt_out = torch.randint(4, V, (B, T), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model.nll(src, lens, tgt_in, tgt_out)
        (loss / B).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(updates):
        step()
    torch.cuda.synchronize()
    return B * T * updates / (time.perf_counter() - t), torch.cuda.max_memory_allocated() / 2**20


def decode_speed(arch: str, V: int, n: int = 480, B: int = 80, T: int = 30) -> float:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = build_model(arch, V, V).to(dev).eval()
    src = torch.randint(4, V, (n, T), device=dev)
    src[:, -1] = 3
    lens = torch.full((n,), T, device=dev)
    with torch.no_grad():
        beam_search(model, src[:B], lens[:B], DecodeConfig(beam=12))  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        for k in range(0, n, B):
            beam_search(model, src[k: k + B], lens[k: k + B], DecodeConfig(beam=12))
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_cuda.py", "nmtkit CUDA benchmark", args, a.allow_dirty)
    if head is None:
        return 2
    cpu = next(k for k, line in enumerate(head) if line.startswith("CPU: "))
    head.insert(cpu + 1, f"device: {torch.cuda.get_device_name()}")
    print("\n".join(head))
    print(__doc__.split("\n\n", 2)[2].strip())
    print()
    print(f"{'model':<16} {'vocab':>6} {'precision':<14} {'train tok/s':>11} {'peak GPU MB':>11}")
    for arch, V in (("rnnsearch-small", 7900), ("rnnsearch-50", 30004), ("rnnencdec-50", 30004)):
        for bf16 in (False, True):
            tok, mem = train_speed(arch, V, bf16)
            print(f"{arch:<16} {V:>6,} {'bf16 autocast' if bf16 else 'float32':<14} {tok:>11,.0f} {mem:>11,.0f}",
                  flush=True)
    print()
    for arch, V in (("rnnsearch-small", 7900), ("rnnsearch-50", 30004)):
        print(f"{arch}: beam 12, batch 80, random weights: {decode_speed(arch, V):,.1f} sentences/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
