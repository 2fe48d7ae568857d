"""Cross-entropy-difference data selection (the library behind ``nmt-select``).

Axelrod, He & Gao (2011), "Domain adaptation via pseudo in-domain data selection", bilingual form; Moore & Lewis
(2010) with one side only. The paper reduced 850M words of WMT'14 English–French to 348M this way. Per language:

1. **In-domain LM** (:mod:`nmtkit.select.lm`): order-N interpolated modified Kneser–Ney on the in-domain text, every
   ``heldout_every``-th pair held out to report perplexities. The vocabulary is the in-domain words seen at least
   ``min_count`` times (Moore & Lewis), shared by both models of the language; other words are ``<unk>``.
2. **General LMs, cross-fitted**: the general pairs are cut into two folds by a hash of their position in the
   general input (:func:`nmtkit.select.config.fold_of`). General model k is trained on a random sample (``seed``) of
   about the in-domain size in raw words drawn from the *other* fold only, and scores the pairs of fold k. So no
   pair is ever scored by a model trained on it: a model scoring its own training sentences finds them far more
   "general" than the in-domain model finds them in-domain (tests/bench/results/bench_select_enrichment.txt), and
   such pairs are never selected whatever their domain.  Copies of a sentence fall in both folds, as they would in
   any held-out sample: a line the general corpus repeats thousands of times (the Hansards' ``* * *``)
   is general, and its scoring model has seen it.  (Folds by a hash of the text kept every copy away from the
   model that scores it: on the whole Hansards those repeated lines then scored as the least general of all and
   crowded out the news, bench_select_enrichment.txt.)
3. **Scores**: every general pair gets ``score = Σ_lang [H_in(side) - H_gen(side)]``, H the per-token cross-entropy
   in bits (-log2 P(sentence) / (tokens + 1), ``</s>`` counted as a token), H_gen under its fold's general model;
   lower is more in-domain-like. A pair with an empty scored side gets no score and is never selected.
4. **Selection**: the lowest scores (ties: earlier pair first) until ``top_words`` source tokens (the scored side's
   in monolingual mode) or ``top_pairs`` pairs, or every pair with score < ``threshold``; written as the original
   lines, in their original order, with a scores file and a JSON report.

The scores file and the scoring workers are in :mod:`nmtkit.select.scores`.

Text goes through :class:`nmtkit.data.text.Preprocessor` as in ``nmt-prepare``. The general corpus is streamed four
times (count and validate, sample, score, write); memory is bounded by the models and a few numbers per general
pair. ``workers`` tokenise and score in parallel processes (:class:`nmtkit.parallel.Mapper`) with the same
results as one. Outputs are written atomically, all at the end: an error leaves none behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np

from nmtkit import __version__
from nmtkit.errors import InputError
from nmtkit.files import atomic_file, read_parallel, read_segments, resolve_prefix
from nmtkit.select.config import FOLDS, SelectConfig, fold_of, output_paths
from nmtkit.select.lm import LMVocab, NgramLM
from nmtkit.select.lm_arpa import write_arpa
from nmtkit.select.lm_count import NgramCounter
from nmtkit.parallel import Mapper
from nmtkit.select.scores import init_worker, score_pairs, tokenize_chunk, write_scores
from nmtkit.data.text import TextConfig

log = logging.getLogger("nmtkit.select")


# -- reading -------------------------------------------------------------------------------------------------------


def _resolve(prefix: str, langs: list[str]) -> tuple[str, ...]:
    if len(langs) == 2:
        return resolve_prefix(prefix, *langs)
    if "," in prefix:
        raise InputError(f"'{prefix}': a monolingual corpus is one PREFIX (PREFIX.{langs[0]}), not SRC,TGT")
    return resolve_prefix(prefix, langs[0], langs[0])[:1]


def _read(corpora: list[tuple[str, ...]]) -> Iterator[tuple[int, int, tuple[str, ...]]]:
    """(corpus number from 1, line number, text of each file) for every line or pair of the corpora, in order."""
    for k, files in enumerate(corpora, start=1):
        if len(files) == 1:
            for seg in read_segments(files[0]):
                yield k, seg.line, (seg.text,)
        else:
            for s, t in read_parallel(*files):
                yield k, s.line, (s.text, t.text)


def _create(directory: str, name: str):
    return open(os.path.join(directory, name), "w", encoding="utf-8", newline="\n")


def _write_tokens(handles: list, tokens: list[list[str]]) -> None:
    for f, words in zip(handles, tokens):
        f.write(" ".join(words) + "\n")


def _read_tokens(path: str) -> Iterator[list[str]]:
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line[:-1]
            yield line.split(" ") if line else []


# -- the steps -----------------------------------------------------------------------------------------------------


def _in_domain(cfg: SelectConfig, mapper: Mapper, files: list[tuple[str, ...]], tmp: str) -> tuple[list, dict]:
    """Tokenise the in-domain text into ``tmp/{in,held}.<lang>``; the vocabularies and statistics."""
    scored, every = cfg.scored, cfg.heldout_every
    stats = {"inputs": [list(f) for f in files], "pairs": 0, "heldout_pairs": 0, "raw_words": 0,
             "tokens": dict.fromkeys(scored, 0)}
    counts = [Counter() for _ in scored]

    def texts():
        for i, (_, _, item) in enumerate(_read(files)):
            if not (every and i % every == every - 1):
                stats["raw_words"] += sum(len(t.split()) for t in item)
            yield item

    with contextlib.ExitStack() as stack:
        train = [stack.enter_context(_create(tmp, f"in.{lang}")) for lang in scored]
        held = [stack.enter_context(_create(tmp, f"held.{lang}")) for lang in scored]
        for i, toks in enumerate(mapper.map(tokenize_chunk, texts())):
            stats["pairs"] += 1
            if every and i % every == every - 1:
                stats["heldout_pairs"] += 1
                _write_tokens(held, toks)
                continue
            _write_tokens(train, toks)
            for c, words in zip(counts, toks):
                c.update(words)
    for j, lang in enumerate(scored):
        stats["tokens"][lang] = counts[j].total()
        if not counts[j]:
            held = f" (after holding out 1 pair in {every})" if every else ""
            raise InputError(f"the in-domain data has no {lang} words{held} to train a language model on",
                             ", ".join(f[j] for f in files))
    return [LMVocab.build(c, cfg.min_count) for c in counts], stats


def _general_sizes(files: list[tuple[str, ...]], col: list[int]) -> tuple[list[int], list[int], np.ndarray]:
    """Lines of each general corpus, raw (whitespace) words of the scored sides of each fold, and each pair's fold
    (int8, one byte per pair); validates the whole input."""
    lines, raw, folds = [0] * len(files), [0] * FOLDS, bytearray()
    for i, (k, _, item) in enumerate(_read(files)):
        lines[k - 1] += 1
        texts = tuple(item[c] for c in col)
        fold = fold_of(i)
        folds.append(fold)
        raw[fold] += sum(len(t.split()) for t in texts)
    return lines, raw, np.frombuffer(bytes(folds), dtype=np.int8)


def _draw_samples(fold: np.ndarray, raw: list[int], in_raw: int, seed: int) -> np.ndarray:
    """(pairs,) int8: which general model's sample each pair is in (-1: none), given each pair's fold. Model k's
    sample is drawn from the pairs of the other fold(s), about as many raw words as the in-domain training text."""
    take = np.full(len(fold), -1, dtype=np.int8)
    rng = np.random.default_rng(seed)
    for k in range(FOLDS):
        pool = np.flatnonzero(fold != k)
        others = sum(raw) - raw[k]
        size = min(len(pool), max(1, round(len(pool) * in_raw / max(others, 1))))
        take[rng.choice(pool, size, replace=False, shuffle=False)] = k
    return take


def _sample(cfg: SelectConfig, mapper: Mapper, files, col, take: np.ndarray, tmp: str) -> dict:
    """Tokenise the general pairs of each model's sample (``take``) into ``tmp/gen<k>.<lang>``."""
    tokens = [dict.fromkeys(cfg.scored, 0) for _ in range(FOLDS)]
    model = take[take >= 0]  # the model of each sampled pair, in corpus order (the mapper keeps the order)
    picked = (tuple(item[c] for c in col) for i, (_, _, item) in enumerate(_read(files)) if take[i] >= 0)
    with contextlib.ExitStack() as stack:
        out = [[stack.enter_context(_create(tmp, f"gen{k}.{lang}")) for lang in cfg.scored] for k in range(FOLDS)]
        for n, toks in enumerate(mapper.map(tokenize_chunk, picked)):  # one pass over the general corpus
            k = int(model[n])
            _write_tokens(out[k], toks)
            for lang, words in zip(cfg.scored, toks):
                tokens[k][lang] += len(words)
    return {"seed": cfg.seed, "models": [{"scores_fold": k, "pairs": int((take == k).sum()), "tokens": tokens[k]}
                                         for k in range(FOLDS)]}


