"""nmtkit.models.fast.activations: tanh through the sigmoid, and the maxout's pairwise maximum with its own backward."""

from __future__ import annotations

import pytest
import torch

from nmtkit.models.fast.activations import pairwise_max, tanh_


def test_tanh_through_the_sigmoid_is_within_float32_rounding_of_tanh():
    x = torch.cat([torch.linspace(-30, 30, 200_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-3, 88.0, -88.0])])
    ref = torch.tanh(x.double())
    y = x.clone()
    assert tanh_(y) is y  # in place
    err = (y.double() - ref).abs()
    assert err.max() <= 2.5e-7, float(err.max())
    assert y.abs().max() <= 1.0  # saturates at ±1 exactly, never beyond
    assert y[x == 0].eq(0).all()  # tanh(0) = 0 exactly: 2 · 0.5 − 1


def test_tanh_keeps_torchs_tanh_for_other_dtypes():
    x = torch.linspace(-5, 5, 1001, dtype=torch.float64)
    assert torch.equal(tanh_(x.clone()), torch.tanh(x))  # float64: gradient checks and exact tests
    xb = x.to(torch.bfloat16)
    assert torch.equal(tanh_(xb.clone()), torch.tanh(xb))


def _with_ties(rows: int = 40, l: int = 6) -> torch.Tensor:
    x = torch.randn(rows, 2 * l, generator=torch.Generator().manual_seed(0))
    x[::3, 1::2] = x[::3, 0::2]  # every third row: both elements of each pair equal
    return x


def test_pairwise_max_values_equal_amax_with_and_without_autograd():
    x = _with_ties()
    ref = x.unflatten(-1, (-1, 2)).amax(dim=-1)
    assert torch.equal(pairwise_max(x.clone().requires_grad_()), ref)
    with torch.no_grad():
        assert torch.equal(pairwise_max(x.clone().requires_grad_()), ref)
    assert torch.equal(pairwise_max(x.view(4, 10, 12)), ref.view(4, 10, 6))  # any leading dimensions


def test_pairwise_max_gradient_goes_to_the_larger_of_each_pair():
    x = _with_ties().requires_grad_()
    g = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    pairwise_max(x).backward(g)
    pairs, grad = x.detach().unflatten(-1, (-1, 2)), x.grad.unflatten(-1, (-1, 2))
    torch.testing.assert_close(grad.sum(-1), g, rtol=0, atol=0)  # all of each pair's gradient, once
    assert (grad != 0).sum(-1).le(1).all()  # to one element of the pair, ties included (a subgradient)
    first, second = pairs[..., 0] > pairs[..., 1], pairs[..., 1] > pairs[..., 0]
    assert torch.equal(grad[..., 0][first], g[first]) and torch.equal(grad[..., 1][second], g[second])
    # where the pair differs, the gradient is amax's exactly
    ref = x.detach().clone().requires_grad_()
    ref.unflatten(-1, (-1, 2)).amax(dim=-1).backward(g)
    differ = (pairs[..., 0] != pairs[..., 1]).repeat_interleave(2, dim=-1)
    assert torch.equal(x.grad[differ], ref.grad[differ])


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 4)])
def test_pairwise_max_gradcheck(shape):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    assert torch.autograd.gradcheck(pairwise_max, (x,))


def test_pairwise_max_wants_pairs():
    for grad in (False, True):
        with pytest.raises(ValueError, match="must be even"):
            pairwise_max(torch.zeros(2, 5, requires_grad=grad))
