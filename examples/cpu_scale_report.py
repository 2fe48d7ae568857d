#!/usr/bin/env python3
"""The CPU-scale recipe's report: fill ``examples/cpu-scale/RESULTS.md.in`` into ``RESULTS.md`` from the run's
outputs (the nmt-score and nmt-align JSON reports, the training logs, the prepared data's manifest), copy the plots
beside it, and check the paper's claims one by one with plain rules::

    python examples/cpu_scale_report.py --work runs/cpu-scale --template examples/cpu-scale/RESULTS.md.in \
        -o examples/cpu-scale/RESULTS.md

(``examples/cpu-scale/run.sh --stage report`` runs it.)  Table 1 and the small helpers come from ``steps.py``
beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from steps import _fmt, _no_unk_scores, _scores, _valid_records, say, table1, write_lines  # (this folder's steps.py)


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _by_length_table(report: dict) -> str:
    by = report["by_length"]
    names = list(by["scores"])
    rows = ["| source words | n | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for k, (label, n) in enumerate(zip(by["labels"], by["counts"])):
        cells = ["-" if by["scores"][name][k] is None else f"{by['scores'][name][k]:.2f}" for name in names]
        rows.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _bootstrap_line(report: dict, metric: str = "BLEU") -> str:
    for test in report.get("bootstrap") or []:
        if test["metric"] != metric:
            continue
        base = test["systems"][0]
        parts = [f"{r['name']} vs {base['name']}: p = {r['p_value']:.4f}" for r in test["systems"][1:]]
        return f"Paired bootstrap ({test['samples']} resamples, {metric}): " + "; ".join(parts) + "."
    return ""


def _short_long(report: dict, split: int = 30) -> dict[str, tuple[float | None, float | None]]:
    """Corpus BLEU of each system of an nmt-score report on the sentences of fewer than ``split`` source words and
    on the others, computed from the files the report names (the same sacreBLEU statistics nmt-score uses)."""
    from nmtkit.score import length_buckets, make_metrics, read_inputs

    files = [s["file"] for s in report["systems"]]
    refs, hyps, src = read_inputs(report["reference"], files, report["source"])
    metric = make_metrics(refs, report.get("target_lang", "fr"), ["BLEU"])["BLEU"]
    buckets = length_buckets(src, report.get("source_lang", "en"), split, split)
    out = {}
    for s, h in zip(report["systems"], hyps):
        stats = metric.stats(h)
        out[s["name"]] = tuple(metric.score(stats, buckets.rows(k)) if len(buckets.rows(k)) else None
                               for k in (0, 1))
    return out


def _curve(log: Path) -> str:
    if not log.is_file():
        return "(missing)"
    rows = ["| update | valid ppl | greedy BLEU (dev sample) | training s |", "|---:|---:|---:|---:|"]
    for r in _valid_records(str(log)):
        bleu = r.get("valid_bleu")
        rows.append(f"| {r['update']} | {r['valid_ppl']:.1f} | {'-' if bleu is None else f'{bleu:.2f}'} | "
                    f"{r['elapsed']:.0f} |")
    return "\n".join(rows)


def _p_value(report: dict, name: str, metric: str = "BLEU") -> float | None:
    for test in report.get("bootstrap") or []:
        if test["metric"] == metric:
            return next((r["p_value"] for r in test["systems"] if r["name"] == name), None)
    return None


def _findings(news: dict, nounk: dict | None, hans: dict | None, aer: dict | None, diag: dict | None,
              search: str, encdec: str) -> str:
    """The paper's claims, checked on this run by plain rules (the numbers are in the tables above)."""
    out = ["| The paper's finding | This run | Reproduced? |", "|---|---|---|"]

    def better(a, b, p):
        if a is None or b is None:
            return "-"
        if a <= b:
            return "no"
        return "yes" if p is None or p < 0.05 else "not significant"

    def cmp(report, label, scores=None):
        s = scores or _scores(report)
        p = _p_value(report, search)
        sig = "" if p is None else f" (p = {p:.3f})"
        out.append(f"| RNNsearch beats RNNencdec: {label} | {_fmt(s[search])} vs {_fmt(s[encdec])} BLEU{sig} | "
                   f"{better(s[search], s[encdec], p)} |")

    cmp(news, "news-test-2014, all sentences")
    if nounk:
        nus, n, _ = _no_unk_scores(nounk)
        cmp(nounk, f"news-test-2014 without unknown words ({n} sentences)", nus)
    if hans:
        cmp(hans, "Hansards test sittings")
    for report, label in ((news, "news-test-2014"), (hans, "Hansards test")):
        if not report:
            continue
        try:
            split = _short_long(report)
        except Exception as e:  # the report still comes out
            out.append(f"| (sentence length, {label}) | could not be computed: {e} | - |")
            continue
        (ss, sl), (es, el) = split[search], split[encdec]
        if None in (ss, sl, es, el) or not ss or not es:
            continue
        keep_s, keep_e = sl / ss, el / es
        out.append(f"| RNNencdec suffers more on sentences longer than those trained on ({label}: BLEU on >= 30 "
                   f"words / BLEU on < 30 words) | RNNsearch {sl:.2f}/{ss:.2f} = {keep_s:.2f}, RNNencdec "
                   f"{el:.2f}/{es:.2f} = {keep_e:.2f} | {'yes' if keep_s > keep_e else 'no'} |")
    if aer and diag:
        out.append(f"| RNNsearch's attention aligns words (Hansards trial AER, lower is better) | "
                   f"{aer['aer']:.3f}, the monotone diagonal {diag['aer']:.3f} | "
                   f"{'yes' if aer['aer'] < diag['aer'] else 'no'} |")
    return "\n".join(out)


