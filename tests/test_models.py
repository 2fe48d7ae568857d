"""Unit tests for nmtkit.models at tiny sizes (torch, numpy and pytest only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from nmtkit.models import (
    BOS,
    EOS,
    PAD,
    build_model,
    count_weights,
    get_config,
    list_models,
    list_presets,
    load_paper_parameters,
    paper_parameters,
    register_model,
    register_preset,
)
from nmtkit.models.gru import PaperGRU, gru_recurrence
from nmtkit.models.init import initialize
from nmtkit.models.fused import gru_sequence
from nmtkit.models.packed import gru_packed, packing, unpack
from nmtkit.models import reference
from nmtkit.models.rnnsearch import RNNsearchConfig

from conftest import ARCHS, V_SRC, V_TGT, make_batch, randomize_, tiny  # the shared tiny models and batches


# ------------------------------------------------------------------------------------------------------ shapes / API
@pytest.mark.parametrize("arch", ARCHS)
def test_shapes(arch):
    model = tiny(arch)
    cfg = model.config
    src, src_lens, tgt_in, _ = make_batch([5, 3, 1], [4, 6, 2])
    B, Tx, Ty = src.shape[0], src.shape[1], tgt_in.shape[1]
    logits = model(src, src_lens, tgt_in)
    assert logits.shape == (B, Ty, V_TGT) and logits.dtype == torch.float32
    logits2, alpha = model(src, src_lens, tgt_in, return_attention=True)
    assert torch.equal(logits, logits2)
    enc = model.encode(src, src_lens)
    ctx = 2 * cfg.hidden_dim if arch == "rnnsearch" else cfg.hidden_dim
    assert enc.annotations.shape == (B, Tx, ctx)
    assert enc.src_mask.shape == (B, Tx) and enc.src_mask.dtype == torch.bool
    assert enc.init_state.shape == (B, cfg.hidden_dim)
    state = model.init_decoder(enc)
    step_logits, new_state, step_alpha = model.decode_step(tgt_in[:, 0], state, enc)
    assert step_logits.shape == (B, V_TGT) and new_state.shape == (B, cfg.hidden_dim)
    if arch == "rnnsearch":
        assert enc.keys.shape == (B, Tx, cfg.attn_dim) and enc.context is None
        assert alpha.shape == (B, Ty, Tx) and step_alpha.shape == (B, Tx)
    else:
        assert enc.keys is None and enc.context.shape == (B, cfg.hidden_dim)
        assert alpha is None and step_alpha is None
    index = torch.tensor([2, 0, 0, 1])
    reordered = model.reorder_encoder_out(enc, index)
    assert reordered.annotations.shape[0] == 4
    assert torch.equal(reordered.annotations[1], enc.annotations[0])
    assert torch.equal(reordered.src_mask[0], enc.src_mask[2])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
def test_single_target_step_and_backward(arch, fused):
    """Ty = 1 (only <s> in, only </s> out) and one-token sources: the edge cases of the loops."""
    model = tiny(arch)
    model.fused = fused
    src, lens, tgt_in, _ = make_batch([1, 3], [0, 0])
    logits = model(src, lens, tgt_in)
    assert logits.shape == (2, 1, V_TGT)
    logits.sum().backward()
    assert model.E_src.grad.abs().sum() > 0 and model.W_o.grad.abs().sum() > 0
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("fused", [True, False])
def test_attention_gives_padding_exactly_zero(fused):
    model = randomize_(tiny("rnnsearch"))
    model.fused = fused
    src, src_lens, tgt_in, _ = make_batch([6, 2, 4], [3, 5, 1])
    _, alpha = model(src, src_lens, tgt_in, return_attention=True)
    pad = ~model.encode(src, src_lens).src_mask  # (B, Tx)
    assert torch.all(alpha.masked_select(pad.unsqueeze(1).expand_as(alpha)) == 0)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(alpha.shape[:2]))
    enc = model.encode(src, src_lens)
    _, _, step_alpha = model.decode_step(tgt_in[:, 0], enc.init_state, enc)
    assert torch.all(step_alpha[pad] == 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_padded_batch_equals_sentences_alone(arch, fused, unit):
    model = randomize_(tiny(arch, encoder_gru=unit))
    model.fused = fused
    src_lens, tgt_lens = [4, 7, 1, 5], [6, 2, 3, 1]
    src, lens, tgt_in, _ = make_batch(src_lens, tgt_lens)
    logp = F.log_softmax(model(src, lens, tgt_in), dim=-1)
    for b, (ls, lt) in enumerate(zip(src_lens, tgt_lens)):
        alone = F.log_softmax(model(src[b : b + 1, :ls], lens[b : b + 1], tgt_in[b : b + 1, : lt + 1]), dim=-1)
        torch.testing.assert_close(logp[b, : lt + 1], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_first_input_is_zero_vector(arch):
    """E y_0 = 0: the <s> row of E_tgt is never used."""
    model = randomize_(tiny(arch))
    src, lens, tgt_in, _ = make_batch([3, 4], [2, 3])
    before = model(src, lens, tgt_in)
    with torch.no_grad():
        model.E_tgt[BOS].add_(5.0)
    torch.testing.assert_close(model(src, lens, tgt_in), before, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------- the GRU
def _paper_gru_by_hand(P, prefix, xs, s):
    """The paper's unit, written from the equations with paper_parameters: reset gate BEFORE U."""
    out = []
    for x in xs:
        z = torch.sigmoid(P[prefix + "W_z"] @ x + P[prefix + "U_z"] @ s + P[prefix + "b_z"])
        r = torch.sigmoid(P[prefix + "W_r"] @ x + P[prefix + "U_r"] @ s + P[prefix + "b_r"])
        s_tilde = torch.tanh(P[prefix + "W"] @ x + P[prefix + "U"] @ (r * s) + P[prefix + "b"])
        s = (1 - z) * s + z * s_tilde
        out.append(s)
    return torch.stack(out)


