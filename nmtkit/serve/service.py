"""What ``nmt-serve`` does with a request, without HTTP: a request's JSON read into its lines and settings
(:func:`read_request`), and the translation of several requests' lines at once (:class:`TranslationService`).

A request is ``{"src": ["line", ...], "prefix": ["...", ...], "alignment": bool, "attention": bool, ...}`` where
``...`` are the fields of :class:`nmtkit.translate.config.DecodeConfig`, by their names (``beam``, ``nbest``,
``lenpen``, ``no_repeat_ngram``, ``sampling``, ...): the object ``nmt-translate``'s options make, read from JSON
with the same checks.  Each line's result is what ``nmt-translate`` writes for it, in plain types: its text, its
log-probability, with ``nbest`` > 1 the n-best list, and when asked its Pharaoh alignment and its attention matrix
over words (the source's tokenised words, the target's words before detokenisation, ``</s>`` last on both axes:
subword columns summed, rows averaged, as ``nmt-align`` and the alignment use it).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from nmtkit.errors import InputError

REQUEST_KEYS = ("src", "prefix", "alignment", "attention", "terms")


@dataclass
class Request:
    """One request's lines and how to translate them."""

    lines: list[str]
    decode: Any  # nmtkit.translate.config.DecodeConfig
    prefixes: list[str] | None = None  # one per line ("" = none), or None
    alignment: bool = False
    attention: bool = False
    first: int = 1  # the number of its first line (a part of a longer request: its lines are numbered on)
    terms: tuple = ()  # glossary entries (nmtkit.translate.glossary.Entry) its translations obey, with the server's
    chars: int = field(init=False)  # (its lines', prefixes' and terms': what --max-chars bounds)

    def __post_init__(self):
        self.chars = sum(len(x) for x in self.lines) + sum(len(x) for x in self.prefixes or []) + \
            sum(len(e.source) + sum(len(x) for x in e.targets) for e in self.terms)

    def part(self, start: int, stop: int) -> Request:
        """Its lines ``start`` to ``stop`` (0-based, ``stop`` excluded) as a request of their own, numbered as
        they are here (a long request is decoded a few lines a batch: nmtkit/serve/batcher.py)."""
        return Request(self.lines[start:stop], self.decode,
                       self.prefixes[start:stop] if self.prefixes is not None else None, self.alignment,
                       self.attention, self.first + start, self.terms)

    @property
    def key(self) -> tuple:
        """What the lines of requests decoded together must share."""
        return self.decode, self.alignment or self.attention, self.terms


def read_request(body: Any, defaults: dict | None = None) -> Request:
    """A request's parsed JSON → :class:`Request`; anything else is one :class:`InputError` naming the field.
    ``defaults``: the checkpoint's saved decoding defaults, under the request's own settings
    (nmtkit/translate/defaults.py)."""
    from nmtkit.translate.config import DecodeConfig
    from nmtkit.translate.defaults import PATH_SETTINGS, resolve

    if not isinstance(body, dict):
        raise InputError(f"the request must be a JSON object with \"src\" (got {type(body).__name__})")
    if "src" not in body:
        raise InputError("the request has no \"src\" (a list of lines to translate)")
    lines = _strings(body["src"], "src")
    prefixes = None
    if body.get("prefix") is not None:
        prefixes = _strings(body["prefix"], "prefix")
        if len(prefixes) != len(lines):
            raise InputError(f"\"prefix\" must have one entry per line of \"src\" (got {len(prefixes)} for "
                             f"{len(lines)} lines)")
    flags = {}
    for name in ("alignment", "attention"):
        value = body.get(name, False)
        if not isinstance(value, bool):
            raise InputError(f"\"{name}\" must be true or false (got {value!r})")
        flags[name] = value
    settings = {k: v for k, v in body.items() if k not in REQUEST_KEYS}
    if defaults and not any(k in PATH_SETTINGS for k in settings):  # (a request names no file: from_dict says so)
        decode = resolve(defaults, settings).decode
    else:
        decode = DecodeConfig.from_dict(settings)
    if decode.alignment_method != "attention" and not flags["alignment"]:  # (as nmt-translate refuses it)
        raise InputError(f"\"alignment_method\": \"{decode.alignment_method}\" says how the alignment is made: "
                         "ask for it with \"alignment\": true")
    terms = _terms(body["terms"]) if body.get("terms") is not None else ()
    return Request(lines, decode, prefixes, **flags, terms=terms)


def _terms(value: Any) -> tuple:
    """A request's ``"terms"``, ``[["source term", "target term", more variants...], ...]``, as glossary entries
    (nmtkit/translate/glossary.py)."""
    from nmtkit.translate.glossary import bad_text, parse

    shape = "\"terms\" must be a list of [source term, target term, ...] lists of strings"
    if not isinstance(value, list):
        raise InputError(shape)
    for k, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) < 2 or not all(isinstance(x, str) for x in entry):
            raise InputError(f"{shape} (\"terms\"[{k}] is not)")
        for x in entry:
            bad = bad_text(x)  # (control characters, a line break among them; lone surrogates)
            problem = "is empty" if not x.strip() else "holds a tab or a line break" if any(c in x for c in "\t\n\r") \
                else None if bad is None else f"holds {bad}"
            if problem:
                raise InputError(f"\"terms\"[{k}]: {x!r} {problem}")
    return tuple(parse("".join("\t".join(e) + "\n" for e in value), "\"terms\""))