def report(a) -> None:
    """Write the filled template to ``a.out`` and the images into ``a.images`` beside it."""
    w = Path(a.work)
    ev = w / "eval"
    dest = Path(a.out).parent
    images = dest / a.images
    images.mkdir(parents=True, exist_ok=True)
    news, nounk = _load(ev / "newstest2014.json"), _load(ev / "newstest2014-nounk.json")
    news_len, hans = _load(ev / "newstest2014-by-length.json"), _load(ev / "hansards-test.json")
    aer, aer_lower, diag = _load(ev / "aer.json"), _load(ev / "aer-lowercased.json"), _load(ev / "aer-diagonal.json")
    recase = _load(ev / "recase-en.json"), _load(ev / "recase-fr.json")
    budget = _load(w / "runs" / "budget.json")
    manifest = _load(w / "data-bin" / "manifest.json")
    settings = _load(w / "settings.json") or {}
    search, encdec = a.search_name, a.encdec_name

    def img(src: Path, name: str) -> str:
        if not src.is_file():
            return "(missing)"
        shutil.copyfile(src, images / name)
        return f"![{name}]({a.images}/{name})"

    fig3 = []
    index = ev / "alignments" / "index.tsv"
    if index.is_file():
        for k, png in enumerate(sorted((ev / "alignments").glob("*.png"))[: a.alignment_plots]):
            fig3.append(img(png, f"alignment-{k + 1}.png"))
    fields = {
        "settings": "\n".join(f"| {k} | {v} |" for k, v in settings.items()),
        "data": _data_summary(w, manifest),
        "timings": _timings(w),
        "budget": ("-" if budget is None else
                   f"{budget['updates']} updates each ({budget['minutes']:g} minutes of training for the slower "
                   "model at its calibrated speed; " + ", ".join(
                       f"{Path(k).parent.name} {v:.2f} s/update" for k, v in budget["seconds_per_update"].items())
                   + ")"),
        "curve_search": _curve(w / "runs" / "rnnsearch" / "train.jsonl"),
        "curve_encdec": _curve(w / "runs" / "rnnencdec" / "train.jsonl"),
        "table1": table1(news, nounk) if news else "(missing)",
        "table1_bootstrap": _bootstrap_line(news) if news else "",
        "table1_model_subset": _model_subset(news),
        "table1_tok": table1(news, nounk, "BLEU-tok", paper=True) if news else "",
        "hansards": table1(hans, None) if hans else "(missing)",
        "hansards_bootstrap": _bootstrap_line(hans) if hans else "",
        "by_length_news": _by_length_table(news_len) if news_len else "(missing)",
        "by_length_hansards": _by_length_table(hans) if hans and hans.get("by_length") else "(missing)",
        "plot_news": img(ev / "bleu-by-length-newstest2014.png", "bleu-by-length-newstest2014.png"),
        "plot_hansards": img(ev / "bleu-by-length-hansards-test.png", "bleu-by-length-hansards-test.png"),
        "aer": _aer_table(aer, aer_lower, diag),
        "recase": _recase_line(recase),
        "alignments": "\n\n".join(fig3) or "(missing)",
        "findings": _findings(news, nounk, hans, aer, diag, search, encdec) if news else "(missing)",
    }
    template = Path(a.template).read_text(encoding="utf-8")
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: str(fields.get(m.group(1), m.group(0))), template)
    write_lines(a.out, text.rstrip("\n").split("\n"))
    say(f"wrote {a.out} (images in {images})")


