#!/usr/bin/env python3
"""A glossary the translation obeys (``nmt-translate --terms``, issue 58): term use, BLEU and chrF with and without
the glossary, and the speed on lines it does not touch.  One command, run alone from a clean commit::

    python tests/bench/bench_terms.py --model M [--prepared DIR]    # bench_terms.txt (about 15 minutes)

As the WMT terminology work evaluates (Dinu et al. 2019; the WMT 2021/2023 terminology tasks):

- **The glossary** comes from data the model did not train on: eflomal's links (forward and reverse,
  grow-diag-final-and) over the Hansards development sittings, Moses-tokenised; phrase pairs of 1-3 source and 1-4
  target words consistent with the links, whose edge words are no function words, the target not a copy of the
  source; kept where the pair was extracted at least ``--min-count`` times and the target term stands in the
  reference of at least ``--min-cooccurrence`` of the development lines whose source has the source term; the
  ``--size`` most frequent.  It is written beside the report (``bench_terms-glossary.tsv``).
- **The lines**: hansards/test and news-test-2014, split into those where nmt-translate finds glossary terms in the
  source and the reference uses every one of them (Dinu et al.'s test lines; ``--term-lines`` of them spread
  evenly), and those without a glossary term (``--plain-lines`` spread evenly); lines whose reference translates a
  term otherwise are counted and not scored.
- **Term use**: of the (line, term) pairs nmt-translate requires, the share whose target variant stands in the
  output as whole words (Moses-tokenised, exact case), without and with ``--terms``.
- **Quality**: sacreBLEU and chrF on the lines with terms and on the others, without and with ``--terms``; the
  lines without terms must come out the same (the option must not touch them).
- **Speed**: lines/s of nmt-translate on the lines without terms, with and without ``--terms``, ``--repeats``
  interleaved runs, median and range (process start-up and loading included).

Every run is an ``nmt-translate`` process with ``examples/one-hour.sh``'s decoding options (beam 12, no repeated
4-gram, numbers from the source, all of them, the candidate lists of ``--prepared``) and its default threads and
workers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from nmtkit.score.terms import stands_in  # noqa: E402  (nmt-score --terms' match)
from peers import BenchError, Goal, log, median, table  # noqa: E402

DECODE_OPTIONS = ["--beam", "12", "--no-repeat-ngram", "4", "--source-numbers", "--all-numbers"]
# function words that may not begin or end a term (a term is a content phrase: "Standing Committee", not "the")
STOP = {
    "en": set("a an the of to in on at for by with from and or but as is are was were be been it its this that these "
              "those he she we you they i my our your his her their not no do does did has have had will would can "
              "could shall should may might must there here which who whom what when where why how all any some "
              "such than then so if into about over under up out also very mr mrs ms".split()),
    "fr": set("le la les l' un une des de du d' à au aux en et ou mais que qu' qui quoi dont où ce cet cette ces il "
              "elle ils elles on nous vous je j' me m' te t' se s' lui leur leurs son sa ses mon ma mes ton ta tes "
              "notre nos votre vos ne n' pas plus est sont était être été a ont avait avoir par pour sur dans avec "
              "sans sous entre comme si y c' ça cela ceci tout tous toute toutes aussi très m. mme".split()),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a checkpoint trained on --prepared")
    p.add_argument("--prepared", type=Path, help="its prepared directory, with candidates.npz (default: "
                                                 "peers.prepare_hour's)")
    p.add_argument("--size", type=int, default=400, help="glossary entries (default: %(default)s)")
    p.add_argument("--min-count", type=int, default=3)
    p.add_argument("--min-cooccurrence", type=float, default=0.6)
    p.add_argument("--term-lines", type=int, default=600)
    p.add_argument("--plain-lines", type=int, default=600)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path("/tmp/nmtkit-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--allow-dirty", action="store_true")
    return p.parse_args(argv)


def content(words: tuple[str, ...], lang: str) -> bool:
    """A phrase fit to be a term: its edge words are words (a letter in them) and no function words, and it has a
    word of 3 letters or more."""
    stop = STOP[lang]
    return all(w.lower() not in stop and any(c.isalpha() for c in w) for w in (words[0], words[-1])) and \
        any(sum(c.isalpha() for c in w) >= 3 for w in words)


def phrase_pairs(src: list[str], tgt: list[str], links: set[tuple[int, int]], max_src: int = 3, max_tgt: int = 4):
    """The phrase pairs (source words, target words) consistent with the links (Och & Ney's extraction, tight: no
    unaligned edge words)."""
    by_src = defaultdict(set)
    by_tgt = defaultdict(set)
    for i, j in links:
        by_src[i].add(j)
        by_tgt[j].add(i)
    for i1 in range(len(src)):
        for i2 in range(i1, min(len(src), i1 + max_src)):
            js = {j for i in range(i1, i2 + 1) for j in by_src[i]}
            if not js:
                continue
            j1, j2 = min(js), max(js)
            if j2 - j1 >= max_tgt or any(not (i1 <= i <= i2) for j in range(j1, j2 + 1) for i in by_tgt[j]):
                continue
            if not by_src[i1] or not by_src[i2]:
                continue
            yield tuple(src[i1: i2 + 1]), tuple(tgt[j1: j2 + 1])


def build_glossary(a, src_lang: str, tgt_lang: str) -> tuple[list[tuple[str, str]], dict]:
    """The glossary's (source term, target term) pairs from the Hansards development sittings, and what it was
    built from."""
    sys.path.insert(0, str(peers.REPO / "examples"))
    from eflomal_aer import run_eflomal  # noqa: E402

    from nmtkit.data.text import Preprocessor, TextConfig
    from nmtkit.symmetrize import symmetrize

    root = peers.data_root() / "hansards" / "dev"
    pre = {lang: Preprocessor(TextConfig(lang)) for lang in (src_lang, tgt_lang)}
    raw = {lang: Path(f"{root}.{lang}").read_text(encoding="utf-8").splitlines() for lang in (src_lang, tgt_lang)}
    words = {lang: [pre[lang].words(line) for line in raw[lang]] for lang in raw}
    t0 = time.perf_counter()
    fwd, rev, _ = run_eflomal([" ".join(w).lower() for w in words[src_lang]],
                              [" ".join(w).lower() for w in words[tgt_lang]], None)
    took = time.perf_counter() - t0
    pairs, sources = Counter(), Counter()
    for s, t, f, r in zip(words[src_lang], words[tgt_lang], fwd, rev):
        if not s or not t:
            continue
        links = symmetrize([tuple(map(int, x.split("-"))) for x in f.split()],
                           [tuple(map(int, x.split("-"))) for x in r.split()], "grow-diag-final-and")
        for sp, tp in set(phrase_pairs(s, t, links)):
            sources[sp] += 1
            if content(sp, src_lang) and content(tp, tgt_lang) and [w.lower() for w in sp] != [w.lower() for w in tp]:
                pairs[sp, tp] += 1
    best = {}
    for (sp, tp), n in pairs.most_common():
        if n >= a.min_count and sp not in best:
            best[sp] = (tp, n)
    kept = []
    for sp, (tp, n) in sorted(best.items(), key=lambda kv: -kv[1][1]):
        lines = [k for k, s in enumerate(words[src_lang]) if stands_in(s, sp)]
        co = sum(stands_in(words[tgt_lang][k], tp) for k in lines) / max(1, len(lines))
        if co >= a.min_cooccurrence:
            kept.append((" ".join(sp), " ".join(tp)))
        if len(kept) >= a.size:
            break
    return kept, {"pairs": len(raw[src_lang]), "eflomal_s": took, "candidates": len(best)}


def decode(model: Path, src: Path, lines: int, out: Path, extra: list) -> tuple[float, list[str]]:
    cmd = [sys.executable, str(peers.REPO / "bin" / "nmt-translate"), "-m", str(model), "--quiet"] + DECODE_OPTIONS \
        + [str(x) for x in extra]
    wall, hyp = peers.translate_timed(cmd, src, out, lines, {**os.environ, **peers.quiet_env()})
    return lines / wall, hyp


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    a = parse_args(args)
    t0 = time.time()
    path = a.out or peers.REPO / "tests" / "bench" / "results" / "bench_terms.txt"
    out = peers.start_report("bench_terms.py", "nmtkit: a glossary the translation obeys (--terms)", args,
                             a.allow_dirty)
    if out is None:
        return 2
    from nmtkit.errors import InputError

    try:
        import sacrebleu

        from nmtkit.data import checkpoint
        from nmtkit.data.text import Preprocessor, TextConfig
        from nmtkit.data.vocab import UNK
        from nmtkit.translate import glossary as G

        prepared = a.prepared or peers.prepare_hour(a.work)
        manifest = json.loads((prepared / "manifest.json").read_text(encoding="utf-8"))
        src_lang, tgt_lang = manifest["source_lang"], manifest["target_lang"]
        candidates = prepared / "candidates.npz"
        if not candidates.is_file():
            raise BenchError(f"{candidates} is missing: nmt-prepare writes it")
        payload = checkpoint.load(str(a.model))
        out.append(f"model: {a.model} ({payload.get('arch')}, "
                   f"{(payload.get('train') or {}).get('state', {}).get('update', '?')} updates)")
        out.append(f"decoding options: {' '.join(DECODE_OPTIONS)} --candidates {candidates}; nmt-translate's default "
                   "threads and workers")
        src_pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
        tgt_pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["tgt"]))
        tgt_index = {t: i for i, t in enumerate(payload["vocab"]["tgt"])}
        compile_ = lambda entries: G.CompiledGlossary(  # noqa: E731
            entries, src_pre.words, lambda x: tgt_pre.subwords(tgt_pre.words(x)), tgt_index, UNK)
        pairs, built = build_glossary(a, src_lang, tgt_lang)
        writable = []
        for s, t in pairs:  # (a target term the model cannot write is left out, and counted)
            try:
                compile_(G.parse(f"{s}\t{t}\n"))
                writable.append((s, t))
            except InputError:
                pass
        built["unwritable"], pairs = len(pairs) - len(writable), writable
        gloss_path = path.with_name(path.stem + "-glossary.tsv")
        gloss_text = "".join(f"{s}\t{t}\n" for s, t in pairs)
        gloss_path.write_text("# written by tests/bench/bench_terms.py from eflomal's links over hansards/dev\n"
                              + gloss_text, encoding="utf-8")
        out.append(f"glossary: {len(pairs)} terms from {built['pairs']:,} hansards/dev pairs (eflomal "
                   f"{built['eflomal_s']:.0f} s, {built['candidates']:,} source phrases extracted {a.min_count}+ "
                   f"times, {built['unwritable']} left out that the model cannot write), {gloss_path.name}, sha256 "
                   f"{hashlib.sha256(gloss_text.encode()).hexdigest()[:16]}")
        g = compile_(G.read(gloss_path))
        runs = a.work / "terms-runs"
        runs.mkdir(parents=True, exist_ok=True)
        root = peers.data_root()
        goals = []
        for name, prefix in (("hansards/test", root / "hansards" / "test"),
                             ("newstest2014", root / "wmt14" / "newstest2014")):
            en = Path(f"{prefix}.{src_lang}").read_text(encoding="utf-8").splitlines()
            fr = Path(f"{prefix}.{tgt_lang}").read_text(encoding="utf-8").splitlines()
            found = [g.find(src_pre.words(line)) for line in en]
            ref_words = [tgt_pre.words(line) for line in fr]
            # (as Dinu et al. 2019: a line is scored with its terms where the reference uses every one of them)
            in_ref = [all(any(stands_in(ref_words[k], tuple(tgt_pre.words(v))) for v in g.terms[i].targets)
                          for i in f) for k, f in enumerate(found)]
            with_terms = [k for k, f in enumerate(found) if f and in_ref[k]]
            others = [k for k, f in enumerate(found) if not f]
            elsewhere = sum(1 for k, f in enumerate(found) if f and not in_ref[k])
            all_terms, all_others = len(with_terms), len(others)
            with_terms = with_terms[:: max(1, len(with_terms) // a.term_lines)][: a.term_lines]
            others = others[:: max(1, len(others) // a.plain_lines)][: a.plain_lines]
            files = {}
            for part, keep in (("terms", with_terms), ("plain", others)):
                f = runs / f"{name.replace('/', '-')}-{part}.{src_lang}"
                f.write_text("".join(en[k] + "\n" for k in keep), encoding="utf-8")
                files[part] = f
            got = {}
            for r in range(a.repeats):
                for use in ((False, True) if r % 2 == 0 else (True, False)):
                    extra = ["--candidates", candidates] + (["--terms", gloss_path] if use else [])
                    speed, hyp = decode(a.model, files["plain"], len(others), runs / "out", extra)
                    got.setdefault(("plain", use), []).append((speed, hyp))
                    if r == 0:
                        speed_t, hyp_t = decode(a.model, files["terms"], len(with_terms), runs / "out", extra)
                        got["terms", use] = [(speed_t, hyp_t)]
                    log(f"{name} repeat {r + 1} --terms {use}: {speed:.1f} lines/s on lines without terms")
            rows, use_rate = [], {}
            for use in (False, True):
                hyp = got["terms", use][0][1]
                required = [(k, i) for n, k in enumerate(with_terms) for i in found[k]]
                hyp_words = [tgt_pre.words(h) for h in hyp]
                met = 0
                for n, k in enumerate(with_terms):
                    for i in found[k]:
                        met += any(stands_in(hyp_words[n], tuple(tgt_pre.words(v))) for v in g.terms[i].targets)
                use_rate[use] = 100 * met / max(1, len(required))
                ref_t = [fr[k] for k in with_terms]
                plain_hyp = got["plain", use][0][1]
                ref_p = [fr[k] for k in others]
                speeds = [s for s, _ in got["plain", use]]
                rows.append(["with --terms" if use else "without", f"{use_rate[use]:.1f}%",
                             f"{sacrebleu.corpus_bleu(hyp, [ref_t]).score:.2f}",
                             f"{sacrebleu.corpus_chrf(hyp, [ref_t]).score:.2f}",
                             f"{sacrebleu.corpus_bleu(plain_hyp, [ref_p]).score:.2f}",
                             f"{sacrebleu.corpus_chrf(plain_hyp, [ref_p]).score:.2f}",
                             f"{median(speeds):.1f} ({min(speeds):.1f}–{max(speeds):.1f})"])
            same = sum(x == y for x, y in zip(got["plain", True][0][1], got["plain", False][0][1]))
            changed = sum(x != y for x, y in zip(got["terms", True][0][1], got["terms", False][0][1]))
            out += ["", f"{name}: {len(with_terms):,} lines with glossary terms, spread evenly over the "
                    f"{all_terms:,} whose reference uses every one ({len(required):,} terms required, {changed:,} "
                    f"lines changed by --terms; {elsewhere:,} lines whose reference translates a term otherwise are "
                    f"not scored); {len(others):,} lines without a term, spread evenly over the {all_others:,} "
                    f"({same:,} written the same with --terms); lines/s median (min–max) of {a.repeats} runs on the "
                    "lines without terms", ""]
            out += table(["", "term use", "BLEU (terms)", "chrF (terms)", "BLEU (others)", "chrF (others)",
                          "lines/s (others)"], rows)
            speed_ratio = median([s for s, _ in got["plain", True]]) / median([s for s, _ in got["plain", False]])
            goals.append(Goal(f"{name}: term use with --terms (without: {use_rate[False]:.1f}%)", use_rate[True],
                              95.0, "%"))
            goals.append(Goal(f"{name}: lines without terms written the same", 100 * same / max(1, len(others)),
                              100.0, "%"))
            goals.append(Goal(f"{name}: speed on lines without terms, with --terms against without (goal: within "
                              "5%)", 100 * speed_ratio, 95.0, "%"))
        return peers.finish_report(out, goals, 58, path, t0)
    except (BenchError, OSError, subprocess.SubprocessError, ValueError, InputError) as e:
        return peers.fail_report(out, path, e)


if __name__ == "__main__":
    sys.exit(main())
