"""The model's weights under the paper's names, in the paper's orientation (W x: W is (out, in)).

``paper_parameters(model)`` returns a dict of detached tensors (views sharing storage with the model for the paper's
unit; writing into them writes into the model).  ``load_paper_parameters(model, params)`` copies such a dict back.

Keys (n hidden units, m embedding size, n' alignment size, l maxout units, ctx = 2n for RNNsearch, n for RNNencdec):

    E_src (V_src, m)  E_tgt (V_tgt, m)
    enc.fwd.W, enc.fwd.W_z, enc.fwd.W_r (n, m)   enc.fwd.U, enc.fwd.U_z, enc.fwd.U_r (n, n)
    enc.fwd.b, enc.fwd.b_z, enc.fwd.b_r (n)      and the same for enc.bwd.* (RNNsearch only)
    dec.W, dec.W_z, dec.W_r (n, m)   dec.U, dec.U_z, dec.U_r (n, n)   dec.C, dec.C_z, dec.C_r (n, ctx)
    dec.b, dec.b_z, dec.b_r (n)
    W_s (n, n)  b_s (n)                                s_0 = tanh(W_s ←h_1 + b_s)  (RNNencdec: W_s c + b_s)
    W_a (n', n)  U_a (n', 2n)  v_a (n')                RNNsearch only; no alignment-model bias
    U_o (2l, n)  V_o (2l, m)  C_o (2l, ctx)  b_o (2l)  t̃ = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i + b_o
    W_o (V_tgt, l)  b_y (V_tgt)                        logits = W_o t + b_y

With ``encoder_gru="torch"`` the encoder is torch.nn.GRU, a different unit; its weights are mapped onto the same
keys so that z has the paper's meaning (s' = (1 − z) ∘ s + z ∘ s̃: torch's update gate is the complement, hence
W_z = −W_iz etc.), b_z and b_r are the sums of torch's two biases, and one extra key per direction, ``enc.fwd.b_hn``
(n), holds the bias torch puts inside r ∘ (U s + b_hn).  These encoder entries are copies, not views.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

GATE_NAMES = ("z", "r", "")  # row blocks of the stacked matrices: [X_z; X_r; X]


def _sym(prefix: str, letter: str, gate: str) -> str:
    return f"{prefix}{letter}_{gate}" if gate else f"{prefix}{letter}"


def _split(out: dict[str, Tensor], prefix: str, letter: str, stacked: Tensor, gates=GATE_NAMES) -> None:
    n = stacked.shape[0] // len(gates)
    for k, gate in enumerate(gates):
        out[_sym(prefix, letter, gate)] = stacked[k * n : (k + 1) * n]


def _torch_gru_direction(rnn: nn.GRU, suffix: str) -> dict[str, Tensor]:
    """Torch's rows are [r; z; n]; the paper's z is torch's complement."""
    n = rnn.hidden_size
    w_ih, w_hh = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
    b_ih, b_hh = getattr(rnn, f"bias_ih_l0{suffix}"), getattr(rnn, f"bias_hh_l0{suffix}")
    r, z, c = slice(0, n), slice(n, 2 * n), slice(2 * n, 3 * n)
    return {
        "W_r": w_ih[r].clone(), "W_z": -w_ih[z], "W": w_ih[c].clone(),
        "U_r": w_hh[r].clone(), "U_z": -w_hh[z], "U": w_hh[c].clone(),
        "b_r": b_ih[r] + b_hh[r], "b_z": -(b_ih[z] + b_hh[z]), "b": b_ih[c].clone(), "b_hn": b_hh[c].clone(),
    }  # fmt: skip


@torch.no_grad()
def paper_parameters(model: nn.Module) -> dict[str, Tensor]:
    """The model's weights named by the paper's symbols (see the module docstring for the keys)."""
    return {k: v.detach() for k, v in paper_weights(model).items()}


