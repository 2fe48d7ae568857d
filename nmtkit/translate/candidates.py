"""Candidate lists: each batch decoded over the target words its sources can plausibly need, not the whole vocabulary.

The output layer W_o t_i (V × l per hypothesis and step) is most of a decoding step's products, and the softmax and
top-k over V follow it (tests/bench/results/bench_profile.txt).  Jean et al. (2015, "On using very large target
vocabulary for neural machine translation", §3.2; the paper's group) decode with a *candidate list* per sentence: the
K most frequent target words and, for every source word, its K' likeliest translations in a word-alignment
dictionary.  Marian's lexical shortlist and CTranslate2's vocabulary map are the same idea.  Here:

- the table (:mod:`nmtkit.data.candidates`, ``candidates.npz``, written by ``nmt-prepare``) holds the most frequent
  target ids and each source id's likeliest translations under IBM Model 1; a batch's list
  (:meth:`~nmtkit.data.candidates.CandidateTable.batch_vocab`) is the specials (ids 0-3, so ``<pad>``, ``<unk>``,
  ``<s>`` and ``</s>`` keep their ids as columns), the ``common`` most frequent ids, the ``per_word`` best
  translations of every source id in the batch, and whatever the batch must be able to write besides (its
  prefixes' tokens; with ``--source-numbers`` every token holding a digit and those that group digits; with
  ``--terms`` the tokens of its glossary terms' variants);
- :func:`restricted` turns a batch into the same search over the list: the models compute the logits of its words
  only (``decode_step``'s ``vocab``), and everything the search reads by token id (prefixes, the tokens the n-gram
  block leaves free, the digit table) is renumbered by column; :func:`to_ids` renumbers the hypotheses back.  The
  search itself is unchanged.  The log-probabilities are normalised over the list (as Marian's and CTranslate2's
  are), so scores are slightly higher than over the whole vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from nmtkit.data.candidates import CandidateTable


class Restricted:
    """A model decoding over a candidate list ``vocab`` (V',) long: the search's tokens are columns of the list,
    turned into ids for the model's input, and its logits are the list's (``decode_step``'s ``vocab``)."""

    def __init__(self, model, vocab: torch.Tensor):
        self.model, self.vocab = model, vocab

    def __getattr__(self, name):  # encode, init_decoder, prepare_decoding, reorder_encoder_out, attentive, ...
        return getattr(self.model, name)

    def decode_step(self, y_prev: torch.Tensor, state: torch.Tensor, enc):
        return self.model.decode_step(self.vocab[y_prev], state, enc, vocab=self.vocab)  # (N, V')


def number_ids(digit_table) -> np.ndarray:
    """The target ids a number may be written with (digits, the tokens that group them, SentencePiece's ``▁``)."""
    ids = set(digit_table.digits) | set(digit_table.glue)
    if digit_table.space is not None:
        ids.add(digit_table.space)
    return np.array(sorted(ids), dtype=np.int64)


def restricted(table: CandidateTable, models: list, sources: list[np.ndarray], device, prefixes=None, numbers=None,
               digit_table=None, source_numbers: bool = False, terms=None
               ) -> tuple[np.ndarray, list, list | None, object, object, object]:
    """A batch's candidate list and its search's inputs renumbered by column: (vocab (V',) int64 ids, the models
    as :class:`Restricted`, the prefixes, the n-gram block's free tokens (bool (V',)), the digit table, the glossary
    terms (:class:`~nmtkit.translate.terms.SourceTerms`, whose variants' tokens are always in the list))."""
    must = [p for p in (prefixes or []) if p is not None]
    if terms is not None:
        must.append(np.array(sorted({i for ts in terms.terms for term in ts for v in term for i in v}), dtype=np.int64))
    if source_numbers and digit_table is not None:
        must.append(number_ids(digit_table))
    vocab = table.batch_vocab(sources, np.concatenate(must) if must else None)
    column = lambda ids: np.searchsorted(vocab, np.asarray(ids, dtype=np.int64))  # noqa: E731  (ids in vocab)
    if prefixes is not None:
        prefixes = [None if p is None else column(p) for p in prefixes]
    if numbers is not None:
        numbers = np.asarray(numbers)[vocab]
    if digit_table is not None:
        digit_table = digit_table.subset(vocab)
    if terms is not None:
        terms = terms.over(vocab)
    ids = torch.from_numpy(vocab).to(device)
    return vocab, [Restricted(m, ids) for m in models], prefixes, numbers, digit_table, terms


def to_ids(vocab: np.ndarray, hyps: list) -> list:
    """In place, and returned: every hypothesis' tokens, columns of the list, as target ids."""
    for sentence in hyps:
        for h in sentence:
            h.tokens = vocab[np.asarray(h.tokens, dtype=np.int64)].tolist()
    return hyps
