"""nmt-align --method posterior (nmtkit.posterior.forced_posterior): p(a_i = j | y_i, y_<i, x) ∝ α_ij p(y_i | y_<i,
c_i = h_j), computed through the models' own decode steps, equals the paper's equations written out (the reference
module's encoder, decoder steps and deep output with the context set to one annotation), in both backends and both
state words; the command writes its links and names the method in its report.  How much better it aligns is measured
by tests/bench/bench_posterior.py on real models (tests/bench/results/bench_posterior.txt)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nmtkit.align import Aligner
from nmtkit.data.vocab import BOS, EOS
from nmtkit.posterior import forced_posterior
from nmtkit.models import reference
from nmtkit.models.params import paper_weights

from conftest import randomize_, tiny
from test_align import model, run_align, trial_files  # noqa: F401  (fixtures)

SRC = [[5, 9, 4, 7], [6, 8], [4, 4, 10, 12, 5, 7]]
TGT = [[7, 5, 9], [11, 6, 4, 8, 20], [4]]


def _by_the_equations(m, src_ids, tgt_ids) -> list[np.ndarray]:
    """The posterior of each pair, one sentence at a time, from reference.py's functions: α_i from the decoder step,
    and the deep output's p(y_i) with c_i = h_j for each source position j (``</s>`` included)."""
    P = paper_weights(m)
    n = P["dec.U"].shape[0]
    out = []
    for x, y in zip(src_ids, tgt_ids):
        src = torch.tensor([x + [EOS]])
        tgt_in, tgt_out = torch.tensor([[BOS] + y]), torch.tensor([y + [EOS]])
        H, mask, summary = reference.encode(P, src, torch.tensor([len(x) + 1]), bidirectional=True)
        state = reference.initial_carried(reference.initial_state(P, summary), H.shape[-1], m.config.state_word)
        rows = []
        for i in range(tgt_in.shape[1]):
            y_prev = tgt_in[:, i]
            if m.config.state_word == "previous":
                s_prev = state
                _, state, alpha = reference.decoder_step(P, y_prev, state, H, mask)
            else:
                _, state, alpha = reference.decoder_step_current(P, y_prev, state, H, mask)
                s_prev = state[:, :n]
            Ey = reference.embed_target(P, y_prev)
            emit = torch.stack([torch.log_softmax(reference.deep_output(P, s_prev, Ey, H[:, j]), -1)[0, tgt_out[0, i]]
                                for j in range(H.shape[1])])
            rows.append(torch.softmax(alpha[0].log() + emit, -1))
        out.append(torch.stack(rows).detach().numpy())
    return out


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("state_word", ["previous", "current"])
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_the_posterior_is_the_papers_equations_written_out(state_word, backend, chunked, monkeypatch):
    import nmtkit.posterior

    if chunked:  # the single-position rows' logits two rows at a time (the tiny vocabulary has 29 words)
        monkeypatch.setattr(nmtkit.posterior, "ROW_ELEMENTS", 2 * 29 + 5)
    m = randomize_(tiny("rnnsearch", state_word=state_word)).eval()  # (float32: the search's step weights are)
    m.backend = backend
    got = forced_posterior(m, [np.array(x) for x in SRC], [np.array(y) for y in TGT], batch_size=2)
    want = _by_the_equations(m, SRC, TGT)
    for g, w, x, y in zip(got, want, SRC, TGT):
        assert g.shape == (len(y) + 1, len(x) + 1)
        np.testing.assert_allclose(g, w, atol=2e-4)
        np.testing.assert_allclose(g.sum(1), 1.0, atol=1e-5)
    # and it is not the attention: the emission moves the weights
    from nmtkit.align import forced_attention

    alpha = forced_attention(m, [np.array(x) for x in SRC], [np.array(y) for y in TGT])
    assert max(float(np.abs(g - a).max()) for g, a in zip(got, alpha)) > 0.05


def test_nmt_align_method_posterior_writes_its_links_and_names_it(model, data_dir, tmp_path):  # noqa: F811
    files = trial_files(data_dir)
    src, tgt, gold = files["e"], files["f"], files["align"]
    reports = {}
    for method in ("attention", "posterior"):
        links = tmp_path / f"{method}.links"
        out = run_align("-m", model, "-s", src, "-t", tgt, "--tokenized", "--gold", gold, "--gold-order", "tgt-src",
                        "--method", method, "--pharaoh", links, "--json")
        reports[method] = json.loads(out.stdout)
        reports[method]["links"] = links.read_text().splitlines()
        assert reports[method]["method"] == method and 0 <= reports[method]["aer"] <= 1
        assert len(reports[method]["links"]) == 37
    assert reports["posterior"]["links"] != reports["attention"]["links"]
    # the posterior of the Python API is what the command read links from
    aligner = Aligner(model, tokenized=True, method="posterior")
    from nmtkit.align import read_text
    from nmtkit.translate.wordalign import hard_links, pharaoh

    words = [aligner.words(line.text, "src") for line in read_text(src)[:3]]
    targets = [aligner.words(line.text, "tgt") for line in read_text(tgt)[:3]]
    for k, soft in enumerate(aligner.align_words(words, targets)):
        np.testing.assert_allclose(soft.alpha.sum(1), 1.0, atol=1e-5)
        assert pharaoh(hard_links(soft.alpha)) == reports["posterior"]["links"][k]


def test_an_unknown_method_or_a_model_without_attention_is_refused(model):  # noqa: F811
    from nmtkit.errors import InputError

    with pytest.raises(InputError, match="unknown alignment method 'viterbi'"):
        Aligner(model, tokenized=True, method="viterbi")
    with pytest.raises(ValueError, match="rnnencdec has none"):
        forced_posterior(tiny("rnnencdec").eval(), [np.array(SRC[0])], [np.array(TGT[0])])
