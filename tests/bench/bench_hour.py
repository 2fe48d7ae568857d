"""One hour of two CPU cores: nmtkit's one-hour recipe against OpenNMT-py trained for the same wall clock (#33).

    python tests/bench/bench_hour.py --work runs/hour --onmt-venv runs/onmt-venv > tests/bench/results/bench_hour.txt

1. nmtkit: ``examples/one-hour.sh`` on the Hansards training pairs (``hansards/train``), validating on 1,000 pairs of
   the Hansards dev sittings: its SentencePiece vocabulary, ``rnnsearch-small`` with the ``budget`` recipe, 3,600 s of
   training; decoded with the options the script leaves (``translate.options``).
2. OpenNMT-py (installed as ``../shared/peers/README.md`` says; ``--onmt-venv``): its RNNsearch-like GRU model
   (``../shared/peers/opennmt-hansards.yaml.tmpl``: Adam 1e-3, batches of 80, clipping at 1, 16,000-word
   vocabularies) on the same pairs as ``nmt-prepare --max-len 30`` keeps them, Moses-tokenised; ``onmt_train`` runs
   for the wall clock the ``nmt-train`` process of step 1 took (start-up, validations and saving included), saving a
   checkpoint every 200 steps, then is stopped; its last checkpoint is decoded.  Its best decoding settings are
   chosen on the same tuning sets as nmtkit's (beam 12, with and without ``-block_ngram_repeat``; its
   ``-replace_unk`` stops with an IndexError under beam search on this model).
3. Both are scored on ``hansards/test`` (all 6,525 pairs) and news-test-2014 (3,003) with ``nmt-score``: sacreBLEU
   BLEU, chrF and TER, the source's numbers carried, repeated 3-grams the reference does not repeat, ``<unk>`` per
   line; and the updates each made.

Each toolkit trains alone, one after the other, on an otherwise idle machine: wall-clock figures are evidence only
then.  Both train before either is decoded (decoding is not timed: its wall clock is reported, not compared).  Stages are cached in WORK (delete a directory to redo it); ``--toolkits`` runs one of them, and a call with
``--toolkits ''`` prints the table of what WORK holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
PEERS = REPO.parent / "shared" / "peers"

import peers  # noqa: E402  (tests/bench/peers.py: this script's folder)
from peers import kept_tokenised_pairs  # noqa: E402
TESTS = {"hansards-test": DATA / "hansards" / "test", "newstest2014": DATA / "wmt14" / "newstest2014"}


def _run(cmd: list, log: Path, capture: bool = False, env: dict | None = None) -> tuple[float, str]:
    cmd = [str(c) for c in cmd]
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE if capture else f, stderr=f, text=True,
                              env={**os.environ, **(env or {})})
    return time.perf_counter() - t0, done.stdout if capture else ""


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _save(path: Path, result: dict) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(result, indent=1))
    os.replace(path.with_suffix(".tmp"), path)


def _split_dev(work: Path) -> tuple[Path, list[Path]]:
    """1,000 pairs of the Hansards dev sittings for validation and two tuning sets (500 other dev pairs, 500 of
    news-test-2013) for choosing decoding settings: none of them is a test set."""
    import random

    out = work / "dev"
    if not (out / "news-tune.fr").is_file():
        out.mkdir(parents=True, exist_ok=True)
        en = (DATA / "hansards" / "dev.en").read_text(encoding="utf-8").splitlines()
        fr = (DATA / "hansards" / "dev.fr").read_text(encoding="utf-8").splitlines()
        order = list(range(len(en)))
        random.Random(7).shuffle(order)
        for name, rows in (("valid", sorted(order[:1000])), ("tune", sorted(order[1000:1500]))):
            for lang, lines in (("en", en), ("fr", fr)):
                (out / f"{name}.{lang}").write_text("".join(lines[i] + "\n" for i in rows), encoding="utf-8")
        for lang in ("en", "fr"):
            lines = (DATA / "wmt14" / f"newstest2013.{lang}").read_text(encoding="utf-8").splitlines()[:500]
            (out / f"news-tune.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return out / "valid", [out / "tune", out / "news-tune"]


def _link_copy(src: Path, dest: Path) -> None:
    """A prepared directory made earlier, hard-linked into place (its files are only read)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)


def _score(hyp: Path, prefix: Path, log: Path) -> dict:
    _, report = _run([sys.executable, REPO / "bin" / "nmt-score", "-r", f"{prefix}.fr", "-s", f"{prefix}.en", hyp,
                      "--json", "-q"], log, capture=True)
    return json.loads(report)


def _bleu_of(report: dict) -> float:
    return float(report["systems"][0]["scores"]["BLEU"]["score"])


def _choose(candidates: dict, tune: list[Path], decode, log: Path) -> tuple[str, dict]:
    """The decoding settings with the best mean BLEU over the tuning sets; every candidate's scores."""
    scores = {}
    for key, options in candidates.items():
        scores[key] = {}
        for prefix in tune:
            hyp = decode(options, prefix, f"tune-{prefix.name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}")
            scores[key][prefix.name] = _bleu_of(_score(hyp, prefix, log))
    best = max(scores, key=lambda k: sum(scores[k].values()))
    return best, scores


