"""``state_word="current"``: the decoder state reads the word just produced, s_i = f(s_{i-1}, y_i, c_i) (v6's
equations, the authors' GroundHog code), every path against the reference and against the equations by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import reference
from nmtkit.models.params import paper_parameters, paper_weights
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.search import beam_search, beam_search_reference
from nmtkit.data.vocab import PAD
from conftest import ARCHS, make_batch, randomize_, tiny

SRC_LENS, TGT_LENS = [4, 6, 2, 5], [5, 3, 4, 6]


def current(arch: str):
    return randomize_(tiny(arch, state_word="current"))


def test_the_option_is_validated_and_defaults_to_appendix_a():
    from nmtkit.models import get_config

    assert tiny("rnnsearch").config.state_word == "previous"
    # the paper's presets are Appendix A's model; the CPU presets read the current word (bench_learning, pass 4)
    assert {p: get_config(p).state_word for p in ("rnnsearch-50", "rnnencdec-30", "rnnsearch-small",
                                                  "rnnencdec-small")} == \
        {"rnnsearch-50": "previous", "rnnencdec-30": "previous", "rnnsearch-small": "current",
         "rnnencdec-small": "current"}
    assert get_config("rnnsearch-small", state_word="previous").state_word == "previous"
    with pytest.raises(ValueError, match="state_word must be one of previous, current, got 'next'"):
        tiny("rnnsearch", state_word="next")


def test_the_state_reads_the_word_just_produced_by_hand():
    # three steps of one sentence written out with vectors: s_1 = f(s_0, y_1, c_1) and y_2 is predicted from s_1
    model = current("rnnsearch").double()
    P = paper_parameters(model)
    src, lens, tgt_in, _ = make_batch(SRC_LENS, TGT_LENS)
    logits = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=True,
                                      state_word="current")[0]
    b = 1
    H = reference.encode(P, src, lens, bidirectional=True)[0][b, :SRC_LENS[b]]  # (Tx, 2n)
    s = torch.tanh(P["W_s"] @ reference.encode(P, src, lens, bidirectional=True)[2][b] + P["b_s"])  # s_0

    def context(s):
        e = torch.stack([P["v_a"] @ torch.tanh(P["W_a"] @ s + P["U_a"] @ h) for h in H])
        return (torch.softmax(e, 0).unsqueeze(1) * H).sum(0)

    def gru(Ey, s, c):
        z = torch.sigmoid(P["dec.W_z"] @ Ey + P["dec.U_z"] @ s + P["dec.C_z"] @ c + P["dec.b_z"])
        r = torch.sigmoid(P["dec.W_r"] @ Ey + P["dec.U_r"] @ s + P["dec.C_r"] @ c + P["dec.b_r"])
        return (1 - z) * s + z * torch.tanh(P["dec.W"] @ Ey + P["dec.U"] @ (r * s) + P["dec.C"] @ c + P["dec.b"])

    def output(s, Ey, c):
        t_tilde = P["U_o"] @ s + P["V_o"] @ Ey + P["C_o"] @ c + P["b_o"]
        return P["W_o"] @ torch.maximum(t_tilde[0::2], t_tilde[1::2]) + P["b_y"]

    Ey_prev = torch.zeros_like(P["E_tgt"][0])  # E y_0 = 0
    for i in range(3):
        c = context(s)  # c_{i+1} from s_i
        torch.testing.assert_close(logits[b, i], output(s, Ey_prev, c))
        Ey = P["E_tgt"][tgt_in[b, i + 1]]  # y_{i+1}, the word this step produced
        s, Ey_prev = gru(Ey, s, c), Ey


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fast_paths_equal_the_reference_in_values_and_gradients(arch):
    model = current(arch).double()
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    logits, alpha = model(src, lens, tgt_in, return_attention=True)
    ref_logits, ref_alpha = reference.teacher_forced(paper_weights(model), src, lens, tgt_in,
                                                     attention=arch == "rnnsearch", state_word="current")
    real = tgt_out != PAD
    torch.testing.assert_close(logits[real], ref_logits[real])
    if arch == "rnnsearch":
        torch.testing.assert_close(alpha[real], ref_alpha[real])
    # and it is another model than Appendix A's, on the same weights
    previous = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=arch == "rnnsearch")[0]
    assert not torch.allclose(previous[real], ref_logits[real])
    # the fused training loss and its gradients against autograd through the reference
    fast_loss, _ = model.training_loss(src, lens, tgt_in, tgt_out)
    model.zero_grad()
    fast_loss.backward()
    g_fast = {k: p.grad.to_dense().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.backend = "reference"
    ref_loss = F.cross_entropy(model(src, lens, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD,
                               reduction="sum")
    ref_loss.backward()
    g_ref = {k: p.grad.to_dense().clone() for k, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(fast_loss, ref_loss)
    assert g_fast.keys() == g_ref.keys()
    for k in g_fast:
        torch.testing.assert_close(g_fast[k], g_ref[k], msg=k)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("grad", [True, False])
def test_decode_step_equals_teacher_forcing(arch, backend, grad):
    # step by step (with autograd: from the parameters; without: through stepweights.py) = the teacher-forced logits
    model = current(arch).eval()
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    with torch.no_grad():
        logits, alpha = model(src, lens, tgt_in, return_attention=True)
    model.backend = backend
    with torch.set_grad_enabled(grad):
        enc = model.prepare_decoding(model.encode(src, lens))
        state = model.init_decoder(enc)
        for i in range(tgt_in.shape[1]):
            step_logits, state, step_alpha = model.decode_step(tgt_in[:, i], state, enc)
            real = tgt_out[:, i] != PAD
            torch.testing.assert_close(step_logits[real], logits[real, i], atol=2e-5, rtol=1e-5)
            if alpha is not None:
                torch.testing.assert_close(step_alpha[real], alpha[real, i], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_equals_the_reference_search(arch):
    # the batched search reorders the carried state (s and the pending context) with its hypotheses
    model = randomize_(tiny(arch, state_word="current"), std=0.5).eval()
    src, lens, _, _ = make_batch(SRC_LENS, TGT_LENS)
    with torch.no_grad():
        batched = beam_search(model, src, lens, DecodeConfig(beam=4, max_len_a=2.0, max_len_b=3))
        for b in range(len(SRC_LENS)):
            alone = beam_search_reference(model, src[b, :SRC_LENS[b] - 1].tolist(),
                                          DecodeConfig(beam=4, max_len_a=2.0, max_len_b=3))
            assert [h.tokens for h in batched[b]] == [h.tokens for h in alone]
            for h, r in zip(batched[b], alone):
                assert h.score == pytest.approx(r.score, abs=1e-4)
    assert any(len(h.tokens) > 2 for hyps in batched for h in hyps)  # (the search ran past a few steps)


def test_the_option_travels_in_a_plain_config(tmp_path):
    from nmtkit.models import RNNsearchConfig

    config = current("rnnsearch").config.to_dict()
    torch.save({"config": config}, tmp_path / "c.pt")
    again = torch.load(tmp_path / "c.pt", weights_only=True)["config"]
    assert RNNsearchConfig.from_dict(again).state_word == "current"
    del again["state_word"]  # a checkpoint from before the option: Appendix A's model
    assert RNNsearchConfig.from_dict(again).state_word == "previous"
