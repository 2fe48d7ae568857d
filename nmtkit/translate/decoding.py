"""Decoding batches of source ids with loaded models: the part of translation that runs in every decoding process
(this one, or a worker of :mod:`nmtkit.translate.pool`), below :mod:`nmtkit.translate.translator`'s line handling.

:func:`load_checkpoints` and :func:`build_models` turn checkpoint files into models in eval mode (an ensemble's
vocabularies and preprocessing must match); :func:`decode_batch` runs beam search (:mod:`nmtkit.translate.search`) or
sampling (:mod:`nmtkit.translate.sampling`) over one batch as a :class:`nmtkit.translate.config.DecodeConfig` says,
optionally forced through target prefixes; then :func:`add_alignments` gives the hypotheses what the translator
reads beyond the search: with ``decode.alignment_method`` ``posterior`` and the attention asked for, each sentence's
best hypothesis its alignment posterior (:func:`add_posteriors`).
"""

from __future__ import annotations

import numpy as np
import torch

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.errors import InputError
from nmtkit.models import model_for_inference
from nmtkit.data.candidates import CandidateTable
from nmtkit.translate.candidates import restricted, to_ids
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.sampling import sample
from nmtkit.translate.search import Hypothesis, beam_search
from nmtkit.translate.sourcenumbers import DigitTable, SourceNumbers
from nmtkit.data.vocab import PAD


def load_checkpoints(paths: list[str]) -> list[dict]:
    """The checkpoints' payloads; an ensemble's vocabularies and preprocessing must be identical."""
    payloads = [checkpoint.load(p) for p in paths]
    for path, p in zip(paths[1:], payloads[1:]):
        for key in ("vocab", "preprocessing"):
            if p[key] != payloads[0][key]:
                raise InputError(f"its {key} differs from that of {paths[0]}: an ensemble needs "
                                 "identical vocabularies and preprocessing", path)
    return payloads


def build_models(paths: list[str], device: str = "cpu", payloads: list[dict] | None = None,
                 backend: str | None = None) -> list:
    """The checkpoints' models, in eval mode on ``device``, on ``backend`` (None:
    :func:`nmtkit.models.default_backend`)."""
    payloads = payloads if payloads is not None else load_checkpoints(paths)
    return [model_for_inference(p, path, torch.device(device), backend) for path, p in zip(paths, payloads)]


def collate_prefixes(prefixes: list[np.ndarray | None]) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """Target prefix id arrays (None: none) → (prefix (B, P) padded with ``<pad>``, prefix_lens (B,)), or
    (None, None) when no sentence has one."""
    lens = [0 if p is None else len(p) for p in prefixes]
    if not any(lens):
        return None, None
    out = np.full((len(prefixes), max(lens)), PAD, dtype=np.int64)
    for k, p in enumerate(prefixes):
        if lens[k]:
            out[k, : lens[k]] = p
    return torch.from_numpy(out), torch.tensor(lens)


def _inputs(sources: list[np.ndarray], decode: DecodeConfig, prefixes, digit_table, source_numbers,
            numbers_whole=None):
    """A batch's collated sources, prefixes and source-numbers constraint."""
    numbers_from = None
    if decode.source_numbers:
        if digit_table is None or source_numbers is None or len(source_numbers) != len(sources):
            raise ValueError("source_numbers needs the target's digit table and each sentence's source numbers")
        numbers_from = SourceNumbers(digit_table, source_numbers, numbers_whole)
    src, lens = collate_source(sources)
    prefix, prefix_lens = collate_prefixes(prefixes) if prefixes is not None else (None, None)
    return src, lens, prefix, prefix_lens, numbers_from


