"""The paper's parameters and the initialisation schemes (Appendix B.1 and Glorot)."""

from __future__ import annotations

import pytest
import torch

from nmtkit.models import build_model, load_paper_parameters, paper_parameters
from nmtkit.errors import InputError
from nmtkit.models import init
from nmtkit.train.registry import INITS

from conftest import ARCHS, V_SRC, V_TGT, make_batch, randomize_, tiny  # the shared tiny models and batches


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
    INITS.load("xavier")(model)
    return model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_xavier_initialisation(arch, unit):
    """--init xavier (nmtkit.models.init.xavier): every non-recurrent matrix Glorot-uniform on its own shape (within
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
    is the model as built, "xavier" differs from it; an unknown scheme is one error naming the schemes (nmtkit.train.registry.INITS)."""
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
    init.paper(reset)
    assert built.state_dict().keys() == reset.state_dict().keys() == a.state_dict().keys()
    for (k, x), y in zip(built.state_dict().items(), reset.state_dict().values()):
        assert x.dtype == y.dtype and torch.equal(x, y), k
    changed = [k for k, x in a.state_dict().items() if not torch.equal(x, built.state_dict()[k])]
    assert "E_src" in changed and "W_o" in changed and len(changed) >= len(a.state_dict()) // 3
    for bad in ("glorot", "Xavier", ""):
        with pytest.raises(InputError, match="unknown --init .*paper, xavier, xavier-flat"):
            INITS.load(bad)
    for (k, x), y in zip(built.state_dict().items(), reset.state_dict().values()):
        assert torch.equal(x, y), k  # refused before touching anything

def test_xavier_flat_starts_the_attention_uniform():
    """--init xavier-flat (init.xavier_flat): the same draws as "xavier" except v_a = 0, so that every e_ij = 0 and α_i is
    uniform over each sentence's own positions at the start (padding still 0), while W_a and U_a are Glorot-scaled."""
    torch.manual_seed(0)
    flat = build_model("rnnsearch-tiny", V_SRC, V_TGT)
    init.xavier_flat(flat)
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
