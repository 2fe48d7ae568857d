"""Everything ``nmt-score`` reports, from one :class:`ScoreConfig`: the metrics, their subsets and tests, and beside
them what a reader notices (numbers, repeats, ``<unk>``: :mod:`nmtkit.score.diagnostics`)."""

from __future__ import annotations

import os
from dataclasses import dataclass


from nmtkit.errors import InputError
from nmtkit.score.diagnostics import Diagnostics
from nmtkit.score.inputs import guess_lang, read_inputs, system_names
from nmtkit.score.metrics import MAX_BOOTSTRAP, METRICS, REGISTRY, make_metrics, paired_bootstrap
from nmtkit.score.subsets import length_buckets, no_unk_rows, shortlist_from_checkpoint, shortlist_from_prepared
from nmtkit.score.likelihood import model_nll
from nmtkit.settings import model_backend, setting


@dataclass
class ScoreConfig:
    """The settings of one scoring run: one field per option of ``nmt-score`` (:mod:`nmtkit.settings`; the
    hypothesis files are its arguments, and ``--metrics`` a comma-separated list of ``metrics``)."""

    reference: str = setting(help="Reference translations (plain text, gzip or WMT SGML).", short="-r", path=True)
    hypotheses: list[str]  # (nmt-score's arguments)
    source: str | None = setting(
        None, "Source sentences: needed for --model, --vocab, --by-length, --plot and the numbers check.", short="-s",
        path=True)
    names: list[str] | None = setting(
        None, "A name for each hypothesis file, in order [file names].", short="-n", flag="--name")
    #   (one per hypothesis file; None: the file names)
    model: str | None = setting(
        None, "Checkpoint: its shortlists give the no-UNK subset; also the references' NLL under it.", short="-m",
        path=True)
    vocab: str | None = setting(
        None, "Prepared directory (nmt-prepare): its shortlists give the no-UNK subset.", path="dir")
    source_lang: str | None = setting(
        None, "Source language for length counting and the source's numbers [checkpoint's/prepared data's, or from "
              "-s].", flag="--src-lang")
    target_lang: str | None = setting(
        None, "Target language for BLEU-tok's Moses tokenizer and the translations' numbers [likewise, or from -r].",
        flag="--tgt-lang")
    by_length: bool = setting(False, "Scores per source-length bucket (the paper's Figure 2).")
    bucket_width: int = setting(10, "Words per length bucket.")
    max_length: int = setting(60, "The last bucket holds this many words and more.")
    length_metric: str = setting("BLEU", "The score of --by-length and --plot.", choices=METRICS)
    plot: str | None = setting(
        None, "Draw the by-length scores, one line per system (.png, .svg or .pdf); implies --by-length.", path=True)
    bootstrap: int = setting(
        0, "Paired bootstrap resampling with N resamples: the first system against each other one.", metavar="N")
    batch_size: int = setting(16, "Sentences per batch for --model's NLL.")
    device: str = setting("cpu", "Device for --model's NLL.")
    backend: str | None = model_backend("NLL")  # (None: $NMTKIT_BACKEND, else fast)
    metrics: list[str] | tuple[str, ...] = METRICS  # which scores, in the table's order (nmt-score --metrics A,B)
    repeat_ngram: int = setting(
        3, "Count the lines that repeat a word N-gram more often than the reference does.", metavar="N")
    terms: str | None = setting(
        None, "A glossary (nmt-translate --terms' file): the share of its terms found in the source that each "
              "translation writes.", metavar="FILE", path=True)
    terms_ignore_case: bool = setting(False, "Find the glossary's source terms whatever their case.")

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
        if self.terms and not self.source:
            raise InputError("--terms needs the source (-s SRC), where the glossary's terms are found")
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
        if self.repeat_ngram < 1:
            raise InputError(f"--repeat-ngram must be >= 1 (got {self.repeat_ngram})")
        if not 0 <= self.bootstrap <= MAX_BOOTSTRAP:
            raise InputError(f"--bootstrap must be from 0 to {MAX_BOOTSTRAP:,} resamples (got {self.bootstrap}; "
                             "sacreBLEU's default is 1,000, and each resample holds a statistics row per sentence)")
        if self.backend is not None and self.model is None:
            raise InputError("--backend chooses how --model computes the references' NLL: give -m CHECKPOINT")
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
    [per metric: see paired_bootstrap], "nll": None | see model_nll, "plot": path or None, "diagnostics":
    {"repeat_ngram", "note": why the numbers are not checked, or None, "reference": {"numbers", "repeats",
    "terms"}}}``, and each system's ``"diagnostics"``: :meth:`nmtkit.score.diagnostics.Diagnostics.of`, and
    ``"terms"`` (with ``--terms``: :meth:`nmtkit.score.terms.TermUse.of`, else None).
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
    diagnostics = Diagnostics(refs, src, src_lang, tgt_lang, cfg.repeat_ngram)
    terms = None
    if cfg.terms:
        from nmtkit.score.terms import TermUse

        terms = TermUse(cfg.terms, src, src_lang, tgt_lang, cfg.terms_ignore_case)
    metrics = make_metrics(refs, tgt_lang, cfg.metrics)
    stats = {m: [metric.stats(h) for h in hyps] for m, metric in metrics.items()}
    report: dict = {
        "reference": cfg.reference, "source": cfg.source, "sentences": len(refs),
        "source_lang": src_lang, "target_lang": tgt_lang,
        "metrics": {m: {"signature": metric.signature, "description": REGISTRY[m].description}
                    for m, metric in metrics.items()},
        "systems": [], "no_unk": None, "by_length": None, "bootstrap": None, "nll": None, "plot": None,
        "diagnostics": {"repeat_ngram": cfg.repeat_ngram,
                        "reference": {**diagnostics.reference, "terms": terms.of(refs) if terms else None},
                        "note": None if src is not None else "numbers not checked: give the source (-s SRC), whose "
                                                             "numbers a translation must carry"},
    }
    for k, (name, path) in enumerate(zip(names, cfg.hypotheses)):
        results = {m: metric.score_of(stats[m][k]) for m, metric in metrics.items()}
        report["systems"].append({
            "name": name, "file": path,
            "scores": {m: {"score": float(r.score), "signature": metrics[m].signature} for m, r in results.items()},
            "details": {m: str(r) for m, r in results.items()},
            "diagnostics": {**diagnostics.of(hyps[k]), "terms": terms.of(hyps[k]) if terms else None},
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
        nll = model_nll(payload, src, refs, cfg.batch_size, cfg.device, cfg.backend, cfg.model,
                        paths=(cfg.source, cfg.reference))
        nll.pop("nll")
        report["nll"] = {"model": cfg.model, **nll}
    if cfg.plot:  # last, so that no plot is left behind when anything before fails
        from nmtkit.plots import plot_by_length

        by = report["by_length"]
        plot_by_length(by["labels"], by["counts"], by["scores"], cfg.plot,
                       ylabel=REGISTRY[by["metric"]].axis_label,
                       xlabel=f"sentence length: {by['unit']}",
                       title=f"{by['metric']} by sentence length: {len(refs)} sentences of "
                             f"{os.path.basename(cfg.reference)}", note=by["signature"])
        report["plot"] = cfg.plot
    return report