def _decode_tests(result: dict, decode, path: Path, log: Path) -> dict:
    """Decode and score each test set with the chosen options (cached in ``result``, saved at ``path``)."""
    for name, prefix in TESTS.items():
        if name not in result.setdefault("tests", {}):
            t0 = time.perf_counter()
            hyp = decode(result["options"], prefix, name)
            result["tests"][name] = {"decode_wall_s": round(time.perf_counter() - t0, 1),
                                     "score": _score(hyp, prefix, log)}
            _save(path, result)
    return result


# ---------------------------------------------------------------------------------------------------------- nmtkit
def nmtkit(a, work: Path, stage: str) -> dict:
    """nmtkit's hour: ``stage`` "train" (the timed part) or "decode" (the tests, after every toolkit has trained)."""
    w = work / "nmtkit"
    w.mkdir(parents=True, exist_ok=True)
    log, path = w / "log.txt", w / "result.json"
    result = _load(path)
    valid, tune = _split_dev(work)
    if a.nmtkit_data and not (w / "run" / "data").exists():  # (one-hour.sh checks that its settings made it)
        _link_copy(Path(a.nmtkit_data), w / "run" / "data")
    if "updates" not in result:
        wall, _ = _run(["bash", REPO / "examples" / "one-hour.sh", DATA / "hansards" / "train", w / "run", "--dev",
                        valid, "--seconds", a.seconds], log)
        records = [json.loads(x) for x in open(w / "run" / "model" / "train.jsonl", encoding="utf-8")]
        result = {"updates": max(r["update"] for r in records), "script_wall_s": round(wall, 1),
                  "train_elapsed_s": max(r.get("elapsed", 0) for r in records),
                  "options": (w / "run" / "translate.options").read_text().split(),
                  "train_process_wall_s": float((w / "run" / "train.wall_s").read_text()),
                  "precision": (w / "run" / "train.precision").read_text().strip()}
        _save(path, result)
    if stage == "train":
        return result
    model = w / "run" / "model" / "checkpoint_last.pt"

    def decode(options, prefix, tag):
        out = w / f"{tag}.hyp.fr"
        if not out.is_file():
            _run([sys.executable, REPO / "bin" / "nmt-translate", "-m", model, "-i", f"{prefix}.en", "-o", out,
                  "--quiet", *options], log)
        return out

    return _decode_tests(result, decode, path, log)


