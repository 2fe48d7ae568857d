"""Scoring translations against a reference: the library behind ``nmt-score`` (the paper's Table 1 and Figure 2).

Every number comes from sacreBLEU and carries its signature:

- ``BLEU``: sacreBLEU's default, detokenized BLEU (13a tokenisation, exponential smoothing), as the WMT findings
  report it;
- ``chrF``: sacreBLEU's chrF2 (character 6-grams, β = 2);
- ``TER``: sacreBLEU's translation edit rate (tercom's: edits, block shifts included, per reference word; lower is
  better; case-insensitive, as sacreBLEU's default);
- ``BLEU-tok``: the paper-era *tokenized* BLEU, as ``tokenizer.perl -l LANG | multi-bleu.perl`` computed it:
  hypothesis and reference Moses-tokenized by sacremoses (no escaping, no punctuation normalisation), then BLEU on
  the tokens, case-sensitive, without smoothing. Its numbers are not comparable with sacreBLEU's.

Each metric's per-sentence sufficient statistics (sacreBLEU's own, the ones its significance tests resample) are
extracted once per system; the corpus score, the no-unknown-word subset (Table 1, second column) and the
sentence-length buckets (Figure 2) are then sums of rows, exactly what sacreBLEU computes on those lines alone.
Paired bootstrap resampling is sacreBLEU's :class:`~sacrebleu.significance.PairedTest` (seed: ``$SACREBLEU_SEED``,
12345 by default, as in sacreBLEU). With a checkpoint, :func:`model_nll` gives the references' negative
log-likelihood under the model (teacher forced, batched).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nmtkit.errors import InputError

METRICS = ("BLEU", "chrF", "TER", "BLEU-tok")
AXIS_LABELS = {"BLEU": "BLEU (sacreBLEU, detokenized)", "chrF": "chrF2 (sacreBLEU)", "TER": "TER (sacreBLEU)",
               "BLEU-tok": "tokenized BLEU (multi-bleu.perl style)"}
DESCRIPTIONS = {
    "BLEU": "sacreBLEU, detokenized",
    "chrF": "sacreBLEU chrF2",
    "TER": "sacreBLEU TER, lower is better",
    "BLEU-tok": "tokenized BLEU, multi-bleu.perl style (Moses-tokenized, case-sensitive, no smoothing); "
                "NOT comparable with sacreBLEU",
}


# -- inputs ----------------------------------------------------------------------------------------------------


def read_lines(path: str | os.PathLike) -> list[str]:
    """The segments of a text file (plain, gzip or WMT SGML; ``-`` = stdin), split on ``\\n`` only, strictly
    UTF-8."""
    from nmtkit.files import decode_line, read_segments, without_bom

    if path == "-":
        import sys

        data = sys.stdin.buffer.read().split(b"\n")
        if data[-1] == b"":
            data.pop()
        return [decode_line(without_bom(raw, n), "<stdin>", n) for n, raw in enumerate(data, start=1)]
    return [s.text for s in read_segments(path)]


def guess_lang(path: str | os.PathLike | None) -> str | None:
    """The two-letter language code that ends a file name (``newstest2014.fr``, ``x.en.sgm``, ``y.de.gz``)."""
    if path is None:
        return None
    m = re.search(r"\.([A-Za-z]{2})(?:\.sgml?)?(?:\.gz)?$", os.path.basename(os.fspath(path)))
    return m.group(1).lower() if m else None


def system_names(paths: Sequence[str]) -> list[str]:
    """Short names for hypothesis files: their base names, or the paths as given where base names repeat (and
    ``#k`` after a path given twice)."""
    names = ["stdin" if p == "-" else os.path.basename(p) for p in paths]
    if len(set(names)) < len(names):
        names = list(paths) if len(set(paths)) == len(paths) else [f"{p}#{k + 1}" for k, p in enumerate(paths)]
    return names


def read_inputs(reference: str, hypotheses: Sequence[str], source: str | None = None
                ) -> tuple[list[str], list[list[str]], list[str] | None]:
    """(reference lines, each hypothesis file's lines, source lines or None), all of one length.

    A file whose line count differs from the reference's is an InputError naming both files and both counts.
    """
    refs = read_lines(reference)
    if not refs:
        raise InputError("is empty: there is nothing to score against", reference)
    files = ([("source", source)] if source is not None else []) + [("hypothesis", h) for h in hypotheses]
    read = []
    for role, path in files:
        lines = read_lines(path)
        if len(lines) != len(refs):
            raise InputError(f"{role} file has {len(lines)} lines but the reference {reference} has {len(refs)}: "
                             "line i of every file must belong to line i of the reference", path)
        read.append(lines)
    src = read.pop(0) if source is not None else None
    return refs, read, src


# -- metrics over sentence statistics --------------------------------------------------------------------------


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


def make_metrics(references: Sequence[str], target_lang: str, names: Sequence[str] = METRICS
                 ) -> dict[str, SentenceMetric]:
    """The metrics named (``BLEU``, ``chrF``, ``TER``, ``BLEU-tok``) with ``references`` cached."""
    from importlib.metadata import version

    from sacrebleu.metrics import BLEU, CHRF, TER

    unknown = set(names) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(METRICS)}")
    out = {}
    for name in names:
        if name == "BLEU":
            m = BLEU(references=[list(references)])
            out[name] = SentenceMetric(name, m, m.get_signature().format())
        elif name == "chrF":
            m = CHRF(references=[list(references)])
            out[name] = SentenceMetric(name, m, m.get_signature().format())
        elif name == "TER":
            m = TER(references=[list(references)])
            out[name] = SentenceMetric(name, m, m.get_signature().format(), integer=False)
        else:
            m = BLEU(tokenize="none", smooth_method="none", force=True,
                     references=[moses_tokenize(references, target_lang)])
            pretok = f"pretok:sacremoses-{version('sacremoses')}-{target_lang}-noescape|"
            out[name] = SentenceMetric(name, m, pretok + m.get_signature().format(),
                                       prepare=lambda lines, lang=target_lang: moses_tokenize(lines, lang))
    return out


