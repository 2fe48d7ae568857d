"""Translating text with checkpoints (the library behind ``nmt-translate``).

:class:`Translator` loads one or more checkpoints (an ensemble when several: their vocabularies and preprocessing
must match) and turns raw lines into translations, **one result per input line, in input order**:

- each line gets the preprocessing recorded in the checkpoint (normalisation, Moses tokenisation, lowercasing,
  BPE) — or, with ``tokenized=True``, is taken as already tokenised words;
- empty lines give empty translations without decoding; a line of more than ``max_source_len`` model tokens is
  cut at word boundaries into pieces that are translated separately and joined (a warning says so);
- lines are read in windows of ``window`` lines, sorted by length into batches of ``batch_size`` within the window,
  decoded with batched beam search (:mod:`nmtkit.translate.search`), and the results given back in input order, window
  by window, so memory does not grow with the input;
- the output undoes the preprocessing (subword merge, Moses detokenisation) unless ``tokenized`` (each line's
  translation is written from its pieces' hypotheses by :mod:`nmtkit.translate.assembly`);
- with ``prefixes`` (one target line per input line, preprocessed as the target side is), each translation starts
  with its line's prefix: the search is forced through it (:mod:`nmtkit.translate.search`) and the prefix's own
  text is written back as given (its words out of the vocabulary, its spacing and case too); an empty source line
  with a prefix gives the prefix itself;
- how the search runs (beam, n-best, length penalty and limits, coverage penalty, repeated-n-gram block, ``<unk>``
  handling) is one :class:`nmtkit.translate.config.DecodeConfig`; with its ``sampling``, translations are drawn from
  the model (:mod:`nmtkit.translate.sampling`) instead of searched for, ``nbest`` samples per line, reproducibly from
  its ``seed``, the line number and the piece.

With ``workers=0`` on a CPU the decoding processes start only once the input fills a first window: a few lines
(one sentence in a shell pipeline) are decoded in this process at once, without paying for starting processes
that each load torch and the model.  Automatic workers that cannot start, or that die mid-stream, cost nothing
but a warning: this process, which kept its models, decodes the windows they did not give back and the rest.

Alignments (Pharaoh ``i-j``, source-target, 0-based) are on Moses-tokenised words, computed as ``nmt-align``
computes them (:func:`nmtkit.translate.wordalign.word_matrix`, :func:`nmtkit.translate.wordalign.hard_links`): a target
word's attention is the mean over its subwords' rows, a source word's the sum over its subwords' columns, argmax per
target word; with ``DecodeConfig.alignment_method`` ``posterior``, of the alignment posterior
(:func:`nmtkit.translate.decoding.add_posteriors`) instead of the attention (``attention`` stays the attention).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator

import torch

# (also the library's names here)
from nmtkit.translate import glossary, linetext
from nmtkit.translate.assembly import Assembler, Piece, Window
from nmtkit.translate.decoding import (DecodeSetup, SourceBatch, build_models, decode_batch,  # noqa: F401
                                       load_checkpoints)
from nmtkit.errors import InputError, WorkerError
from nmtkit.translate.config import DecodeConfig, TranslatorConfig
from nmtkit.translate.search import Hypothesis
from nmtkit.translate.ngramblock import number_tokens
from nmtkit.translate.sourcenumbers import DigitTable, source_numbers
from nmtkit.translate.terms import WordBounds
from nmtkit.translate.stopping import Cancelled, Stop
from nmtkit.data.candidates import load as load_candidates
from nmtkit.streaming import windows
from nmtkit.threads import ThreadGovernor
from nmtkit.data.text import Preprocessor, TextConfig
from nmtkit.data.vocab import SPECIALS, UNK, Vocabulary
from nmtkit.translate.outputs import Translation

log = logging.getLogger("nmtkit.translate")
MAX_AUTO_WORKERS = 4  # workers=0 starts min(threads, this) processes on a CPU
AHEAD = 1  # windows queued behind the one being decoded, with worker processes


def checkpoint_info(path: str, payload: dict) -> dict:
    """What a loaded checkpoint is, in plain types: architecture, languages, model config, vocabulary sizes, the
    preprocessing's settings (its scalar ones: BPE codes are left out, and a SentencePiece model is named by the
    SHA-256 of its bytes, ``spm_model_sha256``, not carried: nmt-serve's ``/models`` says what is loaded, not its
    bytes), the updates it was trained for (None when it holds no training state) and its saved decoding defaults
    (None: none; nmtkit/translate/defaults.py)."""
    state = (payload.get("train") or {}).get("state") or {}
    return {"path": str(path), "arch": payload["arch"], "source_lang": payload.get("source_lang"),
            "target_lang": payload.get("target_lang"), "config": dict(payload["config"]),
            "vocab_sizes": {side: len(payload["vocab"][side]) for side in ("src", "tgt")},
            "preprocessing": {side: _settings_of(dict(cfg)) for side, cfg in payload["preprocessing"].items()},
            "updates": state.get("update"), "decoding_defaults": payload.get("decoding_defaults")}


def _settings_of(cfg: dict) -> dict:
    """A side's preprocessing settings in plain types, its SentencePiece model by digest."""
    import base64
    import hashlib

    scalar = (str, int, float, bool, type(None))
    out = {k: v for k, v in cfg.items() if isinstance(v, scalar) and k != "spm_model"}
    if isinstance(cfg.get("spm_model"), str):  # (a loaded checkpoint's model was decoded once already)
        out["spm_model_sha256"] = hashlib.sha256(base64.b64decode(cfg["spm_model"])).hexdigest()
    return out