# ------------------------------------------------------------------------------------------------------ OpenNMT-py
def onmt(a, work: Path, deadline: float, stage: str) -> dict:
    """OpenNMT-py's hour, trained for ``deadline`` seconds: ``stage`` "train" or "decode" (as :func:`nmtkit`)."""
    bin_ = Path(a.onmt_venv) / "bin"
    if not (bin_ / "onmt_train").is_file():
        raise SystemExit(f"bench_hour: no OpenNMT-py in {a.onmt_venv} (see ../shared/peers/README.md)")
    w = work / "onmt"
    w.mkdir(parents=True, exist_ok=True)
    log, path = w / "log.txt", w / "result.json"
    env = {"OMP_NUM_THREADS": "2", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    result = _load(path)
    valid, tune = _split_dev(work)
    words = w / "words"
    if a.onmt_words and not words.exists():
        manifest = json.loads((Path(a.onmt_words) / "manifest.json").read_text())
        if manifest["filters"]["max_len"] != 30 or manifest.get("sentencepiece") or manifest.get("bpe"):
            raise SystemExit(f"bench_hour: {a.onmt_words}: not the Moses-tokenised words of at most 30 a side")
        _link_copy(Path(a.onmt_words), words)
    if not (words / "manifest.json").is_file():  # the pairs as nmt-prepare --max-len 30 keeps them, Moses tokens
        _run([sys.executable, REPO / "bin" / "nmt-prepare", "-s", "en", "-t", "fr", "--train",
              DATA / "hansards" / "train", "--valid", valid, "--max-len", "30", "--src-vocab-size", "16000",
              "--tgt-vocab-size", "16000", "--workers", "2", "--force", "-q", "--dest", words], log)
    kept_tokenised_pairs(words, w)
    if "updates" not in result:
        cfg = (PEERS / "opennmt-hansards.yaml.tmpl").read_text(encoding="utf-8").replace("@WORK@", str(w))
        for key, value in (("train_steps", 1000000), ("save_checkpoint_steps", 200), ("valid_steps", 2500)):
            cfg = re.sub(rf"(?m)^{key}: \d+", f"{key}: {value}", cfg)
        cfg += "keep_checkpoint: 2\n"
        (w / "config.yaml").write_text(cfg, encoding="utf-8")
        _run([bin_ / "onmt_build_vocab", "-config", w / "config.yaml", "-n_sample", "-1"], log, env=env)
        with open(log, "a", encoding="utf-8") as f:  # the same wall clock as nmt-train's process, then stopped
            t0 = time.perf_counter()
            proc = subprocess.Popen([str(bin_ / "onmt_train"), "-config", str(w / "config.yaml")], stdout=f,
                                    stderr=subprocess.STDOUT, env={**os.environ, **env})
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                proc.wait()
            wall = time.perf_counter() - t0
        steps = sorted(int(m.group(1)) for p in (w / "onmt").glob("model_step_*.pt")
                       if (m := re.search(r"_(\d+)\.pt$", p.name)))
        result = {"updates": steps[-1], "train_wall_s": round(wall, 1), "deadline_s": round(deadline, 1)}
        _save(path, result)
    if stage == "train":
        return result
    model = w / "onmt" / f"model_step_{result['updates']}.pt"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_quality import _preprocessor

    src_pre, tgt_pre = _preprocessor(words, "en"), _preprocessor(words, "fr")

    def decode(options, prefix, tag):
        out = w / f"{tag}.hyp.fr"
        if not out.is_file():
            tok = w / f"{tag}.en.tok"
            tok.write_text("".join(" ".join(src_pre.words(line)) + "\n" for line in
                                   Path(f"{prefix}.en").read_text(encoding="utf-8").splitlines()), encoding="utf-8")
            _run([bin_ / "onmt_translate", "-model", model, "-src", tok, "-output", w / f"{tag}.hyp.tok",
                  "-batch_size", "80", "-gpu", "-1", *options], log, env=env)
            out.write_text("".join(tgt_pre.detokenize(line.split()) + "\n" for line in
                                   (w / f"{tag}.hyp.tok").read_text(encoding="utf-8").splitlines()), encoding="utf-8")
        return out

    if "options" not in result:
        base = ["-beam_size", "12"]
        # (no -replace_unk: OpenNMT-py 3.5.1 stops with "IndexError: index 480 is out of bounds for dimension 0
        # with size 1" in beam_search.advance when it is given with beam search on this RNN model)
        candidates = {"beam 12": base, "+ block 3-gram repeats": base + ["-block_ngram_repeat", "3"]}
        best, scores = _choose(candidates, tune, decode, log)
        result.update(options=candidates[best], tuning=scores)
        _save(path, result)
    return _decode_tests(result, decode, path, log)


# ----------------------------------------------------------------------------------------------------------- table
def table(results: dict) -> str:
    lines = [f"bench_hour (tests/bench/bench_hour.py), {time.strftime('%Y-%m-%d', time.gmtime())}", ""]
    for name, r in results.items():
        label = (f"nmtkit rnnsearch-small, one-hour.sh ({r.get('precision', 'fp32')})" if name == "nmtkit"
                 else "OpenNMT-py 3.5.1 (GRU brnn, mlp)")
        lines.append(f"{label}: {r.get('updates', 0):,} updates; decoded with {' '.join(r.get('options', []))}")
        for test, t in r.get("tests", {}).items():
            system = t["score"]["systems"][0]
            scores, diag = system["scores"], system["diagnostics"]
            numbers = diag["numbers"]["share"]
            lines.append(f"  {test:14} BLEU {scores['BLEU']['score']:5.2f}  chrF {scores['chrF']['score']:5.2f}  "
                         f"TER {scores['TER']['score']:5.2f}  numbers "
                         f"{'-' if numbers is None else f'{100 * numbers:.1f}%'}  repeats "
                         f"{100 * diag['repeats']['share']:.1f}%  unk {diag['unk']['per_line']:.2f}/line")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default=str(REPO / "runs" / "hour"))
    p.add_argument("--onmt-venv", default=str(REPO / "runs" / "onmt-venv"))
    p.add_argument("--toolkits", default="nmtkit,onmt", help="which to run now (the table shows all in WORK)")
    p.add_argument("--seconds", default="3600")
    p.add_argument("--nmtkit-data", help="a directory one-hour.sh's settings prepared from hansards/train with "
                   "WORK/dev/valid (prepared earlier: preparing is not part of the hour)")
    p.add_argument("--onmt-words", help="nmt-prepare --max-len 30 --src/tgt-vocab-size 16000 of hansards/train with "
                   "WORK/dev/valid, for OpenNMT-py's pairs (prepared earlier)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_hour.py", "nmtkit: one hour of two CPU cores against OpenNMT-py", args,
                              a.allow_dirty)
    if head is None:
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    # every toolkit trains first, one after the other (the timed part, alone), then each is decoded and scored
    for stage in ("train", "decode"):
        for name in filter(None, a.toolkits.split(",")):
            if name == "nmtkit":
                results[name] = nmtkit(a, work, stage)
            else:
                ours = _load(work / "nmtkit" / "result.json")
                if "train_process_wall_s" not in ours:
                    raise SystemExit("bench_hour: run nmtkit first: OpenNMT-py gets the wall clock its training took")
                results[name] = onmt(a, work, ours["train_process_wall_s"], stage)
    for name in ("nmtkit", "onmt"):
        if name not in results and (work / name / "result.json").is_file():
            results[name] = _load(work / name / "result.json")
    print("\n".join(head) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
