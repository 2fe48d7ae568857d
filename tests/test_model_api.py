"""Shapes, masking, the registry, dropout, sparse embedding gradients and bf16 autocast of the models, at tiny sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from nmtkit.models import (
    BOS,
    PAD,
    build_model,
    count_weights,
    get_config,
    list_models,
    list_presets,
    register_model,
    register_preset,
)
from nmtkit.models.config import RNNsearchConfig

from conftest import ARCHS, V_TGT, make_batch, randomize_, tiny  # the shared tiny models and batches


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
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_single_target_step_and_backward(arch, backend):
    """Ty = 1 (only <s> in, only </s> out) and one-token sources: the edge cases of the loops."""
    model = tiny(arch)
    model.backend = backend
    src, lens, tgt_in, _ = make_batch([1, 3], [0, 0])
    logits = model(src, lens, tgt_in)
    assert logits.shape == (2, 1, V_TGT)
    logits.sum().backward()
    assert model.E_src.grad.abs().sum() > 0 and model.W_o.grad.abs().sum() > 0
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_attention_gives_padding_exactly_zero(backend):
    model = randomize_(tiny("rnnsearch"))
    model.backend = backend
    src, src_lens, tgt_in, _ = make_batch([6, 2, 4], [3, 5, 1])
    _, alpha = model(src, src_lens, tgt_in, return_attention=True)
    pad = ~model.encode(src, src_lens).src_mask  # (B, Tx)
    assert torch.all(alpha.masked_select(pad.unsqueeze(1).expand_as(alpha)) == 0)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(alpha.shape[:2]))
    enc = model.encode(src, src_lens)
    _, _, step_alpha = model.decode_step(tgt_in[:, 0], enc.init_state, enc)
    assert torch.all(step_alpha[pad] == 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("unit", ["paper", "torch"])
def test_padded_batch_equals_sentences_alone(arch, backend, unit):
    model = randomize_(tiny(arch, encoder_gru=unit))
    model.backend = backend
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
def test_sparse_embedding_grads_are_the_dense_ones(arch):
    """model.sparse_embedding_grads: E_src and E_tgt get row-sparse gradients, at the rows the batch uses, with
    the dense gradients' values (the training loss, and forward's logits); the other parameters are unchanged."""
    model = randomize_(tiny(arch), std=0.1)
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
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_runs_under_bf16_autocast(arch, backend):
    """The trainer's --bf16 option: matmuls in bfloat16, the fused loops in float32; close to float32 results, and
    on the fast backend (training's) close to float32's gradients too."""
    model = randomize_(tiny(arch), std=0.1)
    model.backend = backend
    src, lens, tgt_in, _ = make_batch([4, 6, 2], [5, 3, 4])
    expected = model(src, lens, tgt_in)
    (expected * expected).sum().backward()
    expected_grads = {k: p.grad for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, lens, tgt_in)
    (logits.float() * logits.float()).sum().backward()
    torch.testing.assert_close(logits.float(), expected, atol=0.05, rtol=0.05)
    if backend == "reference":  # (the reference runs its elementwise work and gradients in bf16 too: not this close)
        return
    for k, p in model.named_parameters():  # bf16 rounding of the products' operands only: close to float32's
        if expected_grads[k] is None:
            assert p.grad is None, k
            continue
        scale = expected_grads[k].abs().max().item()
        torch.testing.assert_close(p.grad, expected_grads[k], atol=0.03 * scale, rtol=0.03, msg=k)


# ----------------------------------------------------------------------------------------------------------- backends
def test_backend_is_one_object_chosen_by_name(monkeypatch):
    """A model computes through one backend object, resolved from its name once (registry.make_backend): the
    environment's default when built, the name set later otherwise; an unknown name is refused and changes nothing."""
    from nmtkit.models.fast.backend import FastBackend
    from nmtkit.models.reference import ReferenceBackend

    monkeypatch.delenv("NMTKIT_BACKEND", raising=False)
    model = tiny("rnnsearch")
    assert model.backend == "fast" and type(model._backend) is FastBackend
    monkeypatch.setenv("NMTKIT_BACKEND", "reference")
    built = tiny("rnnencdec")
    assert built.backend == "reference" and type(built._backend) is ReferenceBackend
    assert model.backend == "fast"  # (read once, when the model was built)
    model.backend = "reference"
    assert type(model._backend) is ReferenceBackend
    with pytest.raises(ValueError, match="unknown backend 'slow' \\(choose from fast, reference\\)"):
        model.backend = "slow"
    assert model.backend == "reference"
    monkeypatch.setenv("NMTKIT_BACKEND", "slow")
    with pytest.raises(ValueError, match="NMTKIT_BACKEND='slow' is not a backend"):
        tiny("rnnsearch")


@pytest.mark.parametrize("value, expected", [
    ("", ("fast", set())), ("fast", ("fast", set())), ("reference", ("reference", set())),
    ("fast:no-onednn", ("fast", {"no-onednn"})), (" fast:no-kernels, no-onednn ", ("fast", {"no-onednn", "no-kernels"})),
    ("reference:no-kernels", None), ("fast:no-gpu", None), ("fast,no-onednn", None), ("slow", None)])
def test_one_environment_setting_chooses_backend_and_fast_paths(value, expected):
    """``$NMTKIT_BACKEND`` is the one setting: the backend's name, and for the fast one the paths it turns off
    (read by the speed policy and the kernels); anything else is refused, naming the value.  Its names are the
    registry's."""
    from nmtkit.models import BACKENDS
    from nmtkit.models.fast.policy import SpeedPolicy
    from nmtkit.runtime import BACKEND_NAMES, backend_setting, fast_switches

    assert tuple(BACKENDS) == BACKEND_NAMES

    env = {"NMTKIT_BACKEND": value}
    if expected is None:
        with pytest.raises(ValueError, match=f"NMTKIT_BACKEND={value.strip()!r} is not a backend"):
            backend_setting(env)
        assert fast_switches(env) == set() and SpeedPolicy.from_environment(env).onednn
    else:
        assert backend_setting(env) == (expected[0], frozenset(expected[1]))
        assert SpeedPolicy.from_environment(env).onednn == ("no-onednn" not in expected[1])
