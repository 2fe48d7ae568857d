#!/usr/bin/env python3
"""Decoding speed against quality, beam by beam (issue 55, part 4): ``nmt-translate`` at this commit with
one-hour.sh's options over candidate lists at several beams (greedy included), beside the same options without the
lists and beside an older commit (``--old``, by default 0c0678f, the issue's baseline), on the hour's model.

Three stages, each one command (run alone, from a clean commit -- a dirty tree is refused)::

    python tests/bench/bench_decode_speed.py --stage tune --model M   # bench_decode_speed-tune.txt (about 12 min)
    python tests/bench/bench_decode_speed.py --stage test --model M   # bench_decode_speed.txt (about 25 min)
    python tests/bench/bench_decode_speed.py --stage startup --model M   # bench_decode_speed-startup.txt (2 min)

- **tune**: ``--lines`` lines (default 1000) spread evenly over ``hansards/dev`` and ``newstest2013``, once each;
  it names the beams (``K``, or ``K/C``: beam K, the second search of ``--all-numbers`` C wide) whose BLEU and chrF
  are within 0.3 of the old commit's on both sets and whose numbers carried are no lower, and the fastest of them
  (the choice ``examples/one-hour.sh``'s beam is made by).
- **startup**: one line (the first of hansards/test) through each of the old commit's run and one-hour.sh's,
  ``--repeats`` (default 7) interleaved runs: the issue's "one-line start-up no slower".
- **test**: ``--lines`` lines (default 1000; 0: the whole sets) spread over ``hansards/test`` and
  ``newstest2014``, sets the choice did not see, ``--repeats`` interleaved repeats (the order of the runs reversed
  from one repeat to the next); the goal line takes the row with one-hour.sh's options as committed (its
  ``DECODE_OPTIONS`` and the candidate lists).

Every run is one ``nmt-translate`` process (the old commit's from a git worktree of it) with its default threads
and workers, as a user runs it; lines/s over the whole process, start-up included.  Beside each speed: sacreBLEU
and chrF of the first repeat, the source numbers the translation carries (``nmtkit.score.diagnostics``), and the
share of lines written exactly as the old commit wrote them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, table  # noqa: E402

SETS = {"tune": {"hansards/dev": ("hansards", "dev"), "newstest2013": ("wmt14", "newstest2013")},
        "test": {"hansards/test": ("hansards", "test"), "newstest2014": ("wmt14", "newstest2014")}}
WITHIN = 0.3  # BLEU and chrF points: "the same quality" (issue 55)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=("tune", "test", "startup"), required=True)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint of the hour's model")
    p.add_argument("--candidates", type=Path, help="its candidate lists (default: peers.prepare_hour's)")
    p.add_argument("--old", default="0c0678f", help="the commit compared against (default: %(default)s)")
    p.add_argument("--beams", default="12,8,6,4,2,1",
                   help="the beams over the lists, K or K/C for beam K with --constrained-beam C "
                        "(default: %(default)s)")
    p.add_argument("--lines", type=int, default=1000, help="lines a set, 0 for the whole set (default: %(default)s)")
    p.add_argument("--no-whole", action="store_true", help="leave out the row without the lists")
    p.add_argument("--repeats", type=int, help="default: 1 to tune, 3 to test, 7 for startup")
    p.add_argument("--work", type=Path, default=Path("/tmp/nmtkit-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--allow-dirty", action="store_true")
    return p.parse_args(argv)


def recipe_options() -> list[str]:
    """examples/one-hour.sh's DECODE_OPTIONS as committed (it adds ``--candidates`` where the lists exist)."""
    text = (peers.REPO / "examples" / "one-hour.sh").read_text(encoding="utf-8")
    m = re.search(r'^DECODE_OPTIONS="([^"]*)"', text, re.M)
    if m is None:
        raise BenchError("examples/one-hour.sh has no DECODE_OPTIONS line")
    return shlex.split(m.group(1))


def with_beam(options: list[str], spec: str) -> list[str]:
    """``options`` with the beam of ``spec`` ("K", or "K/C" for --constrained-beam C; no C: none)."""
    out = list(options)
    if "--constrained-beam" in out:
        i = out.index("--constrained-beam")
        del out[i: i + 2]
    beam, _, second = spec.partition("/")
    out[out.index("--beam") + 1] = beam
    return out + (["--constrained-beam", second] if second else [])


def beam_of(options: list[str]) -> str:
    """The beam spec ("K" or "K/C") ``options`` decode with."""
    k = options[options.index("--beam") + 1]
    return k + (f"/{options[options.index('--constrained-beam') + 1]}" if "--constrained-beam" in options else "")