# -- the no-unknown-word subset --------------------------------------------------------------------------------


@dataclass
class Shortlist:
    """The vocabularies and preprocessing that decide which tokens a model knows."""

    origin: str  # the checkpoint or prepared directory they came from
    source_lang: str
    target_lang: str
    src_vocab: object  # nmtkit.data.vocab.Vocabulary
    tgt_vocab: object
    src_config: object  # nmtkit.data.text.TextConfig
    tgt_config: object


def shortlist_from_checkpoint(payload: dict, origin: str) -> Shortlist:
    """The shortlists of a loaded checkpoint (:func:`nmtkit.data.checkpoint.load`)."""
    from nmtkit.data.text import TextConfig
    from nmtkit.data.vocab import Vocabulary

    return Shortlist(origin, payload.get("source_lang", "?"), payload.get("target_lang", "?"),
                     Vocabulary(payload["vocab"]["src"]), Vocabulary(payload["vocab"]["tgt"]),
                     TextConfig.from_dict(payload["preprocessing"]["src"]),
                     TextConfig.from_dict(payload["preprocessing"]["tgt"]))


def shortlist_from_prepared(directory: str) -> Shortlist:
    """The shortlists of a prepared directory (``nmt-prepare``'s output)."""
    from nmtkit.data.manifest import PreparedData

    if not os.path.isdir(directory):
        raise InputError("--vocab takes a prepared directory (the output of nmt-prepare)", directory)
    data = PreparedData.open(directory)
    s, t = data.source_lang, data.target_lang
    return Shortlist(directory, s, t, data.vocab(s), data.vocab(t), data.text_config(s), data.text_config(t))


