#!/usr/bin/env python3
"""Small steps of the example recipes that are not a tool of their own (``python examples/steps.py STEP --help``).

Each step reads and writes plain files, uses nmtkit's library where it can (reading corpora, shortlists, AER), and
prints what it did on stderr (nmtkit must be importable: installed, or the checkout on ``PYTHONPATH``, as the
recipes' run.sh set it):

    sample       draw sentence pairs from corpora: a random subset in random order (a training set), a random or
                 leading subset in corpus order (development and test sets), or everything
    no-unk       the sentence pairs with no token outside a prepared directory's shortlists (Table 1's subset)
    pick         a few random no-UNK sentences of 10-20 words (the paper's Figure 3)
    recase       restore the casing of the lowercased Hansards trial set from the training text
    diagonal-aer AER of the monotone diagonal alignment: the baseline an attention model has to beat
    budget       the number of updates that fits a time budget, from calibration runs of nmt-train
    table1       Table 1 as Markdown from nmt-score --json reports
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path



def say(*args) -> None:
    print("steps:", *args, file=sys.stderr)


def write_lines(path: str | Path, lines) -> None:
    from nmtkit.files import atomic_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        for line in lines:
            f.write(line + "\n")


def _lines(path: str) -> list[str]:
    """The lines of a plain or gzip file, split on \\n only (as nmtkit.files reads them), in one go."""
    from nmtkit.files import open_binary, read_segments

    with open_binary(path) as f:
        data = f.read()
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:  # let nmtkit name the line and column
        return [seg.text for seg in read_segments(path)]
    if lines[-1] == "":
        lines.pop()
    return lines


def read_pairs(prefix: str, src: str = "en", tgt: str = "fr") -> list[tuple[str, str]]:
    """The sentence pairs of a corpus prefix (PREFIX.en/.fr, plain, gzip or SGML)."""
    from nmtkit.files import is_sgml, read_parallel, resolve_prefix

    s, t = resolve_prefix(prefix, src, tgt)
    if is_sgml(s) or is_sgml(t):
        return [(a.text, b.text) for a, b in read_parallel(s, t)]
    a, b = _lines(s), _lines(t)
    if len(a) != len(b):
        raise SystemExit(f"steps: {s} has {len(a)} lines but {t} has {len(b)}")
    return list(zip(a, b))


def write_pairs(out: str, pairs, origins=None, src: str = "en", tgt: str = "fr") -> None:
    write_lines(f"{out}.{src}", (a for a, _ in pairs))
    write_lines(f"{out}.{tgt}", (b for _, b in pairs))
    if origins is not None:
        write_lines(f"{out}.lines", origins)


# -- sample -------------------------------------------------------------------------------------------------------


def cmd_sample(a) -> None:
    """OUT.{en,fr} (and OUT.lines: where each pair comes from) from groups PREFIX[+PREFIX...][=N]."""
    rng = random.Random(a.seed)
    pairs, origins = [], []
    for group in a.groups:
        spec, _, n = group.rpartition("=") if "=" in group else (group, "", "0")
        n = int(n)
        items, where = [], []  # the pairs; (prefix, first index) of each corpus of the group
        for prefix in spec.split("+"):
            where.append((prefix, len(items)))
            items += read_pairs(prefix)
        if n and n > len(items):
            raise SystemExit(f"steps: {spec} has {len(items)} pairs, fewer than the {n} asked for")
        keep = range(len(items)) if not n else range(n) if a.first else sorted(rng.sample(range(len(items)), n))
        for i in keep:
            prefix, first = next((p, f) for p, f in reversed(where) if f <= i)
            pairs.append(items[i])
            origins.append(f"{prefix}:{i - first + 1}")
        say(f"{spec}: {len(keep)} of {len(items)} pairs")
    if a.shuffle:
        order = list(range(len(pairs)))
        rng.shuffle(order)
        pairs, origins = [pairs[i] for i in order], [origins[i] for i in order]
    write_pairs(a.out, pairs, origins)
    say(f"wrote {len(pairs)} pairs to {a.out}.en/.fr{' (shuffled)' if a.shuffle else ''}")


# -- no-unk and pick ----------------------------------------------------------------------------------------------


def _shortlist(prepared: str):
    from nmtkit.score import shortlist_from_prepared

    return shortlist_from_prepared(prepared)


def cmd_no_unk(a) -> None:
    from nmtkit.score import no_unk_rows

    pairs = read_pairs(a.prefix)
    shortlist = _shortlist(a.vocab)
    rows = no_unk_rows([s for s, _ in pairs], [t for _, t in pairs], shortlist).tolist()
    if len(rows) < a.at_least:  # smoke runs only: a tiny vocabulary leaves no sentence without unknown words
        from nmtkit.data.text import Preprocessor
        from nmtkit.data.vocab import UNK

        sp, tp = Preprocessor(shortlist.src_config), Preprocessor(shortlist.tgt_config)
        unks = [list(shortlist.src_vocab.encode(sp.tokenize(s))).count(UNK)
                + list(shortlist.tgt_vocab.encode(tp.tokenize(t))).count(UNK) for s, t in pairs]
        rows = sorted(sorted(range(len(pairs)), key=lambda i: (unks[i], i))[: a.at_least])
        say(f"WARNING: fewer than {a.at_least} pairs without unknown words; taking the {len(rows)} with the "
            "fewest instead (--at-least: for smoke runs, not a no-UNK subset)")
    write_pairs(a.out, [pairs[i] for i in rows], [str(i + 1) for i in rows])
    for spec in a.also:
        src, _, dst = spec.partition(":")
        from nmtkit.score import read_lines

        lines = read_lines(src)
        if len(lines) != len(pairs):
            raise SystemExit(f"steps: {src} has {len(lines)} lines, {a.prefix} has {len(pairs)} pairs")
        write_lines(dst, (lines[i] for i in rows))
    say(f"{len(rows)} of {len(pairs)} pairs have no token outside the shortlists of {a.vocab}: {a.out}.en/.fr")


def cmd_pick(a) -> None:
    from nmtkit.score import moses_tokenize, no_unk_rows

    pairs = read_pairs(a.prefix)
    rows = set(no_unk_rows([s for s, _ in pairs], [t for _, t in pairs], _shortlist(a.vocab)).tolist())
    lengths = [len(t.split()) for t in moses_tokenize([s for s, _ in pairs], "en")]
    eligible = [i for i in range(len(pairs)) if (a.allow_unk or i in rows) and a.min <= lengths[i] <= a.max]
    if len(eligible) < a.n:
        raise SystemExit(f"steps: only {len(eligible)} {'' if a.allow_unk else 'no-UNK '}sentences of "
                         f"{a.min}-{a.max} words")
    chosen = sorted(random.Random(a.seed).sample(eligible, a.n))
    write_pairs(a.out, [pairs[i] for i in chosen], [str(i + 1) for i in chosen])
    say(f"picked lines {', '.join(str(i + 1) for i in chosen)} of {a.prefix} ({len(eligible)} eligible)")


# -- recase -------------------------------------------------------------------------------------------------------

_WRAP = re.compile(r"^(\s*<s\s+snum=[^>]*>)(.*?)(</s>\s*)$")


def truecase_model(tokenized: str) -> dict[str, str]:
    """lowercased word -> its most frequent form in a Moses-tokenized text, counting as Moses' truecaser does only
    words that are not first in their sentence (and skipping all-capitals headings)."""
    from collections import Counter

    counts: Counter = Counter()
    with open(tokenized, encoding="utf-8", newline="\n") as f:
        for line in f:
            words = line.split()
            letters = [w for w in words if any(c.isalpha() for c in w)]
            if letters and all(w.isupper() for w in letters):
                continue  # a heading: says nothing about case
            counts.update(words[1:])
    best: dict[str, tuple[int, str]] = {}
    for word, n in counts.items():
        key = word.lower()
        if n > best.get(key, (0, ""))[0]:
            best[key] = (n, word)
    return {k: w for k, (_, w) in best.items()}


def cmd_recase(a) -> None:
    """Each word of the (lowercased, tokenized) file takes its most frequent casing in the training text (words
    not first in their sentence, as Moses' truecaser counts): ``i`` -> ``I``, ``canada`` -> ``Canada``, ``the``
    stays. The number of words never changes, so gold alignment indices stay valid."""
    from nmtkit.data.manifest import PreparedData

    data = PreparedData.open(a.vocab)
    vocab = data.vocab(a.lang)
    model = truecase_model(data.path(f"train.tok.{a.lang}"))
    stats = {"words": 0, "recased": 0, "oov_before": 0, "oov_after": 0}
    out = []
    from nmtkit.files import read_segments

    for seg in read_segments(a.input):
        m = _WRAP.match(seg.text)
        head, body, tail = (m.group(1), m.group(2), m.group(3)) if m else ("", seg.text, "")
        words = []
        for w in body.split():
            new = model.get(w.lower(), w)
            stats["words"] += 1
            stats["recased"] += new != w
            stats["oov_before"] += w not in vocab.index
            stats["oov_after"] += new not in vocab.index
            words.append(new)
        out.append(f"{head} {' '.join(words)} {tail}".strip() if m else " ".join(words))
    write_lines(a.output, out)
    if a.stats:
        Path(a.stats).write_text(json.dumps(stats, indent=1) + "\n")
    say(f"{a.input} -> {a.output}: {stats['recased']} of {stats['words']} words recased; words outside the "
        f"shortlist: {stats['oov_before']} before, {stats['oov_after']} after")


# -- diagonal AER -------------------------------------------------------------------------------------------------


def cmd_diagonal_aer(a) -> None:
    from nmtkit.align import alignment_error, load_gold, read_text

    src, tgt = read_text(a.source), read_text(a.target)
    gold = load_gold(a.gold, "auto", a.gold_order, src)
    links = []
    for s, t in zip(src, tgt):
        n, m = len(s.text.split()), len(t.text.split())
        links.append({(min(n - 1, int((j + 0.5) * n / m)), j) for j in range(m)})
    scores = alignment_error(links, gold).to_dict()
    print(json.dumps({"gold": a.gold, "sentences": len(src), "aligner": "diagonal", **scores}, indent=2))


# -- budget -------------------------------------------------------------------------------------------------------


def _valid_records(log: str, kind: str = "valid") -> list[dict]:
    """The records of one kind ("valid" or "train") of an nmt-train log (train.jsonl)."""
    with open(log, encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r.get("type") == kind]


def cmd_budget(a) -> None:
    """The updates that fit a time budget, from calibration runs: each job's seconds per update (the last training
    record of its calibration run, which validates only after it: the updates alone) times its share of the base
    number of updates U (``NAME=LOG*2.3``: 2.3 U); the jobs run longest first on ``--slots`` processes at once (each
    starts when a slot frees); U is the largest multiple of ``--round`` whose plan ends within ``--minutes``. Prints
    one line per job in the order to start them: ``NAME UPDATES VALID_EVERY``."""
    jobs = []
    for spec in a.jobs:
        name, _, rest = spec.partition("=")
        log, _, factor = rest.partition("*")
        if not name or not log:
            raise SystemExit(f"steps budget: {spec!r}: expected NAME=TRAIN_JSONL or NAME=TRAIN_JSONL*FACTOR")
        last = _valid_records(log, "train")[-1]
        jobs.append({"name": name, "log": log, "factor": float(factor or 1),
                     "seconds_per_update": last["elapsed"] / last["update"]})
    jobs.sort(key=lambda j: -j["factor"] * j["seconds_per_update"])  # longest first
    slots = [0.0] * a.slots
    for j in jobs:  # the plan for U = 1: each job on the slot that frees first
        k = slots.index(min(slots))
        j["start_per_update"] = slots[k]
        slots[k] += j["factor"] * j["seconds_per_update"]
    per_update = max(slots)  # the plan's wall clock, per update of U
    base = max(math.ceil(a.min / a.round), int(a.minutes * 60 / per_update) // a.round) * a.round
    for j in jobs:  # (a job of factor f > 1 makes more updates than U, however small U is)
        j["updates"] = max(round(base * j["factor"] / a.round), math.ceil(j["factor"]) if j["factor"] > 1 else 1
                           ) * a.round
        j["valid_every"] = max(1, math.ceil(j["updates"] / a.validations / a.round) * a.round)
        j["planned_start_min"] = round(base * j.pop("start_per_update") / 60, 1)
        j["planned_minutes"] = round(j["updates"] * j["seconds_per_update"] / 60, 1)
    info = {"minutes": a.minutes, "slots": a.slots, "updates": base,
            "planned_minutes": round(base * per_update / 60, 1), "jobs": jobs}
    if a.out:
        Path(a.out).write_text(json.dumps(info, indent=1) + "\n")
    say(", ".join(f"{j['name']}: {j['seconds_per_update']:.2f} s/update" for j in jobs)
        + f" -> {base} updates (U) in about {info['planned_minutes']:g} minutes of training on {a.slots} "
        f"process(es) at once: " + ", ".join(f"{j['name']} {j['updates']}" for j in jobs))
    for j in jobs:
        print(j["name"], j["updates"], j["valid_every"])


# -- Table 1 ------------------------------------------------------------------------------------------------------


def _scores(report: dict, metric: str = "BLEU") -> dict[str, float]:
    return {s["name"]: s["scores"][metric]["score"] for s in report["systems"]}


def _no_unk_scores(report: dict, metric: str = "BLEU") -> tuple[dict[str, float], int, int]:
    """No-UNK scores: from the report's no-UNK subset, or (a report on the subset itself) from its systems."""
    if report.get("no_unk"):
        nu = report["no_unk"]
        return {k: v[metric] for k, v in nu["scores"].items()}, nu["sentences"], nu["of"]
    return _scores(report, metric), report["sentences"], None


