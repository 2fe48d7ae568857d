"""The references' negative log-likelihood under a checkpoint (teacher forced, batched)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nmtkit.data.manifest import MAX_EVAL_TOKENS
from nmtkit.errors import InputError
from nmtkit.score.subsets import shortlist_from_checkpoint


def model_nll(payload: dict, sources: Sequence[str], references: Sequence[str], batch_size: int = 16,
              device: str = "cpu", backend: str | None = None, origin: str | None = None,
              paths: tuple[str, str] = ("source", "reference")) -> dict:
    """Negative log-likelihood (nats) of each reference given its source under a checkpoint's model, teacher
    forced: ``-Σ_t log p(y_t | y_<t, x)`` over the reference's model tokens and ``</s>``.

    Returns ``{"sentences", "tokens", "words", "total", "per_sentence", "per_token", "per_word", "perplexity",
    "nll": array}``: per token counts model tokens with ``</s>``; per word divides by the reference's
    Moses-tokenized words (``</s>`` not counted); perplexity is ``exp(per_token)``.  ``backend``: how the model
    computes (:data:`nmtkit.models.BACKENDS`; None: ``$NMTKIT_BACKEND``, else fast).  ``origin``: the checkpoint's
    file, which an error names.  A pair is scored whole: a side of more than
    :data:`~nmtkit.data.manifest.MAX_EVAL_TOKENS` model tokens is an InputError naming its file (``paths``: the
    source's and the reference's) and line, before anything is computed.
    """
    import torch

    from nmtkit.models import model_for_inference
    from nmtkit.data.batching import collate, eval_batches
    from nmtkit.data.text import Preprocessor
    from nmtkit.data.vocab import PAD

    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1 (got {batch_size})")
    from nmtkit.device import resolve_device

    device = resolve_device(str(device))
    shortlist = shortlist_from_checkpoint(payload, origin or "checkpoint")
    model = model_for_inference(payload, origin, device, backend)
    src_pre, tgt_pre = Preprocessor(shortlist.src_config), Preprocessor(shortlist.tgt_config)
    src_ids = [shortlist.src_vocab.encode(src_pre.tokenize(s)) for s in sources]
    words = [tgt_pre.words(r) for r in references]
    tgt_ids = [shortlist.tgt_vocab.encode(tgt_pre.subwords(w)) for w in words]
    nll = np.zeros(len(sources), dtype=np.float64)
    src_sizes = np.array([len(s) for s in src_ids])
    tgt_sizes = np.array([len(t) for t in tgt_ids])
    for sizes, path in zip((src_sizes, tgt_sizes), paths):
        if len(sizes) and sizes.max() > MAX_EVAL_TOKENS:
            line = int(sizes.argmax())
            raise InputError(f"has {int(sizes[line]):,} model tokens, more than the {MAX_EVAL_TOKENS:,} a pair "
                             "scored whole may have (--model's NLL scores each pair whole): shorten or remove the "
                             "line, or score without --model", path, line + 1)
    with torch.no_grad():
        for ids in eval_batches(src_sizes, tgt_sizes, batch_size):
            b = collate(src_ids, tgt_ids, ids).to(device)
            logits = model(b.src, b.src_lens, b.tgt_in).float()  # (B, Ty, V)
            logp = torch.log_softmax(logits, dim=-1).gather(-1, b.tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, Ty)
            logp = logp.masked_fill(b.tgt_out == PAD, 0.0)
            nll[ids] = -logp.double().sum(1).cpu().numpy()
    total, tokens, n_words = float(nll.sum()), int(tgt_sizes.sum() + len(tgt_ids)), sum(len(w) for w in words)
    per_token = total / tokens
    return {"sentences": len(sources), "tokens": tokens, "words": n_words, "total": total,
            "per_sentence": total / len(sources), "per_token": per_token,
            "per_word": total / n_words if n_words else None, "perplexity": math.exp(min(per_token, 700.0)),
            "nll": nll}