def no_unk_rows(sources: Sequence[str], references: Sequence[str], shortlist: Shortlist) -> np.ndarray:
    """Indices of the sentences whose source and reference, preprocessed as the model's input is, contain no
    token outside the shortlists (no token the model would see as ``<unk>``)."""
    from nmtkit.data.text import Preprocessor
    from nmtkit.data.vocab import UNK

    src_pre, tgt_pre = Preprocessor(shortlist.src_config), Preprocessor(shortlist.tgt_config)
    keep = [i for i, (s, r) in enumerate(zip(sources, references))
            if UNK not in shortlist.src_vocab.encode(src_pre.tokenize(s))
            and UNK not in shortlist.tgt_vocab.encode(tgt_pre.tokenize(r))]
    return np.asarray(keep, dtype=np.int64)


# -- sentence-length buckets -----------------------------------------------------------------------------------


@dataclass
class Buckets:
    """Sentences grouped by source length: ``index[i]`` is the bucket of sentence i, ``labels[k]`` its name."""

    labels: list[str]
    index: np.ndarray
    lengths: np.ndarray

    def rows(self, k: int) -> np.ndarray:
        return np.flatnonzero(self.index == k)

    def counts(self) -> list[int]:
        return np.bincount(self.index, minlength=len(self.labels)).tolist()