def table1(all_report: dict, no_unk_report: dict | None, metric: str = "BLEU", paper: bool = False) -> str:
    alls = _scores(all_report, metric)
    if no_unk_report is None:
        rows = [f"| Model | All ({all_report['sentences']} sentences) |", "|---|---:|"]
        rows += [f"| {name} | {_fmt(score)} |" for name, score in alls.items()]
        nus, n = {}, None
    else:
        rows = [f"| Model | All ({all_report['sentences']} sentences) | No UNK |", "|---|---:|---:|"]
        nus, n, _ = _no_unk_scores(no_unk_report, metric)
        rows += [f"| {name} | {_fmt(score)} | {_fmt(nus.get(name))} |" for name, score in alls.items()]
    sig = all_report["metrics"][metric]["signature"]
    text = "\n".join(rows) + f"\n\n{metric}: `{sig}`"
    if n is not None:
        text += f"; no-UNK subset: {n} sentences"
    if paper:
        text += ("\n\nFor reference, the paper's Table 1 (multi-bleu.perl on its own tokenization; other models, "
                 "data and tokenizer, so not directly comparable): RNNencdec-30 13.93 / "
                 "24.19, RNNsearch-30 21.50 / 31.44, RNNencdec-50 17.82 / 26.71, RNNsearch-50 26.75 / 34.16, "
                 "RNNsearch-50* 28.45 / 36.15, Moses 33.30 / 35.63.")
    return text + "\n"


