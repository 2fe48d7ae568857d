"""Decoding batches of source ids with loaded models: the part of translation that runs in every decoding process
(this one, or a worker of :mod:`nmtkit.translate.pool`), below :mod:`nmtkit.translate.translator`'s line handling.

:func:`load_checkpoints` and :func:`build_models` turn checkpoint files into models in eval mode (an ensemble's
vocabularies and preprocessing must match); :func:`decode_batch` runs beam search (:mod:`nmtkit.translate.search`) or
sampling (:mod:`nmtkit.translate.sampling`) over one :class:`SourceBatch` as a :class:`DecodeSetup` says (the one
typed seam between the translator, its worker processes and the search); then :func:`add_alignments` gives the hypotheses what the translator
reads beyond the search: with ``decode.alignment_method`` ``posterior`` and the attention asked for, each sentence's
best hypothesis its alignment posterior (:func:`add_posteriors`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

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
from nmtkit.translate.stopping import stoppable
from nmtkit.translate.terms import SourceTerms, WordBounds
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


@dataclass(frozen=True)
class DecodeSetup:
    """What every batch of a translator is decoded with: the decoding settings, whether the attention is kept
    (alignments, ``--replace-unk``), the precision, and what the target vocabulary says of numbers -- ``numbers``,
    bool (V,), the tokens with a digit (the n-gram block leaves them free), and ``digit_table``, its
    :class:`~nmtkit.translate.sourcenumbers.DigitTable` (``--source-numbers``) -- and the candidate table
    (``--candidates``; None: the whole vocabulary).  Sent once to each decoding worker (:mod:`nmtkit.translate.pool`);
    ``nmt-serve``'s requests change only ``decode`` and ``need_attention`` (:meth:`configured`)."""

    decode: DecodeConfig
    need_attention: bool = False
    bf16: bool = False
    numbers: np.ndarray | None = None
    digit_table: DigitTable | None = None
    candidates: CandidateTable | None = None
    word_bounds: WordBounds | None = None  # the target's word boundaries, for glossary terms (SourceBatch.terms)

    def __post_init__(self):
        if not isinstance(self.decode, DecodeConfig):
            raise TypeError(f"decode must be a DecodeConfig (got {type(self.decode).__name__})")

    def configured(self, decode: DecodeConfig, need_attention: bool) -> DecodeSetup:
        """The same set-up with other decoding settings."""
        return dataclasses.replace(self, decode=decode, need_attention=need_attention)


@dataclass(frozen=True)
class SourceBatch:
    """One batch of sentences to decode: their source ids (without ``</s>``), and per sentence what the settings
    need besides -- a forced target prefix (ids, or None), the key of its random draws (``--sampling``: the samples of
    sentence k are drawn with ``(decode.seed, *keys[k])``), its source numbers
    (:func:`~nmtkit.translate.sourcenumbers.source_numbers`, ``--source-numbers``) and whether it is a whole line
    (a piece of a line cut at ``--max-source-len`` need not write the line's numbers), and the glossary terms it
    must write (``--terms``: each a tuple of variants, each a tuple of target ids)."""

    ids: list[np.ndarray]
    prefixes: list[np.ndarray | None] | None = None
    keys: list[tuple] | None = None
    numbers: list[list[str]] | None = None
    whole: list[bool] | None = None
    terms: list[list[tuple[tuple[int, ...], ...]]] | None = None

    def __post_init__(self):
        for name in ("prefixes", "keys", "numbers", "whole", "terms"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.ids):
                raise ValueError(f"a batch of {len(self.ids)} sentences with {len(given)} {name}")


def decode_batch(models: list, batch: SourceBatch, device, setup: DecodeSetup,
                 stop: Callable[[], bool] | None = None) -> list[list[Hypothesis]]:
    """Beam search (:func:`nmtkit.translate.search.beam_search`) over a batch as ``setup.decode`` says, or with
    ``decode.sampling`` ``decode.nbest`` samples per sentence: each sentence's hypotheses, with attention (if
    ``setup.need_attention``) as float32 numpy arrays (len(tokens) + 1, Tx).  With ``setup.candidates`` the batch
    is decoded over its candidate list (:mod:`nmtkit.translate.candidates`).  Once ``stop()`` says True the search
    raises :class:`~nmtkit.translate.stopping.Cancelled` before its next step."""
    with stoppable(stop):
        return _decode_batch(models, batch, device, setup)


def _decode_batch(models: list, batch: SourceBatch, device, setup: DecodeSetup) -> list[list[Hypothesis]]:
    decode, sources, prefixes = setup.decode, batch.ids, batch.prefixes
    numbers, digit_table = setup.numbers, setup.digit_table
    device = torch.device(device)
    searched, vocab, terms = models, None, None
    if batch.terms is not None and any(batch.terms):
        if setup.word_bounds is None or decode.sampling is not None:
            raise ValueError("glossary terms need beam search and the target's word bounds (DecodeSetup.word_bounds)")
        terms = SourceTerms(setup.word_bounds, batch.terms)
    if setup.candidates is not None:
        vocab, searched, prefixes, numbers, digit_table, terms = restricted(
            setup.candidates, models, sources, device, prefixes, numbers, digit_table, decode.source_numbers, terms)
    numbers_from = None
    if decode.source_numbers:
        if digit_table is None or batch.numbers is None:
            raise ValueError("source_numbers needs the target's digit table and each sentence's source numbers")
        numbers_from = SourceNumbers(digit_table, batch.numbers, batch.whole)
    src, lens = collate_source(sources)
    prefix, prefix_lens = collate_prefixes(prefixes) if prefixes is not None else (None, None)
    need_attention = setup.need_attention
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=setup.bf16):
        if decode.sampling is not None:
            keys = batch.keys if batch.keys is not None else [(k,) for k in range(len(sources))]
            hyps = sample(searched, src.to(device), lens.to(device), [(decode.seed, *k) for k in keys], decode,
                          need_attention=need_attention, prefix=prefix, prefix_lens=prefix_lens, numbers=numbers,
                          numbers_from=numbers_from)
        else:
            hyps = beam_search(searched, src.to(device), lens.to(device), decode, need_attention=need_attention,
                               prefix=prefix, prefix_lens=prefix_lens, numbers=numbers, numbers_from=numbers_from,
                               terms=terms)
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
