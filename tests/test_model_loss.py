"""The training loss: the fused output layer's cross-entropy, label smoothing, bf16, and training gradients against
finite differences."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import PAD, build_model

from conftest import ARCHS, V_SRC, V_TGT, make_batch, randomize_, tiny  # the shared tiny models and batches


# ------------------------------------------------------------------------------------------ the fused training loss
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk_rows", [1, 3, 10, 1000])  # 10: chunks of 8, padding rows inside the last
def test_nll_equals_cross_entropy_of_logits_with_gradients(arch, chunk_rows, speed_policy):
    """model.nll (output layer only at real positions, fused with softmax and gradient, in row chunks) gives the
    value and every parameter's gradient of plain cross-entropy on forward()'s logits (float64)."""
    # the loss in chunks of chunk_rows rows, the softmax in blocks of two rows (or one)
    speed_policy(loss_chunk_elements=chunk_rows * V_TGT, loss_min_chunk_rows=1, softmax_block_elements=2 * V_TGT)
    model = randomize_(tiny(arch)).double()
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 1])
    results = []
    for fused_loss in (True, False):
        model.zero_grad()
        if fused_loss:
            loss = model.nll(src, lens, tgt_in, tgt_out)
        else:
            logits = model(src, lens, tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, V_TGT), tgt_out.reshape(-1), ignore_index=PAD, reduction="sum")
        (0.5 * loss).backward()
        results.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    assert results[0][0].dtype == torch.float64
    torch.testing.assert_close(results[0][0], results[1][0])
    for k in results[0][1]:
        torch.testing.assert_close(results[0][1][k], results[1][1][k], msg=k)
    with torch.no_grad():  # evaluation: the same value, no gradient work
        torch.testing.assert_close(model.nll(src, lens, tgt_in, tgt_out), results[1][0])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_rows", [2, 1000])
def test_nll_under_bf16_autocast(arch, block_rows, speed_policy):
    speed_policy(softmax_block_elements=block_rows * V_TGT)
    model = randomize_(tiny(arch), std=0.1)
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 4])
    expected = F.cross_entropy(model(src, lens, tgt_in).reshape(-1, V_TGT), tgt_out.reshape(-1), ignore_index=PAD,
                               reduction="sum")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.nll(src, lens, tgt_in, tgt_out)
    assert loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    torch.testing.assert_close(loss, expected.detach(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("chunk_rows", [1000, 8])  # one chunk (∂L/∂W_o kept in bf16 until the backward), several
@pytest.mark.parametrize("eps", [0.0, 0.2])  # label smoothing
def test_loss_gradients_under_bf16_autocast(chunk_rows, eps, speed_policy):
    """Under bf16 autocast the loss's gradients come back in float32 and scaled by the incoming gradient, within
    bf16 rounding of float64's, whether ∂L/∂W_o is one chunk's bf16 product or a float32 sum over chunks; with
    label smoothing too (value and gradients of F.cross_entropy(…, label_smoothing=ε))."""
    import nmtkit.models.fast.output as output

    speed_policy(loss_chunk_elements=chunk_rows * 56, loss_min_chunk_rows=1)
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(29, 13, generator=g)).requires_grad_()  # l = 13, V = 50: both padded (to 16 and 56)
    W = (torch.randn(50, 13, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(50, generator=g) * 0.1).requires_grad_()
    y = torch.randint(0, 50, (29,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = output.linear_cross_entropy(t, W, b, y, label_smoothing=eps)
    (loss / 7).backward()
    ref = [x.detach().double().requires_grad_() for x in (t, W, b)]
    expected = F.cross_entropy(F.linear(ref[0], ref[1], ref[2]), y, reduction="sum", label_smoothing=eps)
    (expected / 7).backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.detach().double(), expected.detach(), rtol=0.01, atol=0)
    for x, r in zip((t, W, b), ref):
        assert x.grad.dtype == torch.float32
        torch.testing.assert_close(x.grad.double(), r.grad, rtol=0.03, atol=0.01 * float(r.grad.abs().max()))


@pytest.mark.parametrize("V", [29, 32])  # padded to a multiple of 8 inside, and not
@pytest.mark.parametrize("l", [5, 8])
def test_linear_cross_entropy_for_any_vocabulary_size(V, l):
    """The fused loss rounds the vocabulary and the maxout size up to multiples of 8 for speed (matmul.py): the
    padding must add nothing to the value or the gradients."""
    from nmtkit.models.fast.output import linear_cross_entropy

    g = torch.Generator().manual_seed(3)
    t = torch.randn(7, l, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, l, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, V, (7,), generator=g)
    results = []
    for fused in (True, False):
        loss = (linear_cross_entropy(t, W, b, y) if fused
                else F.cross_entropy(F.linear(t, W, b), y, reduction="sum"))
        grads = torch.autograd.grad(loss, (t, W, b))
        results.append((loss.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, e in zip(results[0][1], results[1][1]):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("block_rows", [2, 1000])
@pytest.mark.parametrize("eps", [0.0, 0.1])  # label smoothing
def test_linear_cross_entropy_when_the_reference_word_underflows(bf16, block_rows, eps, speed_policy):
    """−log p(y) comes from the softmax's p(y); where p(y) underflows in float32 (a reference word 150 nats below
    the best) it is recomputed from the logits: finite and exact, in float32 and under bf16 autocast, also when
    the softmax runs in blocks of rows, and with label smoothing (whose extra term needs no log p)."""
    from nmtkit.models.fast.output import linear_cross_entropy

    speed_policy(softmax_block_elements=block_rows * 16)  # V' = 16

    g = torch.Generator().manual_seed(6)
    t = torch.randn(5, 8, generator=g)
    W = torch.randn(13, 8, generator=g) * 0.1
    b = torch.zeros(13)
    b[3] = -150.0  # p(3) = e^-150 · … underflows to 0 in float32
    y = torch.tensor([3, 1, 3, 0, 12])
    t.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = linear_cross_entropy(t, W, b, y, label_smoothing=eps)
    loss.backward()
    expected = F.cross_entropy(F.linear(t.detach().double(), W.double(), b.double()), y, reduction="sum",
                               label_smoothing=eps)
    assert torch.isfinite(loss) and torch.isfinite(t.grad).all()
    assert float(expected) > 250  # two words 150 nats down
    torch.testing.assert_close(loss.double(), expected, rtol=1e-3 if bf16 else 1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk_rows", [1000, 8, 3])  # one chunk; several (padding rows in the last); blocks of 1
@pytest.mark.parametrize("eps", [0.1, 0.35])
def test_linear_cross_entropy_with_label_smoothing(dtype, chunk_rows, eps, speed_policy):
    """With label smoothing ε the fused loss is F.cross_entropy(…, label_smoothing=ε) -- the cross-entropy against
    (1 − ε) onehot(y) + ε/V over the real vocabulary, V = 29 padded to 32 inside -- in value and in the gradients
    of t, W and b, in one chunk of rows or several; the second result is the plain −Σ log p(y), detached."""
    import nmtkit.models.fast.output as output

    V, l, N = 29, 5, 37  # V' = 32, l' = 8, N' = 40
    # the loss in chunks of chunk_rows rows, the softmax in blocks of two rows (or one)
    speed_policy(loss_chunk_elements=chunk_rows * 32, loss_min_chunk_rows=1, softmax_block_elements=2 * 32)
    g = torch.Generator().manual_seed(7)
    t = torch.randn(N, l, generator=g, dtype=dtype, requires_grad=True)
    W = torch.randn(V, l, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=g)
    loss, nll = output.linear_cross_entropy_with_nll(t, W, b, y, label_smoothing=eps)
    assert loss.dtype == nll.dtype == dtype and loss.requires_grad and not nll.requires_grad
    grads = torch.autograd.grad(3 * loss, (t, W, b))
    logits = F.linear(t, W, b)
    expected = F.cross_entropy(logits, y, reduction="sum", label_smoothing=eps)
    expected_grads = torch.autograd.grad(3 * expected, (t, W, b))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, F.cross_entropy(logits, y, reduction="sum").detach())
    assert float(loss.detach()) > float(nll)  # random logits: the smoothed target puts mass on less likely words
    for a, e in zip(grads, expected_grads):
        assert a.shape == e.shape and a.dtype == dtype
        torch.testing.assert_close(a, e)
    torch.testing.assert_close(output.linear_cross_entropy(t, W, b, y, label_smoothing=eps), expected)
    with torch.no_grad():  # evaluation: the same values
        for a, e in zip(output.linear_cross_entropy_with_nll(t, W, b, y, label_smoothing=eps), (loss, nll)):
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("chunk_rows", [1000, 8])
def test_linear_cross_entropy_without_label_smoothing_is_unchanged(bf16, chunk_rows, speed_policy):
    """ε = 0 is the plain loss, bit for bit: the value, its gradients and the returned −Σ log p(y) are those of
    linear_cross_entropy(t, W, b, y) without the option."""
    import nmtkit.models.fast.output as output

    speed_policy(loss_chunk_elements=chunk_rows * 32, loss_min_chunk_rows=1)
    g = torch.Generator().manual_seed(8)
    inputs = (torch.randn(21, 6, generator=g), torch.randn(27, 6, generator=g), torch.randn(27, generator=g))
    y = torch.randint(0, 27, (21,), generator=g)
    results = []
    for how in ("plain", "eps", "with_nll"):
        t, W, b = (x.clone().requires_grad_() for x in inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if how == "plain":
                loss = output.linear_cross_entropy(t, W, b, y)
            elif how == "eps":
                loss = output.linear_cross_entropy(t, W, b, y, label_smoothing=0.0)
            else:
                loss, nll = output.linear_cross_entropy_with_nll(t, W, b, y, 0)
                assert torch.equal(nll, loss.detach())
        loss.backward()
        results.append((loss.detach(), t.grad, W.grad, b.grad))
    for other in results[1:]:
        for a, e in zip(other, results[0]):
            assert torch.equal(a, e)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), True, "0.1", None])
def test_label_smoothing_out_of_range_raises(bad):
    from nmtkit.models.fast.output import linear_cross_entropy, linear_cross_entropy_with_nll

    t, W, b, y = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(5), torch.tensor([0, 1, 4])
    for f in (linear_cross_entropy, linear_cross_entropy_with_nll):
        with pytest.raises(ValueError, match="label_smoothing must be a number in \\[0, 1\\)"):
            f(t, W, b, y, label_smoothing=bad)
    model = tiny("rnnsearch")
    with pytest.raises(ValueError, match="label_smoothing"):
        model.training_loss(*make_batch([4, 2], [3, 2]), label_smoothing=bad)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("eps", [0.0, 0.15])
def test_training_loss_equals_smoothed_cross_entropy_of_logits(arch, backend, eps, speed_policy):
    """model.training_loss gives the value and every parameter's gradient of
    F.cross_entropy(forward()'s logits, label_smoothing=ε, ignore_index=PAD, reduction="sum") (float64, the
    fused output layer in several chunks), on either backend (fast, reference); its second result is
    model.nll's value, detached."""
    speed_policy(loss_chunk_elements=3 * V_TGT, loss_min_chunk_rows=1)
    model = randomize_(tiny(arch)).double()
    model.backend = backend
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 1])
    results = []
    for fused_loss in (True, False):
        model.zero_grad()
        if fused_loss:
            loss, nll = model.training_loss(src, lens, tgt_in, tgt_out, label_smoothing=eps)
            assert loss.dtype == nll.dtype == torch.float64 and not nll.requires_grad
        else:
            logits = model(src, lens, tgt_in).reshape(-1, V_TGT)
            loss = F.cross_entropy(logits, tgt_out.reshape(-1), ignore_index=PAD, reduction="sum",
                                   label_smoothing=eps)
            plain = F.cross_entropy(logits, tgt_out.reshape(-1), ignore_index=PAD, reduction="sum")
        (0.5 * loss).backward()
        results.append((loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0])
    for k in results[0][1]:
        torch.testing.assert_close(results[0][1][k], results[1][1][k], msg=k)
    torch.testing.assert_close(nll, plain.detach())
    with torch.no_grad():
        assert torch.equal(nll, model.nll(src, lens, tgt_in, tgt_out))
        if eps == 0:
            assert torch.equal(results[0][0], nll)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_loss_under_bf16_autocast(arch):
    """The trainer's --bf16 option with label smoothing: float32 results close to float32's."""
    model = randomize_(tiny(arch), std=0.1)
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 4])
    logits = model(src, lens, tgt_in).reshape(-1, V_TGT)
    expected = F.cross_entropy(logits, tgt_out.reshape(-1), ignore_index=PAD, reduction="sum", label_smoothing=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = model.training_loss(src, lens, tgt_in, tgt_out, label_smoothing=0.1)
    assert loss.dtype == nll.dtype == torch.float32
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    torch.testing.assert_close(loss, expected.detach(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("K", [5, 16])
def test_aligned_linear_is_linear(K):
    """matmul.aligned_linear pads the reduced dimension to a multiple of 8: F.linear's values and gradients."""
    from nmtkit.models.fast.matmul import aligned_linear

    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 4, K, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(6, K, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    ours, ref = aligned_linear(x, W, b), F.linear(x, W, b)
    torch.testing.assert_close(ours, ref)
    w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    for a, e in zip(torch.autograd.grad((ours * w).sum(), (x, W, b)), torch.autograd.grad((ref * w).sum(), (x, W, b))):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_gradients_match_finite_differences(arch, native_kernels, monkeypatch):
    """What training backpropagates -- the fused recurrences, the C attention kernel and the fused output loss, in
    float32 and training mode -- against central differences of the float64 model on the reference backend, for a few
    entries of every parameter (the entry with the largest gradient among them).  The weights are moved away from the
    initialisation first, so that no gradient is trivially zero (v_a = 0 would zero ∂L/∂W_a and ∂L/∂U_a)."""
    torch.manual_seed(0)
    model = build_model(f"{arch}-tiny", V_SRC, V_TGT)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.train()
    src, lens, tgt_in, tgt_out = make_batch([7, 5, 5, 3, 2], [6, 2, 7, 4, 3])
    calls = []
    real_backward = native_kernels.attend_backward
    monkeypatch.setattr(native_kernels, "attend_backward", lambda *a, **k: calls.append(1) or real_backward(*a, **k))
    model.nll(src, lens, tgt_in, tgt_out).backward()
    assert bool(calls) == (arch == "rnnsearch")  # (the C kernel's backward is what is checked)
    ref = build_model(f"{arch}-tiny", V_SRC, V_TGT).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    ref.backend = "reference"
    ref.train()
    g = torch.Generator().manual_seed(3)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        grad = p.grad.double().flatten()
        picks = torch.cat([torch.randperm(q.numel(), generator=g)[:3], grad.abs().argmax().view(1)]).tolist()
        for k in picks:
            with torch.no_grad():
                old, h = q.view(-1)[k].item(), 1e-6
                q.view(-1)[k] = old + h
                up = ref.nll(src, lens, tgt_in, tgt_out).item()
                q.view(-1)[k] = old - h
                down = ref.nll(src, lens, tgt_in, tgt_out).item()
                q.view(-1)[k] = old
            fd = (up - down) / (2 * h)
            assert abs(fd - grad[k].item()) <= 1e-3 * max(abs(fd), 1e-2), (name, k, fd, grad[k].item())