def beam_words(spec: str) -> str:
    """"greedy" or "beam K[, second search C]" for a beam spec."""
    beam, _, second = spec.partition("/")
    return "greedy" if beam == "1" else f"beam {beam}{f', second search {second}' if second else ''}"


def row_label(spec: str) -> str:
    return f"this commit, {beam_words(spec)}, candidate lists"


def sets_for(stage: str, n: int, work: Path) -> dict:
    """name -> (source file of n lines spread evenly over the set (0: all), the source lines, their references)."""
    root = peers.data_root()
    if root is None:
        raise BenchError("no data: set NMTKIT_DATA or put it in ../shared/data")
    return peers.spread_sets({name: root / folder / stem for name, (folder, stem) in SETS[stage].items()}, n, work,
                             "speed")


def decode(checkout: Path, model: Path, src: Path, lines: int, options: list[str], out: Path) -> tuple[float, list]:
    cmd = [sys.executable, str(checkout / "bin" / "nmt-translate"), "-m", str(model), "--quiet"] + options
    env = {**os.environ, **peers.quiet_env(), **peers.checkout_env(checkout)}
    wall, hyp = peers.translate_timed(cmd, src, out, lines, env)
    return lines / wall, hyp


def startup(old: tuple, new: tuple, repeats: int, a, out: list[str]) -> list[Goal]:
    """One line through ``nmt-translate`` as a shell pipeline sends it (the first line of hansards/test), the old
    commit's options against one-hour.sh's, ``repeats`` interleaved runs: the whole process's wall clock."""
    root = peers.data_root()
    if root is None:
        raise BenchError("no data: set NMTKIT_DATA or put it in ../shared/data")
    src = a.work / "startup.en"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(peers.read_lines(root / "hansards" / "test.en", 1)[0] + "\n", encoding="utf-8")
    walls: dict = {}
    for r in range(repeats):
        for key, tree, options, _ in ((old, new) if r % 2 == 0 else (new, old)):
            speed, _ = decode(tree, a.model, src, 1, options, a.work / "startup.fr")
            walls.setdefault(key, []).append(1 / speed)
            log(f"repeat {r + 1} {key}: {1 / speed:.2f} s")
    base = median(walls[old[0]])
    rows = [[label, f"{median(walls[key]):.2f} ({min(walls[key]):.2f}–{max(walls[key]):.2f})",
             f"{median(walls[key]) / base:.2f}"] for key, _, _, label in (old, new)]
    out += ["", f"one line (the first of hansards/test) through nmt-translate, the whole process; {repeats} "
            "interleaved runs each", ""]
    out += table(["run", "wall s, median (min–max)", "against the old"], rows)
    out.append("")
    return [Goal(f"one line: {old[3].split(',')[0]}'s wall over one-hour.sh's options' (start-up no slower: at "
                 "least 1)", base / median(walls[new[0]]), 1.0, "×")]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    a = parse_args(args)
    t0 = time.time()
    name = {"tune": "bench_decode_speed-tune.txt", "test": "bench_decode_speed.txt",
            "startup": "bench_decode_speed-startup.txt"}[a.stage]
    path = a.out or peers.REPO / "tests" / "bench" / "results" / name
    out = peers.start_report("bench_decode_speed.py", f"nmtkit decoding speed against quality, beam by beam: {a.stage}",
                             args, a.allow_dirty)
    if out is None:
        return 2
    try:
        import sacrebleu

        from bench_candidates import model_note
        from nmtkit.score.diagnostics import Diagnostics

        repeats = a.repeats or {"tune": 1, "test": 3, "startup": 7}[a.stage]
        beams = a.beams.split(",")
        if not all(re.fullmatch(r"[1-9][0-9]*(/[1-9][0-9]*)?", b) for b in beams):
            raise BenchError(f"--beams {a.beams}: expected K or K/C, joined by commas")
        cands = a.candidates or peers.prepare_hour(a.work) / "candidates.npz"
        if not cands.is_file():
            raise BenchError(f"{cands}: no candidate lists (bench_candidates.py builds them)")
        recipe = recipe_options()
        old_tree = peers.worktree(a.work, a.old)
        old_options = ["--beam", "12", "--no-repeat-ngram", "4", "--source-numbers", "--all-numbers"]
        configs = [("old", old_tree, old_options, f"{a.old[:7]}, one-hour.sh's options then (beam 12, whole vocab.)")]
        if not a.no_whole:
            configs.append(("whole", peers.REPO, with_beam(recipe, "12"), "this commit, beam 12, whole vocabulary"))
        configs += [(f"beam{k}", peers.REPO, with_beam(recipe, k) + ["--candidates", str(cands)], row_label(k))
                    for k in beams]
        out += [model_note(a.model), f"candidate lists: {cands}",
                f"options: {a.old[:7]}: {' '.join(old_options)}; this commit: one-hour.sh's '{' '.join(recipe)}' "
                "with the beam of the row (and --candidates where the row says); nmt-translate's default threads "
                "and workers; lines/s over the whole process"]
        if a.stage == "startup":
            recipe_row = ("recipe", peers.REPO, recipe + ["--candidates", str(cands)],
                          f"this commit, one-hour.sh's options ({beam_words(beam_of(recipe))}, candidate lists)")
            goals = startup(configs[0], recipe_row, repeats, a, out)
            return peers.finish_report(out, goals, 55, path, t0)
        sets = sets_for(a.stage, a.lines, a.work)
        runs = a.work / "speed-runs"
        runs.mkdir(parents=True, exist_ok=True)
        got: dict = {}
        for r in range(repeats):
            for s, (src, _, ref) in sets.items():
                for key, tree, options, _ in (configs if r % 2 == 0 else configs[::-1]):
                    speed, hyp = decode(tree, a.model, src, len(ref), options, runs / "out.fr")
                    got.setdefault((s, key), []).append((speed, hyp))
                    log(f"repeat {r + 1} {s} {key}: {speed:.1f} lines/s")
        goals, quality = [], {}
        for s, (_, source, ref) in sets.items():
            diag = Diagnostics(ref, source, "en", "fr")
            base_speed = median([v for v, _ in got[s, "old"]])
            base_hyp = got[s, "old"][0][1]
            rows = []
            for key, _, options, label in configs:
                speeds, hyp = [v for v, _ in got[s, key]], got[s, key][0][1]
                bleu = sacrebleu.corpus_bleu(hyp, [ref]).score
                chrf = sacrebleu.corpus_chrf(hyp, [ref]).score
                numbers = diag.of(hyp)["numbers"]
                quality[s, key] = (bleu, chrf, numbers["share"])
                same = sum(x == y for x, y in zip(hyp, base_hyp)) / len(ref)
                rows.append([label, f"{median(speeds):.1f} ({min(speeds):.1f}–{max(speeds):.1f})",
                             f"{median(speeds) / base_speed:.2f}×", f"{bleu:.2f}", f"{chrf:.2f}",
                             "none in the source" if numbers["share"] is None else
                             f"{100 * numbers['share']:.1f}% of {numbers['of']}", f"{100 * same:.1f}%"])
            where = " spread evenly over the set" if a.lines else ", the whole set"
            out += ["", f"{s}: {len(ref)} lines{where}; lines/s median (min–max) of {repeats} run(s); BLEU, chrF and "
                    f"numbers of the first run; lines written as {a.old[:7]} wrote them", ""]
            out += table(["run", "lines/s", "speed", "BLEU", "chrF", "numbers carried", "same lines"], rows)
        base = {s: quality[s, "old"] for s in sets}

        def holds(key):
            return all(quality[s, key][0] >= base[s][0] - WITHIN and quality[s, key][1] >= base[s][1] - WITHIN
                       and (quality[s, key][2] or 0.0) >= (base[s][2] or 0.0) for s in sets)

        out.append("")
        if a.stage == "tune":
            ok = [k for k in beams if holds(f"beam{k}")]
            fastest = max(ok, key=lambda k: min(median([v for v, _ in got[s, f"beam{k}"]]) for s in sets)) \
                if ok else "none"
            out.append(f"beams over the lists within {WITHIN} BLEU and chrF of {a.old[:7]} on both sets, numbers no "
                       f"lower: {', '.join(ok) or 'none'}; the fastest of them on its slower set: {fastest}")
        else:
            k = beam_of(recipe)
            key = f"beam{k}"
            if key not in {c[0] for c in configs}:
                raise BenchError(f"one-hour.sh's beam {k} is not among --beams {a.beams}")
            for s in sets:
                b, c, n = quality[s, key]
                speed = median([v for v, _ in got[s, key]]) / median([v for v, _ in got[s, "old"]])
                goals.append(Goal(f"{s}: one-hour.sh's options (beam {k}, lists) against {a.old[:7]}'s (BLEU "
                                  f"{b - base[s][0]:+.2f}, chrF {c - base[s][1]:+.2f}, numbers "
                                  f"{100 * ((n or 0.0) - (base[s][2] or 0.0)):+.1f} points)", speed, 3.0, "×"))
            goals.append(Goal(f"the same quality: BLEU and chrF within {WITHIN} of {a.old[:7]}'s and numbers no lower "
                              "on both sets (1 = yes, 0 = no)", 1.0 if holds(key) else 0.0, 1.0))
        return peers.finish_report(out, goals, 55, path, t0)
    except (BenchError, OSError, subprocess.SubprocessError, ValueError) as e:
        return peers.fail_report(out, path, e)


if __name__ == "__main__":
    sys.exit(main())