def paper_weights(model: nn.Module) -> dict[str, Tensor]:
    """The same dict, with autograd: slices of the model's parameters (and, for ``encoder_gru="torch"``,
    differentiable expressions of torch's), so that a loss computed from them has gradients in the model's
    parameters.  What :mod:`nmtkit.models.reference` computes with."""
    out: dict[str, Tensor] = {"E_src": model.E_src, "E_tgt": model.E_tgt}
    encoder = model.encoder
    directions = ("fwd", "bwd") if encoder.bidirectional else ("fwd",)
    for d in directions:
        prefix = f"enc.{d}."
        if encoder.unit == "paper":
            layer = getattr(encoder, d)
            _split(out, prefix, "W", layer.W_stack)
            _split(out, prefix, "b", layer.b_stack)
            _split(out, prefix, "U", layer.U_zr, gates=("z", "r"))
            out[prefix + "U"] = layer.U
        else:
            for k, v in _torch_gru_direction(encoder.rnn, "" if d == "fwd" else "_reverse").items():
                out[prefix + k] = v
    dec = model.decoder
    _split(out, "dec.", "W", dec.W_stack)
    _split(out, "dec.", "U", dec.U_zr, gates=("z", "r"))
    out["dec.U"] = dec.U
    _split(out, "dec.", "C", dec.C_stack)
    _split(out, "dec.", "b", dec.b_stack)
    for name in ("W_s", "b_s"):
        out[name] = getattr(model, name)
    if model.attentive:
        for name in ("W_a", "U_a", "v_a"):
            out[name] = getattr(model.attention, name)
    for name in ("U_o", "V_o", "C_o", "b_o", "W_o", "b_y"):
        out[name] = getattr(model, name)
    return out


@torch.no_grad()
def load_paper_parameters(model: nn.Module, params: dict[str, Tensor]) -> None:
    """Copy a ``paper_parameters``-style dict into the model (every key required; shapes must match)."""
    targets = paper_parameters(model)
    missing, unknown = sorted(set(targets) - set(params)), sorted(set(params) - set(targets))
    if missing or unknown:
        raise ValueError(f"paper parameters do not match the model: missing {missing}, unexpected {unknown}")
    for key, target in targets.items():
        if tuple(params[key].shape) != tuple(target.shape):
            raise ValueError(f"{key}: shape {tuple(params[key].shape)} does not match {tuple(target.shape)}")
    encoder = model.encoder
    if encoder.unit == "torch":  # the encoder entries are copies: write torch's tensors from them
        for d, suffix in (("fwd", ""), ("bwd", "_reverse"))[: 2 if encoder.bidirectional else 1]:
            p = {k[len(f"enc.{d}.") :]: v for k, v in params.items() if k.startswith(f"enc.{d}.")}
            rnn = encoder.rnn
            getattr(rnn, f"weight_ih_l0{suffix}").copy_(torch.cat([p["W_r"], -p["W_z"], p["W"]]))
            getattr(rnn, f"weight_hh_l0{suffix}").copy_(torch.cat([p["U_r"], -p["U_z"], p["U"]]))
            getattr(rnn, f"bias_ih_l0{suffix}").copy_(torch.cat([p["b_r"], -p["b_z"], p["b"]]))
            getattr(rnn, f"bias_hh_l0{suffix}").copy_(torch.cat([torch.zeros_like(p["b"])] * 2 + [p["b_hn"]]))
        targets = {k: v for k, v in targets.items() if not k.startswith("enc.")}
    for key, target in targets.items():  # views into the model's parameters
        target.copy_(params[key])


def count_weights(model: nn.Module, biases: bool = False) -> int:
    """Number of parameters; without biases by default.  A bias is a parameter whose own name starts with "b"
    (b_stack, b_s, b_o, b_y, torch's bias_*); v_a is a weight."""
    return sum(
        p.numel() for name, p in model.named_parameters() if biases or not name.rsplit(".", 1)[-1].startswith("b")
    )