def _train_lm(path: str, vocab: LMVocab, order: int) -> NgramLM:
    counter = NgramCounter(order, len(vocab))
    for words in _read_tokens(path):
        counter.add(vocab.ids(words))
    return NgramLM.estimate(counter.finish(), vocab)


def _perplexity(lm: NgramLM, path: str, batch: int = 10000) -> float | None:
    total, tokens = 0.0, 0
    sentences = _read_tokens(path)
    while block := [s for _, s in zip(range(batch), sentences)]:
        total += float(lm.sentence_logprobs(block).sum())
        tokens += sum(len(s) + 1 for s in block)
    return 10.0 ** (-total / tokens) if tokens else None


def _model_report(lm: NgramLM, heldout: str) -> dict:
    return {"ngrams": lm.sizes(), "discounts": [list(d) for d in lm.discounts[1:]],
            "discount_fallback": lm.discount_fallback[1:], "trained_on": {"sentences": lm.sentences,
                                                                           "tokens": lm.tokens},
            "heldout_perplexity": _perplexity(lm, heldout)}


def _choose(cfg: SelectConfig, score: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, float | None]:
    """The selection mask over the general pairs, and the highest selected score."""
    # lowest score first, ties: earlier pair first; argsort puts the nan (unscored) pairs last, and they are cut off
    ranked = np.argsort(score, kind="stable")[:int(np.count_nonzero(~np.isnan(score)))]
    unit = "source" if cfg.side != "target" else "target"
    if cfg.threshold is not None:
        chosen = ranked[score[ranked] < cfg.threshold]
    elif cfg.top_pairs is not None:
        if cfg.top_pairs > len(ranked):
            raise InputError(f"--top-pairs {cfg.top_pairs:,} asks for more pairs than the general corpus has "
                             f"({len(ranked):,} scored pairs of {len(score):,})")
        chosen = ranked[:cfg.top_pairs]
    else:
        cum = np.cumsum(words[ranked], dtype=np.int64)
        if len(cum) == 0 or cfg.top_words > cum[-1]:
            have = int(cum[-1]) if len(cum) else 0
            raise InputError(f"--top-words {cfg.top_words:,} asks for more {unit} words than the general corpus has "
                             f"({have:,} in {len(ranked):,} scored pairs)")
        chosen = ranked[:int(np.searchsorted(cum, cfg.top_words)) + 1]
    mask = np.zeros(len(score), dtype=bool)
    mask[chosen] = True
    return mask, (float(score[chosen[-1]]) if len(chosen) else None)