def length_buckets(sources: Sequence[str], lang: str, width: int = 10, top: int = 60) -> Buckets:
    """Buckets of ``width`` words by Moses-tokenized source length: 0–9, 10–19, …, and ``top``+ for the rest."""
    if width < 1 or top < width or top % width:
        raise InputError(f"length buckets need width >= 1 and a top that is a multiple of the width "
                         f"(got width {width}, top {top})")
    lengths = np.array([len(line.split()) for line in moses_tokenize(sources, lang)], dtype=np.int64)
    closed = top // width
    labels = [f"{k * width}-{(k + 1) * width - 1}" for k in range(closed)] + [f"{top}+"]
    return Buckets(labels, np.minimum(lengths // width, closed), lengths)


# -- significance ----------------------------------------------------------------------------------------------


def paired_bootstrap(systems: Sequence[tuple[str, Sequence[str]]], metric: SentenceMetric, samples: int = 1000
                     ) -> dict:
    """sacreBLEU's paired bootstrap resampling: the first system against each other one.

    Returns ``{"signature", "samples", "systems": [{"name", "score", "mean", "ci", "p_value"}]}``: ``mean ± ci`` is
    the bootstrap mean and half-width of the 95% interval; ``p_value`` is None for the baseline (the first system).
    """
    from sacrebleu.significance import PairedTest

    if samples < 1:
        raise InputError(f"--bootstrap needs at least 1 resample (got {samples})")
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


# -- model likelihood ------------------------------------------------------------------------------------------


def model_nll(payload: dict, sources: Sequence[str], references: Sequence[str], batch_size: int = 16,
              device: str = "cpu") -> dict:
    """Negative log-likelihood (nats) of each reference given its source under a checkpoint's model, teacher
    forced: ``-Σ_t log p(y_t | y_<t, x)`` over the reference's model tokens and ``</s>``.

    Returns ``{"sentences", "tokens", "words", "total", "per_sentence", "per_token", "per_word", "perplexity",
    "nll": array}``: per token counts model tokens with ``</s>``; per word divides by the reference's
    Moses-tokenized words (``</s>`` not counted); perplexity is ``exp(per_token)``.
    """
    import torch

    from nmtkit.models import build_from_checkpoint
    from nmtkit.data.batching import collate, eval_batches
    from nmtkit.data.text import Preprocessor
    from nmtkit.data.vocab import PAD

    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1 (got {batch_size})")
    from nmtkit.device import resolve_device

    device = resolve_device(str(device))
    shortlist = shortlist_from_checkpoint(payload, "checkpoint")
    try:
        model = build_from_checkpoint(payload).to(device).eval()
    except (ValueError, RuntimeError) as e:
        raise InputError(f"cannot rebuild the checkpoint's model: {str(e).splitlines()[0]}") from None
    src_pre, tgt_pre = Preprocessor(shortlist.src_config), Preprocessor(shortlist.tgt_config)
    src_ids = [shortlist.src_vocab.encode(src_pre.tokenize(s)) for s in sources]
    words = [tgt_pre.words(r) for r in references]
    tgt_ids = [shortlist.tgt_vocab.encode(tgt_pre.subwords(w)) for w in words]
    nll = np.zeros(len(sources), dtype=np.float64)
    src_sizes = np.array([len(s) for s in src_ids])
    tgt_sizes = np.array([len(t) for t in tgt_ids])
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


# -- everything nmt-score reports ------------------------------------------------------------------------------


@dataclass
class ScoreConfig:
    """The settings of one scoring run (``nmt-score``'s options)."""

    reference: str
    hypotheses: list[str]
    source: str | None = None
    names: list[str] | None = None  # one per hypothesis file; default: the file names
    model: str | None = None  # checkpoint: shortlists for the no-UNK subset, and the references' NLL
    vocab: str | None = None  # prepared directory: shortlists for the no-UNK subset
    source_lang: str | None = None  # default: the checkpoint's / prepared data's, else the file name's
    target_lang: str | None = None
    by_length: bool = False
    bucket_width: int = 10
    max_length: int = 60  # the last bucket holds this many words and more
    length_metric: str = "BLEU"
    plot: str | None = None  # PNG/SVG/PDF of the by-length scores (implies by_length)
    bootstrap: int = 0  # resamples; 0 = no significance test
    batch_size: int = 16
    device: str = "cpu"
    metrics: list[str] | tuple[str, ...] = METRICS  # which scores, in the table's order

    def check(self) -> None:
        """Reject contradictory or incomplete settings before any file is read."""
        if not self.hypotheses:
            raise InputError("no hypothesis file given")
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise InputError(f"--metrics: unknown {', '.join(unknown) or 'empty list'} (choose from "
                             f"{', '.join(METRICS)})")
        if (self.by_length or self.plot) and self.length_metric not in self.metrics:
            raise InputError(f"--length-metric {self.length_metric} is not among --metrics "
                             f"{','.join(self.metrics)}")
        if [self.reference, self.source, *self.hypotheses].count("-") > 1:
            raise InputError("only one input can be read from stdin ('-')")
        from nmtkit.files import check_distinct

        check_distinct({"--plot": self.plot}, {"--reference": self.reference, "--source": self.source,
                                               **{f"hypothesis {h}": h for h in self.hypotheses}})
        if self.model and self.vocab:
            raise InputError("--model and --vocab both give the shortlist: choose one")
        if self.names is not None and (len(self.names) != len(self.hypotheses)
                                       or len(set(self.names)) < len(self.names)):
            raise InputError(f"need {len(self.hypotheses)} different names, one per hypothesis file "
                             f"(got {', '.join(self.names)})")
        if self.length_metric not in METRICS:
            raise InputError(f"unknown length metric '{self.length_metric}' (choose from {', '.join(METRICS)})")
        if self.bootstrap < 0:
            raise InputError(f"--bootstrap must be >= 0 (got {self.bootstrap})")
        if self.source is None:
            for flag, needed in (("--model", self.model), ("--vocab", self.vocab), ("--by-length", self.by_length),
                                 ("--plot", self.plot)):
                if needed:
                    raise InputError(f"{flag} needs the source sentences: give -s SRC")
        if self.plot is not None:
            from nmtkit.plots import plot_format

            plot_format(self.plot)
            parent = os.path.dirname(os.path.abspath(self.plot))
            if not os.path.isdir(parent):
                raise InputError(f"cannot write the plot: no directory {parent}", self.plot)


def evaluate(cfg: ScoreConfig) -> dict:
    """Score every hypothesis file of ``cfg`` and return the report (plain types, ready for JSON).

    ``{"reference", "source", "sentences", "metrics": {name: {"signature", "description"}}, "systems": [{"name",
    "file", "scores": {metric: {"score", "signature"}}, "details": {metric: sacreBLEU's verbose line}}],
    "no_unk": None | {"sentences", "of", "shortlist", "scores": {name: {metric: score}}}, "by_length": None |
    {"metric", "signature", "unit", "labels", "counts", "scores": {name: [score or None]}}, "bootstrap": None |
    [per metric: see paired_bootstrap], "nll": None | see model_nll, "plot": path or None}``.
    """
    cfg.check()
    refs, hyps, src = read_inputs(cfg.reference, cfg.hypotheses, cfg.source)
    names = list(cfg.names) if cfg.names else system_names(cfg.hypotheses)
    payload = shortlist = None
    if cfg.model:
        from nmtkit.data import checkpoint

        payload = checkpoint.load(cfg.model)
        shortlist = shortlist_from_checkpoint(payload, cfg.model)
    elif cfg.vocab:
        shortlist = shortlist_from_prepared(cfg.vocab)
    tgt_lang = cfg.target_lang or (shortlist and shortlist.target_lang) or guess_lang(cfg.reference) or "en"
    src_lang = cfg.source_lang or (shortlist and shortlist.source_lang) or guess_lang(cfg.source) or "en"
    metrics = make_metrics(refs, tgt_lang, cfg.metrics)
    stats = {m: [metric.stats(h) for h in hyps] for m, metric in metrics.items()}
    report: dict = {
        "reference": cfg.reference, "source": cfg.source, "sentences": len(refs),
        "source_lang": src_lang, "target_lang": tgt_lang,
        "metrics": {m: {"signature": metric.signature, "description": DESCRIPTIONS[m]}
                    for m, metric in metrics.items()},
        "systems": [], "no_unk": None, "by_length": None, "bootstrap": None, "nll": None, "plot": None,
    }
    for k, (name, path) in enumerate(zip(names, cfg.hypotheses)):
        results = {m: metric.score_of(stats[m][k]) for m, metric in metrics.items()}
        report["systems"].append({
            "name": name, "file": path,
            "scores": {m: {"score": float(r.score), "signature": metrics[m].signature} for m, r in results.items()},
            "details": {m: str(r) for m, r in results.items()},
        })
    if shortlist is not None:
        rows = no_unk_rows(src, refs, shortlist)
        report["no_unk"] = {
            "sentences": len(rows), "of": len(refs), "shortlist": shortlist.origin,
            "shortlist_sizes": {"source": len(shortlist.src_vocab), "target": len(shortlist.tgt_vocab)},
            "scores": {name: {m: metric.score(stats[m][k], rows) for m, metric in metrics.items()}
                       for k, name in enumerate(names)},
        }
    if cfg.by_length or cfg.plot:
        buckets = length_buckets(src, src_lang, cfg.bucket_width, cfg.max_length)
        metric = metrics[cfg.length_metric]
        by = {"metric": metric.name, "signature": metric.signature,
              "unit": f"source words ({src_lang}, Moses-tokenized)", "width": cfg.bucket_width,
              "labels": buckets.labels, "counts": buckets.counts(),
              "scores": {name: [metric.score(stats[metric.name][k], buckets.rows(b))
                                for b in range(len(buckets.labels))] for k, name in enumerate(names)}}
        report["by_length"] = by
    if cfg.bootstrap:
        report["bootstrap"] = [paired_bootstrap(list(zip(names, hyps)), metric, cfg.bootstrap)
                               for metric in metrics.values()]
    if payload is not None:
        nll = model_nll(payload, src, refs, cfg.batch_size, cfg.device)
        nll.pop("nll")
        report["nll"] = {"model": cfg.model, **nll}
    if cfg.plot:  # last, so that no plot is left behind when anything before fails
        from nmtkit.plots import plot_by_length

        by = report["by_length"]
        plot_by_length(by["labels"], by["counts"], by["scores"], cfg.plot,
                       ylabel=AXIS_LABELS[by["metric"]],
                       xlabel=f"sentence length: {by['unit']}",
                       title=f"{by['metric']} by sentence length: {len(refs)} sentences of "
                             f"{os.path.basename(cfg.reference)}", note=by["signature"])
        report["plot"] = cfg.plot
    return report