def _encoder_by_hand(P, src_ids, bidirectional):
    x = P["E_src"][src_ids]  # (T, m)
    n = P["enc.fwd.U"].shape[0]
    fwd = _paper_gru_by_hand(P, "enc.fwd.", x, torch.zeros(n))
    if not bidirectional:
        return fwd, fwd[-1], None
    bwd = _paper_gru_by_hand(P, "enc.bwd.", x.flip(0), torch.zeros(n)).flip(0)
    return torch.cat([fwd, bwd], dim=-1), fwd[-1], bwd[0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", ["fused", "op-by-op", "reference"])
def test_encoder_matches_paper_equations(arch, path):
    # one sentence at a time, unbatched: also the check of the batched reference's masking (nmtkit/models/reference.py)
    model = randomize_(tiny(arch))
    model.fused = path == "fused"
    model.backend = "reference" if path == "reference" else "fast"
    P = paper_parameters(model)
    src, lens, _, _ = make_batch([5, 2, 4], [1, 1, 1])
    enc = model.encode(src, lens)
    for b, ls in enumerate(lens.tolist()):
        H, last_fwd, first_bwd = _encoder_by_hand(P, src[b, :ls], arch == "rnnsearch")
        torch.testing.assert_close(enc.annotations[b, :ls], H, atol=1e-5, rtol=1e-5)
        assert torch.all(enc.annotations[b, ls:] == 0)
        summary = first_bwd if arch == "rnnsearch" else last_fwd
        torch.testing.assert_close(enc.init_state[b], torch.tanh(P["W_s"] @ summary + P["b_s"]), atol=1e-5, rtol=1e-5)
        if arch == "rnnencdec":
            torch.testing.assert_close(enc.context[b], last_fwd, atol=1e-5, rtol=1e-5)


def test_paper_gru_differs_from_torch_gru():
    """Same weights, mapped onto torch.nn.GRU (r, z, n rows; torch's z is the paper's 1 − z): only the reset
    placement differs, and the outputs do."""
    torch.manual_seed(3)
    m, n, T = 4, 5, 4
    layer = randomize_(PaperGRU(m, n), std=0.5)
    Wz, Wr, W = layer.W_stack.detach().split(n)
    bz, br, b = layer.b_stack.detach().split(n)
    Uz, Ur = layer.U_zr.detach().split(n)
    U = layer.U.detach()
    x = torch.randn(T, 1, m)
    ours = layer(layer.input_projections(x))[:, 0]  # (T, n)
    P = {"W_z": Wz, "W_r": Wr, "W": W, "U_z": Uz, "U_r": Ur, "U": U, "b_z": bz, "b_r": br, "b": b}
    torch.testing.assert_close(ours, _paper_gru_by_hand(P, "", x[:, 0], torch.zeros(n)), atol=1e-6, rtol=1e-5)
    ref = torch.nn.GRU(m, n)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.cat([Wr, -Wz, W]))
        ref.weight_hh_l0.copy_(torch.cat([Ur, -Uz, U]))
        ref.bias_ih_l0.copy_(torch.cat([br, -bz, b]))
        ref.bias_hh_l0.zero_()
    theirs = ref(x)[0][:, 0].detach()
    # torch's form by hand: the reset gate multiplies U s, after the matrix
    s, by_hand = torch.zeros(n), []
    for xt in x[:, 0]:
        z = torch.sigmoid(Wz @ xt + Uz @ s + bz)
        r = torch.sigmoid(Wr @ xt + Ur @ s + br)
        s = (1 - z) * s + z * torch.tanh(W @ xt + r * (U @ s) + b)
        by_hand.append(s)
    torch.testing.assert_close(theirs, torch.stack(by_hand), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-6, rtol=1e-5)  # from s_0 = 0 both agree on step 1
    assert (ours[1:] - theirs[1:]).abs().max() > 1e-3


