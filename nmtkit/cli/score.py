"""``nmt-score``: translations + reference → BLEU/chrF with signatures, no-UNK subset, by-length, bootstrap, NLL;
and beside them numbers carried, repeats and ``<unk>`` per line (nmtkit.score.diagnostics).

The command parses options into :class:`nmtkit.score.ScoreConfig`, calls :func:`nmtkit.score.evaluate` and prints
its report, as a table (the paper's Table 1 layout, signatures under it) or as JSON (``--json``), on stdout.
"""

from __future__ import annotations

import json
import sys

import click

from nmtkit.cli import CONTEXT, ToolCommand, config_options, run, setup_logging
from nmtkit.score.report import ScoreConfig


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned others, two spaces between columns."""
    widths = [max(len(r[c]) for r in [header] + rows) for c in range(len(header))]
    out = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(r[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
    return out


def render_text(report: dict) -> str:
    """The report of :func:`nmtkit.score.evaluate` as plain text: one table with a column per score and a row per
    system, then each column's signature; then the by-length table, the bootstrap tests and the NLL."""
    metrics = list(report["metrics"])
    lines = [f"{report['sentences']} sentences; reference {report['reference']}"
             + (f"; source {report['source']}" if report["source"] else "")]
    header = ["system"] + metrics
    no_unk = report["no_unk"]
    if no_unk:
        header += [f"{m} no-UNK" for m in metrics]
    rows = []
    for s in report["systems"]:
        row = [s["name"]] + [_num(s["scores"][m]["score"]) for m in metrics]
        if no_unk:
            row += [_num(no_unk["scores"][s["name"]][m]) for m in metrics]
        rows.append(row)
    lines += [""] + _table(header, rows) + [""]
    key = max(len(m) for m in metrics) + 1
    for m, info in report["metrics"].items():
        lines.append(f"{m.ljust(key)} {info['signature']}  [{info['description']}]")
    if no_unk:
        lines.append(f"{'no-UNK'.ljust(key)} {no_unk['sentences']} of {no_unk['of']} sentences have no token outside "
                     f"the shortlists ({no_unk['shortlist_sizes']['source']} source / "
                     f"{no_unk['shortlist_sizes']['target']} target entries of {no_unk['shortlist']}) in source "
                     "or reference")
    lines += _noticed(report)
    by = report["by_length"]
    if by:
        lines += ["", f"{by['metric']} by sentence length, in {by['unit']}: {by['signature']}"]
        names = list(by["scores"])
        rows = [[label, str(n)] + [_num(by["scores"][name][k]) for name in names]
                for k, (label, n) in enumerate(zip(by["labels"], by["counts"]))]
        rows.append(["all", str(sum(by["counts"]))]
                    + [_num(s["scores"][by["metric"]]["score"]) for s in report["systems"]])
        lines += _table(["length", "n"] + names, rows)
    for test in report["bootstrap"] or []:
        lines += ["", f"Paired bootstrap resampling, {test['metric']} ({test['samples']} resamples; baseline "
                      f"{test['systems'][0]['name']}): {test['signature']}"]
        rows = [[r["name"], _num(r["score"]), f"{_num(r['mean'])} ± {_num(r['ci'])}",
                 "baseline" if r["p_value"] is None else _num(r["p_value"], 4)
                 + (" *" if r["p_value"] < 0.05 else "")] for r in test["systems"]]
        lines += _table(["system", test["metric"], "mean ± 95% CI", "p"], rows)
    if report["bootstrap"]:
        lines.append("(* p < 0.05: the difference from the baseline is significant)")
    nll = report["nll"]
    if nll:
        lines += ["", f"NLL of the references under {nll['model']} (teacher forced, nats): "
                      f"{nll['per_sentence']:.3f} per sentence ({nll['sentences']} sentences), "
                      f"{_num(nll['per_word'], 4)} per word ({nll['words']} Moses words), "
                      f"{nll['per_token']:.4f} per token ({nll['tokens']} model tokens incl. </s>; "
                      f"perplexity {nll['perplexity']:.2f})"]
    if report["plot"]:
        lines += ["", f"plot: {report['plot']}"]
    return "\n".join(lines) + "\n"


def _noticed(report: dict) -> list[str]:
    """The diagnostics (nmtkit.score.diagnostics): one line per system, after a heading that says how numbers were
    read, or why they were not checked."""
    from nmtkit.score.diagnostics import summary

    diag = report["diagnostics"]
    n = diag["repeat_ngram"]
    how = diag["note"] or (f"numbers: the {report['source_lang']} source's, read in the {report['target_lang']} "
                           "translations")
    out = ["", f"What a reader notices ({how}; repeats: the lines that say a word {n}-gram more often than the "
               "reference does; any: the lines that say one twice at all):"]
    width = max(len(s["name"]) for s in report["systems"])
    out += [f"  {s['name'].ljust(width)}  {summary(s['diagnostics'], diag['reference'])}" for s in report["systems"]]
    if diag["reference"].get("terms") is not None:
        from nmtkit.score.terms import summary as terms_summary

        out += [f"  {s['name'].ljust(width)}  {terms_summary(s['diagnostics']['terms'], diag['reference']['terms'])}"
                for s in report["systems"]]
    return out


@click.command(cls=ToolCommand, context_settings=CONTEXT)
@click.argument("hypotheses", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@config_options(ScoreConfig)
@click.option("--metrics", default=",".join(ScoreConfig.__dataclass_fields__["metrics"].default), show_default=True,
              help="The scores to give, comma-separated, in this order (TER is by far the slowest to compute).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", "-q", is_flag=True)
def main(hypotheses, metrics, as_json, quiet, **settings):
    """Score one or more translations of the same source against a reference, side by side.

    BLEU is sacreBLEU's detokenized BLEU and chrF its chrF2, each printed with its signature; BLEU-tok is the
    paper-era tokenized BLEU (Moses-tokenized text, multi-bleu.perl style), not comparable with sacreBLEU.
    With --model or --vocab the same scores are given on the sentences with no unknown word in source or
    reference (Table 1's second column), with the subset's size. Beside the scores, what a reader notices: the
    share of the source's numbers each translation carries (needs -s), the lines that repeat a word n-gram the
    reference does not repeat, and <unk> per line.

    \b
      nmt-score -r newstest2014.fr rnnsearch.fr rnnencdec.fr moses.fr
      nmt-score -r newstest2014.fr -s newstest2014.en -m model.pt --by-length --plot len.png --bootstrap 1000 \\
          rnnsearch.fr moses.fr
    """
    from nmtkit.settings import from_options

    cfg = from_options(ScoreConfig, settings, hypotheses=list(hypotheses),
                       metrics=[m.strip() for m in metrics.split(",") if m.strip()])
    setup_logging(quiet)
    run("nmt-score", lambda: _score(cfg, as_json))


def _score(cfg, as_json: bool) -> None:
    import logging

    from nmtkit.score import evaluate

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)
    report = evaluate(cfg)
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n" if as_json else render_text(report)
    sys.stdout.write(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main(prog_name="nmt-score")