def _strings(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InputError(f"\"{name}\" must be a list of strings")
    for k, x in enumerate(value):
        if "\n" in x or "\r" in x:
            raise InputError(f"\"{name}\"[{k}] holds a line break: one line per entry")
        try:  # (JSON's "\ud800" escape: a string no file holds, which breaks SentencePiece and the JSON answer)
            x.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"\"{name}\"[{k}] holds a lone surrogate (U+{ord(x[e.start]):04X} at character "
                             f"{e.start}): not text") from None
    return value


class TranslationService:
    """A loaded :class:`nmtkit.translate.translator.Translator` and the translation of request groups with it:
    decoded in this process (one caller at a time), or by the translator's worker processes (as many callers at
    once as there are workers: :attr:`concurrency`; nmtkit/serve/batcher.py keeps to it)."""

    def __init__(self, translator):
        self.translator = translator
        self.concurrency = max(1, len(translator.worker_pids))
        self._configured: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the decoding workers, if any."""
        self.translator.close()

    def describe(self) -> dict:
        """What is loaded, for ``GET /models``."""
        t = self.translator
        return {"models": t.checkpoint_info, "ensemble": len(t.checkpoint_info), "device": str(t.device),
                "attention": t.has_attention, "max_source_len": t.max_source_len}

    def _translator(self, decode, need_attention: bool, terms: tuple = ()):
        key = (decode, need_attention, terms)
        with self._lock:
            if key not in self._configured:
                if len(self._configured) > 64:  # (settings are many only under unusual use: keep memory bounded)
                    self._configured.clear()
                self._configured[key] = self.translator.configured(decode, need_attention, list(terms))
            return self._configured[key]

    def check(self, request: Request) -> None:
        """Whether a request's settings make a translator (its glossary compiled for the model, a beam to share
        among its terms): else one InputError, before it is queued."""
        self._translator(*request.key)

    def translate(self, requests: list[Request], stop=None) -> list[list[dict]]:
        """Requests that share their :attr:`Request.key` → each one's results, one per line, in order.  Each
        request's lines are numbered from 1 as in a file of its own (a part of one, :meth:`Request.part`, on from the
        lines before it), so that sampling draws what ``nmt-translate`` draws for that file.  ``stop``: a
        :class:`~nmtkit.translate.stopping.Stop` that, once set, ends the decoding with ``Cancelled``."""
        if not requests:
            return []
        translator = self._translator(*_key(requests))
        numbered, prefixes = _lines(requests)
        return _split(requests, list(translator.translate(numbered, prefixes, "prefix", stop)))


def _key(requests: list[Request]) -> tuple:
    if any(r.key != requests[0].key for r in requests):
        raise ValueError("requests decoded together must share their settings")
    return requests[0].key


def _lines(requests: list[Request]) -> tuple[list[tuple[int, str]], list[str] | None]:
    """The requests' lines, each request's numbered from its first (1, or on from the part before), and their
    prefixes (None: no request has any)."""
    numbered = [(k, line) for r in requests for k, line in enumerate(r.lines, start=r.first)]
    prefixes = None
    if any(r.prefixes is not None for r in requests):
        prefixes = [p for r in requests for p in (r.prefixes or [""] * len(r.lines))]
    return numbered, prefixes


def _split(requests: list[Request], translations: list) -> list[list[dict]]:
    """The translations of the requests' lines (in order) → each request's results."""
    out, at = [], 0
    for r in requests:
        out.append([_result(t, r) for t in translations[at: at + len(r.lines)]])
        at += len(r.lines)
    return out


def _result(t, request: Request) -> dict:
    """One line's result as JSON: what nmt-translate writes for it."""
    from nmtkit.translate.wordalign import pharaoh

    numbers = [t.score, *(x for _, logprob, norm, _ in t.nbest for x in (logprob, norm))]
    if not all(math.isfinite(x) for x in numbers):  # (JSON has no NaN: the answer could not be written, a 500)
        raise InputError(f"line {t.line}: a score of {next(x for x in numbers if not math.isfinite(x))}: its "
                         f"settings leave no finite probabilities (sampling {request.decode.sampling!r}, lenpen "
                         f"{request.decode.lenpen:g})")
    result: dict[str, Any] = {"tgt": t.text, "score": t.score}
    if request.decode.nbest > 1:
        result["nbest"] = [{"tgt": text, "score": logprob, "ranking_score": norm, "length": length}
                           for text, logprob, norm, length in t.nbest]
    if request.alignment:
        result["alignment"] = pharaoh(t.alignment)
    if t.terms is not None:  # (a glossary: the server's --terms, the request's "terms")
        result["terms"] = {"used": [x for x in t.terms if x not in t.missed], "missed": list(t.missed)}
    if request.attention:  # (over words, as nmt-align shows them; nmt-translate --attention writes model tokens)
        result["attention"] = {"src": t.word_attention["source"], "tgt": t.word_attention["target"],
                               "weights": t.word_attention["alpha"]}
    return result