def test_fused_gru_equals_reference():
    torch.manual_seed(4)
    gx, s0 = torch.randn(6, 3, 15, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    U_zr, U = torch.randn(10, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    torch.testing.assert_close(gru_sequence(gx, U_zr, U, s0), gru_recurrence(gx, U_zr, U, s0))


def test_packing_layout():
    """Sentences by decreasing length (stable), step t = the first b_t of them; the backward direction reads each
    sentence from its own last token."""
    lens, Tx = torch.tensor([2, 4, 1, 4]), 5  # width 5 > longest: extra padding column
    pack = packing(lens, Tx)
    assert pack.batch_sizes == [4, 3, 2, 2] and pack.offsets == [0, 4, 7, 9] and pack.shape == (4, 5)
    rank = [1, 3, 0, 2]  # the order: lengths 4, 4 (stable: sentence 1 before 3), 2, 1
    expect_fwd = [b * Tx + t for t in range(4) for b in rank if t < lens[b]]
    assert pack.fwd_index.tolist() == expect_fwd
    # the backward direction's packed row k reads position L_b − 1 − t of the same sentence
    expect_bwd = [b * Tx + int(lens[b]) - 1 - t for t in range(4) for b in rank if t < lens[b]]
    assert pack.fwd_index[pack.fwd_of_bwd].tolist() == expect_bwd
    assert torch.equal(pack.bwd_of_fwd[pack.fwd_of_bwd], torch.arange(len(expect_fwd)))
    # the previous step of each row t ≥ 1 is the same sentence's position t − 1
    assert (pack.fwd_index[pack.prev_rows] + 1).tolist() == expect_fwd[4:]
    # each sentence's last reading step is at its last position
    assert pack.fwd_index[pack.last_rows].tolist() == [b * Tx + int(lens[b]) - 1 for b in range(4)]
    values = torch.arange(len(expect_fwd), dtype=torch.float32).unsqueeze(1)
    grid = unpack(values, pack)  # (4, 5, 1)
    assert grid.shape == (4, 5, 1) and grid.flatten()[expect_fwd].tolist() == values.squeeze(1).tolist()
    assert int((grid != 0).sum()) == len(expect_fwd) - 1  # only padding is zero (and row 0 holds the value 0)


@pytest.mark.parametrize("lens", [[3, 1, 5, 3, 2], [4, 4], [1]])
def test_packed_grus_equal_the_reference_and_gradcheck(lens):
    """Both directions over packed sentences = the reference recurrence over each sentence alone (forward order
    and read backwards), values and float64 gradients."""
    torch.manual_seed(6)
    n, dt = 4, torch.float64
    lens_t = torch.tensor(lens)
    pack = packing(lens_t, max(lens))
    N = sum(lens)
    x = torch.randn(len(lens), max(lens), 3 * n, dtype=dt)  # gx at every (sentence, position)
    U_zr, U = torch.randn(2, 2 * n, n, dtype=dt) * 0.5, torch.randn(2, n, n, dtype=dt) * 0.5
    flat = x.view(-1, 3 * n)
    gx = torch.stack([flat[pack.fwd_index], flat[pack.fwd_index[pack.fwd_of_bwd]]])  # (2, N, 3n)
    H = gru_packed(gx, U_zr, U, pack)  # (2, N, n)
    for b, L in enumerate(lens):
        fwd = gru_recurrence(x[b, :L].unsqueeze(1), U_zr[0], U[0])[:, 0]  # (L, n)
        bwd = gru_recurrence(x[b, :L].flip(0).unsqueeze(1), U_zr[1], U[1])[:, 0]  # (L, n)   in reading order
        rows_f = [k for k in range(N) if pack.fwd_index[k] // max(lens) == b]
        rows_b = [k for k in range(N) if pack.fwd_index[pack.fwd_of_bwd[k]] // max(lens) == b]
        torch.testing.assert_close(H[0, rows_f], fwd)
        torch.testing.assert_close(H[1, rows_b], bwd)
    args = (gx.clone().requires_grad_(), U_zr.clone().requires_grad_(), U.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda g, a, u: gru_packed(g, a, u, pack), args, eps=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------------- decoder
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
def test_decode_step_equals_forward(arch, fused):
    model = randomize_(tiny(arch))
    model.fused = fused
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    logits, alpha = model(src, lens, tgt_in, return_attention=True)
    with torch.no_grad():  # the fused path keeps no per-step state then: same values
        no_grad_logits, no_grad_alpha = model(src, lens, tgt_in, return_attention=True)
    torch.testing.assert_close(no_grad_logits, logits, atol=0, rtol=0)
    if alpha is not None:
        torch.testing.assert_close(no_grad_alpha, alpha, atol=0, rtol=0)
    enc = model.encode(src, lens)
    state = model.init_decoder(enc)
    for i in range(tgt_in.shape[1]):
        step_logits, state, step_alpha = model.decode_step(tgt_in[:, i], state, enc)
        torch.testing.assert_close(step_logits, logits[:, i], atol=1e-5, rtol=1e-5)
        if alpha is not None:
            torch.testing.assert_close(step_alpha, alpha[:, i], atol=1e-6, rtol=1e-5)


def test_rnnsearch_decode_step_matches_hand_written_equations():
    model = randomize_(tiny("rnnsearch"))
    P = paper_parameters(model)
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [3, 3, 3])
    enc = model.encode(src, lens)
    state = model.init_decoder(enc)
    for i in range(2):  # the first step (y_0 = <s>) and a real word
        y = tgt_in[:, i]
        ref_logits, ref_state, ref_alpha = reference.decoder_step(P, y, state, enc.annotations, enc.src_mask)
        logits, new_state, alpha = model.decode_step(y, state, enc)
        torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_state, ref_state, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(alpha, ref_alpha, atol=1e-6, rtol=1e-5)
        state = new_state


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_and_reference_agree_with_gradients(arch):
    model = randomize_(tiny(arch)).double()
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 4])
    grads, outs = [], []
    for fused in (True, False):
        model.fused = fused
        model.zero_grad()
        logits, alpha = model(src, lens, tgt_in, return_attention=True)
        loss = F.cross_entropy(logits.reshape(-1, V_TGT), tgt_out.reshape(-1), ignore_index=PAD)
        if alpha is not None:  # a loss on the attention too (e.g. guided alignment): its gradient path is checked
            loss = loss + (alpha * torch.linspace(-1, 1, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
        loss.backward()
        outs.append(logits.detach())
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    torch.testing.assert_close(outs[0], outs[1])
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], msg=k)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sigma", ["recomputed", "kept"])
def test_gradcheck(arch, sigma, monkeypatch):
    """float64 gradcheck of the whole model (the fused path, with its hand-written backward) w.r.t. every parameter;
    with the attention's σ recomputed in the backward (paper size) and kept from the forward (smaller sizes)."""
    import nmtkit.models.fused as fused

    if sigma == "kept":
        monkeypatch.setattr(fused, "RECOMPUTE_MIN_ELEMENTS", 1 << 62)
    torch.manual_seed(5)
    extra = {"attn_dim": 2} if arch == "rnnsearch" else {}
    model = build_model(arch, 6, 5, emb_dim=2, hidden_dim=3, maxout_dim=2, **extra)
    model = randomize_(model, std=0.5).double()
    src = torch.tensor([[5, 4, EOS], [4, EOS, PAD]])
    lens = torch.tensor([3, 2])
    tgt_in = torch.tensor([[BOS, 4, 4], [BOS, 4, PAD]])
    names = [k for k, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    weights = torch.randn(2, 3, 5, dtype=torch.float64)

    def f(*ps):
        return (functional_call(model, dict(zip(names, ps)), (src, lens, tgt_in)) * weights).sum()

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- attention in source-length groups
def _source_mask(lens):
    return torch.arange(max(lens)).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)


def test_row_groups(monkeypatch):
    """fused._row_groups: equal-size groups of a batch sorted by source length, each over its longest source;
    groups of the same length merged; one group for an unsorted or small batch, or too little attention work."""
    import nmtkit.models.fused as fused
    from nmtkit.models.fused import _row_groups

    assert _row_groups(_source_mask([9, 9, 8, 7, 7, 5, 3, 3, 2, 1]), 1) == [(0, 2, 9), (2, 5, 8), (5, 8, 5), (8, 10, 2)]
    assert _row_groups(_source_mask([6, 6, 6, 6, 6, 6, 4, 4]), 1) == [(0, 6, 6), (6, 8, 4)]  # three merged
    assert _row_groups(_source_mask([5, 6, 4, 4, 3, 3, 2, 1]), 1) == [(0, 8, 6)]  # not sorted
    assert _row_groups(_source_mask([6, 5, 4, 3, 2, 1, 1]), 1) == [(0, 7, 6)]  # fewer than 2 rows per group
    monkeypatch.setattr(fused, "GROUP_MIN_ELEMENTS", 1 << 21)  # (as outside the tests)
    assert _row_groups(_source_mask([9, 9, 8, 7, 7, 5, 3, 3, 2, 1]), 1000) == [(0, 10, 9)]  # 90,000 elements
    assert len(_row_groups(_source_mask([50] * 20 + [30] * 60), 1000)) == 2  # 80 × 50 × 1,000: the paper's


GROUP_SRC, GROUP_TGT = [7, 7, 6, 5, 5, 4, 3, 3, 2, 1], [4, 6, 2, 5, 3, 3, 4, 1, 2, 5]


def test_attention_groups_equal_one_group(monkeypatch):
    """A batch sorted by source length runs its attention in four groups (fused._row_groups): the logits, the
    attention weights (exactly zero at padding) and every gradient, with a loss on α as well, equal those of one
    group over all positions (float64)."""
    import nmtkit.models.fused as fused

    assert len(fused._row_groups(_source_mask(GROUP_SRC), 1)) == 4
    model = randomize_(tiny("rnnsearch")).double()
    model.fused = True
    src, lens, tgt_in, tgt_out = make_batch(GROUP_SRC, GROUP_TGT)
    results = []
    for grouped in (True, False):
        if not grouped:
            monkeypatch.setattr(fused, "_row_groups", lambda m, n_a: [(0, m.shape[0], m.shape[1])])
        model.zero_grad()
        logits, alpha = model(src, lens, tgt_in, return_attention=True)
        loss = F.cross_entropy(logits.reshape(-1, V_TGT), tgt_out.reshape(-1), ignore_index=PAD)
        loss = loss + (alpha * torch.linspace(-1, 1, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
        loss.backward()
        results.append((logits.detach(), alpha.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (logits, alpha, grads), (logits_1, alpha_1, grads_1) = results
    torch.testing.assert_close(logits, logits_1)
    torch.testing.assert_close(alpha, alpha_1)
    assert (alpha.masked_select((src == PAD).unsqueeze(1)) == 0).all()
    for k in grads:
        torch.testing.assert_close(grads[k], grads_1[k], msg=k)


@pytest.mark.parametrize("unit", ["paper", "torch"])  # packed encoder (C_stack h_j at the real positions) or not
@pytest.mark.parametrize("bf16", [False, True])
def test_attention_kernel_equals_torch_ops(native_kernels, monkeypatch, bf16, unit):
    """The fused decoder's attention step through the C kernel (nmtkit/kernels/attention.c) and through torch ops
    (row groups, σ recomputed) give the same loss, logits, attention weights (exactly 0 at padding) and
    gradients of every parameter, with a loss on α as well: in float32 within float32 rounding of each other and
    of the float64 reference path; under bf16 autocast, where a last-bit difference can flip a bf16 rounding,
    within 1e-2 of each tensor's largest value (measured: 7e-4 with the packed encoder, 3.5e-3 with
    torch.nn.GRU's).  A spy checks which path ran, and that under bf16 the kernel reads C_stack h_j in bf16."""
    import nmtkit.models.fused as fused

    calls, ch_dtypes = [], set()
    for name, ch_arg in (("attend_forward", 5), ("attend_backward", 6)):  # (CH's position)
        real = getattr(native_kernels, name)

        def spy(*a, _r=real, _n=name, _c=ch_arg):
            calls.append(_n)
            ch_dtypes.add(None if a[_c] is None else a[_c].dtype)
            return _r(*a)

        monkeypatch.setattr(native_kernels, name, spy)
    model = randomize_(tiny("rnnsearch", encoder_gru=unit), std=0.2)
    src, lens, tgt_in, tgt_out = make_batch(GROUP_SRC, GROUP_TGT)
    results = []
    for kernel in (True, False) if bf16 else (True, False, None):  # None: the float64 reference
        monkeypatch.setattr(fused, "ATTENTION_KERNEL", bool(kernel))
        m = model.double() if kernel is None else model.float()
        m.fused = kernel is not None
        m.zero_grad()
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, alpha = m(src, lens, tgt_in, return_attention=True)
            nll = m.nll(src, lens, tgt_in, tgt_out)
        loss = F.cross_entropy(logits.float().reshape(-1, V_TGT), tgt_out.reshape(-1), ignore_index=PAD)
        loss = nll.double() + loss + (alpha.double() * torch.linspace(-1, 1, alpha.numel(), dtype=torch.float64)
                                      .view_as(alpha)).sum()
        loss.backward()
        assert (len(calls) > 0) == bool(kernel)
        if kernel:
            assert calls.count("attend_forward") == calls.count("attend_backward") == 2 * (max(GROUP_TGT) + 1)
            # C_stack h_j as the bf16 product gave it (the kernel reads half the bytes), else float32
            assert ch_dtypes - {None} == {torch.bfloat16 if bf16 else torch.float32}
        results.append([nll.detach(), logits.detach(), alpha.detach(), *(p.grad for p in m.parameters())])
    assert (results[0][2].masked_select((src == PAD).unsqueeze(1)) == 0).all()
    names = ["nll", "logits", "alpha", *(k for k, _ in model.named_parameters())]
    for other in results[1:]:
        for what, a, b in zip(names, results[0], other):
            a, b = a.double(), b.double()
            if bf16:
                assert (a - b).abs().max() <= 1e-2 * b.abs().max(), what
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=what)


def test_attention_kernel_without_gradients_and_with_a_mask_that_is_not_right_padding(native_kernels,
                                                                                     monkeypatch):
    """Without autograd (validation, alignment) the kernel gives the torch ops' α; a source mask that is not
    right padding (the kernel reads each row's first positions) goes to the torch ops, with their values."""
    import nmtkit.models.fused as fused

    calls = []
    real = native_kernels.attend_forward
    monkeypatch.setattr(native_kernels, "attend_forward", lambda *a: calls.append(1) or real(*a))
    model = randomize_(tiny("rnnsearch"), std=0.2)
    src, lens, tgt_in, _ = make_batch(GROUP_SRC, GROUP_TGT)
    alphas = []
    for kernel in (True, False):
        monkeypatch.setattr(fused, "ATTENTION_KERNEL", kernel)
        with torch.no_grad():
            alphas.append(model(src, lens, tgt_in, return_attention=True)[1])
    assert calls
    torch.testing.assert_close(alphas[0], alphas[1], rtol=1e-5, atol=1e-7)
    torch.manual_seed(3)
    B, Tx, Ty, n, m = 3, 4, 2, 5, 6
    mask = torch.tensor([[True, False, True, False], [True, True, True, True], [True, True, False, False]])
    H = torch.randn(B, Tx, 2 * n) * mask.unsqueeze(-1)
    args = (torch.randn(Ty, B, 3 * n), torch.randn(B, n), H, torch.randn(B, Tx, m), mask, torch.randn(m, n),
            torch.randn(m), torch.randn(2 * n, n), torch.randn(n, n), torch.randn(3 * n, 2 * n))
    outs = []
    for kernel in (True, False):
        monkeypatch.setattr(fused, "ATTENTION_KERNEL", kernel)
        calls.clear()
        outs.append(fused.attentive_decoder(*args))
        assert not calls
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert outs[0][2][:, 0, 1].eq(0).all() and outs[0][2][:, 0, 2].gt(0).all()  # α follows the mask


class _NLL(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *batch):
        return self.model.nll(*batch)


@pytest.mark.parametrize("sigma", ["recomputed", "kept"])
def test_nll_sorts_its_batch_and_gradchecks_in_groups(sigma, monkeypatch):
    """nll takes the sentences longest source first, so that the attention runs in groups: the loss of a batch
    in any order is the sum of its sentences' losses, and its float64 gradcheck (fused path, four groups; the
    attention's σ recomputed or kept) holds."""
    import nmtkit.models.fused as fused
    from nmtkit.models.fused import _row_groups, by_source_length

    if sigma == "kept":
        monkeypatch.setattr(fused, "RECOMPUTE_MIN_ELEMENTS", 1 << 62)

    torch.manual_seed(5)
    model = randomize_(build_model("rnnsearch", 6, 5, emb_dim=2, hidden_dim=3, maxout_dim=2, attn_dim=2),
                       std=0.5).double()
    src, lens, tgt_in, tgt_out = make_batch(GROUP_SRC[::-1], GROUP_TGT, seed=3)  # (shortest source first)
    src, tgt_in, tgt_out = src.clamp(max=5), tgt_in.clamp(max=4), tgt_out.clamp(max=4)
    assert len(_row_groups(by_source_length(src, lens)[0] != PAD, 2)) == 4
    alone = sum(model.nll(src[b:b + 1, :lens[b]], lens[b:b + 1], tgt_in[b:b + 1], tgt_out[b:b + 1])
                for b in range(len(lens)))
    torch.testing.assert_close(model.nll(src, lens, tgt_in, tgt_out), alone)
    wrapper = _NLL(model)
    names = [k for k, _ in wrapper.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in wrapper.parameters())

    def f(*ps):
        return functional_call(wrapper, dict(zip(names, ps)), (src, lens, tgt_in, tgt_out))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5)


# ------------------------------------------------------------------------------------------------ paper parameters
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_paper_parameters_round_trip(arch, unit):
    source = randomize_(tiny(arch, encoder_gru=unit))
    P = {k: v.clone() for k, v in paper_parameters(source).items()}
    n, m, l = 48, 32, 24
    ctx = 2 * n if arch == "rnnsearch" else n
    assert P["enc.fwd.W_z"].shape == (n, m) and P["enc.fwd.U"].shape == (n, n) and P["dec.C_r"].shape == (n, ctx)
    assert P["E_src"].shape == (V_SRC, m) and P["W_o"].shape == (V_TGT, l) and P["C_o"].shape == (2 * l, ctx)
    assert ("W_a" in P) == ("enc.bwd.U" in P) == (arch == "rnnsearch")
    torch.manual_seed(9)
    target = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)
    load_paper_parameters(target, P)
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    if unit == "paper":  # (torch.nn.GRU's two input/recurrent biases reach the paper's one bias as their sum)
        for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
            assert torch.equal(a, b), name  # every weight arrives exactly
    # same weights, same values (up to rounding: BLAS results may depend on buffer alignment)
    torch.testing.assert_close(target(src, lens, tgt_in), source(src, lens, tgt_in), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="missing"):
        load_paper_parameters(target, {k: v for k, v in P.items() if k != "W_s"})


# ---------------------------------------------------------------------------------------------------- initialisation
def test_initialisation_statistics():
    torch.manual_seed(0)
    model = build_model("rnnsearch", 400, 400, emb_dim=64, hidden_dim=96, attn_dim=80, maxout_dim=48)
    P = paper_parameters(model)
    for key, val in P.items():
        name = key.rsplit(".", 1)[-1]
        if name.startswith("b") or name == "v_a":
            assert torch.all(val == 0), key
        elif name in ("U", "U_z", "U_r"):
            torch.testing.assert_close(val.T @ val, torch.eye(val.shape[0]), atol=1e-5, rtol=0, msg=key)
        elif name in ("W_a", "U_a"):
            assert abs(val.std().item() - 0.001) < 0.0001 and abs(val.mean().item()) < 0.0001, key
        else:
            assert abs(val.std().item() - 0.01) < 0.001 and abs(val.mean().item()) < 0.001, key
    torch.manual_seed(0)
    again = build_model("rnnsearch", 400, 400, emb_dim=64, hidden_dim=96, attn_dim=80, maxout_dim=48)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    model.reset_parameters()
    assert not torch.equal(model.E_src, again.E_src)



RECURRENT = ("U", "U_z", "U_r")


def _xavier(arch: str, unit: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)
    initialize(model, "xavier")
    return model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_xavier_initialisation(arch, unit):
    """initialize(model, "xavier"): every non-recurrent matrix Glorot-uniform on its own shape (within
    sqrt(6 / (fan_in + fan_out)), with the uniform's std bound/sqrt(3)), v_a as a (1 x n') matrix, U, U_z, U_r
    orthogonal n x n blocks (as in B.1), every bias zero."""
    model = _xavier(arch, unit)
    torch.manual_seed(0)
    paper = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)
    P, B1 = paper_parameters(model), paper_parameters(paper)
    assert P.keys() == B1.keys()
    matrices = 0
    for key, val in P.items():
        name = key.rsplit(".", 1)[-1]
        if name.startswith("b"):  # b, b_z, b_r, b_s, b_o, b_y (and torch's b_hn)
            assert val.dim() == 1 and torch.all(val == 0), key
        elif name in RECURRENT:
            n = val.shape[0]
            assert val.shape == (n, n), key
            torch.testing.assert_close(val @ val.T, torch.eye(n), atol=1e-5, rtol=0, msg=key)
            assert val.abs().max() > 0.05, key  # (not a scaled identity or zeros)
        elif name == "v_a":
            bound = (6 / (1 + val.numel())) ** 0.5
            assert val.dim() == 1 and bool(torch.all(val != 0)) and val.abs().max() <= bound, key
        else:
            assert val.dim() == 2, key
            fan_out, fan_in = val.shape
            bound = (6 / (fan_in + fan_out)) ** 0.5
            assert val.abs().max() <= bound, (key, val.abs().max().item(), bound)
            assert val.abs().max() > 0.9 * bound, key  # not a smaller scale (B.1's 0.01 is far below)
            if val.numel() >= 1000:
                assert abs(val.std().item() / (bound / 3 ** 0.5) - 1) < 0.25, (key, val.std().item(), bound)
                assert abs(val.mean().item()) < 0.1 * bound, key
            assert not torch.equal(val, B1[key]), key
            matrices += 1
    assert matrices == (21 if arch == "rnnsearch" else 16)  # E_src, E_tgt, W, W_z, W_r a GRU, C, C_z, C_r, W_s, U_o...
    if unit == "torch":  # torch's own four tensors per direction: biases zero, recurrent rows orthogonal blocks
        for name, p in model.encoder.rnn.named_parameters():
            if name.startswith("bias"):
                assert torch.all(p == 0), name
            elif name.startswith("weight_hh"):
                n = p.shape[1]
                for k in range(3):
                    torch.testing.assert_close(p[k * n : (k + 1) * n] @ p[k * n : (k + 1) * n].T, torch.eye(n),
                                               atol=1e-5, rtol=0, msg=name)
    # the model computes with what paper_parameters reports
    copy = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)
    load_paper_parameters(copy, {k: v.clone() for k, v in P.items()})
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    torch.testing.assert_close(copy(src, lens, tgt_in), model(src, lens, tgt_in), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_initialisation_schemes_are_reproducible(arch, unit):
    """Both schemes draw from torch's global generator: the same seed gives the same weights bit for bit; "paper"
    is the model as built, "xavier" differs from it; an unknown scheme is a ValueError naming the schemes."""
    a, b = _xavier(arch, unit), _xavier(arch, unit)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k
    other = _xavier(arch, unit, seed=1)
    assert not torch.equal(a.E_src, other.E_src) and not torch.equal(a.W_o, other.W_o)

    torch.manual_seed(0)
    built = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)
    reset = build_model(f"{arch}-tiny", V_SRC, V_TGT, encoder_gru=unit)  # (another draw: different weights)
    assert not torch.equal(built.E_src, reset.E_src)
    torch.manual_seed(0)
    initialize(reset, "paper")
    assert built.state_dict().keys() == reset.state_dict().keys() == a.state_dict().keys()
    for (k, x), y in zip(built.state_dict().items(), reset.state_dict().values()):
        assert x.dtype == y.dtype and torch.equal(x, y), k
    changed = [k for k, x in a.state_dict().items() if not torch.equal(x, built.state_dict()[k])]
    assert "E_src" in changed and "W_o" in changed and len(changed) >= len(a.state_dict()) // 3
    for bad in ("glorot", "Xavier", ""):
        with pytest.raises(ValueError, match="unknown initialisation .*paper, xavier"):
            initialize(reset, bad)
    for (k, x), y in zip(built.state_dict().items(), reset.state_dict().values()):
        assert torch.equal(x, y), k  # refused before touching anything

def test_xavier_flat_starts_the_attention_uniform():
    """initialize(model, "xavier-flat"): the same draws as "xavier" except v_a = 0, so that every e_ij = 0 and α_i is
    uniform over each sentence's own positions at the start (padding still 0), while W_a and U_a are Glorot-scaled."""
    torch.manual_seed(0)
    flat = build_model("rnnsearch-tiny", V_SRC, V_TGT)
    initialize(flat, "xavier-flat")
    xav = _xavier("rnnsearch", "paper")
    for (k, x), y in zip(flat.state_dict().items(), xav.state_dict().values()):
        assert torch.equal(x, torch.zeros_like(y) if k == "attention.v_a" else y), k
    assert bool(torch.all(xav.attention.v_a != 0))
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    _, alpha = flat(src, lens, tgt_in, return_attention=True)  # (B, Ty, Tx)
    for b, n in enumerate(lens.tolist()):
        torch.testing.assert_close(alpha[b, :, :n], torch.full_like(alpha[b, :, :n], 1 / n))
        assert bool(torch.all(alpha[b, :, n:] == 0))
    _, alpha = xav(src, lens, tgt_in, return_attention=True)
    assert (alpha[1, :, :lens[1]] - 1 / lens[1]).abs().max() > 1e-3  # (Glorot v_a: not uniform)


def test_rnnsearch_50_weight_count():
    with torch.device("meta"):
        model = build_model("rnnsearch-50", 30000, 30000)
    assert count_weights(model) == 80_401_000
    n_biases = count_weights(model, biases=True) - count_weights(model)
    assert n_biases == 2 * 3000 + 3000 + 1000 + 1000 + 30000  # enc b*, dec b*, b_s, b_o, b_y


# ---------------------------------------------------------------------------------------------------------- registry
def test_registry_and_configs():
    assert set(ARCHS) <= set(list_models())
    for p in ["rnnsearch-30", "rnnsearch-50", "rnnencdec-30", "rnnencdec-50", "rnnsearch-small", "rnnencdec-tiny"]:
        assert p in list_presets()
    cfg = get_config("rnnsearch-50")
    assert (cfg.emb_dim, cfg.hidden_dim, cfg.attn_dim, cfg.maxout_dim, cfg.max_len) == (620, 1000, 1000, 500, 50)
    assert get_config("rnnencdec-30").max_len == 30 and not hasattr(get_config("rnnencdec-30"), "attn_dim")
    model = build_model("rnnsearch-tiny", 11, 13, hidden_dim=16, dropout=0.25)
    assert model.config.hidden_dim == 16 and model.config.dropout == 0.25 and model.W_o.shape == (13, 24)
    assert model.arch == "rnnsearch"
    d = model.config.to_dict()
    assert all(type(v) in (int, float, str) for v in d.values())
    assert RNNsearchConfig.from_dict(d) == model.config
    assert dataclasses.asdict(build_model(model.arch, **d).config) == d


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown model or preset 'rnnsaerch'.*rnnsearch-50"):
        get_config("rnnsaerch")
    with pytest.raises(ValueError, match="hiden_dim.*valid options:.*hidden_dim"):
        build_model("rnnsearch-tiny", 10, 10, hiden_dim=3)
    with pytest.raises(ValueError, match="attn_dim"):
        get_config("rnnencdec", attn_dim=5)
    with pytest.raises(ValueError, match="unknown RNNsearchConfig option"):
        RNNsearchConfig.from_dict({"emb_dim": 3, "colour": "red"})
    with pytest.raises(ValueError, match="hidden_dim"):
        get_config("rnnsearch", hidden_dim=0)
    with pytest.raises(ValueError, match="encoder_gru"):
        get_config("rnnsearch", encoder_gru="lstm")
    with pytest.raises(ValueError, match="dropout"):
        get_config("rnnsearch", dropout=1.5)
    with pytest.raises(ValueError, match="already registered"):
        register_model("rnnsearch")(type("Dup", (), {"config_class": RNNsearchConfig}))
    with pytest.raises(ValueError, match="already registered"):
        register_preset("rnnsearch-50", "rnnsearch")


def test_dropout_only_in_training():
    model = randomize_(tiny("rnnsearch", dropout=0.5))
    src, lens, tgt_in, _ = make_batch([4, 3], [3, 2])
    model.train()
    assert not torch.equal(model(src, lens, tgt_in), model(src, lens, tgt_in))
    model.eval()
    torch.testing.assert_close(model(src, lens, tgt_in), model(src, lens, tgt_in), atol=0, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
def test_sparse_embedding_grads_are_the_dense_ones(arch, fused):
    """model.sparse_embedding_grads: E_src and E_tgt get row-sparse gradients, at the rows the batch uses, with
    the dense gradients' values (the training loss, and forward's logits); the other parameters are unchanged."""
    model = randomize_(tiny(arch), std=0.1)
    model.fused = fused
    src, lens, tgt_in, tgt_out = make_batch([4, 6, 2], [5, 3, 4])
    grads = []
    for sparse in (False, True):
        model.sparse_embedding_grads = sparse
        model.zero_grad(set_to_none=True)
        (model.nll(src, lens, tgt_in, tgt_out) + model(src, lens, tgt_in).square().sum()).backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    dense, sparse = grads
    assert {k for k, g in sparse.items() if g.is_sparse} == {"E_src", "E_tgt"}
    for name, ids in (("E_src", src), ("E_tgt", tgt_in)):
        rows = set(sparse[name].coalesce().indices()[0].tolist())
        assert set(ids[ids != PAD].tolist()) <= rows <= set(ids.flatten().tolist()), name  # (<pad>: as looked up)
    for k in dense:
        torch.testing.assert_close(sparse[k].to_dense(), dense[k], rtol=1e-5, atol=1e-7, msg=k)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
def test_runs_under_bf16_autocast(arch, fused):
    """The trainer's --bf16 option: matmuls in bfloat16, the fused loops in float32; close to float32 results, and
    on the fused path (training's) close to float32's gradients too."""
    model = randomize_(tiny(arch), std=0.1)
    model.fused = fused
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    expected = model(src, lens, tgt_in)
    (expected * expected).sum().backward()
    expected_grads = {k: p.grad for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, lens, tgt_in)
    (logits.float() * logits.float()).sum().backward()
    torch.testing.assert_close(logits.float(), expected, atol=0.05, rtol=0.05)
    if not fused:  # (the op-by-op reference runs its elementwise work and gradients in bf16 too: not this close)
        return
    for k, p in model.named_parameters():  # bf16 rounding of the products' operands only: close to float32's
        if expected_grads[k] is None:
            assert p.grad is None, k
            continue
        scale = expected_grads[k].abs().max().item()
        torch.testing.assert_close(p.grad, expected_grads[k], atol=0.03 * scale, rtol=0.03, msg=k)


# ------------------------------------------------------------------------------------------ the fused training loss
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk_rows", [1, 3, 10, 1000])  # 10: chunks of 8, padding rows inside the last
def test_nll_equals_cross_entropy_of_logits_with_gradients(arch, chunk_rows, monkeypatch):
    """model.nll (output layer only at real positions, fused with softmax and gradient, in row chunks) gives the
    value and every parameter's gradient of plain cross-entropy on forward()'s logits (float64)."""
    import nmtkit.models.output as output

    monkeypatch.setattr(output, "CHUNK_ELEMENTS", chunk_rows * V_TGT)
    monkeypatch.setattr(output, "MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(output, "BLOCK_ELEMENTS", 2 * V_TGT)  # the softmax in blocks of two rows (or one)
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
def test_nll_under_bf16_autocast(arch, block_rows, monkeypatch):
    import nmtkit.models.output as output

    monkeypatch.setattr(output, "BLOCK_ELEMENTS", block_rows * V_TGT)
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
def test_loss_gradients_under_bf16_autocast(chunk_rows, eps, monkeypatch):
    """Under bf16 autocast the loss's gradients come back in float32 and scaled by the incoming gradient, within
    bf16 rounding of float64's, whether ∂L/∂W_o is one chunk's bf16 product or a float32 sum over chunks; with
    label smoothing too (value and gradients of F.cross_entropy(…, label_smoothing=ε))."""
    import nmtkit.models.output as output

    monkeypatch.setattr(output, "CHUNK_ELEMENTS", chunk_rows * 56)
    monkeypatch.setattr(output, "MIN_CHUNK_ROWS", 1)
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


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_step_with_k_states_per_sentence(arch):
    """Beam search keeps the source side once per sentence and K decoder states per sentence: the step gives what
    it gives with the encoder output repeated K times, and prepare_decoding's precomputed source projections
    (C h_j read as Σ_j α_ij C h_j) change nothing but rounding."""
    model = randomize_(tiny(arch))
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    K = 3
    enc = model.encode(src, lens)
    g = torch.Generator().manual_seed(5)
    state = torch.randn(3 * K, model.config.hidden_dim, generator=g)  # K different states per sentence
    y = torch.randint(4, V_TGT, (3 * K,), generator=g)
    repeated = model.reorder_encoder_out(enc, torch.arange(3).repeat_interleave(K))
    expected = model.decode_step(y, state, repeated)
    for e in (enc, model.prepare_decoding(enc)):
        got = model.decode_step(y, state, e)
        for a, b in zip(got, expected):
            if b is None:
                assert a is None
            else:
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert model.prepare_decoding(enc).proj.shape[:2] == ((3, src.shape[1]) if arch == "rnnsearch" else (3, 1))


@pytest.mark.parametrize("V", [29, 32])  # padded to a multiple of 8 inside, and not
@pytest.mark.parametrize("l", [5, 8])
def test_linear_cross_entropy_for_any_vocabulary_size(V, l):
    """The fused loss rounds the vocabulary and the maxout size up to multiples of 8 for speed (matmul.py): the
    padding must add nothing to the value or the gradients."""
    from nmtkit.models.output import linear_cross_entropy

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
def test_linear_cross_entropy_when_the_reference_word_underflows(bf16, block_rows, eps, monkeypatch):
    """−log p(y) comes from the softmax's p(y); where p(y) underflows in float32 (a reference word 150 nats below
    the best) it is recomputed from the logits: finite and exact, in float32 and under bf16 autocast, also when
    the softmax runs in blocks of rows, and with label smoothing (whose extra term needs no log p)."""
    import nmtkit.models.output as output
    from nmtkit.models.output import linear_cross_entropy

    monkeypatch.setattr(output, "BLOCK_ELEMENTS", block_rows * 16)  # V' = 16

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
def test_linear_cross_entropy_with_label_smoothing(dtype, chunk_rows, eps, monkeypatch):
    """With label smoothing ε the fused loss is F.cross_entropy(…, label_smoothing=ε) -- the cross-entropy against
    (1 − ε) onehot(y) + ε/V over the real vocabulary, V = 29 padded to 32 inside -- in value and in the gradients
    of t, W and b, in one chunk of rows or several; the second result is the plain −Σ log p(y), detached."""
    import nmtkit.models.output as output

    V, l, N = 29, 5, 37  # V' = 32, l' = 8, N' = 40
    monkeypatch.setattr(output, "CHUNK_ELEMENTS", chunk_rows * 32)
    monkeypatch.setattr(output, "MIN_CHUNK_ROWS", 1)
    monkeypatch.setattr(output, "BLOCK_ELEMENTS", 2 * 32)  # the softmax in blocks of two rows (or one)
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
def test_linear_cross_entropy_without_label_smoothing_is_unchanged(bf16, chunk_rows, monkeypatch):
    """ε = 0 is the plain loss, bit for bit: the value, its gradients and the returned −Σ log p(y) are those of
    linear_cross_entropy(t, W, b, y) without the option."""
    import nmtkit.models.output as output

    monkeypatch.setattr(output, "CHUNK_ELEMENTS", chunk_rows * 32)
    monkeypatch.setattr(output, "MIN_CHUNK_ROWS", 1)
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
    from nmtkit.models.output import linear_cross_entropy, linear_cross_entropy_with_nll

    t, W, b, y = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(5), torch.tensor([0, 1, 4])
    for f in (linear_cross_entropy, linear_cross_entropy_with_nll):
        with pytest.raises(ValueError, match="label_smoothing must be a number in \\[0, 1\\)"):
            f(t, W, b, y, label_smoothing=bad)
    model = tiny("rnnsearch")
    with pytest.raises(ValueError, match="label_smoothing"):
        model.training_loss(*make_batch([4, 2], [3, 2]), label_smoothing=bad)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.15])
def test_training_loss_equals_smoothed_cross_entropy_of_logits(arch, fused, eps, monkeypatch):
    """model.training_loss gives the value and every parameter's gradient of
    F.cross_entropy(forward()'s logits, label_smoothing=ε, ignore_index=PAD, reduction="sum") (float64, the
    fused output layer in several chunks), on the fused and the reference recurrences; its second result is
    model.nll's value, detached."""
    import nmtkit.models.output as output

    monkeypatch.setattr(output, "CHUNK_ELEMENTS", 3 * V_TGT)
    monkeypatch.setattr(output, "MIN_CHUNK_ROWS", 1)
    model = randomize_(tiny(arch)).double()
    model.fused = fused
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
    from nmtkit.models.matmul import aligned_linear

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
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("tgt_vocab", [V_TGT, 32])
def test_search_step_weights_give_the_plain_step(arch, table, tgt_vocab, monkeypatch):
    """Without autograd in eval mode decode_step uses stepweights.py ([W_a; U_z; U_r; U_o] s as one product, the
    input side looked up from a per-word table or one product, W_o padded to a multiple of 8): the same logits,
    states and attention as the plain step that training's autograd path uses."""
    import nmtkit.models.stepweights as sw

    monkeypatch.setattr(sw, "TABLE_MAX_ELEMENTS", sw.TABLE_MAX_ELEMENTS if table else 0)
    torch.manual_seed(0)
    model = randomize_(build_model(f"{arch}-tiny", V_SRC, tgt_vocab)).eval()
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    enc = model.prepare_decoding(model.encode(src, lens))
    state = model.init_decoder(enc)
    for i in range(tgt_in.shape[1]):  # starts with y_0 = <s>, whose table row is E y_0 = 0
        y = tgt_in[:, i]
        plain = model.decode_step(y, state, enc)  # autograd on: the plain path
        with torch.no_grad():
            fast = model.decode_step(y, state, enc)
        assert (model.__dict__["_step_weights"][1].y_table is not None) == table
        assert fast[0].shape == (3, tgt_vocab) and fast[0].is_contiguous()
        for a, e in zip(fast, plain):
            if e is None:
                assert a is None
            else:
                torch.testing.assert_close(a, e.detach(), atol=1e-5, rtol=1e-5)
        state = plain[1].detach()


@pytest.mark.parametrize("arch", ARCHS)
def test_search_step_weights_follow_weight_updates(arch):
    """The cached step weights are rebuilt after the model's weights change in place (an optimizer step between
    two validations, load_state_dict)."""
    model = randomize_(tiny(arch)).eval()
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    y = tgt_in[:, 1]

    def step():
        enc = model.encode(src, lens)
        with torch.no_grad():
            return model.decode_step(y, model.init_decoder(enc), enc)[0]

    before = step()
    other = randomize_(tiny(arch), seed=7).state_dict()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    after_update = step()
    enc = model.encode(src, lens)
    torch.testing.assert_close(after_update, model.decode_step(y, model.init_decoder(enc), enc)[0].detach(),
                               atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before, after_update)
    model.load_state_dict(other)
    enc = model.encode(src, lens)
    torch.testing.assert_close(step(), model.decode_step(y, model.init_decoder(enc), enc)[0].detach(),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_gradients_match_finite_differences(arch, native_kernels, monkeypatch):
    """What training backpropagates -- the fused recurrences, the C attention kernel and the fused output loss, in
    float32 and training mode -- against central differences of the float64 op-by-op reference model, for a few
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
    ref.fused = False
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