class Translator:
    """Checkpoint(s) + decoding settings → :meth:`translate` over lines."""

    def __init__(self, checkpoints: list[str], decode: DecodeConfig | None = None,
                 config: TranslatorConfig | None = None, unk_dict: dict[str, str] | None = None,
                 need_attention: bool = False, restart_workers: bool = False, **settings):
        """``decode``: how to search or sample (:class:`nmtkit.translate.config.DecodeConfig`; None: its defaults);
        ``config``: how lines are read, batched and run (:class:`~nmtkit.translate.config.TranslatorConfig`, or its
        fields as keywords: ``Translator(paths, workers=2)``; ``candidates``: a candidate table's file, to decode
        each batch over its candidate list, :mod:`nmtkit.translate.candidates`); ``need_attention``: give every
        translation its attention and alignment; ``restart_workers``: a worker process that dies fails only the
        batches it held, and a new one starts in its place (a server's; :class:`nmtkit.translate.pool.DecodePool`)."""
        if not checkpoints:
            raise InputError("no checkpoint given (-m CHECKPOINT)")
        decode = DecodeConfig() if decode is None else decode
        if not isinstance(decode, DecodeConfig):
            raise TypeError(f"decode must be a DecodeConfig (got {type(decode).__name__})")
        if settings.get("window") is None:
            settings.pop("window", None)  # (None as 0: 10 x the batch size)
        config = TranslatorConfig(**settings) if config is None else dataclasses.replace(config, **settings)
        self.config = config
        from nmtkit.device import resolve_device, warn_if_slow_bf16

        self.device = resolve_device(str(config.device))
        if config.bf16:
            warn_if_slow_bf16(self.device, log)
        payloads = load_checkpoints(checkpoints)
        first = payloads[0]
        self.checkpoint_info = [checkpoint_info(path, p) for path, p in zip(checkpoints, payloads)]
        self.models = build_models(checkpoints, config.device, payloads, config.backend)
        self.backend = config.backend
        self.src_vocab = Vocabulary(first["vocab"]["src"])
        self.tgt_vocab = Vocabulary(first["vocab"]["tgt"])
        self.src_pre = Preprocessor(TextConfig.from_dict(first["preprocessing"]["src"]))
        self.tgt_pre = Preprocessor(TextConfig.from_dict(first["preprocessing"]["tgt"]))
        self.decode = decode
        # a source's "2 p.m." is "14" in a target language that writes the 24-hour clock (any but English)
        self._clock24 = (first.get("target_lang") or "en").lower() != "en"
        self.batch_size, self.window = config.batch_size, config.window or 10 * config.batch_size
        self.tokenized, self.max_source_len = config.tokenized, config.max_source_len
        self.unk_dict = unk_dict or {}
        self.need_attention = need_attention or decode.replace_unk
        self.has_attention = all(m.attentive for m in self.models)
        self._arch = self.models[0].arch  # (for messages, also once the workers hold the models)
        if (self.need_attention or decode.attends) and not self.has_attention:
            raise InputError("alignments, attention, --coverage-penalty and --replace-unk need an attention model "
                             f"(rnnsearch); this checkpoint is {self.models[0].arch}", checkpoints[0])
        # what every batch is decoded with, also sent to the worker processes
        # (numbers: the target tokens with a digit, which the n-gram block leaves free)
        # --terms: the glossary the translations obey (nmtkit/translate/glossary.py), a server's requests' added
        self._terms_ignore_case = config.terms_ignore_case
        self._glossary_entries = [] if config.terms is None else glossary.read(config.terms)
        self.glossary = self._compile_glossary(self._glossary_entries, config.terms) if config.terms else None
        _check_glossary_search(self.glossary, decode)
        self.setup = DecodeSetup(decode, self.need_attention, config.bf16,
                                 number_tokens(self.tgt_vocab.tokens).numpy(), DigitTable(self.tgt_vocab.tokens),
                                 None if config.candidates is None else
                                 load_candidates(config.candidates, self.src_vocab.tokens, self.tgt_vocab.tokens),
                                 WordBounds(self.tgt_vocab.tokens))  # (a server's request may bring terms)
        # --threads 0 on a CPU: the count this process decodes with, measured as it goes (nmtkit.threads)
        self._governor = None
        threads, workers = config.threads, config.workers
        if not threads and self.device.type == "cpu" and torch.get_num_threads() > 1:
            self._governor = ThreadGovernor(torch.get_num_threads(), window=1, warmup=1, settle=0, trials=False,
                                            events=lambda kind, line: log.info("decoding: %s", line))
        threads = threads or torch.get_num_threads()
        self._lazy_pool = workers == 0  # automatic: start processes only for an input that fills a window
        if workers == 0:  # processes rather than threads on a CPU (see nmtkit.translate.pool)
            workers = min(threads, MAX_AUTO_WORKERS) if self.device.type == "cpu" else 1
        self.workers, self._threads, self._checkpoints = workers, threads, list(checkpoints)
        self._restart_workers = restart_workers
        self._pool = None
        self._configured = False  # (configured(): each batch brings its decoding settings to shared workers)
        if workers > 1 and not self._lazy_pool:
            self._start_pool()

    def _compile_glossary(self, entries: list, name: str) -> glossary.CompiledGlossary:
        return glossary.CompiledGlossary(entries, self.source_words,
                                         lambda text: self.tgt_pre.subwords(self.target_words(text)),
                                         self.tgt_vocab.index, UNK, self._terms_ignore_case, name)

    def configured(self, decode: DecodeConfig, need_attention: bool = False, terms: list | None = None) -> Translator:
        """The same loaded models with other decoding settings: how a server answers each request with its own
        options without loading the checkpoints again (``nmtkit.serve``).  Decoded in this process, or, where this
        translator started its worker processes (``workers`` > 1, not automatic), by the same workers, each batch
        bringing its settings; several configured translators may then translate at once, one per thread.
        ``terms``: glossary entries (:class:`nmtkit.translate.glossary.Entry`) added to this translator's."""
        if not isinstance(decode, DecodeConfig):
            raise TypeError(f"decode must be a DecodeConfig (got {type(decode).__name__})")
        if self._lazy_pool or (self._pool is None and not self.models):
            raise ValueError("configured() needs a translator that decodes in this process (workers=1) or in "
                             "workers started with it (workers > 1)")
        other = copy.copy(self)
        other.decode = decode
        other.need_attention = need_attention or decode.replace_unk
        if (other.need_attention or decode.attends) and not self.has_attention:
            raise InputError("alignments, attention, --coverage-penalty and --replace-unk need an attention model "
                             f"(rnnsearch); this checkpoint is {self._arch}", self._checkpoints[0])
        if terms:
            other.glossary = self._compile_glossary(self._glossary_entries + list(terms), '"terms"')
        _check_glossary_search(other.glossary, decode)
        other.setup = self.setup.configured(decode, other.need_attention)
        other._configured = True
        return other

    def _start_pool(self) -> None:
        from nmtkit.translate.pool import DecodePool

        self._pool = DecodePool(self._checkpoints, self.workers, max(1, self._threads // self.workers), self.device,
                                self.setup, self.backend, restart=self._restart_workers)
        if not self._lazy_pool:
            self.models = []  # the workers hold the models; the parent only checked that they build
        # (automatic workers: the parent keeps its models, to go on alone if the workers fail: _fall_back)

    def _start_lazy_pool(self) -> None:
        """Start the automatic workers for a large input; if they cannot start, go on decoding in this process."""
        try:
            self._start_pool()
        except (OSError, WorkerError, InputError) as e:
            self._fall_back(e)

    def _fall_back(self, error: Exception) -> None:
        """Automatic workers that failed (to start, or later): stop them and decode in this process from here on."""
        log.warning("the decoding worker processes failed (%s); translating on in this process", error)
        self.close(kill=True)
        self._lazy_pool = False  # (no second try)
        self.workers = 1

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the decoding workers (none when decoding in this process)."""
        return self._pool.pids if self._pool is not None else []

    @property
    def workers_ready(self) -> bool:
        """Whether every decoding worker is there (false while one that died is being replaced; true without)."""
        return self._pool is None or self._pool.complete

    def close(self, kill: bool = False) -> None:
        """Stop the decoding workers, if any (also done by ``with Translator(...) as t:``; killed on an error)."""
        if self._pool is not None:
            self._pool.close(kill=kill)
            self._pool = None

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close(kill=exc[0] is not None)

    # -- preprocessing -----------------------------------------------------------------------------------------

    def source_words(self, line: str) -> list[str]:
        return linetext.words(self.src_pre, line, self.tokenized)

    # -- translation -------------------------------------------------------------------------------------------

    def translate(self, lines: Iterable[tuple[int, str]], prefixes: Iterable[str] | None = None,
                  prefix_name: str = "prefixes", stop: Stop | None = None) -> Iterator[Translation]:
        """(line number, text) pairs → one :class:`Translation` per line, in order, window by window; ``prefixes``
        (from the file ``prefix_name``, for messages) gives each line its target prefix, one line per input line.
        Once ``stop`` is set, the decoding stops and :class:`~nmtkit.translate.stopping.Cancelled` is raised.

        Windows are full while lines flow; when the input stalls, the lines read so far form a window and are
        translated before more is read (nmtkit/streaming.py), so a pipeline that waits for each translation gets it.
        With worker processes, a window's batches are submitted as soon as it is read and the next window is read
        while they decode; at most ``AHEAD`` windows are in flight, so memory stays bounded."""
        pending: deque[Window] = deque()
        prefix_lines = iter(prefixes) if prefixes is not None else None
        last = 0
        for window, stalled in windows(lines, self.window):
            last = window[-1][0]
            w = self._prepare(window, *self._read_prefixes(prefix_lines, window, prefix_name))
            if self._pool is None and self._lazy_pool and self.workers > 1 and len(window) == self.window \
                    and not stalled:
                self._start_lazy_pool()  # the input is large: worth the processes' start-up
            if self._pool is None:
                yield from self._assemble(w, [self._decode(b, stop) for b in w.batches])
                continue
            pending.append(w)
            # an input that stalled waits for its translations: finish what is in flight before reading on
            yield from self._from_pool(pending, w, lambda: stalled or len(pending) > AHEAD
                                       or all(self._pool.ready(t) for t in pending[0].tickets), stop)
        yield from self._from_pool(pending, None, lambda: True, stop)
        if prefix_lines is not None and next(prefix_lines, None) is not None:
            raise InputError(f"has more lines than the input ({last})", prefix_name, last + 1)

    def _read_prefixes(self, prefix_lines, window: list[tuple[int, str]], name: str
                       ) -> tuple[list[list[str]], list[str]]:
        """The window's target prefixes as model tokens, and as given (none: every line's empty)."""
        if prefix_lines is None:
            return [[] for _ in window], ["" for _ in window]
        tokens, given = [], []
        for lineno, _ in window:
            text = next(prefix_lines, None)
            if text is None:
                raise InputError(f"has fewer lines than the input (no prefix for input line {lineno})", name, lineno)
            words = self.target_words(text)
            tokens.append(self.tgt_pre.subwords(words) if words else [])
            given.append(text)
        return tokens, given

    def target_words(self, line: str) -> list[str]:
        """A target-side line (a prefix) as the target side's words."""
        return linetext.words(self.tgt_pre, line, self.tokenized)

    def _batch(self, batch: list[Piece]) -> SourceBatch:
        """A batch's sentences as the search takes them: ids, and what the settings need beside them."""
        decode = self.decode
        return SourceBatch([p.ids for p in batch],
                           [p.prefix for p in batch] if any(p.prefix is not None for p in batch) else None,
                           [p.key for p in batch] if decode.sampling is not None else None,
                           [p.numbers for p in batch] if decode.source_numbers else None,
                           [p.whole for p in batch] if decode.source_numbers else None,
                           None if self.glossary is None else
                           [[self.glossary.terms[i].variants for i in p.terms] for p in batch])

    def translate_lines(self, texts: Iterable[str]) -> list[str]:
        """Convenience: a list of raw lines → a list of translations."""
        return [t.text for t in self.translate(enumerate(texts, start=1))]

    def _from_pool(self, pending: deque[Window], new: Window | None, more, stop: Stop | None = None
                   ) -> Iterator[Translation]:
        """Submit the batches of window ``new`` (if any) to the workers, then give back the windows in flight, in
        order, while ``more()`` says so.  Automatic workers that fail leave what is in flight to this process;
        ``stop``, once set, cancels the batches submitted."""
        try:
            if new is not None:
                settings = (self.decode, self.need_attention) if self._configured else None
                new.tickets = [self._pool.submit(self._batch(b), settings) for b in new.batches]
                if stop is not None:
                    stop.on_set(lambda pool=self._pool, tickets=new.tickets: pool.cancel(tickets))
            while pending and more():
                results = [self._pool.result(t) for t in pending[0].tickets]
                yield from self._assemble(pending.popleft(), results)
        except Cancelled:
            self._pool.discard([t for w in pending for t in w.tickets])
            raise
        except WorkerError as e:
            if not self._lazy_pool:
                if self._pool is not None:  # (the other batches of these windows: their results are not wanted)
                    self._pool.discard([t for w in pending for t in w.tickets])
                raise
            self._fall_back(e)
            yield from self._in_process(pending)

    def _in_process(self, pending: deque[Window]) -> Iterator[Translation]:
        """The windows whose results the failed workers did not give back, decoded here, in order."""
        while pending:
            w = pending.popleft()
            yield from self._assemble(w, [self._decode(b) for b in w.batches])

    def _decode(self, batch: list[Piece], stop: Stop | None = None) -> list[list[Hypothesis]]:
        t0 = time.perf_counter()
        hyps = decode_batch(self.models, self._batch(batch), self.device, self.setup, stop)
        if self._governor is not None:  # (the work: source tokens, which a batch's cost follows)
            self._governor.step(sum(len(p.ids) for p in batch), time.perf_counter() - t0)
        return hyps

    def _prepare(self, window: list[tuple[int, str]], prefixes: list[list[str]], given: list[str]) -> Window:
        """Words, model-token pieces and length-sorted batches of a window of lines."""
        words = [self.source_words(text) for _, text in window]
        pieces: list[Piece] = []
        for k, (lineno, _) in enumerate(window):
            tokens = self.src_pre.subwords(words[k])
            parts = linetext.pieces(self.src_pre, tokens, self.max_source_len) if tokens else []
            if len(parts) > 1:
                log.warning("line %d: %d source tokens, more than --max-source-len %d: translated in %d pieces",
                            lineno, len(tokens), self.max_source_len, len(parts))
            numbers = source_numbers(window[k][1], self._clock24) if self.decode.source_numbers else []
            for n, p in enumerate(parts):
                piece = Piece(k, n, self.src_vocab.encode(p), p, key=(lineno, n), numbers=numbers,
                              whole=len(parts) == 1)
                if self.glossary is not None:  # (the terms of each piece's own words)
                    piece.terms = self.glossary.find(words[k] if len(parts) == 1 else self.src_pre.words_of(p)[0])
                if n == 0 and prefixes[k]:
                    ids = self.tgt_vocab.encode(prefixes[k])
                    ids[ids < len(SPECIALS)] = UNK  # a "</s>" or "<s>" written in a prefix is a word: <unk>
                    piece.prefix, piece.prefix_tokens = ids, prefixes[k]
                pieces.append(piece)
        order = sorted(range(len(pieces)), key=lambda i: len(pieces[i].ids))
        batches = [[pieces[i] for i in order[start: start + self.batch_size]]
                   for start in range(0, len(order), self.batch_size)]
        return Window(window, words, prefixes, given, batches)

    def _assemble(self, w: Window, hyps: list[list[list[Hypothesis]]]) -> list[Translation]:
        """The window's translations in input order, from each batch's hypotheses (nmtkit/translate/assembly.py),
        with this translator's settings as they are now."""
        return Assembler(self.src_pre, self.tgt_pre, self.tgt_vocab, self.decode, self.need_attention, self.glossary,
                         self.unk_dict, self.tokenized).assemble(w, hyps)


def _check_glossary_search(compiled, decode: DecodeConfig) -> None:
    """A glossary needs a beam to share among hypotheses by the terms they have written."""
    if compiled is not None and (decode.sampling is not None or decode.beam < 2):
        raise InputError("--terms needs beam search with --beam 2 or more (the beam is shared among hypotheses by "
                         "the terms they have written)")
