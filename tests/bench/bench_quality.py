"""Quality side by side: OpenNMT-py's RNNsearch-like model and nmtkit's RNNsearch on the same Hansards pairs.

Both toolkits train on the same prepared pairs (``nmt-prepare --max-len 30``, 16,000-word vocabularies: nmtkit
reads the prepared directory, OpenNMT-py its Moses-tokenised ``train.tok.*`` lines listed in ``train.kept``, and the
``valid`` split), batches of 80 sentences, gradient norm clipped at 1, the same number of updates; each then decodes
the test sets with beam 12, and sacreBLEU scores the detokenised output against the raw references.  OpenNMT-py's
configuration is ``../shared/peers/opennmt-hansards.yaml.tmpl`` (GRU ``brnn`` encoder 128 per direction, GRU decoder
256, ``mlp`` attention, input feeding, Glorot init, Adam 1e-3); nmtkit's is ``rnnsearch-small`` (maxout l = 256,
its decoder state reading the current word: ``nmtkit/models/config.py``) with the options of ``--nmtkit-options``
(default: ``--recipe fast``).  Install OpenNMT-py as ``../shared/peers/README.md`` says and give
its virtual environment with ``--onmt-venv``.

    python tests/bench/bench_quality.py --data runs/q/hans16k --work runs/quality --onmt-venv runs/onmt-venv \\
        > tests/bench/results/bench_quality.txt

Stages are cached in WORK (a trained model is not trained again; delete its directory to redo it), so the two
trainings can also be run one at a time: ``--toolkits onmt`` then ``--toolkits nmtkit``, and a last call prints the
table from both.  Wall-clock figures are only evidence when each training ran alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the tools it runs import this checkout's nmtkit (bin/ has no sys.path of its own)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
DATA = Path(os.environ.get("NMTKIT_DATA", REPO.parent / "shared" / "data"))
PEERS = REPO.parent / "shared" / "peers"

import peers  # noqa: E402  (tests/bench/peers.py: this script's folder)
from peers import kept_tokenised_pairs  # noqa: E402
TEST_SETS = {"hansards-test": ("hansards/test.en", "hansards/test.fr"),
             "newstest2014": ("wmt14/newstest2014.en", "wmt14/newstest2014.fr")}


def _run(cmd: list[str], log: Path, env: dict | None = None) -> float:
    """Run a command with its output appended to ``log``; returns its wall time in seconds."""
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        subprocess.run(list(map(str, cmd)), check=True, stdout=f, stderr=subprocess.STDOUT,
                       env={**os.environ, **(env or {})})
    return time.perf_counter() - t0


def _bleu(hyp_path: Path, ref_path: Path) -> dict:
    import sacrebleu

    hyps = hyp_path.read_text(encoding="utf-8").splitlines()
    refs = ref_path.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        raise SystemExit(f"bench_quality: {hyp_path} has {len(hyps)} lines, its reference {len(refs)}")
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hyps, [refs])
    chrf = sacrebleu.metrics.CHRF().corpus_score(hyps, [refs])
    return {"bleu": round(score.score, 2), "chrf": round(chrf.score, 2), "signature": str(bleu.get_signature())}


def diagnostics(hyp_path: Path, ref_path: Path) -> dict:
    """What the outputs look like: length against the reference (sacreBLEU's tokens, ``<unk>`` as one), the share
    of lines with a repeated word trigram (loops such as "de la procédure de la procédure"), ``<unk>`` per line."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    hyps = hyp_path.read_text(encoding="utf-8").splitlines()
    refs = ref_path.read_text(encoding="utf-8").splitlines()
    tok = Tokenizer13a()
    hyp_len = sum(len(tok(h.replace("<unk>", "UNK")).split()) for h in hyps)
    ref_len = sum(len(tok(r).split()) for r in refs)
    loops = 0
    for h in hyps:
        w = h.split()
        grams = [tuple(w[i: i + 3]) for i in range(len(w) - 2)]
        loops += len(grams) != len(set(grams))
    return {"ratio": hyp_len / max(ref_len, 1), "loops": loops / max(len(hyps), 1),
            "unk": sum(h.count("<unk>") for h in hyps) / max(len(hyps), 1)}


def _preprocessor(data: Path, lang: str):
    from nmtkit.data.manifest import PreparedData
    from nmtkit.data.text import Preprocessor

    return Preprocessor(PreparedData.open(str(data)).text_config(lang))


# ------------------------------------------------------------------------------------------------------ OpenNMT-py
def onmt(a, work: Path) -> dict:
    """Train OpenNMT-py (unless done), translate the test sets, score them."""
    bin_ = Path(a.onmt_venv) / "bin"
    if not (bin_ / "onmt_train").is_file():
        raise SystemExit(f"bench_quality: no OpenNMT-py in {a.onmt_venv} (see ../shared/peers/README.md)")
    w = work / "onmt"
    w.mkdir(parents=True, exist_ok=True)
    log = w / "log.txt"
    env = {"OMP_NUM_THREADS": str(a.threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    data = Path(a.data)
    kept_tokenised_pairs(data, w)  # the pairs nmtkit trains on, as Moses tokens
    cfg = (PEERS / "opennmt-hansards.yaml.tmpl").read_text(encoding="utf-8").replace("@WORK@", str(w))
    cfg = re.sub(r"(?m)^train_steps: \d+", f"train_steps: {a.updates}", cfg)
    cfg = re.sub(r"(?m)^save_checkpoint_steps: \d+", f"save_checkpoint_steps: {a.updates}", cfg)
    cfg = re.sub(r"(?m)^valid_steps: \d+", f"valid_steps: {a.updates}", cfg)
    (w / "config.yaml").write_text(cfg, encoding="utf-8")
    model = w / "onmt" / f"model_step_{a.updates}.pt"
    result_path = w / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if not model.is_file():
        _run([bin_ / "onmt_build_vocab", "-config", w / "config.yaml", "-n_sample", "-1"], log, env)
        result["train_wall_s"] = round(_run([bin_ / "onmt_train", "-config", w / "config.yaml"], log, env), 1)
        result["updates"] = a.updates
        result_path.write_text(json.dumps(result, indent=1))
    src_pre, tgt_pre = _preprocessor(data, "en"), _preprocessor(data, "fr")
    for name, (src, ref) in TEST_SETS.items():
        if name in result.get("tests", {}):
            continue
        tok = w / f"{name}.en.tok"
        tok.write_text("".join(" ".join(src_pre.words(line)) + "\n"
                               for line in (DATA / src).read_text(encoding="utf-8").splitlines()), encoding="utf-8")
        out = w / f"{name}.hyp.tok"
        t = _run([bin_ / "onmt_translate", "-model", model, "-src", tok, "-output", out, "-beam_size", "12",
                  "-batch_size", "80", "-gpu", "-1"], log, env)
        detok = w / f"{name}.hyp.fr"
        detok.write_text("".join(tgt_pre.detokenize(line.split()) + "\n"
                                 for line in out.read_text(encoding="utf-8").splitlines()), encoding="utf-8")
        result.setdefault("tests", {})[name] = {**_bleu(detok, DATA / ref), "decode_wall_s": round(t, 1)}
        result_path.write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------------------------------------------------- nmtkit
def nmtkit(a, work: Path) -> dict:
    """Train nmtkit (unless done), translate the test sets, score them."""
    w = work / "nmtkit"
    w.mkdir(parents=True, exist_ok=True)
    log = w / "log.txt"
    result_path = w / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    model = w / "model" / "checkpoint_last.pt"
    options = a.nmtkit_options.split()
    if result.get("options") != options or not model.is_file():
        start, before = "--force", {}
        if a.extend_from:  # go on from another run's model (its WORK), resumed exactly, to --updates
            base = Path(a.extend_from) / "nmtkit"
            before = json.loads((base / "result.json").read_text())
            if before.get("options") != options:
                raise SystemExit(f"bench_quality: {base} trained with {before.get('options')}, not {options}")
            shutil.rmtree(w / "model", ignore_errors=True)
            shutil.copytree(base / "model", w / "model")
            start = "--resume"
        cmd = [sys.executable, REPO / "bin" / "nmt-train", a.data, "--arch", "rnnsearch-small", "--batch-size", "80",
               "--clip-norm", "1", *options, "--max-updates", a.updates, "--valid-every", a.updates,
               "--valid-bleu-sentences", "0", "--threads", a.threads, "--save-dir", w / "model", start, "-q"]
        wall = _run(cmd, log)
        result = {"options": options, "updates": a.updates,
                  "train_wall_s": round(before.get("train_wall_s", 0) + wall, 1)}
        if before:
            result["extended_from"] = {"work": str(a.extend_from), "train_wall_s": before["train_wall_s"],
                                       "resumed_wall_s": round(wall, 1)}
        result_path.write_text(json.dumps(result, indent=1))
    for name, (src, ref) in TEST_SETS.items():
        if name in result.get("tests", {}):
            continue
        out = w / f"{name}.hyp.fr"
        t = _run([sys.executable, REPO / "bin" / "nmt-translate", "-m", model, "-i", DATA / src, "-o", out,
                  "--beam", "12", "--batch-size", "80", "--threads", a.threads, "--quiet"], log)
        result.setdefault("tests", {})[name] = {**_bleu(out, DATA / ref), "decode_wall_s": round(t, 1)}
        result_path.write_text(json.dumps(result, indent=1))
    if "alignment" not in result:  # the attention against the trial set's human links, and Figure 3's pictures
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_learning import alignment_quality, diagonal_aer

        trial = DATA / "hansards-trial"
        result["alignment"] = {**alignment_quality(str(model), trial), "diagonal_aer": diagonal_aer(trial)}
        _run([sys.executable, REPO / "bin" / "nmt-align", "-m", model, "-s", DATA / TEST_SETS["hansards-test"][0],
              "-t", w / "hansards-test.hyp.fr", "--plot-dir", w / "figure3", "--plot-sentences",
              a.plot_sentences, "--force", "--pharaoh", w / "figure3.align", "-q"], log)
        result_path.write_text(json.dumps(result, indent=1))
    return result


# ----------------------------------------------------------------------------------------------------------- table
def _updates(result: dict, name: str, a) -> int:
    """The updates a toolkit's column was trained for (older results: its config, else --updates)."""
    if "updates" in result:
        return result["updates"]
    cfg = Path(a.work) / name / "config.yaml"
    m = re.search(r"(?m)^train_steps: (\d+)", cfg.read_text()) if name == "onmt" and cfg.is_file() else None
    return int(m.group(1)) if m else a.updates


def table(results: dict, a) -> str:
    names = [n for n in ("onmt", "nmtkit") if n in results]
    ups = {n: _updates(results[n], n, a) for n in names}
    each = (f"{next(iter(ups.values())):,} updates each" if len(set(ups.values())) == 1 else
            ", ".join(f"{'OpenNMT-py' if n == 'onmt' else 'nmtkit'} {u:,} updates" for n, u in ups.items()))
    lines = [f"Hansards pairs of 1-30 tokens a side (722,304), 16,000-word vocabularies, batches of 80, clipping at 1, "
             f"{each}; beam 12; sacreBLEU on detokenised output", ""]
    options = " ".join(results.get("nmtkit", {}).get("options", a.nmtkit_options.split()))
    label = {"onmt": "OpenNMT-py 3.5.1", "nmtkit": f"nmtkit rnnsearch-small ({options})"}
    lines.append(f"{'test set':16} " + " ".join(f"{label[n]:>40}" for n in names))
    work = Path(a.work)
    for test, (_, ref) in TEST_SETS.items():
        row, shape = [], []
        for n in names:
            r = results[n].get("tests", {}).get(test)
            cell = "-" if r is None else f"BLEU {r['bleu']:.2f}  chrF {r['chrf']:.2f}"
            row.append(f"{cell:>40}")
            hyp = work / n / f"{test}.hyp.fr"
            d = diagnostics(hyp, DATA / ref) if r is not None and hyp.is_file() else None
            cell = "-" if d is None else f"len {d['ratio']:.2f}  loops {100 * d['loops']:.0f}%  unk {d['unk']:.1f}"
            shape.append(f"{cell:>40}")
        lines.append(f"{test:16} " + " ".join(row))
        lines.append(f"{'':16} " + " ".join(shape))
    lines.append(f"{'train wall s':16} " + " ".join(
        f"{results[n].get('train_wall_s', '-'):>40}" for n in names))
    per = [f"{results[n]['train_wall_s'] / ups[n]:.3f}" if "train_wall_s" in results[n] else "-" for n in names]
    lines.append(f"{'s per update':16} " + " ".join(f"{x:>40}" for x in per))
    if "alignment" in results.get("nmtkit", {}):
        al = results["nmtkit"]["alignment"]
        lines += ["", f"nmtkit's attention on the Hansards trial set's 37 human-aligned sentences (argmax links): AER "
                      f"{al['aer']:.3f} (monotone diagonal {al['diagonal_aer']:.3f}); mean entropy "
                      f"{al['entropy']:.2f} nats per target word, {al['eos_mass']:.3f} of α on the source's </s>"]
    sig = next((r["signature"] for n in names for r in results[n].get("tests", {}).values()), None)
    if sig:
        lines += ["", f"sacreBLEU signature: {sig}"]
    lines += ["len: output length / reference length (sacreBLEU's 13a tokens, <unk> as one); loops: lines with a "
              "repeated word trigram; unk: <unk> per line"]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="prepared Hansards directory (nmt-prepare --max-len 30, 16k vocabs)")
    p.add_argument("--work", default=str(REPO / "runs" / "quality"))
    p.add_argument("--onmt-venv", default=str(REPO / "runs" / "onmt-venv"))
    p.add_argument("--toolkits", default="onmt,nmtkit", help="which to train/evaluate now (the table shows all)")
    p.add_argument("--updates", type=int, default=5000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--nmtkit-options", default="--recipe fast")
    p.add_argument("--extend-from", metavar="WORK",
                   help="nmtkit: resume the model of an earlier run's WORK (same options) up to --updates instead of "
                        "training from scratch: the comparison at equal wall-clock time; its wall time is added")
    p.add_argument("--plot-sentences", default="332,566,777,1019",
                   help="hansards/test lines whose attention nmtkit's model draws (WORK/nmtkit/figure3)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a tree with uncommitted changes (the report then says it is no evidence)")
    a = p.parse_args(args)
    head = peers.start_report("bench_quality.py", "nmtkit: quality beside OpenNMT-py on the same Hansards pairs", args,
                              a.allow_dirty)
    if head is None:
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in filter(None, a.toolkits.split(",")):  # (none: print the table of what WORK holds)
        results[name] = {"onmt": onmt, "nmtkit": nmtkit}[name](a, work)
    for name in ("onmt", "nmtkit"):
        path = work / name / "result.json"
        if name not in results and path.is_file():
            results[name] = json.loads(path.read_text())
    print("\n".join(head) + "\n")
    print(table(results, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
