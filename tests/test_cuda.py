"""The CUDA path (``--device cuda``): the same values, searches and tools as on the CPU.

These tests need a CUDA device and are skipped without one (CI has none); run them on a GPU machine with
``python -m pytest -q tests/test_cuda.py``.  What they prove: the models (both implementations of the recurrences,
the fused loss) give the CPU's values and gradients on the GPU; bf16 autocast works there; beam search finds the
same hypotheses; and ``nmt-train --device cuda`` trains, writes a checkpoint that loads anywhere with
``weights_only=True``, and ``nmt-translate --device cuda`` translates with it, line for line.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmtkit.data import checkpoint
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.search import beam_search
from nmtkit.train.trainer import TrainConfig, train
from nmtkit.translate.translator import Translator
from nmtkit.data.vocab import PAD
from conftest import ARCHS, make_batch, randomize_, tiny  # the CPU tests' tiny models and batches

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (CI has none): run on a GPU machine")


def _model(arch: str) -> torch.nn.Module:
    return randomize_(tiny(arch))  # the paper's init makes attention uniform: give every path weight


def _batch(src_lens=(4, 7, 2, 5), tgt_lens=(5, 3, 6, 1)):
    return make_batch(list(src_lens), list(tgt_lens))


def _run(model, batch, backend: str, device: str):
    model = model.to(device)
    model.backend = backend
    model.zero_grad(set_to_none=True)
    src, lens, tgt_in, tgt_out = (t.to(device) for t in batch)
    logits, alpha = model(src, lens, tgt_in, return_attention=True)
    loss = model.nll(src, lens, tgt_in, tgt_out)
    loss.backward()
    grads = {k: p.grad.detach().cpu() for k, p in model.named_parameters() if p.grad is not None}
    return logits.detach().cpu(), None if alpha is None else alpha.detach().cpu(), loss.detach().cpu(), grads


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_values_and_gradients_equal_the_cpu(arch, backend):
    batch = _batch()
    cpu = _run(_model(arch), batch, backend, "cpu")
    gpu = _run(_model(arch), batch, backend, "cuda")
    tol = dict(atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(gpu[0], cpu[0], **tol)
    if arch == "rnnsearch":
        torch.testing.assert_close(gpu[1], cpu[1], **tol)
    torch.testing.assert_close(gpu[2], cpu[2], **tol)
    assert gpu[3].keys() == cpu[3].keys()
    for k in cpu[3]:
        torch.testing.assert_close(gpu[3][k], cpu[3][k], msg=k, **tol)
    # the loss is cross-entropy of the logits, on the GPU too
    expected = F.cross_entropy(gpu[0].flatten(0, 1).double(), batch[3].flatten(), ignore_index=PAD, reduction="sum")
    assert abs(float(gpu[2]) - float(expected)) < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_on_cuda(arch):
    model = _model(arch).cuda()
    src, lens, tgt_in, tgt_out = (t.cuda() for t in _batch())
    with torch.no_grad():
        expected = float(model.nll(src, lens, tgt_in, tgt_out))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.nll(src, lens, tgt_in, tgt_out)
    loss.backward()
    assert loss.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert abs(loss.detach().item() - expected) < 0.03 * abs(expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_equals_the_cpu(arch):
    src, lens, _, _ = _batch(src_lens=(4, 7, 2, 5, 9, 3))
    results = {}
    for device in ("cpu", "cuda"):
        model = _model(arch).to(device).eval()
        with torch.no_grad():
            results[device] = beam_search(model, src.to(device), lens.to(device), DecodeConfig(beam=5, nbest=2))
    for cpu_hyps, gpu_hyps in zip(results["cpu"], results["cuda"]):
        assert [h.tokens for h in gpu_hyps] == [h.tokens for h in cpu_hyps]
        for a, b in zip(cpu_hyps, gpu_hyps):
            assert abs(a.score - b.score) < 1e-3


@pytest.fixture(scope="module")
def prepared(data_dir, tmp_path_factory):
    """400 real Multi30K pairs with joint BPE, and 50 validation pairs."""
    root = tmp_path_factory.mktemp("cuda")
    for split, name, n in (("train", "train", 400), ("valid", "val", 50)):
        for lang in ("en", "fr"):
            with open(data_dir / "multi30k" / f"{name}.{lang}", encoding="utf-8") as f:
                (root / f"{split}.{lang}").write_text("".join(itertools.islice(f, n)), encoding="utf-8")
    dest = root / "data"
    prepare(PrepareConfig("en", "fr", [str(root / "train")], str(dest), valid=str(root / "valid"),
                          src_vocab_size=300, tgt_vocab_size=300, bpe_merges=300))
    return root, dest


@pytest.mark.parametrize("bf16", [False, True])
def test_train_and_translate_on_cuda(prepared, tmp_path, bf16):
    root, data = prepared
    save = tmp_path / "run"
    result = train(TrainConfig(str(data), "rnnsearch-tiny", str(save), optimizer="adam", lr=3e-3, max_updates=60,
                               valid_every=30, valid_bleu_sentences=10, batch_size=20, device="cuda", bf16=bf16))
    assert result["update"] == 60
    payload = checkpoint.load(str(save / "checkpoint_last.pt"))  # weights_only=True, on the CPU
    assert all(t.device.type == "cpu" for t in payload["model"].values())
    lines = (root / "valid.en").read_text(encoding="utf-8").splitlines()[:20] + ["", "a"]
    on_gpu = Translator([str(save / "checkpoint_last.pt")], DecodeConfig(beam=4), device="cuda").translate_lines(lines)
    on_cpu = Translator([str(save / "checkpoint_last.pt")], DecodeConfig(beam=4), device="cpu").translate_lines(lines)
    assert len(on_gpu) == len(lines) and on_gpu[20] == ""
    assert sum(a == b for a, b in zip(on_gpu, on_cpu)) >= len(lines) - 2  # near-ties may break differently
    # the command line, as a pipeline uses it
    out = subprocess.run([sys.executable, "-m", "nmtkit.cli.translate", "-m", str(save / "checkpoint_last.pt"),
                          "--device", "cuda", "--beam", "4"], input="\n".join(lines) + "\n", text=True,
                         capture_output=True, check=True).stdout.splitlines()
    assert out == on_gpu


def test_serve_on_cuda_gives_nmt_translates_lines(prepared, tmp_path):
    """``nmt-serve --device cuda``: /models names the device; one request and four concurrent clients (decoded in
    shared batches on the GPU) each get ``nmt-translate --device cuda``'s lines, in order, empty lines included (a
    batch of other lines runs other GPU kernels, so a near-tie may break differently: at most two lines of 26)."""
    from concurrent.futures import ThreadPoolExecutor

    from test_serve import Server  # the real server process of the CPU tests

    root, data = prepared
    save = tmp_path / "run"
    train(TrainConfig(str(data), "rnnsearch-tiny", str(save), optimizer="adam", lr=3e-3, max_updates=60,
                      valid_every=60, valid_bleu_sentences=0, batch_size=20, device="cuda"))
    ckpt = str(save / "checkpoint_last.pt")
    lines = (root / "valid.en").read_text(encoding="utf-8").splitlines()[:24] + ["", "a"]
    cli = subprocess.run([sys.executable, "-m", "nmtkit.cli.translate", "-m", ckpt, "--device", "cuda", "--beam", "4"],
                         input="\n".join(lines) + "\n", text=True, capture_output=True, check=True).stdout.splitlines()
    server = Server(ckpt, "--device", "cuda", "--batch-wait-ms", "50")
    try:
        server.ready()
        status, models, _ = server.call("/models")
        assert status == 200 and models["device"].startswith("cuda"), models
        served = [t["tgt"] for t in server.translate(lines, beam=4)]
        assert len(served) == len(cli) and served[24] == "" and sum(a != b for a, b in zip(served, cli)) <= 2
        slices = [lines[k::4] for k in range(4)]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda part: [t["tgt"] for t in server.translate(part, beam=4)], slices))
        assert [len(a) for a in answers] == [len(s) for s in slices]
        concurrent = [answers[i % 4][i // 4] for i in range(len(lines))]  # back in the input's order
        assert concurrent[24] == "" and sum(a != b for a, b in zip(concurrent, cli)) <= 2, (concurrent, cli)
    finally:
        assert server.stop() == 0
