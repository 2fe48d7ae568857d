"""The alignment posterior of an attention model (``nmt-align --method posterior``): which source word each target
word comes from, by the model's own reckoning once the word is known.

RNNsearch's attention α_i is computed from s_{i-1}, before y_i is chosen: it says where the decoder looks next,
which is not always the source word y_i translates (an article looks at the noun it agrees with, a word order
change is anticipated late or early).  Read as a latent alignment (hard attention: Xu et al. 2015, Deng et al. 2018,
of which the soft attention is the expectation), the model gives a posterior that also reads y_i:

    p(a_i = j | y_i, y_<i, x) ∝ α_ij · p(y_i | y_<i, c_i = h_j),

the attention as the prior, and as the likelihood how well source position j's annotation alone, given to the
decoder as its context, predicts the word that came -- a lexical factor, as a statistical aligner's translation
table is, taken from the model itself.  It has no parameter.  What it gains over the attention, measured:
tests/bench/results/bench_posterior.txt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


ROW_ELEMENTS = 1 << 22  # logits made at once (4M: 16 MB in float32), whatever the batch and sentence lengths


def forced_posterior(model, src_ids: Sequence[np.ndarray], tgt_ids: Sequence[np.ndarray], batch_size: int = 32,
                     device: str = "cpu", words: Sequence[int] | None = None) -> list[np.ndarray]:
    """The alignment posterior of an attention model for each pair, shaped as
    :func:`nmtkit.align.forced_attention`'s α:

        p(a_i = j | y_i, y_<i, x) ∝ α_ij · p(y_i | y_<i, c_i = h_j),

    the attention α_i as the prior over which source position y_i comes from, and how well that position's
    annotation h_j alone, given to the decoder as its context, predicts the word y_i that follows -- the model read
    as if its attention chose one position (hard attention: Xu et al. 2015, Deng et al. 2018), which its soft
    attention approximates.  α_i is computed before y_i is known; the posterior also reads y_i, as a statistical
    aligner's posterior does.  Both factors come from the model's own steps (``decode_step`` on the sentence, then
    on each source position alone), so every backend computes it; it costs an output layer per target token and
    source token (``</s>`` included), about Tx times teacher forcing's, made :data:`ROW_ELEMENTS` logits at a time.
    The model must be in eval mode (the two calls must see the same weights: no dropout).

    ``words``: target ids whose rows alone are wanted (``--replace-unk``'s ``<unk>``): the lexical factor is
    computed only where the target word is one of them -- an output layer per source token for each such word, not
    for every target token -- and the other rows are the attention α_i as it is."""
    import torch

    from nmtkit.data.batching import forced_blocks
    from nmtkit.models.backend import EncoderOut

    if not model.attentive:
        raise ValueError(f"the alignment posterior reads the attention; {model.arch} has none")
    vocab = model.W_o.shape[0]
    wanted = None if words is None else torch.as_tensor(list(words), dtype=torch.long, device=device)
    rows_per_chunk = max(1, ROW_ELEMENTS // vocab)  # single-position rows whose logits are made at once

    def posterior(b):
        enc = model.encode(b.src, b.src_lens)
        B, Tx = b.src.shape
        # each source position alone, as a sentence of one (B·Tx "sentences"): attention over it is 1, c_i = h_j;
        # only the real positions (flat b·Tx + j), in chunks (logits of a chunk: rows_per_chunk × V)
        real = enc.src_mask.flatten().nonzero().squeeze(1)  # (N,)
        alone = EncoderOut(enc.annotations.reshape(B * Tx, 1, -1),
                           None if enc.keys is None else enc.keys.reshape(B * Tx, 1, -1),
                           torch.ones(B * Tx, 1, dtype=torch.bool, device=b.src.device),
                           enc.init_state.repeat_interleave(Tx, 0), None)
        alone = model.prepare_decoding(model.reorder_encoder_out(alone, real))
        sentence = torch.div(real, Tx, rounding_mode="floor")  # (N,)   each real position's sentence
        enc = model.prepare_decoding(enc)
        state = model.init_decoder(enc)
        post = torch.zeros(B, b.tgt_in.shape[1], Tx, device=b.src.device)
        emit = torch.full((B * Tx,), float("-inf"), device=b.src.device)  # log p(y_i | c_i = h_j), b·Tx + j
        every = torch.arange(len(real), device=b.src.device)  # (N,)   the single-position rows (of ``alone``)
        for i in range(b.tgt_in.shape[1]):
            y_prev, y = b.tgt_in[:, i], b.tgt_out[:, i]  # (B,)   y_{i-1}, y_i
            _, next_state, alpha = model.decode_step(y_prev, state, enc)  # α_i (B, Tx)
            asked = None if wanted is None else torch.isin(y, wanted)  # (B,)   the rows wanted, or all
            pick = every if asked is None else asked[sentence].nonzero().squeeze(1)  # rows of ``alone`` to compute
            for c in range(0, len(pick), rows_per_chunk):
                k = pick[c: c + rows_per_chunk]
                rows = sentence[k]
                logits, _, _ = model.decode_step(y_prev[rows], state[rows], model.reorder_encoder_out(alone, k))
                emit[real[k]] = torch.log_softmax(logits.float(), -1).gather(1, y[rows].unsqueeze(1)).squeeze(1)
            score = alpha.float().clamp_min(1e-30).log() + emit.view(B, Tx)  # log α_ij + log p(y_i | h_j)
            row = torch.softmax(score.masked_fill(~enc.src_mask, float("-inf")), -1)
            post[:, i] = row if asked is None else torch.where(asked.unsqueeze(1), row, alpha.float())
            state = next_state
        return post.cpu().numpy()

    return forced_blocks(src_ids, tgt_ids, batch_size, device, posterior)