def _check_outputs(outputs: list[str], inputs: list[tuple[str, ...]]) -> None:
    given = {os.path.realpath(p) for files in inputs for p in files}
    if len({os.path.realpath(p) for p in outputs}) < len(outputs):
        raise InputError(f"two outputs would be the same file ({', '.join(outputs)}); choose another --scores")
    for path in outputs:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise InputError("no such directory for the outputs", parent)
        if os.path.realpath(path) in given:
            raise InputError("is an input; choose another output prefix", path)
        if os.path.isdir(path):
            raise InputError("is a directory; the outputs are files OUT_PREFIX.<lang>, OUT_PREFIX.scores, ...", path)


def _write(cfg: SelectConfig, paths: dict, files, mask: np.ndarray, details: str, models: list,
           report: dict) -> None:
    """Write every output through temporary files, renamed into place together at the end."""
    scored = cfg.scored
    with contextlib.ExitStack() as stack:
        text = [stack.enter_context(atomic_file(paths[lang])) for lang in cfg.langs]
        for i, (_, _, item) in enumerate(_read(files)):
            if mask[i]:
                for f, t in zip(text, item):
                    f.write(t + "\n")
        with open(details, encoding="utf-8", newline="\n") as rows:
            write_scores(stack.enter_context(atomic_file(paths["scores"])), scored, files, rows, mask)
        for j, lang in enumerate(scored):
            named = [("in", models[j][1], "in-domain")] + [
                (f"gen{k}", lm, f"general (scores fold {k}, trained on a sample of the other fold)")
                for k, lm in enumerate(models[j][2])]
            for name, lm, what in named:
                if (name, lang) in paths:
                    write_arpa(lm, stack.enter_context(atomic_file(paths[name, lang])),
                               f"{what} {lang} model of nmt-select")
        f = stack.enter_context(atomic_file(paths["report"]))
        f.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")



