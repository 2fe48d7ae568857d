"""The paper's GRU and the bidirectional encoder: every path against the equations, packing, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import paper_parameters
from nmtkit.models.gru import PaperGRU
from nmtkit.models.fast.fused import gru_sequence
from nmtkit.models.fast.packed import gru_packed, packing, unpack

from conftest import ARCHS, make_batch, randomize_, reference_gru, tiny  # the shared tiny models and batches


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
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_encoder_matches_paper_equations(arch, path):
    # one sentence at a time, unbatched: also the check of the batched reference's masking (nmtkit/models/reference.py)
    # "fast": the encoder over packed sentences
    model = randomize_(tiny(arch))
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
    ours = gru_sequence(F.linear(x, layer.W_stack, layer.b_stack), layer.U_zr, layer.U)[:, 0].detach()  # (T, n)
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
    torch.testing.assert_close(gru_sequence(gx, U_zr, U, s0), reference_gru(gx, U_zr, U, s0))


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
        fwd = reference_gru(x[b, :L].unsqueeze(1), U_zr[0], U[0])[:, 0]  # (L, n)
        bwd = reference_gru(x[b, :L].flip(0).unsqueeze(1), U_zr[1], U[1])[:, 0]  # (L, n)   in reading order
        rows_f = [k for k in range(N) if pack.fwd_index[k] // max(lens) == b]
        rows_b = [k for k in range(N) if pack.fwd_index[pack.fwd_of_bwd[k]] // max(lens) == b]
        torch.testing.assert_close(H[0, rows_f], fwd)
        torch.testing.assert_close(H[1, rows_b], bwd)
    args = (gx.clone().requires_grad_(), U_zr.clone().requires_grad_(), U.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda g, a, u: gru_packed(g, a, u, pack), args, eps=1e-6, atol=1e-6)