def _data_summary(work: Path, manifest: dict | None) -> str:
    """Lines, tokens and shortlist coverage of each split of the prepared directory."""
    if not manifest:
        return "(missing)"
    rows = ["| split | pairs in | pairs kept | tokens en / fr | shortlist coverage en / fr |",
            "|---|---:|---:|---:|---:|"]
    for name, sp in manifest["splits"].items():
        cov = sp.get("coverage", {})
        rows.append(f"| {name} | {sp['lines_in']:,} | {sp['lines_out']:,} | {sp['tokens']['en']:,} / "
                    f"{sp['tokens']['fr']:,} | {cov.get('en', 0):.1%} / {cov.get('fr', 0):.1%} |")
    try:
        import numpy as np

        from nmtkit.data.manifest import PreparedData

        data = PreparedData.open(work / "data-bin")
        src, tgt = (np.asarray(data.corpus("train", lang).sizes) for lang in ("en", "fr"))
        short = int(((src <= 30) & (tgt <= 30)).sum())
        rows.append(f"\nTraining pairs of at most 30 tokens a side (what both models train on): {short:,}.")
    except Exception as e:  # the report still comes out
        rows.append(f"\n(could not count the training pairs of at most 30 tokens: {e})")
    vocab = manifest["vocab"]
    rows.append("Shortlists: " + ", ".join(f"{lang} {v['size'] - len(v['specials']):,} words of "
                                             f"{v['types_in_training']:,} in training" for lang, v in vocab.items())
                + ".")
    return "\n".join(rows)


def _timings(work: Path) -> str:
    path = work / "timings.tsv"
    if not path.is_file():
        return "(missing)"
    rows = ["| stage | minutes |", "|---|---:|"]
    total = 0
    order = ["data", "prepare", "train", "translate", "score", "align", "report"]
    lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    for stage, seconds in sorted(lines, key=lambda x: order.index(x[0]) if x[0] in order else len(order)):
        total += int(seconds)
        rows.append(f"| {stage} | {int(seconds) / 60:.1f} |")
    rows.append(f"| all (as run) | {total / 60:.1f} |")
    return "\n".join(rows)


def _model_subset(report: dict | None) -> str:
    if not report or not report.get("no_unk"):
        return ""
    nu = report["no_unk"]
    parts = ", ".join(f"{k} {_fmt(v['BLEU'])}" for k, v in nu["scores"].items())
    return (f"For reference, the translations made *with* `<unk>` allowed, scored on the same subset "
            f"({nu['sentences']} of {nu['of']} sentences, from `nmt-score --model`): {parts}.")


def _aer_table(aer, lower, diag) -> str:
    rows = ["| Alignment of the Hansards trial set (37 pairs, 338 Sure + 1,446 Possible links) | AER | precision "
            "| recall |", "|---|---:|---:|---:|"]
    for label, r in (("RNNsearch, forced decoding, trial text recased (argmax links)", aer),
                     ("RNNsearch, forced decoding, trial text as distributed (lowercased)", lower),
                     ("monotone diagonal (no model)", diag)):
        if r:
            rows.append(f"| {label} | {r['aer']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} |")
    return "\n".join(rows)


def _recase_line(stats) -> str:
    parts = []
    for lang, s in zip(("English", "French"), stats):
        if s:
            parts.append(f"{lang}: {s['recased']} of {s['words']} words recased, words outside the shortlist "
                         f"{s['oov_before']} -> {s['oov_after']}")
    return "; ".join(parts) if parts else "(missing)"


# -- the command line ---------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="cpu_scale_report.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="the recipe's work directory")
    p.add_argument("--template", required=True)
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--images", default="results", help="folder for the images, relative to OUT's folder")
    p.add_argument("--alignment-plots", type=int, default=4)
    p.add_argument("--search-name", default="RNNsearch")
    p.add_argument("--encdec-name", default="RNNencdec")
    report(p.parse_args(argv))


if __name__ == "__main__":
    main()
