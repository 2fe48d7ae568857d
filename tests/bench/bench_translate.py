#!/usr/bin/env python3
"""Decoding speed of nmtkit (``nmt-translate``'s library), side by side with OpenNMT-py 3.5.1.

One command (about 12 minutes on two quiet cores, 16 the first time, when it trains the two small models;
``--quick`` for a smoke run)::

    python tests/bench/bench_translate.py              # writes tests/bench/results/bench_translate.txt
    python tests/bench/bench_translate.py --quick      # writes tests/bench/results/bench_translate-quick.txt
    python tests/bench/bench_translate.py --parts peer,refcheck

Parts:

``peer``  The peers' synthetic test set (1,000 sentences, ``../shared/peers``), small models trained by this script
    for a few hundred updates on the synthetic corpus (same corpus, same batches of 80, Adam 0.001, no clipping:
    nmtkit ``rnnsearch-small`` with the paper's GRU, OpenNMT-py with the README's template; cached in the work
    directory), beam 1 and beam 12, batch 80 sentences, "natural" ending (outputs end when the model says so).
    Sentences per second measured inside each tool, start-up (imports, model loading) excluded as in the README:
    OpenNMT-py's own ``-report_time`` timer; for nmtkit, a process set up as ``nmt-translate`` sets itself up
    (``nmtkit.runtime.tune_malloc``; by default its decoding worker processes, 2 × 1 thread on two cores, started and
    loaded before the clock starts, as the tools' start-up is excluded) times ``Translator.translate`` on the
    pre-read lines; a second nmtkit row decodes in one process with the same threads (``--workers 1``)
    (``tokenized=True``: words in, words out; batching, search and output conversion included).
    nmtkit reads windows of 10 × batch lines and sorts each by length (the tool's default); OpenNMT-py sorts the
    whole input. Peak RSS is that of the whole process (``/usr/bin/time -v``). Runs are interleaved (beam 1: OpenNMT-py,
    nmtkit; beam 12: OpenNMT-py, nmtkit; next repeat in the other order, ...), medians reported. OpenNMT-py's beam 1
    is given ``-random_sampling_topk 1`` (argmax): with its defaults a beam of 1 *samples* from the distribution.
    BLEU against the test references and the mean output length show the outputs are comparable and not degenerate.
``newstest``  news-test-2014 (3,003 sentences, Moses-tokenised by ``nmt-prepare``), beam 1 and 12, batch 80, with
    ``rnnsearch-small`` and ``rnnsearch-50`` with 30,000-word shortlists (Hansards vocabularies) and RANDOM
    (initial) weights: outputs then never end early and run to the length limit (2 × source length + 10 tokens,
    about 2.4 × a real translation's length), so these are worst-case-length figures. For time, subsets: the first
    1,000 sentences for ``rnnsearch-small`` (``--newstest-sentences 3003`` for all: ~10 more minutes) and the first
    200 for ``rnnsearch-50`` (``--paper-sentences``).
``batch``  Throughput against batch size (1, 16, 64, 128) for the trained small model at beam 12, on the first 300
    sentences of the synthetic test set.
``refcheck``  nmtkit's batched beam-12 output (batch 80, from the ``peer`` part) equals its unoptimised reference
    decoding (``nmtkit.translate.search.beam_search_reference``, one sentence at a time) on the first 20 sentences: same
    tokens, same scores (to 1e-3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from peers import BenchError, Goal, log, median, run_measured, spread, table  # noqa: E402
from nmtkit.translate.config import DecodeConfig

PARTS = ("peer", "newstest", "batch", "refcheck")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring for what is measured and how.")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of: {', '.join(PARTS)}")
    p.add_argument("--repeats", type=int, help="interleaved repeats of the peer part [3; quick 1]")
    p.add_argument("--beams", default="1,12", help="beam sizes [1,12]")
    p.add_argument("--batch-size", type=int, default=80, help="sentences per batch [80]")
    p.add_argument("--test-sentences", type=int, help="synthetic test sentences decoded [1000; quick 200]")
    p.add_argument("--train-updates", type=int, help="updates of the two small models [300; quick 40]")
    p.add_argument("--newstest-sentences", type=int, help="news-test-2014 sentences, small model [1000; quick 80]")
    p.add_argument("--paper-sentences", type=int, help="news-test-2014 sentences, rnnsearch-50 [200; quick 16]")
    p.add_argument("--sweep-batches", default="1,16,64,128", help="batch sizes of the batch part")
    p.add_argument("--sweep-sentences", type=int, help="sentences decoded per batch size [300; quick 32]")
    p.add_argument("--refcheck-sentences", type=int, help="sentences checked against the reference [20; quick 3]")
    p.add_argument("--hansards-lines", type=int, default=150000, help="Hansards pairs for the 30k vocabularies")
    p.add_argument("--onmt-venv", type=Path, default=peers.DEFAULT_ONMT_VENV)
    p.add_argument("--work", type=Path, default=peers.DEFAULT_WORK, help="work/cache directory [%(default)s]")
    p.add_argument("--retrain", action="store_true", help="retrain the cached small models")
    p.add_argument("--out", type=Path, help="report [results/bench_translate.txt; quick: bench_translate-quick.txt]")
    p.add_argument("--quick", action="store_true", help="smoke run: small counts (figures not comparable)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(argv)
    q = a.quick
    a.repeats = a.repeats or (1 if q else 3)
    a.test_sentences = a.test_sentences or (200 if q else 1000)
    a.train_updates = a.train_updates or (40 if q else 300)
    a.newstest_sentences = a.newstest_sentences or (80 if q else 1000)
    a.paper_sentences = a.paper_sentences or (16 if q else 200)
    a.sweep_sentences = a.sweep_sentences or (32 if q else 300)
    a.refcheck_sentences = a.refcheck_sentences if a.refcheck_sentences is not None else (3 if q else 20)
    a.out = a.out or peers.RESULTS_DIR / ("bench_translate-quick.txt" if q else "bench_translate.txt")
    a.parts = [x for x in a.parts.split(",") if x]
    bad = [x for x in a.parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {', '.join(bad)} (choose from {', '.join(PARTS)})")
    a.beams = [int(x) for x in a.beams.split(",") if x]
    a.sweep_batches = [int(x) for x in a.sweep_batches.split(",") if x]
    return a


# -- the nmtkit worker (runs in its own process, so that its peak RSS is its own) ------------------------------------

def worker(spec: dict) -> None:
    import torch

    from nmtkit.runtime import tune_malloc

    tune_malloc()  # as nmt-translate does before it decodes (it keeps freed buffers instead of page-faulting them in)
    if spec["mode"] == "decode":
        from nmtkit.translate.translator import Translator

        t0 = time.perf_counter()
        tr = Translator([spec["checkpoint"]], DecodeConfig(beam=spec["beam"]), batch_size=spec["batch_size"],
                        tokenized=True, workers=spec.get("workers", 0))  # 0: nmt-translate's default (processes)
        load_s = time.perf_counter() - t0
        lines = peers.read_lines(Path(spec["input"]), spec.get("limit"))
        t0 = time.perf_counter()
        results = list(tr.translate(enumerate(lines, start=1)))
        decode_s = time.perf_counter() - t0
        pids = [os.getpid()] + tr.worker_pids
        tree_hwm_kb = sum(peers.peak_rss_kb(pid) or 0 for pid in pids)  # before the workers exit
        tr.close()
        with open(spec["output"], "w", encoding="utf-8", newline="\n") as f:
            f.writelines(r.text + "\n" for r in results)
        with open(spec["output"] + ".scores", "w", encoding="utf-8") as f:
            f.writelines(f"{r.score!r}\n" for r in results)
        print("RESULT " + json.dumps({
            "sentences": len(lines), "decode_s": decode_s, "load_s": load_s, "threads": torch.get_num_threads(),
            "processes": len(pids), "tree_hwm_kb": tree_hwm_kb,
            "out_tokens": sum(len(r.target_words) for r in results),
            "src_tokens": sum(len(r.source_words) for r in results)}), flush=True)
    elif spec["mode"] == "refcheck":
        from nmtkit.translate.search import beam_search_reference
        from nmtkit.translate.translator import Translator

        tr = Translator([spec["checkpoint"]], DecodeConfig(beam=spec["beam"]), batch_size=spec["batch_size"],
                        tokenized=True)
        lines = peers.read_lines(Path(spec["input"]), spec["limit"])
        batched = peers.read_lines(Path(spec["batched"]), spec["limit"])
        scores = [float(x) for x in peers.read_lines(Path(spec["batched"] + ".scores"), spec["limit"])]
        same, max_diff, diffs = 0, 0.0, []
        t0 = time.perf_counter()
        for k, line in enumerate(lines):
            ids = tr.src_vocab.encode(tr.src_pre.subwords(tr.source_words(line)))
            hyps = beam_search_reference(tr.models, [int(i) for i in ids], tr.decode)
            text = " ".join(tr.tgt_pre.merge_subwords(tr.tgt_vocab.decode(hyps[0].tokens)))
            diff = abs(hyps[0].score - scores[k])
            max_diff = max(max_diff, diff)
            if text == batched[k] and diff < 1e-3:
                same += 1
            else:
                diffs.append({"line": k + 1, "reference": text, "batched": batched[k],
                              "reference_score": hyps[0].score, "batched_score": scores[k]})
        print("RESULT " + json.dumps({"checked": len(lines), "same": same, "max_score_diff": max_diff,
                                      "diffs": diffs[:5], "seconds": time.perf_counter() - t0}), flush=True)
    elif spec["mode"] == "random-checkpoint":
        from nmtkit.data import checkpoint
        from nmtkit.train.trainer import TrainConfig, Trainer

        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(TrainConfig(data=spec["data"], arch=spec["arch"], save_dir=tmp, seed=1))
            payload = trainer.state_dict()
        payload.pop("train", None)  # initial weights, no optimizer state: what nmt-translate needs
        checkpoint.save(payload, spec["output"])
        print("RESULT " + json.dumps({"params": sum(p.numel() for p in trainer.model.parameters())}), flush=True)
    else:
        raise SystemExit(f"unknown worker mode {spec['mode']}")


def call_worker(spec: dict, log_path: Path) -> tuple[dict, peers.Measured]:
    m = run_measured([sys.executable, Path(__file__).resolve(), "--worker", json.dumps(spec)],
                     env=peers.quiet_env(), log_path=log_path)
    lines = [line for line in m.output.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise BenchError(f"the nmtkit worker printed no result (log: {log_path})")
    return json.loads(lines[-1][len("RESULT "):]), m


# -- models -------------------------------------------------------------------------------------------------------

class Session:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        self.out_dir = self.work / "translate-out"
        self.models_dir = self.work / "translate-models"
        self.logs = self.work / "logs" / "translate"
        self.onmt_bin, self.onmt_reason = None, ""
        self.synth = self.synth_prep = None
        self.nmtkit_ckpt = self.onmt_ckpt = None
        self.train_info: dict = {}

    def setup_synthetic(self, with_onmt: bool) -> None:
        a = self.a
        self.synth = peers.make_synthetic_corpus(self.work)
        self.synth_prep = peers.prepare_synthetic(self.work, self.synth)
        self.test_file = self.out_dir / f"test{a.test_sentences}.src"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.test_file.write_text("".join(line + "\n" for line in peers.read_lines(self.synth / "test.src",
                                                                                  a.test_sentences)), "utf-8")
        self.refs = peers.read_lines(self.synth / "test.tgt", a.test_sentences)
        self.nmtkit_ckpt = self.train_nmtkit()
        if with_onmt:
            self.onmt_bin, self.onmt_reason = peers.find_onmt(a.onmt_venv)
            if self.onmt_bin is None:
                log(f"SKIPPING OpenNMT-py: {self.onmt_reason}")
            else:
                self.onmt_ckpt = self.train_onmt()

    def train_nmtkit(self) -> Path:
        u = self.a.train_updates
        d = self.models_dir / f"nmtkit-small-adam-u{u}"
        ckpt = d / "checkpoint_last.pt"
        if ckpt.is_file() and not self.a.retrain:
            self.train_info["nmtkit"] = "cached"
            return ckpt
        log(f"training nmtkit rnnsearch-small for {u} updates (Adam 0.001, batch 80)")
        shutil.rmtree(d, ignore_errors=True)
        m = run_measured(peers.nmtkit_tool("nmt-train") + [
            self.synth_prep, "--arch", "rnnsearch-small", "--save-dir", d, "--max-updates", u, "--optimizer", "adam",
            "--lr", "0.001", "--clip-norm", "0", "--log-every", min(50, u), "--valid-every", 10 ** 9,
            "--valid-bleu-sentences", 0, "--seed", 1, "--force", "--keep-last", 1],
            env=peers.quiet_env(), log_path=self.logs / "train-nmtkit.log")
        self.train_info["nmtkit"] = f"trained in {m.wall_s:.0f} s"
        return ckpt

    def train_onmt(self) -> Path:
        u = self.a.train_updates
        d = self.models_dir / f"onmt-small-u{u}"
        ckpt = d / f"model_step_{u}.pt"
        if ckpt.is_file() and not self.a.retrain:
            self.train_info["onmt"] = "cached"
            return ckpt
        log(f"training OpenNMT-py (README template) for {u} updates")
        shutil.rmtree(d, ignore_errors=True)
        cfg = peers.onmt_config(self.work, self.synth, d, u, report_every=min(50, u),
                                bucket_size=8192 if self.a.quick else None)
        peers.onmt_build_vocab(self.onmt_bin, cfg, self.work)
        m = run_measured([self.onmt_bin / "onmt_train", "-config", cfg], env=peers.onmt_env(),
                         log_path=d / "train.log")
        self.train_info["onmt"] = f"trained in {m.wall_s:.0f} s"
        if not ckpt.is_file():
            raise BenchError(f"OpenNMT-py wrote no {ckpt}")
        return ckpt

    # -- one decode each ------------------------------------------------------------------------------------------
    def nmtkit_decode(self, ckpt: Path, input_file: Path, beam: int, batch: int, name: str,
                      limit: int | None = None, workers: int = 0) -> dict:
        out = self.out_dir / f"{name}.txt"
        res, m = call_worker({"mode": "decode", "checkpoint": str(ckpt), "input": str(input_file), "beam": beam,
                              "batch_size": batch, "output": str(out), "limit": limit, "workers": workers},
                             self.logs / f"{name}.log")
        rss = m.max_rss_kb if res["processes"] == 1 else max(m.max_rss_kb or 0, res["tree_hwm_kb"])
        res.update(sent_s=res["sentences"] / res["decode_s"], rss_kb=rss, wall_s=m.wall_s, output=out)
        return res

    def onmt_decode(self, input_file: Path, beam: int, batch: int, name: str) -> dict:
        out = self.out_dir / f"{name}.txt"
        cmd = [self.onmt_bin / "onmt_translate", "-model", self.onmt_ckpt, "-src", input_file, "-output", out,
               "-beam_size", beam, "-batch_size", batch, "-batch_type", "sents", "-gpu", -1, "-report_time"]
        if beam == 1:
            cmd += ["-random_sampling_topk", 1]  # argmax: greedy (its default at beam 1 samples)
        m = run_measured(cmd, env=peers.onmt_env(), log_path=self.logs / f"{name}.log")
        total = re.search(r"Total translation time \(s\):\s*([\d.]+)", m.output)
        avg = re.search(r"Average translation time \(ms\):\s*([\d.]+)", m.output)
        n = len(peers.read_lines(out))
        if not avg and not total:
            raise BenchError(f"no timing line in OpenNMT-py's output ({self.logs / f'{name}.log'})")
        seconds = float(avg.group(1)) * n / 1000 if avg else float(total.group(1))
        return {"sentences": n, "decode_s": seconds, "sent_s": n / seconds, "rss_kb": m.max_rss_kb,
                "wall_s": m.wall_s, "output": out,
                "out_tokens": sum(len(x.split()) for x in peers.read_lines(out))}


# -- parts --------------------------------------------------------------------------------------------------------

LABELS = {"onmt": "OpenNMT-py 3.5.1", "nmtkit": "nmtkit", "nmtkit-1p": "nmtkit 1 process"}
WORKERS_NOTE = "min(threads, 4) worker processes of threads / workers threads each (2 × 1 on two cores)"


def peer_part(s: Session, out: list[str]) -> list[Goal]:
    a = s.a
    tools = (["onmt"] if s.onmt_bin is not None else []) + ["nmtkit", "nmtkit-1p"]
    res: dict[tuple[str, int], list[dict]] = {(t, b): [] for t in tools for b in a.beams}
    for r in range(a.repeats):
        for b in a.beams:
            for t in (tools if r % 2 == 0 else tools[::-1]):
                log(f"peer, repeat {r + 1}/{a.repeats}: {t} beam {b}, {a.test_sentences} sentences, batch "
                    f"{a.batch_size}")
                name = f"synth-{t}-b{b}-r{r}"
                x = (s.onmt_decode(s.test_file, b, a.batch_size, name) if t == "onmt" else
                     s.nmtkit_decode(s.nmtkit_ckpt, s.test_file, b, a.batch_size, name,
                                     workers=1 if t == "nmtkit-1p" else 0))
                res[(t, b)].append(x)
                log(f"  → {x['sent_s']:,.1f} sentences/s, peak RSS {peers.fmt_mb(x['rss_kb'])}")
    s.batched_b12 = res.get(("nmtkit", 12), [{}])[0].get("output") if ("nmtkit", 12) in res else None
    out += ["", f"Part peer: the synthetic test set ({a.test_sentences:,} sentences), small models trained "
                f"{a.train_updates} updates (Adam 0.001, batch 80) by this script, batch {a.batch_size}, natural "
                f"ending, {a.repeats} interleaved repeat(s)", "-" * 100,
            "sentences/s: each tool's own timer, start-up and model loading excluded; median (min–max). BLEU: "
            "tokenised, against the test references (first run of each). Models: "
            + "; ".join(f"{k} {v}" for k, v in s.train_info.items())]
    if s.onmt_bin is None:
        out.append(f"OpenNMT-py SKIPPED: {s.onmt_reason}")
    rows = []
    for (t, b), xs in res.items():
        first = xs[0]
        hyps = peers.read_lines(first["output"])
        rows.append([LABELS[t], b,
                     f"{median([x['sent_s'] for x in xs]):,.1f}", spread([x["sent_s"] for x in xs]),
                     f"{median([x['out_tokens'] / x['decode_s'] for x in xs]):,.0f}",
                     f"{first['out_tokens'] / max(first['sentences'], 1):.1f}", f"{peers.bleu(hyps, s.refs):.1f}",
                     peers.fmt_mb(median([x["rss_kb"] for x in xs])), f"{median([x['wall_s'] for x in xs]):.1f} s"])
    out += [""] + table(["system", "beam", "sent/s", "(min–max)", "out tok/s", "out tok/sent", "BLEU", "peak RSS",
                         "wall"], rows)
    out += [f"(wall: the whole process, start-up included. Reference mean length "
            f"{sum(len(x.split()) for x in s.refs) / len(s.refs):.1f} tokens. With natural ending the tool whose "
            "model stops earlier does less work: out tok/s, output tokens per second of decoding, is less "
            "sensitive to that. Models of a few hundred updates end their outputs at realistic lengths but "
            "translate poorly; --train-updates N trains better ones, cached.)",
            f"nmtkit: as nmt-translate runs by default here, {WORKERS_NOTE}; nmtkit 1 process: --workers 1, the "
            "same threads in one process. Peak RSS with worker processes: the sum of the processes' peaks (VmHWM; "
            "the shared torch libraries counted in each)."]
    goals = []
    for b in a.beams:
        if ("onmt", b) in res and res[("onmt", b)] and res[("nmtkit", b)]:
            ratio = median([x["sent_s"] for x in res[("nmtkit", b)]]) / median([x["sent_s"] for x in res[("onmt", b)]])
            pairs = [n["sent_s"] / o["sent_s"] for n, o in zip(res[("nmtkit", b)], res[("onmt", b)])]
            out.append(f"beam {b}: nmtkit / OpenNMT-py = {ratio:.2f}× (ratio of medians); per repeat "
                       + ", ".join(f"{p:.2f}×" for p in pairs))
            if res.get(("nmtkit-1p", b)):
                one = median([x["sent_s"] for x in res[("nmtkit-1p", b)]]) / median(
                    [x["sent_s"] for x in res[("onmt", b)]])
                out.append(f"beam {b}: nmtkit 1 process / OpenNMT-py = {one:.2f}×")
            if b == 12:
                goals.append(Goal("decoding at beam 12, small model: nmtkit / OpenNMT-py 3.5.1 sentences/s", ratio,
                                  2.0, "×"))
    return goals


def newstest_part(s: Session, out: list[str]) -> None:
    a = s.a
    prep = peers.prepare_real(s.work, a.hansards_lines)
    src_file = prep / "test.tok.en"
    n_all = peers._line_count(src_file)
    rows = []
    for arch, limit in (("rnnsearch-small", a.newstest_sentences), ("rnnsearch-50", a.paper_sentences)):
        ckpt = s.models_dir / f"random-{arch}-{prep.name}.pt"
        if not ckpt.is_file():
            log(f"random-weight checkpoint: {arch}")
            call_worker({"mode": "random-checkpoint", "data": str(prep), "arch": arch, "output": str(ckpt)},
                        s.logs / f"random-{arch}.log")
        n = min(limit, n_all)
        for b in a.beams:
            log(f"newstest: {arch} beam {b}, {n} sentences, batch {a.batch_size}")
            x = s.nmtkit_decode(ckpt, src_file, b, a.batch_size, f"newstest-{arch}-b{b}", limit=n)
            log(f"  → {x['sent_s']:,.2f} sentences/s, peak RSS {peers.fmt_mb(x['rss_kb'])}")
            rows.append([arch, b, f"{n:,}" + ("" if n == n_all else f" of {n_all:,}"), f"{x['sent_s']:,.2f}",
                         f"{x['out_tokens'] / x['decode_s']:,.0f}", f"{x['src_tokens'] / n:.1f}",
                         f"{x['out_tokens'] / n:.1f}", peers.fmt_mb(x["rss_kb"]), f"{x['decode_s']:.1f} s"])
    out += ["", "Part newstest: news-test-2014 (Moses-tokenised by nmt-prepare), nmtkit, batch "
                f"{a.batch_size}, 30,000-word shortlists, RANDOM weights", "-" * 100,
            "Random weights never end a sentence early: every output runs to the length limit (2 × source + 10 "
            "tokens), the worst case; trained models stop much earlier. One run each. nmtkit as nmt-translate "
            f"runs by default: {WORKERS_NOTE}."]
    subsets = [f"{arch} the first {n:,}" for arch, n in (("rnnsearch-small", a.newstest_sentences),
                                                          ("rnnsearch-50", a.paper_sentences)) if n < n_all]
    if subsets:
        out.append(f"Subsets of the {n_all:,} sentences, for time: {'; '.join(subsets)}.")
    out += [""] + table(["model", "beam", "sentences", "sent/s", "out tok/s", "src tok/sent", "out tok/sent",
                         "peak RSS", "decode time"], rows)


def batch_part(s: Session, out: list[str]) -> None:
    a = s.a
    rows = []
    for bs in a.sweep_batches:
        log(f"batch: beam 12, batch {bs}, {a.sweep_sentences} sentences")
        x = s.nmtkit_decode(s.nmtkit_ckpt, s.test_file, 12, bs, f"sweep-b12-bs{bs}", limit=a.sweep_sentences)
        log(f"  → {x['sent_s']:,.1f} sentences/s")
        rows.append([bs, f"{x['sent_s']:,.1f}", f"{x['out_tokens'] / x['decode_s']:,.0f}", peers.fmt_mb(x["rss_kb"])])
    out += ["", f"Part batch: nmtkit rnnsearch-small (trained), beam 12, the first {a.sweep_sentences} synthetic test "
                f"sentences, by batch size (one run each; {WORKERS_NOTE})", "-" * 100, ""]
    out += table(["batch size", "sent/s", "out tok/s", "peak RSS"], rows)


def refcheck_part(s: Session, out: list[str]) -> list[Goal]:
    a = s.a
    batched = getattr(s, "batched_b12", None)
    if batched is None:
        log("refcheck: batched beam-12 decode (batch 80) of the synthetic test set")
        batched = s.nmtkit_decode(s.nmtkit_ckpt, s.test_file, 12, a.batch_size, "refcheck-batched")["output"]
    log(f"refcheck: beam_search_reference on {a.refcheck_sentences} sentences")
    res, _ = call_worker({"mode": "refcheck", "checkpoint": str(s.nmtkit_ckpt), "input": str(s.test_file),
                          "batched": str(batched), "beam": 12, "batch_size": a.batch_size,
                          "limit": a.refcheck_sentences}, s.logs / "refcheck.log")
    out += ["", "Part refcheck: batched beam search (beam 12, batch 80, length-sorted window) against "
                "nmtkit.translate.search.beam_search_reference", "-" * 100,
            f"{res['same']} of {res['checked']} sentences identical (same tokens, score within 1e-3); largest score "
            f"difference {res['max_score_diff']:.2e}; reference decoding took {res['seconds']:.0f} s."]
    for d in res["diffs"]:
        out.append(f"  DIFFERS line {d['line']}: reference {d['reference']!r} ({d['reference_score']:.4f}) vs "
                   f"batched {d['batched']!r} ({d['batched_score']:.4f})")
    return [Goal("batched beam-12 output equal to the reference decoding (sentences identical)",
                 float(res["same"]), float(res["checked"]))]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        worker(json.loads(argv[1]))
        return 0
    a = parse_args(argv)
    title = "nmtkit decoding benchmark" + (" (QUICK SMOKE RUN: not comparable)" if a.quick else "")
    out = peers.start_report("bench_translate.py", title, argv, a.allow_dirty)
    if out is None:
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    out.append(f"OpenNMT-py venv: {a.onmt_venv}; work dir: {a.work}")
    s = Session(a)
    goals: list[Goal] = []
    try:
        if {"peer", "batch", "refcheck"} & set(a.parts):
            s.setup_synthetic(with_onmt="peer" in a.parts)
        if "peer" in a.parts:
            goals += peer_part(s, out)
        if "refcheck" in a.parts:
            goals += refcheck_part(s, out)
        if "batch" in a.parts:
            batch_part(s, out)
        if "newstest" in a.parts:
            newstest_part(s, out)
    except BenchError as e:
        return peers.fail_report(out, a.out, e)
    return peers.finish_report(out, goals, 4, a.out, t0)


if __name__ == "__main__":
    sys.exit(main())
