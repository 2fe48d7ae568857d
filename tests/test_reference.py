"""The literal reference (nmtkit/models/reference.py) against every fast path of the models, values and gradients,
and the reference backend running training and beam search."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import reference
from nmtkit.models.params import paper_parameters, paper_weights
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.search import beam_search
from nmtkit.data.vocab import BOS, PAD
from conftest import ARCHS, make_batch, randomize_, tiny

SRC_LENS, TGT_LENS = [4, 6, 2, 5], [5, 3, 4, 6]


def _grads(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {k: p.grad.to_dense().clone() for k, p in model.named_parameters() if p.grad is not None}


def _close_grads(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


def test_one_decoder_step_is_the_papers_equations_written_out():
    # the reference itself, term by term against Appendix A.2.2 on a tiny RNNsearch (float64, no fast path involved)
    model = randomize_(tiny("rnnsearch")).double()
    P = paper_parameters(model)
    src, lens, tgt_in, _ = make_batch(SRC_LENS, TGT_LENS)
    H, mask, first_backward = reference.encode(P, src, lens, bidirectional=True)
    s = torch.tanh(first_backward @ P["W_s"].T + P["b_s"])
    y = tgt_in[:, 1]
    logits, s_new, alpha = reference.decoder_step(P, y, s, H, mask)
    b = 2  # one sentence, by hand with vectors
    Ey = P["E_tgt"][y[b]]
    e = torch.stack([P["v_a"] @ torch.tanh(P["W_a"] @ s[b] + P["U_a"] @ H[b, j]) for j in range(SRC_LENS[b])])
    a = torch.exp(e) / torch.exp(e).sum()
    c = sum(a[j] * H[b, j] for j in range(SRC_LENS[b]))
    z = torch.sigmoid(P["dec.W_z"] @ Ey + P["dec.U_z"] @ s[b] + P["dec.C_z"] @ c + P["dec.b_z"])
    r = torch.sigmoid(P["dec.W_r"] @ Ey + P["dec.U_r"] @ s[b] + P["dec.C_r"] @ c + P["dec.b_r"])
    s_tilde = torch.tanh(P["dec.W"] @ Ey + P["dec.U"] @ (r * s[b]) + P["dec.C"] @ c + P["dec.b"])
    t_tilde = P["U_o"] @ s[b] + P["V_o"] @ Ey + P["C_o"] @ c + P["b_o"]
    t = torch.tensor([max(t_tilde[2 * j], t_tilde[2 * j + 1]) for j in range(len(t_tilde) // 2)], dtype=t_tilde.dtype)
    torch.testing.assert_close(alpha[b, : SRC_LENS[b]], a)
    assert torch.all(alpha[b, SRC_LENS[b]:] == 0)
    torch.testing.assert_close(s_new[b], (1 - z) * s[b] + z * s_tilde)
    torch.testing.assert_close(logits[b], P["W_o"] @ t + P["b_y"])
    # E y_0 = 0: the first step's input is the zero vector, whatever the <s> row holds
    logits0, _, _ = reference.decoder_step(P, torch.full_like(y, BOS), s, H, mask)
    P0 = dict(P, E_tgt=P["E_tgt"].clone().index_fill_(0, torch.tensor([BOS]), 5.0))
    torch.testing.assert_close(reference.decoder_step(P0, torch.full_like(y, BOS), s, H, mask)[0], logits0)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_fast_paths_equal_the_reference_in_values_and_gradients(arch):
    model = randomize_(tiny(arch)).double()
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    logits, alpha = model(src, lens, tgt_in, return_attention=True)
    ref_logits, ref_alpha = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=arch == "rnnsearch")
    real = tgt_out != PAD  # (the fast paths leave padded target positions unspecified)
    torch.testing.assert_close(logits[real], ref_logits[real])
    if arch == "rnnsearch":
        torch.testing.assert_close(alpha[real], ref_alpha[real])
    else:
        assert alpha is None and ref_alpha is None
    # the training loss (the fused output layer) and its gradients, with label smoothing
    fast_loss, fast_nll = model.training_loss(src, lens, tgt_in, tgt_out, label_smoothing=0.1)
    g_fast = _grads(model, fast_loss)
    ref_loss = F.cross_entropy(ref_logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum",
                               label_smoothing=0.1)
    ref_logits2, _ = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=arch == "rnnsearch")
    ref_loss = F.cross_entropy(ref_logits2.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum",
                               label_smoothing=0.1)
    g_ref = _grads(model, ref_loss)
    torch.testing.assert_close(fast_loss, ref_loss)
    _close_grads(g_fast, g_ref)
    torch.testing.assert_close(fast_nll, F.cross_entropy(ref_logits2.detach().flatten(0, 1), tgt_out.flatten(),
                                                         ignore_index=PAD, reduction="sum"))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_search_step_equals_the_reference(arch):
    # decode_step as beam search calls it (K hypotheses per sentence, the step weights of stepweights.py without
    # autograd) against the reference's step, over several steps
    model = randomize_(tiny(arch)).eval()
    src, lens, tgt_in, _ = make_batch(SRC_LENS, TGT_LENS)
    K = 3
    with torch.no_grad():
        enc = model.prepare_decoding(model.encode(src, lens))
        rows = torch.arange(len(SRC_LENS)).repeat_interleave(K)
        state = model.init_decoder(enc).index_select(0, rows)
        P = paper_parameters(model)
        H, mask, summary = reference.encode(P, src, lens, bidirectional=arch == "rnnsearch")
        ref_state = reference.initial_state(P, summary).index_select(0, rows)
        torch.testing.assert_close(state, ref_state)
        context = None if arch == "rnnsearch" else summary.index_select(0, rows)
        y = torch.full((len(rows),), BOS)
        for _ in range(3):
            logits, state, alpha = model.decode_step(y, state, enc)
            ref_logits, ref_state, ref_alpha = reference.decoder_step(P, y, ref_state, H.index_select(0, rows),
                                                                      mask.index_select(0, rows), context)
            torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(state, ref_state, atol=2e-5, rtol=1e-5)
            if arch == "rnnsearch":
                torch.testing.assert_close(alpha, ref_alpha, atol=2e-6, rtol=1e-5)
            y = logits.argmax(-1)


def test_the_torch_unit_encoder_equals_the_reference():
    model = randomize_(tiny("rnnsearch", encoder_gru="torch")).double()
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    real = tgt_out != PAD
    ref_logits, _ = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=True)
    torch.testing.assert_close(model(src, lens, tgt_in)[real], ref_logits[real])
    g_fast = _grads(model, model.nll(src, lens, tgt_in, tgt_out))
    model.backend = "reference"
    g_ref = _grads(model, model.nll(src, lens, tgt_in, tgt_out))
    _close_grads(g_fast, g_ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_on_the_reference_backend_finds_what_the_fast_one_finds(arch):
    model = randomize_(tiny(arch), std=0.5).eval()
    src, lens, _, _ = make_batch(SRC_LENS, TGT_LENS)
    decode, attends = DecodeConfig(beam=4, nbest=2, max_len_a=1.5, max_len_b=3), arch == "rnnsearch"
    fast = beam_search([model], src, lens, decode, need_attention=attends)
    model.backend = "reference"
    ref = beam_search([model], src, lens, decode, need_attention=attends)
    for f_sentence, r_sentence in zip(fast, ref):
        assert [h.tokens for h in f_sentence] == [h.tokens for h in r_sentence]
        for f, r in zip(f_sentence, r_sentence):
            assert f.score == pytest.approx(r.score, abs=1e-4)
            if arch == "rnnsearch":
                torch.testing.assert_close(f.attention, r.attention, atol=1e-5, rtol=1e-4)
    assert any(len(s[0].tokens) > 1 for s in fast)  # (the sentences are not all empty)


def test_translations_on_the_reference_backend_equal_the_fast_ones(trained, data_dir):
    # a real checkpoint (trained on Multi30K), in this process and in decoding worker processes
    from nmtkit.translate.translator import Translator
    from conftest import lines_of

    _, ckpt = trained
    lines = lines_of(data_dir / "multi30k" / "test_2016_flickr.en", 6)
    with Translator([ckpt], DecodeConfig(beam=3, nbest=2), workers=1, need_attention=True) as fast:
        expected = list(fast.translate(enumerate(lines, 1)))
    with Translator([ckpt], DecodeConfig(beam=3, nbest=2), workers=1, need_attention=True, backend="reference") as ref:
        assert all(m.backend == "reference" for m in ref.models)
        got = list(ref.translate(enumerate(lines, 1)))
    assert [t.text for t in got] == [t.text for t in expected] and any(t.text for t in got)
    assert [t.alignment for t in got] == [t.alignment for t in expected]
    for g, e in zip(got, expected):
        assert g.score == pytest.approx(e.score, abs=1e-3)
    with Translator([ckpt], DecodeConfig(beam=3), workers=2, threads=2, backend="reference") as pooled:
        assert [t.text for t in pooled.translate(enumerate(lines, 1))] == [t.text for t in expected]
    with pytest.raises(Exception, match="unknown --backend 'slow' \\(choose from fast, reference\\)"):
        Translator([ckpt], backend="slow")
