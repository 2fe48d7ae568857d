"""Validation during training: cross-entropy on the development set, and BLEU of decoding part of it.

Plain functions over a model and a prepared directory's ``valid`` split, so that they can be called outside
``nmt-train`` (e.g. on a checkpoint after the fact):

- :func:`validation_loss`: summed −log p(y | x) of the references over every development pair, per target token
  (``</s>`` included), and its perplexity;
- :func:`validation_bleu`: BLEU (sacreBLEU, ``tokenize="none"``: the references are the prepared, Moses-tokenised
  ``valid.tok.LANG``) of greedy or beam decoding of the first ``n`` development sentences, subwords merged.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nmtkit.data.batching import collate, collate_source, eval_batches
from nmtkit.data.corpus import Corpus
from nmtkit.data.manifest import PreparedData
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.search import beam_search, greedy
from nmtkit.data.text import Preprocessor
from nmtkit.data.vocab import Vocabulary


@torch.no_grad()
def validation_loss(model, src: Corpus, tgt: Corpus, device: torch.device, batch_size: int = 80,
                    bf16: bool = False) -> dict:
    """{"valid_loss": NLL per target token, "valid_ppl": its exponential} over every pair of (src, tgt)."""
    model.eval()
    nll, ntok = 0.0, 0
    for ids in eval_batches(np.asarray(src.sizes), np.asarray(tgt.sizes), batch_size):
        batch = collate(src, tgt, ids).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            nll += float(model.nll(batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out))
        ntok += batch.num_tokens
    loss = nll / max(ntok, 1)
    return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 100))}


@torch.no_grad()
def validation_bleu(model, data: PreparedData, src: Corpus, tgt_vocab: Vocabulary, n: int, device: torch.device,
                    beam: int = 1, batch_size: int = 80, bf16: bool = False) -> dict:
    """BLEU of decoding the first ``n`` sentences of ``src`` (the prepared ``valid`` split of ``data``) against
    ``valid.tok.<target>``: {"valid_bleu", "valid_bleu_sentences", "valid_bleu_signature"}."""
    import sacrebleu

    model.eval()
    post = Preprocessor(data.text_config(data.target_lang))
    hyps: list[str] = [""] * n
    for ids in eval_batches(np.asarray(src.sizes[:n]), None, batch_size):
        src_t, lens = collate_source([src[i] for i in ids])
        src_t, lens = src_t.to(device), lens.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = greedy(model, src_t, lens) if beam == 1 else \
                [h[0] for h in beam_search(model, src_t, lens, DecodeConfig(beam=beam))]
        for i, h in zip(ids, out):
            hyps[i] = " ".join(post.merge_subwords(tgt_vocab.decode(h.tokens)))
    with open(data.path(f"valid.tok.{data.target_lang}"), encoding="utf-8", newline="\n") as f:
        refs = [line.rstrip("\n") for _, line in zip(range(n), f)]
    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    decoding = "greedy" if beam == 1 else f"beam {beam}"
    return {"valid_bleu": bleu.corpus_score(hyps, [refs]).score, "valid_bleu_sentences": n,
            "valid_bleu_signature": f"{bleu.get_signature()} ({decoding}, Moses-tokenised)"}


def describe(r: dict) -> str:
    """One log line for a validation record."""
    text = f"update {r['update']}: valid loss {r.get('valid_loss', float('nan')):.4f} ppl {r.get('valid_ppl', 0):.2f}"
    if "valid_bleu" in r:
        text += f", BLEU {r['valid_bleu']:.2f} on {r['valid_bleu_sentences']} sentences ({r['valid_bleu_signature']})"
    return text
