"""A window's translations from its batches' hypotheses, for :mod:`nmtkit.translate.translator`.

The translator cuts a window of lines into pieces (:class:`Piece`: a line, or a piece of one longer than
``max_source_len``), sorts them by length into batches (:class:`Window`) and decodes the batches; an
:class:`Assembler` puts each line's pieces back in order and writes its :class:`~nmtkit.translate.outputs.Translation`:

- the best and the n-best target tokens of the pieces joined, a prefix's tokens written back as given and, with
  ``--replace-unk``, each ``<unk>`` replaced from the source (:func:`nmtkit.translate.unkreplace.replace_unks`),
  rendered as text (:func:`nmtkit.translate.linetext.render`);
- an empty line's translation without decoding: its prefix as given (counted and shaped as a decoded line's);
- the glossary's report (:func:`nmtkit.translate.glossary.report`);
- with ``need_attention``, the attention of the pieces as one block matrix, and the word alignment and attention on
  Moses-tokenised words (:mod:`nmtkit.translate.wordalign`), the links from the attention or, with
  ``DecodeConfig.alignment_method`` ``posterior``, from the alignment posterior.

It reads nothing of the translator but the settings an :class:`Assembler` is given, those of the translator at the
time (a configured translator's own: ``Translator.configured``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nmtkit.data.text import Preprocessor
from nmtkit.data.vocab import Vocabulary
from nmtkit.translate import glossary, linetext
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.outputs import Translation
from nmtkit.translate.search import Hypothesis
from nmtkit.translate.unkreplace import replace_unks
from nmtkit.translate.wordalign import block_attention, block_matrix, hard_links, word_matrix


@dataclass
class Piece:
    """A source line, or a piece of one too long for ``max_source_len``, as one sentence of a batch."""

    index: int  # position of the line in the window
    order: int  # position of the piece within its line
    ids: np.ndarray  # source ids (no </s>)
    tokens: list[str]  # source model tokens
    key: tuple[int, int] = (0, 0)  # (line number, piece): what a sample's random draws depend on, with the seed
    prefix: np.ndarray | None = None  # target prefix ids the translation must start with (first piece only)
    prefix_tokens: list[str] = field(default_factory=list)  # the prefix's model tokens, written back as given
    numbers: list[str] = field(default_factory=list)  # the line's source numbers (with decode.source_numbers)
    whole: bool = True  # the line is one piece (--all-numbers makes only a whole line write all its numbers)
    terms: list[int] = field(default_factory=list)  # the glossary terms the piece must write (--terms)


@dataclass
class Window:
    """A window of input lines in flight: what the translator read and prepared, and its length-sorted batches."""

    lines: list[tuple[int, str]]  # (line number, text)
    words: list[list[str]]  # each line's source words
    prefixes: list[list[str]]  # each line's target prefix tokens (empty: none)
    given: list[str]  # each line's prefix as the user wrote it (what the translation starts with)
    batches: list[list[Piece]]  # length-sorted
    tickets: list[int] = field(default_factory=list)  # the batches' tickets in the decoding pool


@dataclass(frozen=True)
class Assembler:
    """What writing a window's translations reads of the translator: its preprocessing (both sides), target
    vocabulary and settings (``unk_dict``: ``--replace-unk``'s dictionary; ``glossary``: the compiled ``--terms``,
    or None)."""

    src_pre: Preprocessor
    tgt_pre: Preprocessor
    tgt_vocab: Vocabulary
    decode: DecodeConfig
    need_attention: bool
    glossary: glossary.CompiledGlossary | None
    unk_dict: dict[str, str]
    tokenized: bool

    def assemble(self, w: Window, hyps: list[list[list[Hypothesis]]]) -> list[Translation]:
        """The window's translations in input order, from each batch's hypotheses."""
        results: list[list[tuple[Piece, list[Hypothesis]]]] = [[] for _ in w.lines]
        for batch, batch_hyps in zip(w.batches, hyps):
            for p, h in zip(batch, batch_hyps):
                results[p.index].append((p, h))
        for r in results:  # pieces of a line were sorted by length: restore their order
            r.sort(key=lambda ph: ph[0].order)
        return [self._finish(lineno, w.words[k], results[k], w.prefixes[k], w.given[k])
                for k, (lineno, _) in enumerate(w.lines)]

    def _finish(self, lineno: int, src_words: list[str], parts: list[tuple[Piece, list[Hypothesis]]],
                prefix: list[str], given: str) -> Translation:
        if not parts:  # an empty line: nothing to translate, the prefix (if any) as it was given
            # (counted and shaped as a decoded line's: its tokens and </s>, all attention on the source's </s>)
            text = self._render(prefix, given, len(prefix))
            prefix_words = self.tgt_pre.merge_subwords(prefix)
            return Translation(lineno, text, src_words, prefix_words, 0.0,
                               nbest=[(text, 0.0, 0.0, len(prefix) + 1)],
                               alignment=[] if self.need_attention else None,
                               attention={"source": ["</s>"], "target": list(prefix) + ["</s>"],
                                          "alpha": [[1.0]] * (len(prefix) + 1)}
                               if self.need_attention else None,
                               word_attention={"source": ["</s>"], "target": prefix_words + ["</s>"],
                                               "alpha": [[1.0]] * (len(prefix_words) + 1)}
                               if self.need_attention else None)
        best_tokens: list[str] = []
        src_tokens: list[str] = []
        alphas, posteriors = [], []
        by_posterior = self.need_attention and self.decode.alignment_method == "posterior"
        for piece, hyps in parts:
            h = hyps[0]
            toks = self._target_tokens(h, piece)
            best_tokens += toks
            src_tokens += piece.tokens
            if self.need_attention:
                alphas.append((piece.tokens, toks, h.attention))
            if by_posterior:
                posteriors.append((piece.tokens, toks, h.posterior))
        target_words = self.tgt_pre.merge_subwords(best_tokens)
        score = sum(hyps[0].score for _, hyps in parts)
        nbest = []
        for k in range(self.decode.nbest):
            toks, logprob, norm, length = [], 0.0, 0.0, 0
            for piece, hyps in parts:
                h = hyps[min(k, len(hyps) - 1)]
                toks += self._target_tokens(h, piece)
                logprob += h.score
                norm += h.norm_score
                length += len(h.tokens) + 1
            if k < max(len(hyps) for _, hyps in parts):
                nbest.append((self._render(toks, given, len(prefix)), logprob, norm, length))
        t = Translation(lineno, self._render(best_tokens, given, len(prefix)), src_words, target_words, score, nbest,
                        pieces=len(parts))
        if self.glossary is not None:
            t.terms, t.missed, t.nbest_missed = glossary.report(self.glossary, parts, len(nbest))
        if self.need_attention:
            t.attention = block_attention(alphas)
            words = word_matrix(src_tokens, best_tokens, np.asarray(t.attention["alpha"]), self.src_pre.words_of,
                                self.tgt_pre.words_of)
            if by_posterior:  # the links from the posterior (as nmt-align reads them), the attention as it is
                t.alignment = hard_links(word_matrix(src_tokens, best_tokens, block_matrix(posteriors),
                                                     self.src_pre.words_of, self.tgt_pre.words_of))
            else:
                t.alignment = hard_links(words)
            t.word_attention = {"source": self.src_pre.words_of(src_tokens)[0] + ["</s>"],
                                "target": self.tgt_pre.words_of(best_tokens)[0] + ["</s>"], "alpha": words.tolist()}
        return t

    def _target_tokens(self, h: Hypothesis, piece: Piece) -> list[str]:
        toks = self.tgt_vocab.decode(h.tokens)
        forced = len(piece.prefix_tokens)
        toks[:forced] = piece.prefix_tokens  # the prefix's words as given, out-of-vocabulary too
        if self.decode.replace_unk and h.attention is not None:
            toks = replace_unks(toks, h.tokens, h.attention, piece.tokens, self.src_pre.words_of, self.unk_dict,
                                start=forced)
        return toks

    def _render(self, tokens: list[str], given: str = "", forced: int = 0) -> str:
        return linetext.render(self.tgt_pre, tokens, self.tokenized, given, forced)