def decode_batch(models: list, sources: list[np.ndarray], device, decode: DecodeConfig,
                 need_attention: bool = False, bf16: bool = False, prefixes: list[np.ndarray | None] | None = None,
                 keys: list | None = None, numbers=None, digit_table: DigitTable | None = None,
                 source_numbers: list[list[str]] | None = None, numbers_whole: list[bool] | None = None,
                 candidates: CandidateTable | None = None) -> list[list[Hypothesis]]:
    """Beam search (:func:`nmtkit.translate.search.beam_search`) over source id arrays (without ``</s>``) as
    ``decode`` says, or with ``decode.sampling`` ``decode.nbest`` samples per sentence drawn with the keys
    ``(decode.seed, *keys[k])`` (``numbers``: the target tokens the n-gram block leaves free, bool (V,); with
    ``decode.source_numbers``, ``digit_table``, the target vocabulary's
    :class:`~nmtkit.translate.sourcenumbers.DigitTable`, and ``source_numbers``, each sentence's
    :func:`~nmtkit.translate.sourcenumbers.source_numbers`, with ``numbers_whole`` which sentences are whole lines
    (default all; see :class:`~nmtkit.translate.sourcenumbers.SourceNumbers`)): each sentence's hypotheses, with attention (if asked
    for) as float32 numpy arrays (len(tokens) + 1, Tx).  With ``candidates`` the batch is decoded over its
    candidate list (:mod:`nmtkit.translate.candidates`)."""
    device = torch.device(device)
    searched, vocab = models, None
    if candidates is not None:
        vocab, searched, prefixes, numbers, digit_table = restricted(
            candidates, models, sources, device, prefixes, numbers, digit_table, decode.source_numbers)
    src, lens, prefix, prefix_lens, numbers_from = _inputs(sources, decode, prefixes, digit_table, source_numbers,
                                                           numbers_whole)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        if decode.sampling is not None:
            keys = keys if keys is not None else [(k,) for k in range(len(sources))]
            hyps = sample(searched, src.to(device), lens.to(device), [(decode.seed, *k) for k in keys], decode,
                          need_attention=need_attention, prefix=prefix, prefix_lens=prefix_lens, numbers=numbers,
                          numbers_from=numbers_from)
        else:
            hyps = beam_search(searched, src.to(device), lens.to(device), decode, need_attention=need_attention,
                               prefix=prefix, prefix_lens=prefix_lens, numbers=numbers, numbers_from=numbers_from)
    if vocab is not None:
        hyps = to_ids(vocab, hyps)
    return add_alignments(models, sources, finish_hypotheses(hyps), device, decode, need_attention)


def add_alignments(models: list, sources: list[np.ndarray], hyps: list[list[Hypothesis]], device,
                   decode: DecodeConfig, need_attention: bool) -> list[list[Hypothesis]]:
    """In place, and returned: the posteriors that ``decode`` reads from the batch's hypotheses -- the best
    hypothesis' whole posterior for ``alignment_method`` ``posterior`` (with the attention asked for)."""
    if need_attention and decode.alignment_method == "posterior":
        add_posteriors(models, sources, hyps, device)
    return hyps


def add_posteriors(models: list, sources: list[np.ndarray], hyps: list[list[Hypothesis]], device) -> None:
    """In place: each sentence's best hypothesis gets its alignment posterior (:attr:`Hypothesis.posterior`,
    :func:`nmtkit.posterior.forced_posterior` on the source and the hypothesis' tokens; an ensemble's is the mean of
    its models'), which ``--alignment-method posterior`` reads the alignment from.  In float32, whatever ``--bf16``
    decoded with."""
    best = [(k, sentence[0]) for k, sentence in enumerate(hyps) if sentence]
    for (_, h), p in zip(best, _posteriors(models, sources, best, device)):
        h.posterior = p


def _posteriors(models: list, sources: list[np.ndarray], todo: list[tuple[int, Hypothesis]], device
                ) -> list[np.ndarray]:
    """The alignment posterior of each (sentence, hypothesis) of ``todo``, the mean of the models'."""
    if not todo:
        return []
    from nmtkit.posterior import forced_posterior

    src = [sources[k] for k, _ in todo]
    tgt = [np.asarray(h.tokens, dtype=np.int64) for _, h in todo]
    total = None
    with torch.autocast(torch.device(device).type, enabled=False):  # (float32 under a caller's bf16 autocast too)
        for model in models:
            post = forced_posterior(model, src, tgt, batch_size=max(1, len(todo)), device=device)
            total = post if total is None else [a + b for a, b in zip(total, post)]
    return [(p / len(models)).astype(np.float32) for p in total]


def finish_hypotheses(hyps: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
    """In place, and returned: each hypothesis' attention as a float32 numpy array."""
    for sentence in hyps:
        for h in sentence:
            if h.attention is not None:
                h.attention = h.attention.float().cpu().numpy()
    return hyps
