"""The decoder's attention step: every path against the equations and the reference, source-length groups, the C kernel, the search step."""

from __future__ import annotations

import pytest
import torch

from nmtkit.models.fast.policy import SpeedPolicy
import torch.nn.functional as F
from torch.func import functional_call

from nmtkit.models import BOS, EOS, PAD, build_model, paper_parameters
from nmtkit.models import reference

from conftest import ARCHS, V_SRC, V_TGT, make_batch, randomize_, tiny  # the shared tiny models and batches


# ------------------------------------------------------------------------------------------------------- decoder
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_decode_step_equals_forward(arch, backend):
    model = randomize_(tiny(arch))
    model.backend = backend
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    logits, alpha = model(src, lens, tgt_in, return_attention=True)
    with torch.no_grad():  # the fast path keeps no per-step state then: same values
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
    for backend in ("fast", "reference"):
        model.backend = backend
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
def test_gradcheck(arch, sigma, speed_policy):
    """float64 gradcheck of the whole model (the fused path, with its hand-written backward) w.r.t. every parameter;
    with the attention's σ recomputed in the backward (paper size) and kept from the forward (smaller sizes)."""

    if sigma == "kept":
        speed_policy(recompute_min_elements=1 << 62)
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


def test_row_groups(speed_policy):
    """fused._row_groups: equal-size groups of a batch sorted by source length, each over its longest source;
    groups of the same length merged; one group for an unsorted or small batch, or too little attention work."""
    from nmtkit.models.fast.fused import _row_groups

    assert _row_groups(_source_mask([9, 9, 8, 7, 7, 5, 3, 3, 2, 1]), 1) == [(0, 2, 9), (2, 5, 8), (5, 8, 5), (8, 10, 2)]
    assert _row_groups(_source_mask([6, 6, 6, 6, 6, 6, 4, 4]), 1) == [(0, 6, 6), (6, 8, 4)]  # three merged
    assert _row_groups(_source_mask([5, 6, 4, 4, 3, 3, 2, 1]), 1) == [(0, 8, 6)]  # not sorted
    assert _row_groups(_source_mask([6, 5, 4, 3, 2, 1, 1]), 1) == [(0, 7, 6)]  # fewer than 2 rows per group
    speed_policy(group_min_elements=SpeedPolicy.group_min_elements)  # (as outside the tests)
    assert _row_groups(_source_mask([9, 9, 8, 7, 7, 5, 3, 3, 2, 1]), 1000) == [(0, 10, 9)]  # 90,000 elements
    assert len(_row_groups(_source_mask([50] * 20 + [30] * 60), 1000)) == 2  # 80 × 50 × 1,000: the paper's


GROUP_SRC, GROUP_TGT = [7, 7, 6, 5, 5, 4, 3, 3, 2, 1], [4, 6, 2, 5, 3, 3, 4, 1, 2, 5]


def test_attention_groups_equal_one_group(speed_policy):
    """A batch sorted by source length runs its attention in four groups (fused._row_groups): the logits, the
    attention weights (exactly zero at padding) and every gradient, with a loss on α as well, equal those of one
    group over all positions (float64)."""
    import nmtkit.models.fast.fused as fused

    assert len(fused._row_groups(_source_mask(GROUP_SRC), 1)) == 4
    model = randomize_(tiny("rnnsearch")).double()
    src, lens, tgt_in, tgt_out = make_batch(GROUP_SRC, GROUP_TGT)
    results = []
    for grouped in (True, False):
        if not grouped:
            speed_policy(attention_groups=1)
            assert fused._row_groups(_source_mask(GROUP_SRC), 1) == [(0, len(GROUP_SRC), max(GROUP_SRC))]
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
def test_attention_kernel_equals_torch_ops(native_kernels, monkeypatch, bf16, unit, speed_policy):
    """The fused decoder's attention step through the C kernel (nmtkit/kernels/attention.c) and through torch ops
    (row groups, σ recomputed) give the same loss, logits, attention weights (exactly 0 at padding) and
    gradients of every parameter, with a loss on α as well: in float32 within float32 rounding of each other and
    of the float64 reference path; under bf16 autocast, where a last-bit difference can flip a bf16 rounding,
    within 1e-2 of each tensor's largest value (measured: 7e-4 with the packed encoder, 3.5e-3 with
    torch.nn.GRU's).  A spy checks which path ran, and that under bf16 the kernel reads C_stack h_j in bf16."""

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
        speed_policy(attention_kernel=bool(kernel))
        m = model.double() if kernel is None else model.float()
        m.backend = "fast" if kernel is not None else "reference"
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
                                                                                     monkeypatch, speed_policy):
    """Without autograd (validation, alignment) the kernel gives the torch ops' α; a source mask that is not
    right padding (the kernel reads each row's first positions) goes to the torch ops, with their values."""
    import nmtkit.models.fast.fused as fused

    calls = []
    real = native_kernels.attend_forward
    monkeypatch.setattr(native_kernels, "attend_forward", lambda *a: calls.append(1) or real(*a))
    model = randomize_(tiny("rnnsearch"), std=0.2)
    src, lens, tgt_in, _ = make_batch(GROUP_SRC, GROUP_TGT)
    alphas = []
    for kernel in (True, False):
        speed_policy(attention_kernel=kernel)
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
        speed_policy(attention_kernel=kernel)
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
def test_nll_sorts_its_batch_and_gradchecks_in_groups(sigma, speed_policy):
    """nll takes the sentences longest source first, so that the attention runs in groups: the loss of a batch
    in any order is the sum of its sentences' losses, and its float64 gradcheck (fused path, four groups; the
    attention's σ recomputed or kept) holds."""
    from nmtkit.models.fast.fused import _row_groups, by_source_length

    if sigma == "kept":
        speed_policy(recompute_min_elements=1 << 62)

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


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("tgt_vocab", [V_TGT, 32])
def test_search_step_weights_give_the_plain_step(arch, table, tgt_vocab, speed_policy):
    """Without autograd in eval mode decode_step uses stepweights.py ([W_a; U_z; U_r; U_o] s as one product, the
    input side looked up from a per-word table or one product, W_o padded to a multiple of 8): the same logits,
    states and attention as the plain step that training's autograd path uses."""

    speed_policy(table_max_elements=SpeedPolicy.table_max_elements if table else 0)
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
