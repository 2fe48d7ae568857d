"""The output softmax and its cross-entropy, fused with their gradient, for training speed.

    p(y_i | …) = softmax(W_o t_i + b_y)_{y_i},   loss = −Σ_i log p(y_i | …)   over the real (non-padding) targets

Computed naively this writes and re-reads several (N, V) tensors -- the logits, their float32 copy under bf16, the
log-softmax, its gradient -- each of them 190 MB at paper size (N = 1,600 targets, V = 30,000).  Here the logits'
product is followed by one sweep over blocks of rows small enough for the cache (the speed policy's
``softmax_block_elements``): in each block the logits (widened to float32 with the bias under bf16) are turned in place into p = softmax by torch's
fused softmax, then into p − onehot(y) = ∂loss/∂logits, whose column sums are the bias gradient, and written back
(rounded once to bf16 under bf16); the products of ∂loss/∂logits with W_o and t follow.  The loss is −Σ log p(y),
recomputed as log Σ_v exp z_v − z_y for the rare rows whose p(y) underflows.  Only the real (non-padding)
targets are given (the fast backend's ``nll`` picks them, backend.py).  The products take rows in chunks of
at most the policy's ``loss_chunk_elements`` logits to bound the memory of very large batches (smaller chunks for
the products measured slower here: the matmuls get thin and ∂W_o is re-read once per chunk).  The gradients are thus computed in the
forward pass and only scaled in the backward pass (the loss is a scalar), which is what a training step needs
and what evaluation (no gradient) skips.

**Label smoothing** (``label_smoothing`` ε > 0, Szegedy et al. 2016): the loss is the cross-entropy against the
target distribution (1 − ε) onehot(y) + ε/V, V the real vocabulary (the columns padded to a multiple of 8 take no
part), as in ``F.cross_entropy(…, label_smoothing=ε)``:

    loss = Σ_i (1 − ε)(−log p(y_i)) + ε (−(1/V) Σ_v log p_v)
         = Σ_i −log p(y_i) + ε (z_{i,y_i} − (1/V) Σ_v z_{i,v})

(since −(1/V) Σ_v log p_v = logsumexp z − mean z and log p(y) + logsumexp z = z_y): the extra term needs
only each row's mean logit, taken in the block before the softmax overwrites it, and z_y; nothing of the
log-sum-exp, so the recomputed rows (``LOG_TINY``) enter through −log p(y) alone.  Its gradient,
p − (1 − ε) onehot(y) − ε/V over the real columns, is formed in the same block.
``linear_cross_entropy_with_nll`` also returns the plain −Σ log p(y) (for perplexity); with ε = 0 the loss is
that sum, computed exactly as without the option.

The values equal ``F.cross_entropy(F.linear(t, W_o, b_y), y, reduction="sum", label_smoothing=ε)`` up to rounding
(tests compare values and gradients).  Under autocast (bf16) the three products run in the autocast dtype; the
softmax, the loss and the gradient accumulations stay float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from nmtkit.models.fast.matmul import ALIGN, autocast_dtype, in_lowp, padded_vocab, token_rows
from nmtkit.models.fast.policy import policy

LOG_TINY = -69.0  # log p(y) below this (p < 1e-30; float32's normal range ends at 1.2e-38): recomputed from the logits


def _logits(t: Tensor, W: Tensor, b: Tensor | None, lowp) -> Tensor:
    """W t (+ b) for the rows of t (c, l): in float32 with the bias when ``lowp`` is None; else the product in
    ``lowp``, without the bias (added in float32 block by block, see ``_softmax_rows``)."""
    if lowp is None:
        return torch.addmm(b, t, W.t())
    z = t @ W.t()
    return z if b is None else z.float().add_(b)


def _softmax_rows(z: Tensor, b: Tensor, y: Tensor, want_grad: bool, buf: Tensor | None, eps: float = 0.0,
                  V: int = 0) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """For a block of logits z (r, V') -- float32 with the bias, or lowp without it (then widened into ``buf``
    and the bias added there) -- returns (log p(y) (r, 1), z_y (r, 1)); with label smoothing ``eps`` > 0 also
    z_y − (1/V) Σ_v z_v over the ``V`` real columns (r, 1), else None; with ``want_grad`` it leaves
    p − (1 − ε) onehot(y) − ε/V (real columns; the padded ones keep p = 0) = ∂loss/∂z in z and returns its
    column sums too (the bias gradient), else None."""
    zf = z if buf is None else buf[: len(z)].copy_(z).add_(b)  # (r, V')   float32 logits
    z_y = zf.gather(1, y)  # (r, 1)   logit of the reference word
    # (r, 1)   z_y − mean of the real logits (the padded ones are −inf), before the softmax overwrites them
    smooth = z_y - zf[:, :V].mean(dim=1, keepdim=True) if eps else None
    torch.softmax(zf, dim=1, out=zf)  # (r, V')   p, in place (torch's fused softmax: one pass per row)
    log_p = zf.gather(1, y).log_()  # (r, 1)   log p(y)
    if not want_grad:
        return log_p, z_y, smooth, None
    zf.scatter_add_(1, y, zf.new_full(y.shape, eps - 1.0))  # p − (1 − ε) onehot(y)   (ε = 0: ∂loss/∂z)
    if eps:
        zf[:, :V].sub_(eps / V)  # − ε/V on the real columns: ∂loss/∂z
    if buf is not None:
        z.copy_(zf)  # one rounding to lowp, for both products
    return log_p, z_y, smooth, zf.sum(dim=0)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lowp, want_grad: bool, eps: float, t: Tensor, W: Tensor, b: Tensor,
                y: Tensor) -> tuple[Tensor, Tensor]:
        """(the loss, smoothed by ``eps`` when > 0; −Σ log p(y), not differentiable): two scalars."""
        (N, l), V = t.shape, W.shape[0]
        # V, l and N rounded up to multiples of 8 (matmul.py): the extra logits are −inf (probability 0), the
        # extra columns of W and t zero; under lowp W is padded straight into its lowp copy.  The extra rows of t
        # (zero) make every product's row count a multiple of 8 too -- the logits (N', V') and ∂L/∂t (N', l')
        # are results N' rows high: the bf16 products are faster for some real batch sizes and unchanged for
        # others (tests/bench/results/bench_kernels.txt, rows "bf16 loss products") --; their logits are never
        # used and their ∂L/∂z is set to zero.  In bf16 on the CPU, N is rounded up to a multiple of 64
        # (``token_rows``: a shape oneDNN has compiled already).
        W_l, b = padded_vocab(W, b, float("-inf"), columns=True, dtype=lowp)  # (V', l'), (V',)
        t = F.pad(t, (0, W_l.shape[1] - l, 0, token_rows(N, lowp, t.device) - N))  # (N', l')
        V2 = W_l.shape[0]
        sizes = policy()
        chunk = max(sizes.loss_min_chunk_rows, sizes.loss_chunk_elements // V2)
        chunk -= chunk % ALIGN if chunk > ALIGN else 0  # a multiple of 8 too
        # the softmax in cache-sized blocks of rows on the CPU; a GPU takes the whole chunk at once (each block is a
        # dozen kernel launches, and its launches, not its caches, bound it: tests/bench/results/bench_cuda.txt)
        rows = max(1, sizes.softmax_block_elements // V2) if t.device.type == "cpu" else chunk
        buf = None if lowp is None else t.new_empty(min(rows, N), V2)  # float32 logits of one block
        t_l = in_lowp(t, lowp)
        loss = t.new_zeros((), dtype=torch.float64)  # −Σ log p(y)
        smooth = t.new_zeros((), dtype=torch.float64)  # Σ_i z_{i,y_i} − mean_v z_{i,v}   (label smoothing)
        if want_grad:
            dt, dW, db = torch.empty_like(t), None, torch.zeros_like(b)  # dW from the first chunk's product
        for start in range(0, N, chunk):
            tc, yc = t_l[start: start + chunk], y[start: start + chunk].unsqueeze(1)  # (c, l'), (c_real, 1)
            z = _logits(tc, W_l, b if lowp is None else None, lowp)  # (c, V')   logits
            real = len(yc)  # the chunk's real rows; the rest (at the batch's end) are padding
            for r in range(0, real, rows):  # softmax, loss and ∂loss/∂z block by block, in the cache
                log_p, z_y, smooth_r, db_r = _softmax_rows(z[r: min(r + rows, real)], b, yc[r: r + rows],
                                                           want_grad, buf, eps, V)
                lost = (log_p < LOG_TINY).squeeze(1).nonzero().squeeze(1)  # p(y) (nearly) underflowed: recompute
                if len(lost):  # log p(y) = z_y − log Σ_v exp z_v
                    z_lost = _logits(tc[r: r + rows][lost], W_l, b, lowp)
                    log_p[lost] = z_y[lost] - torch.logsumexp(z_lost, 1, keepdim=True)
                loss -= log_p.sum(dtype=torch.float64)
                if eps:
                    smooth += smooth_r.sum(dtype=torch.float64)
                if want_grad:
                    db += db_r  # (V',)
            if want_grad:  # z = ∂loss/∂z (c, V')
                z[real:] = 0.0  # the padding rows: no gradient
                if lowp is None:
                    torch.mm(z, W_l, out=dt[start: start + chunk])  # (c, l')
                    dW = z.t() @ tc if dW is None else dW.addmm_(z.t(), tc)  # (V', l')
                else:
                    dt[start: start + chunk] = z @ W_l
                    dW_c = z.t() @ tc  # (V', l')   in lowp
                    dW = dW_c.float() if dW is None else dW.add_(dW_c)
        if want_grad:
            if dW is None:  # no rows
                dW = W_l.new_zeros(W_l.shape, dtype=t.dtype)
            ctx.save_for_backward(dt[:N, :l], dW[:V, :l], db[:V])
        dtype = t.dtype if t.dtype != torch.bfloat16 else torch.float32
        nll = loss.to(dtype, copy=True)
        ctx.mark_non_differentiable(nll)
        return (loss + eps * smooth if eps else loss).to(dtype), nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_nll):
        dt, dW, db = ctx.saved_tensors
        g = grad.to(dt.dtype)
        return None, None, None, dt * g, dW * g, db * g, None


def check_label_smoothing(label_smoothing: float) -> float:
    """``label_smoothing`` as a float, or a ValueError unless it is a number in [0, 1)."""
    eps = label_smoothing
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:  # (NaN fails too)
        raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
    return float(eps)


def linear_cross_entropy_with_nll(t: Tensor, W: Tensor, b: Tensor, y: Tensor,
                                  label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """(the summed cross-entropy of softmax(W t + b) against (1 − ε) onehot(y) + ε/V over rows, ε =
    ``label_smoothing`` in [0, 1) (plain −Σ log p(y) for ε = 0); −Σ log p(y), detached, for perplexity), for
    t (N, l), W (V, l), b (V,), y (N,) long: two scalars (float32, or float64 for float64 inputs).  Only the first
    has gradients."""
    eps = check_label_smoothing(label_smoothing)
    lowp = autocast_dtype(t)
    want_grad = torch.is_grad_enabled() and (t.requires_grad or W.requires_grad or b.requires_grad)
    if lowp is None:
        return _LinearCrossEntropy.apply(None, want_grad, eps, t, W, b, y)
    with torch.autocast(t.device.type, enabled=False):
        return _LinearCrossEntropy.apply(lowp, want_grad, eps, t.float(), W.float(), b.float(), y)


def linear_cross_entropy(t: Tensor, W: Tensor, b: Tensor, y: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Summed −log softmax(W t + b)_y over rows -- smoothed by ``label_smoothing`` ε > 0, see
    ``linear_cross_entropy_with_nll`` --: t (N, l), W (V, l), b (V,), y (N,) long -> scalar (float32, or float64
    for float64 inputs)."""
    return linear_cross_entropy_with_nll(t, W, b, y, label_smoothing)[0]
