"""The settings of a decoding, written once: :class:`DecodeConfig`.

Every decoding option lives here as one field with its default, its help text and its check: ``nmt-translate``'s
options are made from the fields (:func:`nmtkit.cli.decode_options`), and :class:`nmtkit.translate.translator.Translator`,
the decoding workers (:mod:`nmtkit.translate.pool`), :func:`nmtkit.translate.decoding.decode_batch`, beam search and
sampling all take the object.  A Python user builds one by keyword (``DecodeConfig(beam=5, no_repeat_ngram=3)``); an
application sends one as JSON (:meth:`DecodeConfig.from_dict`, :meth:`DecodeConfig.to_dict`: plain types only).  A
bad value or an unknown name is one :class:`nmtkit.errors.InputError` naming it.

Adding a decoding option: a field here (its help and check beside it), and its use in the search
(:mod:`nmtkit.translate.search`, :mod:`nmtkit.translate.sampling`); the command line, the workers and the
documentation of ``nmt-translate --help`` follow.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from nmtkit.errors import InputError
from nmtkit.runtime import BACKEND_NAMES
from nmtkit.settings import model_backend, setting
from nmtkit.translate.retired import refuse

ALIGNMENT_METHODS = ("attention", "posterior")  # how --alignments are read (nmtkit.translate.decoding.add_posteriors)
MAX_COVERAGE_PENALTY = 10.0  # (Wu et al. use 0.2; far above, the penalty alone ranks and its sums overflow)
# The ranges of the search's sizes: far past what any translation asks for, and small enough that the arithmetic of
# a search holds (a length**LENPEN of 400 overflows a float; a length limit of 1e9 tokens asks for gigabytes at once)
MAX_BEAM = 1000  # beam and n-best
MAX_SAMPLES = 10_000  # samples a line (--sampling's --nbest: one row each, no beam's K x V candidates)
MAX_LENPEN = 10.0  # (fairseq and OpenNMT-py use 0.6 to 2)
MAX_LEN_A = 100.0  # output tokens per source token (--max-len-a, --min-length-ratio)
MAX_LEN_B = 10_000  # output tokens


@dataclass(frozen=True)
class DecodeConfig:
    """How translations are searched for (or sampled): one field per option of ``nmt-translate``."""

    beam: int = setting(12, "Beam size; 1 = greedy.", short="-b")
    nbest: int = setting(1, "Write the N best hypotheses (Moses n-best format); with --sampling, N samples a line.")
    lenpen: float = setting(1.0, "Rank finished hypotheses by logprob / length**LENPEN (0 = raw log-probability).")
    max_len_a: float = setting(2.0, "At most A * source words + B output tokens.")
    max_len_b: int = setting(10, "See --max-len-a.")
    coverage_penalty: float = setting(
        0.0, "Rank finished hypotheses with Wu et al. (2016)'s coverage penalty BETA * sum_j log min(sum_i alpha_ij, 1) "
             f"added (attention models; 0 = off, at most {MAX_COVERAGE_PENALTY:g}; OpenNMT-py's beta, e.g. 0.2).",
        metavar="BETA")
    no_repeat_ngram: int = setting(
        0, "No hypothesis may produce a target n-gram of N tokens twice (fairseq's --no-repeat-ngram-size; against "
           "loops; 0 = off; 1 forbids any repeated token). A number's tokens are never blocked (numbers repeat "
           "digits: \"1 000 000\"). A --prefix is kept as given.", metavar="N")
    source_numbers: bool = setting(
        False, "Write digits only as parts of the source's numbers: a number the source does not have, one of its "
               "numbers changed, cut short or run on, or written more often than the source has it, is never written "
               "(grouping and separators are the model's; a '%' also allows the French 'p. 100').")
    all_numbers: bool = setting(
        False, "With --source-numbers: a line whose best translation leaves out a source number is searched again "
               "with the beam shared among hypotheses by the numbers' digits written (Post & Vilar 2018's dynamic "
               "beam allocation), none ending before it has written them all; that translation is taken when it "
               "ends before the length limit ('%' needs no 'p. 100'). Other lines read as without it.")
    constrained_beam: int = setting(
        0, "The beam of the second search of --all-numbers and --terms (0 = --beam): a beam shared out by the "
           "constraints met needs more room than a free one (docs/performance.rst, 'Choosing the beam').",
        metavar="K")
    min_length_ratio: float = setting(
        0.0, "No hypothesis may end before RATIO * source words output tokens (against translations cut short; "
             "0 = off; a forced --prefix counts; never past the length limit).", metavar="RATIO")
    no_unk: bool = setting(False, "Never generate the unknown-word token.")
    replace_unk: bool = setting(
        False, "Replace each generated <unk> by the source word it attends to most (Luong et al. 2015, as fairseq "
               "and OpenNMT-py do), or by that word's --unk-dict entry.")
    alignment_method: str = setting(
        "attention", "How --alignments (and nmt-serve's \"alignment\") link words: 'attention', each target word to "
                     "its most attended source word (as fairseq and Marian print them), or 'posterior', to the source "
                     "word of the largest alignment posterior (nmt-align --method posterior: the attention times how "
                     "well that source word alone predicts the word written; on the Hansards gold links about half the "
                     "attention's error), which costs an output layer per source word and target token of the best "
                     "translation (several times the decoding's time).  The translations are the same.",
        choices=ALIGNMENT_METHODS)
    sampling: str | None = setting(
        None, "Sample instead of searching: topk:K, topp:P, temperature:T or several joined by commas (e.g. "
              "topk:10,temperature:0.8); --nbest N draws N samples per line.", metavar="SPEC")
    seed: int = setting(1, "With --sampling: the seed; the samples of a line depend only on it and the line number.")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), _KINDS[f.name]
            if isinstance(value, bool) and kind is not bool:
                ok = False  # (True is an int to Python, not a beam size)
            else:
                ok = (value is None and f.default is None) or isinstance(value, (int, float) if kind is float else kind)
            if not ok:
                raise InputError(f"{_flag(f.name)} must be {_KIND_NAMES[kind]} (got {value!r})")
            if kind is float:
                object.__setattr__(self, f.name, float(value))  # (2 and 2.0 are one setting)
            if f.metadata["choices"] and value not in f.metadata["choices"]:
                raise InputError(f"{_flag(f.name)} must be {' or '.join(f.metadata['choices'])} (got {value!r})")
        if self.sampling is None and (self.beam < 1 or not 1 <= self.nbest <= self.beam):
            raise InputError(f"need beam >= 1 and 1 <= nbest <= beam (got beam {self.beam}, nbest {self.nbest})")
        if self.constrained_beam and (self.sampling is not None or not self.nbest <= self.constrained_beam):
            raise InputError(f"--constrained-beam is the beam of a second beam search: it has no meaning with "
                             f"--sampling, and holds the n-best (need 0 or nbest <= K <= {MAX_BEAM:,}; got "
                             f"{self.constrained_beam}, nbest {self.nbest})")
        if self.sampling is not None and self.nbest < 1:
            raise InputError(f"--nbest must be at least 1 sample (got {self.nbest})")
        for name in ("beam", "nbest", "constrained_beam"):
            most = MAX_SAMPLES if name == "nbest" and self.sampling is not None else MAX_BEAM
            if getattr(self, name) > most:
                raise InputError(f"{_flag(name)} must be at most {most:,} (got {getattr(self, name)})")
        if not (math.isfinite(self.coverage_penalty) and 0 <= self.coverage_penalty <= MAX_COVERAGE_PENALTY):
            raise InputError(f"--coverage-penalty must be a finite number of at least 0 and at most "
                             f"{MAX_COVERAGE_PENALTY:g} (got {self.coverage_penalty}; Wu et al. use 0.2)")
        if self.sampling is not None and self.coverage_penalty:
            raise InputError("--coverage-penalty ranks beam search's hypotheses; it has no meaning with --sampling")
        if self.all_numbers and (not self.source_numbers or self.sampling is not None):
            raise InputError("--all-numbers steers beam search by the source's numbers: it needs --source-numbers, "
                             "and has no meaning with --sampling")
        if self.no_repeat_ngram < 0:
            raise InputError(f"--no-repeat-ngram must be a whole number of at least 0, 0 = off "
                             f"(got {self.no_repeat_ngram})")
        for name in ("lenpen", "max_len_a", "max_len_b", "min_length_ratio"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"{_flag(name)} must be a finite number of at least 0 (got {value})")
        for name, most in (("lenpen", MAX_LENPEN), ("max_len_a", MAX_LEN_A), ("max_len_b", MAX_LEN_B),
                           ("min_length_ratio", MAX_LEN_A)):
            if getattr(self, name) > most:
                raise InputError(f"{_flag(name)} must be at most {most:,g} (got {getattr(self, name):g})")
        if self.sampling is not None:
            self.how  # (checked now: a bad spec is the caller's error, not a worker's)

    @property
    def how(self):
        """The parsed ``sampling`` (:class:`nmtkit.translate.sampling.Sampling`), or None for beam search."""
        if self.sampling is None:
            return None
        try:
            return parse_sampling(self.sampling)
        except ValueError as e:
            raise InputError(f"--sampling: {e}") from None

    @property
    def attends(self) -> bool:
        """Whether the settings themselves read the attention (the coverage penalty, the replacement of ``<unk>``)."""
        return bool(self.coverage_penalty or self.replace_unk)

    @property
    def second(self) -> DecodeConfig:
        """The settings of the second search of ``--all-numbers`` and ``--terms``: the beam ``constrained_beam``."""
        return self if not self.constrained_beam else self.replace(beam=self.constrained_beam, constrained_beam=0)

    @property
    def widest(self) -> int:
        """The most rows a line's beam search may hold at once: the larger of the two searches' beams."""
        return max(self.beam, self.constrained_beam)

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain types (JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> DecodeConfig:
        """Settings by name (JSON); the others keep their defaults.  An unknown name is an error naming it, a
        retired one (:mod:`nmtkit.translate.retired`) an error saying what replaced it."""
        if not isinstance(settings, dict):
            raise InputError(f"decoding settings must be an object of names and values (got {type(settings).__name__})")
        refuse(settings)  # (a setting measured, lost and removed: what replaced it)
        unknown = sorted(set(settings) - set(_KINDS))
        if unknown:
            raise InputError(f"unknown decoding setting{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(repr(k) for k in unknown)} (known: {', '.join(_KINDS)})")
        return cls(**settings)

    def replace(self, **changes: Any) -> DecodeConfig:
        """A copy with ``changes`` (checked as a new one is)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TranslatorConfig:
    """How a :class:`~nmtkit.translate.translator.Translator` reads, batches and runs lines, whatever it decodes
    them with: ``nmt-translate``'s and ``nmt-serve``'s options alike (``nmt-translate``'s default ``workers`` is 0,
    automatic)."""

    batch_size: int = setting(64, "Sentences decoded together.")
    window: int = setting(0, "Lines read and length-sorted together (0 = 10 x the batch size).")
    max_source_len: int = setting(
        250, "Longer lines are translated in pieces of at most this many tokens (with a warning).")
    device: str = setting("cpu", "Where to decode: cpu, cuda or cuda:N.")
    threads: int = setting(
        0, "Torch threads in all (0 = one per core; fewer in this process while other work makes fewer faster).")
    workers: int = setting(1, "Decoding processes sharing the threads, each decoding a batch of its own (0 = on CPU "
                              "min(threads, 4), else 1).")
    bf16: bool = setting(False, "bfloat16 autocast (fast where the processor has native bf16; a warning where not).")
    tokenized: bool = setting(False, "Lines are tokenised words; translations are too (no detokenisation).")
    candidates: str | None = setting(
        None, "Decode each batch over its candidate list from this table (nmt-prepare's candidates.npz): faster, at "
              "nearly the same output.", metavar="FILE", path=True)
    terms: str | None = setting(
        None, "A glossary (UTF-8 TSV: source term, tab, target variants): each source term found in a line must "
              "appear in its translation as one of its variants.", metavar="FILE", path=True)
    terms_ignore_case: bool = setting(False, "Find the glossary's source terms whatever their case.")
    backend: str | None = model_backend("translations")

    def __post_init__(self):
        for name in ("batch_size", "max_source_len"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.window < 0:
            raise InputError(f"--window must be at least 1 line (got {self.window}; 0 = 10 x the batch size)")
        for name in ("workers", "threads"):
            if getattr(self, name) < 0:
                raise InputError(f"--{name} must be at least 0 (got {getattr(self, name)}; 0 = automatic)")
        if self.backend is not None and self.backend not in BACKEND_NAMES:
            raise InputError(f"unknown --backend '{self.backend}' (choose from {', '.join(BACKEND_NAMES)})")
        if self.workers > 1 and not str(self.device).startswith("cpu"):
            raise InputError(f"--workers {self.workers} needs --device cpu (one process drives a {self.device} device)")


def field_kind(name: str) -> type:
    """The type of a field's values: int, float, bool or str (``sampling``, which may also be None)."""
    return _KINDS[name]


MIN_TEMPERATURE = 0.01  # the lowest sampling temperature


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    topk: int = 0  # 0 = the whole vocabulary
    topp: float = 1.0  # 1 = the whole vocabulary

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= MIN_TEMPERATURE):
            # (below it p^(1/T) underflows: 1e-320 gave every token -inf, and NaN scores)
            raise ValueError(f"the temperature must be at least {MIN_TEMPERATURE:g}, where sampling is all but "
                             f"greedy decoding (got {self.temperature})")
        if self.topk < 0:
            raise ValueError(f"topk must be at least 0, the whole vocabulary (got {self.topk})")
        if not (0 < self.topp <= 1):
            raise ValueError(f"topp must be in (0, 1] (got {self.topp})")


def parse_sampling(spec: str) -> Sampling:
    """``topk:K``, ``topp:P``, ``temperature:T`` or several of them joined by commas (``topk:10,temperature:0.8``)
    -> :class:`Sampling`; anything else -> ValueError saying what is expected."""
    expected = "expected topk:K, topp:P or temperature:T (several joined by commas)"
    fields: dict[str, float | int] = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition(":")
        if not sep or name not in ("topk", "topp", "temperature") or name in fields:
            raise ValueError(f"bad sampling '{spec}': {expected}")
        try:
            fields[name] = int(value) if name == "topk" else float(value)
        except ValueError:
            raise ValueError(f"bad sampling '{spec}': '{value}' is not a number for {name}") from None
    if fields.get("topk", 1) < 1:
        raise ValueError(f"bad sampling '{spec}': topk must be at least 1")
    return Sampling(**fields)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_KIND_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}
# each field's type, from its annotation ("str | None": text or nothing)
_KINDS = {f.name: {"int": int, "float": float, "bool": bool, "str": str, "str | None": str}[f.type]
          for f in dataclasses.fields(DecodeConfig)}
