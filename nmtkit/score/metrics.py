"""The metrics as per-sentence sufficient statistics (sacreBLEU's own), so that a corpus score, a subset's and a
bucket's are sums of rows; and sacreBLEU's paired bootstrap over them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nmtkit.errors import InputError

MAX_BOOTSTRAP = 10_000  # paired bootstrap resamples: sacreBLEU holds them all at once, (resamples x sentences) rows


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses-tokenize lines as ``tokenizer.perl -l LANG -no-escape`` does (sacremoses), tokens joined by spaces."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, escape=False, return_str=True) for line in lines]


class SentenceMetric:
    """One sacreBLEU metric with the reference cached: per-sentence statistics, and scores of any set of rows.

    ``metric`` is the sacreBLEU object, ``signature`` the full signature string of every score it gives,
    ``prepare`` turns hypothesis lines into what the metric reads (the Moses tokenizer for ``BLEU-tok``).
    """

    def __init__(self, name: str, metric, signature: str, prepare=None, integer: bool = True):
        self.name, self.metric, self.signature, self.prepare = name, metric, signature, prepare
        self.integer = integer  # (TER's statistics are edit counts and average reference lengths: floats)

    def stats(self, hypotheses: Sequence[str]) -> np.ndarray:
        """(sentences, k) sufficient statistics, one row per hypothesis line."""
        lines = self.prepare(hypotheses) if self.prepare else list(hypotheses)
        return np.asarray(self.metric._extract_corpus_statistics(lines, None),
                          dtype=np.int64 if self.integer else np.float64)

    def score_of(self, stats: np.ndarray, rows: np.ndarray | None = None):
        """sacreBLEU's Score object for the summed statistics of ``rows`` (all rows when None); None if no rows."""
        s = stats if rows is None else stats[rows]
        if len(s) == 0:
            return None
        return self.metric._compute_score_from_stats([int(v) if self.integer else float(v) for v in s.sum(0)])

    def score(self, stats: np.ndarray, rows: np.ndarray | None = None) -> float | None:
        result = self.score_of(stats, rows)
        return None if result is None else float(result.score)


class Metric:
    """A kind of score ``nmt-score`` reports (sacreBLEU's ``Metric`` shape): its name, what it is, the label of a
    figure's axis, and how to build it over references (:meth:`build`).  A new metric is one subclass here and
    its line in :data:`REGISTRY`."""

    name: str
    description: str
    axis_label: str

    @classmethod
    def build(cls, references: Sequence[str], target_lang: str) -> SentenceMetric:
        raise NotImplementedError


class _SacreBleu(Metric):
    """A sacreBLEU metric over the detokenized text as sacreBLEU reads it: ``sacrebleu_class`` names its class in
    ``sacrebleu.metrics``; ``integer``: whether its statistics are counts (TER's are not)."""

    sacrebleu_class: str
    integer: bool = True

    @classmethod
    def build(cls, references, target_lang):
        import sacrebleu.metrics

        m = getattr(sacrebleu.metrics, cls.sacrebleu_class)(references=[list(references)])
        return SentenceMetric(cls.name, m, m.get_signature().format(), integer=cls.integer)


class Bleu(_SacreBleu):
    name, description, axis_label = "BLEU", "sacreBLEU, detokenized", "BLEU (sacreBLEU, detokenized)"
    sacrebleu_class = "BLEU"


class Chrf(_SacreBleu):
    name, description, axis_label = "chrF", "sacreBLEU chrF2", "chrF2 (sacreBLEU)"
    sacrebleu_class = "CHRF"


class Ter(_SacreBleu):
    name, description, axis_label = "TER", "sacreBLEU TER, lower is better", "TER (sacreBLEU)"
    sacrebleu_class, integer = "TER", False


class TokenizedBleu(Metric):
    name = "BLEU-tok"
    description = ("tokenized BLEU, multi-bleu.perl style (Moses-tokenized, case-sensitive, no smoothing); "
                   "NOT comparable with sacreBLEU")
    axis_label = "tokenized BLEU (multi-bleu.perl style)"

    @classmethod
    def build(cls, references, target_lang):
        from importlib.metadata import version

        from sacrebleu.metrics import BLEU

        m = BLEU(tokenize="none", smooth_method="none", force=True,
                 references=[moses_tokenize(references, target_lang)])
        pretok = f"pretok:sacremoses-{version('sacremoses')}-{target_lang}-noescape|"
        return SentenceMetric(cls.name, m, pretok + m.get_signature().format(),
                              prepare=lambda lines, lang=target_lang: moses_tokenize(lines, lang))


REGISTRY: dict[str, type[Metric]] = {m.name: m for m in (Bleu, Chrf, Ter, TokenizedBleu)}  # in the table's order
METRICS = tuple(REGISTRY)


def make_metrics(references: Sequence[str], target_lang: str, names: Sequence[str] = METRICS
                 ) -> dict[str, SentenceMetric]:
    """The metrics named (:data:`REGISTRY`: ``BLEU``, ``chrF``, ``TER``, ``BLEU-tok``) with ``references`` cached."""
    unknown = set(names) - set(REGISTRY)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(METRICS)}")
    return {name: REGISTRY[name].build(references, target_lang) for name in names}


def paired_bootstrap(systems: Sequence[tuple[str, Sequence[str]]], metric: SentenceMetric, samples: int = 1000
                     ) -> dict:
    """sacreBLEU's paired bootstrap resampling: the first system against each other one.

    Returns ``{"signature", "samples", "systems": [{"name", "score", "mean", "ci", "p_value"}]}``: ``mean ± ci`` is
    the bootstrap mean and half-width of the 95% interval; ``p_value`` is None for the baseline (the first system).
    """
    from sacrebleu.significance import PairedTest

    if not 1 <= samples <= MAX_BOOTSTRAP:  # (checked here too: a library caller's count is allocated at once)
        raise InputError(f"--bootstrap must be from 1 to {MAX_BOOTSTRAP:,} resamples (got {samples}; sacreBLEU's "
                         "default is 1,000, and each resample holds a statistics row per sentence)")
    prepare = metric.prepare or list
    named = [(name, prepare(hyps)) for name, hyps in systems]
    test = PairedTest(named, {metric.name: metric.metric}, references=None, test_type="bs", n_samples=samples)
    signatures, results = test()
    key = next(k for k in results if k != "System")
    sig = signatures[key].format()
    if metric.prepare is not None:  # keep the pre-tokenisation part of the signature
        sig = metric.signature.split("|", 1)[0] + "|" + sig
    rows = [{"name": name, "score": float(r.score), "mean": float(r.mean), "ci": float(r.ci),
             "p_value": None if r.p_value is None else float(r.p_value)}
            for name, r in zip(results["System"], results[key])]
    return {"metric": metric.name, "signature": sig, "samples": samples, "systems": rows}