def cmd_table1(a) -> None:
    all_report = json.loads(Path(a.all).read_text())
    no_unk = json.loads(Path(a.no_unk).read_text()) if a.no_unk else None
    text = "".join(table1(all_report, no_unk, m, paper=(m == "BLEU-tok")) + "\n" for m in a.metric)
    if a.out:
        write_lines(a.out, text.rstrip("\n").split("\n"))
    print(text, end="")


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="steps.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)

    s = sub.add_parser("sample", help="draw sentence pairs from corpora")
    s.add_argument("groups", nargs="+", metavar="PREFIX[+PREFIX...][=N]", help="N = 0 or absent: all pairs")
    s.add_argument("-o", "--out", required=True, metavar="OUT_PREFIX")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--shuffle", action="store_true", help="random order (else corpus order)")
    s.add_argument("--first", action="store_true", help="the first N pairs (else N random ones)")
    s.set_defaults(func=cmd_sample)

    s = sub.add_parser("no-unk", help="the pairs with no token outside the shortlists")
    s.add_argument("prefix")
    s.add_argument("--vocab", required=True, metavar="PREPARED_DIR")
    s.add_argument("-o", "--out", required=True, metavar="OUT_PREFIX")
    s.add_argument("--at-least", type=int, default=0, metavar="N",
                   help="smoke runs: with fewer qualifying pairs, take the N with the fewest unknown tokens")
    s.add_argument("--also", action="append", default=[], metavar="FILE:OUT",
                   help="another file aligned with the corpus (e.g. a system output): subset it alike")
    s.set_defaults(func=cmd_no_unk)

    s = sub.add_parser("pick", help="random no-UNK sentences of MIN-MAX words")
    s.add_argument("prefix")
    s.add_argument("--vocab", required=True, metavar="PREPARED_DIR")
    s.add_argument("-o", "--out", required=True, metavar="OUT_PREFIX")
    s.add_argument("-n", type=int, default=4)
    s.add_argument("--min", type=int, default=10)
    s.add_argument("--max", type=int, default=20)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--allow-unk", action="store_true", help="smoke runs: sentences with unknown words too")
    s.set_defaults(func=cmd_pick)

    s = sub.add_parser("recase", help="restore casing from the training text")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("--vocab", required=True, metavar="PREPARED_DIR")
    s.add_argument("--lang", required=True)
    s.add_argument("--stats", metavar="JSON")
    s.set_defaults(func=cmd_recase)

    s = sub.add_parser("diagonal-aer", help="AER of the monotone diagonal alignment")
    s.add_argument("-s", "--source", required=True)
    s.add_argument("-t", "--target", required=True)
    s.add_argument("--gold", required=True)
    s.add_argument("--gold-order", default="src-tgt", choices=["src-tgt", "tgt-src"])
    s.set_defaults(func=cmd_diagonal_aer)

    s = sub.add_parser("budget", help="updates that fit a time budget, from calibration runs")
    s.add_argument("jobs", nargs="+", metavar="NAME=TRAIN_JSONL[*FACTOR]")
    s.add_argument("--minutes", type=float, required=True)
    s.add_argument("--slots", type=int, default=1, help="jobs run at once")
    s.add_argument("--min", type=int, default=1, help="at least this many updates")
    s.add_argument("--round", type=int, default=10, help="round to a multiple of this")
    s.add_argument("--validations", type=int, default=4, help="validations in each run")
    s.add_argument("--out", metavar="JSON")
    s.set_defaults(func=cmd_budget)

    s = sub.add_parser("table1", help="Table 1 as Markdown from nmt-score --json reports")
    s.add_argument("--all", required=True, metavar="JSON", help="the translations of the whole test set")
    s.add_argument("--no-unk", metavar="JSON", help="the --no-unk translations (a report with a no-UNK subset, "
                   "or a report on the subset itself)")
    s.add_argument("--metric", action="append", default=None, choices=["BLEU", "BLEU-tok", "chrF"])
    s.add_argument("-o", "--out")
    s.set_defaults(func=cmd_table1)

    a = p.parse_args(argv)
    if getattr(a, "metric", "x") is None:
        a.metric = ["BLEU", "BLEU-tok"]
    from nmtkit.errors import InputError

    try:
        a.func(a)
    except InputError as e:
        raise SystemExit(f"steps {a.step}: error: {e}") from None


if __name__ == "__main__":
    main()