# -- the pipeline --------------------------------------------------------------------------------------------------


def select(cfg: SelectConfig) -> dict:
    """Run the whole selection; returns the report also written to ``OUTPUT.report.json``."""
    cfg.check()
    langs, scored = cfg.langs, cfg.scored
    col = [langs.index(lang) for lang in scored]  # where the scored sides are in a general item
    in_files = [_resolve(p, scored) for p in cfg.in_domain]
    gen_files = [_resolve(p, langs) for p in cfg.general]
    paths = output_paths(cfg)
    _check_outputs(list(paths.values()), in_files + gen_files)
    text_cfgs = [TextConfig(lang, cfg.normalize_punctuation, cfg.aggressive_dash_splits, cfg.lowercase).to_dict()
                 for lang in scored]
    report: dict = {"format": "nmt-select-report", "format_version": 1, "nmtkit_version": __version__,
                    "settings": asdict(cfg), "preprocessing": text_cfgs}
    tmp_parent = os.path.dirname(os.path.abspath(paths["scores"]))
    seconds = report["seconds"] = {}  # wall time of each step, for benchmarks
    clock = [time.perf_counter()]

    def lap(step: str) -> None:
        now = time.perf_counter()
        seconds[step] = round(now - clock[0], 3)
        clock[0] = now

    with tempfile.TemporaryDirectory(dir=tmp_parent, prefix=".nmt-select.") as tmp:
        with Mapper(cfg.workers, init_worker, (text_cfgs, None)) as mapper:
            vocabs, report["in_domain"] = _in_domain(cfg, mapper, in_files, tmp)
            log.info("in-domain: %d pairs (%d held out), %s", report["in_domain"]["pairs"],
                     report["in_domain"]["heldout_pairs"], _tokens_text(report["in_domain"]["tokens"]))
            lap("in_domain_tokenize")
            lines, raw_words, folds = _general_sizes(gen_files, col)
            total = sum(lines)
            if total == 0:
                raise InputError("the general corpus is empty", ", ".join(f[0] for f in gen_files))
            if np.bincount(folds, minlength=FOLDS).min() == 0:
                raise InputError(f"the general corpus's {total} pair(s) all fall in one fold: each half is scored by "
                                 "a model trained on the other, so both halves need a pair (give more pairs)",
                                 ", ".join(f[0] for f in gen_files))
            lap("general_read")
            take = _draw_samples(folds, raw_words, report["in_domain"]["raw_words"], cfg.seed)
            sample = _sample(cfg, mapper, gen_files, col, take, tmp)
            del take
            lap("sample_tokenize")
            log.info("general: %d pairs in %d corpora; LM samples (seed %d), each from the other fold: %s", total,
                     len(gen_files), cfg.seed, "; ".join(f"{m['pairs']} pairs, {_tokens_text(m['tokens'])}"
                                                          for m in sample["models"]))

        models, report["models"] = [], {}
        for j, lang in enumerate(scored):
            lm_in = _train_lm(os.path.join(tmp, f"in.{lang}"), vocabs[j], cfg.order)
            lm_gens = tuple(_train_lm(os.path.join(tmp, f"gen{k}.{lang}"), vocabs[j], cfg.order)
                            for k in range(FOLDS))
            models.append((vocabs[j], lm_in, lm_gens))
            held = os.path.join(tmp, f"held.{lang}")
            report["models"][lang] = {"order": cfg.order, "vocab": len(vocabs[j]), "min_count": cfg.min_count,
                                      "in": _model_report(lm_in, held),
                                      "gen": [_model_report(lm, held) for lm in lm_gens]}
            _log_models(lang, report["models"][lang])
        lap("lm_count_estimate")

        details = os.path.join(tmp, "scores")
        with _create(tmp, "scores") as rows:
            pairs = ((k, line, tuple(item[c] for c in col)) for k, line, item in _read(gen_files))
            score, tokens = score_pairs(pairs, folds, cfg.workers, text_cfgs, models, rows)
        lap("score")
        mask, last = _choose(cfg, score, tokens[:, 0])
        report["general"] = {"inputs": [list(f) for f in gen_files], "pairs": lines, "raw_words": sum(raw_words),
                             "tokens": {lang: int(tokens[:, j].sum()) for j, lang in enumerate(scored)},
                             "unscored_pairs": int(np.isnan(score).sum()), "sample": sample}
        report["selected"] = {"pairs": int(mask.sum()), "last_score": last,
                              "tokens": {lang: int(tokens[mask, j].sum()) for j, lang in enumerate(scored)}}
        lap("choose")
        _write(cfg, paths, gen_files, mask, details, models, report)
        lap("write")
    sel, gen = report["selected"], report["general"]
    log.info("selected %d of %d pairs (%.1f%%), %s (%.1f%% of the %s words); highest score selected: %s",
             sel["pairs"], total, 100 * sel["pairs"] / total, _tokens_text(sel["tokens"]),
             100 * sel["tokens"][scored[0]] / max(gen["tokens"][scored[0]], 1), scored[0],
             "none" if last is None else f"{last:.4f}")
    if not sel["pairs"]:
        log.warning("no pair has a score below the threshold %s: the selection is empty", cfg.threshold)
    log.info("wrote %s", ", ".join(paths.values()))
    return report


def _tokens_text(tokens: dict) -> str:
    return ", ".join(f"{n:,} {lang} tokens" for lang, n in tokens.items())


def _log_models(lang: str, m: dict) -> None:
    fallback = any(m["in"]["discount_fallback"] + [x for g in m["gen"] for x in g["discount_fallback"]])
    log.info("%s LMs (order %d, vocabulary %d): in-domain %s n-grams, general %s; held-out in-domain perplexity "
             "%.1f (in-domain LM) vs %s (general LMs)%s", lang, m["order"], m["vocab"],
             "/".join(map(str, m["in"]["ngrams"])), " and ".join("/".join(map(str, g["ngrams"])) for g in m["gen"]),
             m["in"]["heldout_perplexity"] or float("nan"),
             " and ".join(f"{g['heldout_perplexity'] or float('nan'):.1f}" for g in m["gen"]),
             " (fallback discounts for a tiny corpus)" if fallback else "")
