#!/usr/bin/env python3
"""The CPU-scale recipe's report: fill ``examples/cpu-scale/RESULTS.md.in`` into ``RESULTS.md`` from the run's
outputs (the nmt-score and nmt-align JSON reports, the training logs, the prepared data's manifest), copy the plots
beside it and the evidence into ``results/eval`` (:data:`EVIDENCE`: the JSON reports, links and the run's records,
so that every number of the report can be traced without the work directory), and check the paper's claims one by
one with plain rules::

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

from steps import _fmt, _scores, _valid_records, say, table1, write_lines  # (this folder's steps.py)


# what is copied into the report's evidence folder: (folder of the work directory, file patterns)
EVIDENCE = (("eval", ("*.json", "*.links", "table1.md", "figure3*.en", "figure3*.fr", "figure3*.lines")),
            (".", ("settings.json", "sessions.tsv", "timings.tsv")), ("runs", ("budget.json", "plan.txt")))


SETTING_NAMES = {"git": "git (the first session's)"}  # (run.sh records the commit once, when the run begins)


def copy_evidence(work: Path, dest: Path) -> int:
    """The files :data:`EVIDENCE` names, from ``work`` into ``dest`` (emptied of earlier files first, so that a file
    of an earlier run does not stay beside this one's); returns how many were copied.  ``dest`` may not be a folder
    the evidence comes from, nor hold one (emptying it would lose the run's own files), and is left as it is when
    ``work`` has no evaluation."""
    target = dest.resolve()
    for folder, _ in EVIDENCE:
        source = (work / folder).resolve()
        if target == source or target in source.parents:
            raise SystemExit(f"cpu_scale_report.py: the evidence would be copied into {dest}, where the run keeps "
                             f"its own ({source}): give -o elsewhere, or another --images")
    if not (work / "eval").is_dir():
        say(f"no {work / 'eval'}: the evidence in {dest} is left as it is")
        return 0
    if dest.is_dir():
        for old in dest.iterdir():
            if old.is_file():
                old.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for folder, patterns in EVIDENCE:
        for pattern in patterns:
            for src in sorted((work / folder).glob(pattern)):
                if src.is_file():
                    shutil.copyfile(src, dest / src.name)
                    copied += 1
    return copied


DISCUSSION = "\n## Discussion\n"


def keep_discussion(text: str, out: Path, run: str | None) -> str:
    """``text`` with its Discussion section (the last, which a person writes after reading the numbers) replaced by
    the one ``out`` already has, if it has one and is a report of the same run (``run``, the first line of its
    sessions table, is in both): the report is made again without losing what was written about it."""
    if not out.is_file() or DISCUSSION not in text:
        return text
    old = out.read_text(encoding="utf-8")
    if DISCUSSION not in old:
        return text
    if run is None or run not in old or run not in text:
        say(f"{out} was written for another run: its Discussion is not kept")
        return text
    say(f"kept the Discussion {out} has: read it again against the new numbers")
    return text[: text.index(DISCUSSION)] + old[old.index(DISCUSSION):]


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


MODELS = ("rnnencdec-30", "rnnsearch-30", "rnnencdec-50", "rnnsearch-50", "rnnsearch-50star")
# run.sh's nmt-align reports, eval/aer-KEY.json (eval/aer.json: RNNsearch-50's attention)
AER_REPORTS = ("aer", "lowercased", "diagonal", "eflomal", "posterior", "guided", "star", "symmetrized",
               "symmetrized-posterior", "guided-symmetrized-attention", "guided-symmetrized", "star-symmetrized",
               "star-symmetrized-posterior", "star-guided-symmetrized-attention", "star-guided-symmetrized")
# every run of the recipe, as the report names it (Table 1's five first)
NAMES = {"rnnencdec-30": "RNNencdec-30", "rnnsearch-30": "RNNsearch-30", "rnnencdec-50": "RNNencdec-50",
         "rnnsearch-50": "RNNsearch-50", "rnnsearch-50star": "RNNsearch-50star",
         "rnnsearch-50-fr-en": "RNNsearch-50-fr-en", "rnnsearch-50-guided": "RNNsearch-50 guided (stage guide)",
         "rnnsearch-50-fr-en-guided": "RNNsearch-50-fr-en guided (stage guide)",
         "rnnsearch-50star-fr-en": "RNNsearch-50star-fr-en (stage twin)",
         "rnnsearch-50star-guided": "RNNsearch-50star guided (stage guide)",
         "rnnsearch-50star-fr-en-guided": "RNNsearch-50star-fr-en guided (stage guide)"}
# Table 1's orderings that the paper claims (better, worse, what it shows)
CLAIMS = (("RNNsearch-30", "RNNencdec-30", "RNNsearch beats RNNencdec (-30)"),
          ("RNNsearch-50", "RNNencdec-50", "RNNsearch beats RNNencdec (-50)"),
          ("RNNsearch-30", "RNNencdec-50", "RNNsearch-30 beats even RNNencdec-50"),
          ("RNNencdec-50", "RNNencdec-30", "training on longer sentences helps RNNencdec"),
          ("RNNsearch-50", "RNNsearch-30", "training on longer sentences helps RNNsearch"),
          ("RNNsearch-50star", "RNNsearch-50", "the longer-trained RNNsearch-50* beats RNNsearch-50"))


class Pairs:
    """Paired bootstrap p-values between any two systems of an nmt-score report (sacreBLEU's paired test, as
    ``nmt-score --bootstrap`` runs it against the first system), from the files the report names."""

    def __init__(self, report: dict, samples: int):
        from nmtkit.score import make_metrics, read_inputs

        self.names = [s["name"] for s in report["systems"]]
        refs, self.hyps, _ = read_inputs(report["reference"], [s["file"] for s in report["systems"]], None)
        self.metric = make_metrics(refs, report.get("target_lang", "fr"), ["BLEU"])["BLEU"]
        self.samples = samples

    def p(self, better: str, worse: str) -> float | None:
        from nmtkit.score.metrics import paired_bootstrap

        if better not in self.names or worse not in self.names:
            return None
        h = dict(zip(self.names, self.hyps))
        test = paired_bootstrap([(worse, h[worse]), (better, h[better])], self.metric, self.samples)
        return test["systems"][1]["p_value"]


def _short_long(report: dict, split: int = 30, top: int = 50) -> dict[str, tuple[float | None, ...]]:
    """Corpus BLEU of each system of an nmt-score report on the sentences of fewer than ``split`` source words, on
    those of ``split`` or more, and on those of ``top`` or more, computed from the files the report names (the
    same sacreBLEU statistics nmt-score uses)."""
    from nmtkit.score import length_buckets, make_metrics, read_inputs

    files = [s["file"] for s in report["systems"]]
    refs, hyps, src = read_inputs(report["reference"], files, report["source"])
    metric = make_metrics(refs, report.get("target_lang", "fr"), ["BLEU"])["BLEU"]
    cut = length_buckets(src, report.get("source_lang", "en"), split, split)
    far = length_buckets(src, report.get("source_lang", "en"), top, top)
    out = {}
    for s, h in zip(report["systems"], hyps):
        stats = metric.stats(h)
        rows = (cut.rows(0), cut.rows(1), far.rows(1))
        out[s["name"]] = tuple(metric.score(stats, r) if len(r) else None for r in rows)
    return out


def _curve(records: list[dict] | None) -> str:
    """A run's validation records (None: no log) as a table."""
    if records is None:
        return "(missing)"
    rows = ["| update | valid ppl | greedy BLEU (dev sample) | training s |", "|---:|---:|---:|---:|"]
    for r in records:
        bleu = r.get("valid_bleu")
        rows.append(f"| {r['update']} | {r['valid_ppl']:.1f} | {'-' if bleu is None else f'{bleu:.2f}'} | "
                    f"{r['elapsed']:.0f} |")
    return "\n".join(rows)


def _curves(runs: Path) -> str:
    """Each model's validations, and how far from converged the models of U updates stopped: what RNNsearch-50*,
    the same model trained 2.3 times as long, gained over RNNsearch-50 (the last stretch of one run says less: the
    budget recipe anneals the rate there)."""
    out, last = [], {}
    for m in NAMES:
        log = runs / m / "train.jsonl"
        records = _valid_records(str(log)) if log.is_file() else None
        if records:
            last[m] = records[-1]
        out.append(f"**{NAMES[m]}**\n\n{_curve(records)}")
    if "rnnsearch-50" in last and "rnnsearch-50star" in last:
        a, b = last["rnnsearch-50"], last["rnnsearch-50star"]
        out.insert(0, f"How far from converged: RNNsearch-50*, trained {b['update']:,} updates instead of "
                      f"{a['update']:,}, reached a validation perplexity of {b['valid_ppl']:.1f} against "
                      f"{a['valid_ppl']:.1f} ({1 - b['valid_ppl'] / a['valid_ppl']:.0%} lower): the models of U "
                      "updates stopped "
                      + ("far from converged." if b["valid_ppl"] < 0.9 * a["valid_ppl"] else "near a plateau."))
    return "\n\n".join(out)


def _better(a, b, p) -> str:
    if a is None or b is None:
        return "-"
    if a <= b:
        return "no"
    return "yes" if p is None or p < 0.05 else "not significant"


def _findings(sets: list[tuple[str, dict, dict]], by_length: list[tuple[str, dict]], aers: dict, samples: int) -> str:
    """The paper's claims, checked on this run by plain rules (the numbers are in the tables above). ``sets``:
    (label, report, scores) of each test set, ``by_length``: (label, report) of Figure 2's reports."""
    out = ["| The paper's finding | Test set | This run (BLEU) | p | Reproduced? |", "|---|---|---|---:|---|"]
    pairs = {}
    for better, worse, claim in CLAIMS:
        for label, report, scores in sets:
            if better not in scores or worse not in scores:
                continue
            p = None
            if scores[better] > scores[worse]:
                pairs.setdefault(label, Pairs(report, samples))
                p = pairs[label].p(better, worse)
            out.append(f"| {claim} | {label} | {better} {_fmt(scores[better])} vs {worse} {_fmt(scores[worse])} | "
                       f"{'-' if p is None else f'{p:.3f}'} | {_better(scores[better], scores[worse], p)} |")
    for label, report in by_length:
        try:
            split = _short_long(report)
        except Exception as e:  # the report still comes out
            out.append(f"| (sentence length) | {label} | could not be computed: {e} | - | - |")
            continue
        for search, encdec in (("RNNsearch-50", "RNNencdec-50"), ("RNNsearch-30", "RNNencdec-30")):
            if search not in split or encdec not in split:
                continue
            (ss, sl, _), (es, el, _) = split[search], split[encdec]
            if None in (ss, sl, es, el):
                out.append(f"| RNNencdec falls more than RNNsearch on long sentences | {label} | no sentences on one "
                           "side of 30 words | - | cannot be judged |")
                continue
            text = (f"{search} {sl:.2f}/{ss:.2f} = {sl / max(ss, 1e-9):.2f}, {encdec} {el:.2f}/{es:.2f} = "
                    f"{el / max(es, 1e-9):.2f}")
            verdict = ("cannot be judged: a model scores under 5 BLEU on the short sentences" if min(ss, es) < 5
                       else "yes" if sl / ss > el / es else "no")
            out.append(f"| RNNencdec falls more than RNNsearch on long sentences (BLEU on >= 30 words / on < 30) | "
                       f"{label} | {text} | - | {verdict} |")
        if "RNNsearch-50" in split:
            ss, _, far = split["RNNsearch-50"]
            verdict = ("cannot be judged: no sentences of 50 words or more, or none under 30" if None in (ss, far)
                       else "cannot be judged: under 5 BLEU on the short sentences" if ss < 5
                       else "yes" if far >= 0.9 * ss else "no")
            out.append(f"| RNNsearch-50 does not deteriorate up to 50 words and more (BLEU on >= 50 words within "
                       f"10% of that on < 30) | {label} | {_fmt(far)} vs {_fmt(ss)} | - | {verdict} |")
    aer, diag, efl = aers.get("aer"), aers.get("diagonal"), aers.get("eflomal")
    if aer and diag:
        out.append(f"| RNNsearch-50's attention aligns words (AER, lower is better) | Hansards trial | "
                   f"{aer['aer']:.3f}, the monotone diagonal {diag['aer']:.3f} | - | "
                   f"{'yes' if aer['aer'] < diag['aer'] else 'no'} |")
    for key, who in (("symmetrized", "the symmetrised attention of RNNsearch-50 and RNNsearch-50-fr-en"),
                     ("symmetrized-posterior", "the symmetrised alignment posterior of the same two models"),
                     ("guided-symmetrized-attention", "the symmetrised attention of RNNsearch-50 and "
                                                      "RNNsearch-50-fr-en after guided alignment (beyond the paper)"),
                     ("guided-symmetrized", "the symmetrised posterior of RNNsearch-50 and RNNsearch-50-fr-en after "
                                            "guided alignment (beyond the paper)"),
                     ("star-symmetrized", "the symmetrised attention of RNNsearch-50star and RNNsearch-50star-fr-en "
                                          "(the longer-trained pair, beyond the paper)"),
                     ("star-symmetrized-posterior", "the symmetrised posterior of RNNsearch-50star and "
                                                    "RNNsearch-50star-fr-en"),
                     ("star-guided-symmetrized-attention", "the symmetrised attention of RNNsearch-50star and "
                                                           "RNNsearch-50star-fr-en after guided alignment"),
                     ("star-guided-symmetrized", "the symmetrised posterior of RNNsearch-50star and "
                                                 "RNNsearch-50star-fr-en after guided alignment")):
        sym = aers.get(key)
        if not sym:
            continue
        best = min(sym["by_method"].items(), key=lambda kv: kv[1]["aer"])
        out.append(f"| (issue #37's goal) {who} at or below 0.25 AER | Hansards trial | "
                   f"{sym['symmetrization']} {sym['aer']:.3f} (best: {best[0]} {best[1]['aer']:.3f})"
                   + (f"; eflomal {efl['aer']:.3f}" if efl else "")
                   + f" | - | {'yes' if sym['aer'] <= 0.25 else 'no'} |")
    return "\n".join(out)


def report(a) -> None:
    """Write the filled template to ``a.out`` and the images into ``a.images`` beside it."""
    w = Path(a.work)
    ev = w / "eval"
    dest = Path(a.out).parent
    images = dest / a.images
    images.mkdir(parents=True, exist_ok=True)
    news, nounk = _load(ev / "newstest2014.json"), _load(ev / "newstest2014-nounk.json")
    news_len, hans_len = _load(ev / "newstest2014-by-length.json"), _load(ev / "hansards-test-by-length.json")
    hans = _load(ev / "hansards-test.json")
    aers = {k: _load(ev / ("aer.json" if k == "aer" else f"aer-{k}.json")) for k in AER_REPORTS}
    recase = _load(ev / "recase-en.json"), _load(ev / "recase-fr.json")
    budget = _load(w / "runs" / "budget.json")
    manifest = _load(w / "data-bin" / "manifest.json")
    settings = _load(w / "settings.json") or {}
    samples = int(settings.get("BOOTSTRAP") or 1000)

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
    sets = []
    if news:
        sets.append(("news-test-2014", news, _scores(news)))
    if nounk:
        sets.append((f"news-test-2014, no UNK ({nounk['sentences']} sentences)", nounk, _scores(nounk)))
    if hans:
        sets.append(("Hansards test", hans, _scores(hans)))
    by_length = [(label, r) for label, r in (("news-test-2014", news_len), ("Hansards test", hans_len)) if r]
    fields = {
        "settings": "\n".join(f"| {SETTING_NAMES.get(k, k)} | {v} |" for k, v in settings.items()),
        "sessions": _sessions(w),
        "data": _data_summary(w, manifest),
        "timings": _timings(w),
        "budget": _budget(budget),
        "curves": _curves(w / "runs"),
        "table1": table1(news, nounk) if news else "(missing)",
        "table1_bootstrap": _bootstrap_line(news) if news else "",
        "table1_model_subset": _model_subset(news),
        "table1_tok": table1(news, nounk, "BLEU-tok", paper=True) if news else "",
        "hansards": table1(hans, None) if hans else "(missing)",
        "hansards_bootstrap": _bootstrap_line(hans) if hans else "",
        "by_length_news": _by_length_table(news_len) if news_len else "(missing)",
        "by_length_hansards": _by_length_table(hans_len) if hans_len else "(missing)",
        "plot_news": img(ev / "bleu-by-length-newstest2014.png", "bleu-by-length-newstest2014.png"),
        "plot_hansards": img(ev / "bleu-by-length-hansards-test.png", "bleu-by-length-hansards-test.png"),
        "aer": _aer_table(aers),
        "recase": _recase_line(recase),
        "alignments": "\n\n".join(fig3) or "(missing)",
        "findings": _findings(sets, by_length, aers, samples) if news else "(missing)",
    }
    template = Path(a.template).read_text(encoding="utf-8")
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: str(fields.get(m.group(1), m.group(0))), template)
    rows = _session_rows(w)  # (the run: its first session's start, commit and what it was asked)
    text = keep_discussion(text, Path(a.out), _row(rows[0][:3]) if rows else None)
    write_lines(a.out, text.rstrip("\n").split("\n"))
    copied = copy_evidence(w, images / "eval")
    say(f"wrote {a.out} (images in {images}, {copied} files of evidence in {images / 'eval'})")


def _session_rows(work: Path) -> list[list[str]]:
    """The lines of ``sessions.tsv`` (run.sh writes one each time it starts): started, commit, what was asked, the
    stages it ran -- "(none)" if it ran none, "(not recorded)" on lines written before run.sh recorded them; a line
    cut short is padded with "?"."""
    path = work / "sessions.tsv"
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        if line.strip():
            cols = line.split("\t")
            ran = (cols[3] or "(none)") if len(cols) > 3 else "(not recorded)"
            rows.append((cols + ["?"] * 3)[:3] + [ran])
    return rows


def _row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def _sessions(work: Path) -> str:
    """The sessions the run took and the commit of each."""
    rows = _session_rows(work)
    if not rows:
        return "(no record)"
    commits = sorted({r[1] for r in rows})
    head = (f"All from one commit, {commits[0]}." if len(commits) == 1 else
            f"**From {len(commits)} commits** ({', '.join(commits)}): the run went on under other code.")
    return (head + "\n\n| started | commit | asked | stages it ran |\n|---|---|---|---|\n"
            + "\n".join(_row(r) for r in rows))


def _budget(budget: dict | None) -> str:
    if budget is None:
        return "a fixed number of updates (UPDATES), no calibration"
    jobs = ", ".join(f"{NAMES.get(j['name'], j['name'])} {j['updates']:,} ({j['seconds_per_update']:.2f} s/update "
                     "calibrated)" for j in budget["jobs"])
    return (f"U = {budget['updates']:,} updates, chosen so that the six trainings, {budget['slots']} at a time, "
            f"longest first, take about {budget['planned_minutes']:g} of the {budget['minutes']:g} minutes: {jobs}")


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
        rows.append(f"\nTraining pairs of at most 30 tokens a side (what the -30 models train on): {short:,}; of "
                    f"at most 50 (the -50 models): {int(((src <= 50) & (tgt <= 50)).sum()):,}.")
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
    order = ["data", "prepare", "train", "translate", "score", "twin", "guide", "align", "report"]  # (run.sh's)
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


def _aer_table(aers: dict) -> str:
    rows = ["| Alignment of the Hansards trial set (37 pairs, 338 Sure + 1,446 Possible links) | AER | precision "
            "| recall |", "|---|---:|---:|---:|"]

    def row(label, r):
        rows.append(f"| {label} | {_fmt(r['aer'], 3)} | {_fmt(r['precision'], 3)} | {_fmt(r['recall'], 3)} |")

    for label, key in (("RNNsearch-50, forced decoding, trial text recased (argmax links)", "aer"),
                       ("RNNsearch-50, forced decoding, trial text as distributed (lowercased)", "lowercased")):
        if aers.get(key):
            row(label, aers[key])
    efl = aers.get("eflomal") or {}
    if aers.get("posterior"):
        row("RNNsearch-50, its alignment posterior (`--method posterior`), recased", aers["posterior"])
    if aers.get("guided"):
        row("RNNsearch-50 after guided alignment (stage guide), its attention, recased", aers["guided"])
    if aers.get("star"):
        row("RNNsearch-50star (trained longer), its attention, recased", aers["star"])
    for who, key in (("RNNsearch-50 with RNNsearch-50-fr-en, attention, recased", "symmetrized"),
                     ("the same two, alignment posterior, recased", "symmetrized-posterior"),
                     ("the same two after guided alignment, attention, recased", "guided-symmetrized-attention"),
                     ("the same two after guided alignment, alignment posterior, recased", "guided-symmetrized"),
                     ("RNNsearch-50star with RNNsearch-50star-fr-en (stage twin), attention, recased",
                      "star-symmetrized"),
                     ("the same two, alignment posterior, recased", "star-symmetrized-posterior"),
                     ("the same two after guided alignment, attention, recased", "star-guided-symmetrized-attention"),
                     ("the same two after guided alignment, alignment posterior, recased", "star-guided-symmetrized"),
                     (f"eflomal on the training pairs ({efl.get('train_pairs', '?')} and the trial's, lowercased)",
                      "eflomal")):
        r = aers.get(key)
        for method, scores in (r or {}).get("by_method", {}).items():
            row(f"{who}: {method}" + (" (chosen)" if method == r.get("symmetrization") else ""), scores)
    if aers.get("diagonal"):
        row("monotone diagonal (no model)", aers["diagonal"])
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
    report(p.parse_args(argv))


if __name__ == "__main__":
    main()
