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
log-likelihood under the model (teacher forced, batched). Beside the scores, :class:`Diagnostics` counts what a
reader notices and the scores hide: the source's numbers a translation carries, the lines that repeat a word n-gram
the reference does not, and ``<unk>`` per line.

The package's modules: the inputs (``inputs``), the metrics and the bootstrap (``metrics``), the no-UNK subset and
the length buckets (``subsets``), the model likelihood (``likelihood``), the reader's figures (``diagnostics``) and
the whole report (``report``). Their public names are importable from the package itself
(``nmtkit.score.evaluate``), each looked up in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "read_lines": "inputs", "guess_lang": "inputs", "system_names": "inputs", "read_inputs": "inputs",
    "METRICS": "metrics", "REGISTRY": "metrics", "Metric": "metrics", "moses_tokenize": "metrics",
    "SentenceMetric": "metrics", "make_metrics": "metrics", "paired_bootstrap": "metrics", "Shortlist":
    "subsets", "shortlist_from_checkpoint": "subsets", "shortlist_from_prepared": "subsets", "no_unk_rows":
    "subsets", "Buckets": "subsets", "length_buckets": "subsets", "model_nll": "likelihood", "ScoreConfig":
    "report", "evaluate": "report", "Diagnostics": "diagnostics", "numbers": "diagnostics",
    "excess_repeats": "diagnostics",
})
