"""nmt-score and nmtkit.score on real WMT14 system outputs, checked against sacreBLEU called directly here.

The no-UNK subset, the length buckets, tokenized BLEU and the model NLL are recomputed in the test by other means:
sacremoses and the vocabulary file read as text, a plain-Python multi-bleu.perl, and a sentence-by-sentence
forward pass of the model.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from nmtkit.errors import InputError
from nmtkit.score import ScoreConfig, evaluate, make_metrics, model_nll, paired_bootstrap

from conftest import REPO

SCORE = [sys.executable, str(REPO / "bin" / "nmt-score")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SYSTEMS = ("uedin-wmt14.3023.fr", "kit.3440.fr", "rbmt1.0.fr")
SMALL = 200  # lines of the copies the command-line tests run on


def lines(path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return out


def write(path, rows) -> str:
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return str(path)


def multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl on whitespace tokens: case-sensitive, clipped n-gram precisions, no smoothing."""
    correct, total = [0] * 4, [0] * 4
    c = r = 0
    for h, ref in zip(hyps, refs):
        ht, rt = h.split(), ref.split()
        c, r = c + len(ht), r + len(rt)
        for n in range(1, 5):
            hn = Counter(tuple(ht[k:k + n]) for k in range(len(ht) - n + 1))
            rn = Counter(tuple(rt[k:k + n]) for k in range(len(rt) - n + 1))
            correct[n - 1] += sum(min(v, rn[g]) for g, v in hn.items())
            total[n - 1] += max(len(ht) - n + 1, 0)
    if min(correct) == 0:
        return 0.0
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(a / b) for a, b in zip(correct, total)) / 4)


@pytest.fixture(scope="module")
def wmt(data_dir):
    d = data_dir / "wmt14"
    return {"ref": str(d / "newstest2014.fr"), "src": str(d / "newstest2014.en"),
            "hyps": [str(d / "system-outputs" / s) for s in SYSTEMS]}


@pytest.fixture(scope="module")
def small(wmt, tmp_path_factory):
    """Lines 501-700 of the reference, source and systems, for the command-line tests (about half of them inside
    the shortlist fixture's training lines)."""
    d = tmp_path_factory.mktemp("small")
    part = slice(500, 500 + SMALL)
    out = {"ref": write(d / "ref.fr", lines(wmt["ref"])[part]), "src": write(d / "src.en", lines(wmt["src"])[part])}
    out["hyps"] = [write(d / s, lines(h)[part]) for s, h in zip(SYSTEMS, wmt["hyps"])]
    return out


@pytest.fixture(scope="module")
def shortlist(wmt, tmp_path_factory):
    """A prepared directory (3,000-word shortlists from the first 600 test pairs) and a tiny RNNsearch checkpoint
    with those vocabularies and random, non-uniform weights."""
    import torch

    from nmtkit.data import checkpoint
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import build_model
    from nmtkit.prepare import PrepareConfig, prepare

    d = tmp_path_factory.mktemp("shortlist")
    write(d / "train.en", lines(wmt["src"])[:600])
    write(d / "train.fr", lines(wmt["ref"])[:600])
    prepare(PrepareConfig("en", "fr", train=[str(d / "train")], dest=str(d / "data"), src_vocab_size=3000,
                          tgt_vocab_size=3000))
    data = PreparedData.open(d / "data")
    sv, tv = data.vocab("en"), data.vocab("fr")
    torch.manual_seed(1)
    model = build_model("rnnsearch-tiny", len(sv), len(tv))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    checkpoint.save({"arch": model.arch, "config": model.config.to_dict(), "source_lang": "en", "target_lang": "fr",
                     "vocab": {"src": sv.tokens, "tgt": tv.tokens},
                     "preprocessing": {"src": data.text_config("en").to_dict(),
                                       "tgt": data.text_config("fr").to_dict()},
                     "model": model.state_dict()}, d / "model.pt")
    return str(d / "data"), str(d / "model.pt")


# -- the library against sacreBLEU -----------------------------------------------------------------------------


def test_scores_equal_sacrebleu_on_real_system_outputs(wmt):
    refs = lines(wmt["ref"])
    report = evaluate(ScoreConfig(reference=wmt["ref"], hypotheses=wmt["hyps"][:1],
                                  metrics=["BLEU", "chrF", "BLEU-tok"]))  # (TER: the next test, on a part)
    assert report["sentences"] == 3003 and [s["name"] for s in report["systems"]] == [SYSTEMS[0]]
    system = report["systems"][0]
    bleu = BLEU()
    expected = bleu.corpus_score(lines(wmt["hyps"][0]), [refs])
    assert system["scores"]["BLEU"]["score"] == pytest.approx(expected.score, abs=1e-9)
    assert system["scores"]["BLEU"]["signature"] == bleu.get_signature().format()
    assert system["details"]["BLEU"] == str(expected)
    assert report["metrics"]["BLEU"]["signature"] == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    tok = MosesTokenizer(lang="fr")
    tok_h = [" ".join(tok.tokenize(h, escape=False)) for h in lines(wmt["hyps"][0])]
    tok_r = [" ".join(tok.tokenize(r, escape=False)) for r in refs]
    tokenized = report["systems"][0]["scores"]["BLEU-tok"]
    assert tokenized["score"] == pytest.approx(multi_bleu(tok_h, tok_r), abs=1e-8)
    assert tokenized["score"] == pytest.approx(
        sacrebleu.corpus_bleu(tok_h, [tok_r], tokenize="none", smooth_method="none", force=True).score, abs=1e-9)
    assert tokenized["signature"].startswith("pretok:sacremoses-") and "tok:none|smooth:none" in tokenized["signature"]
    assert f"{report['systems'][0]['scores']['BLEU']['score']:.2f}" == "35.80"  # the README's figure
    chrf = sacrebleu.corpus_chrf(lines(wmt["hyps"][0]), [refs])
    assert report["systems"][0]["scores"]["chrF"]["score"] == pytest.approx(chrf.score, abs=1e-9)
    assert report["metrics"]["chrF"]["signature"] == "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"


def test_ter_of_a_subset_and_its_bootstrap_equal_sacrebleu(wmt):
    """TER's statistics are summed per row like BLEU's: the score of any set of lines is sacreBLEU's on those lines
    alone, and its paired bootstrap is sacreBLEU's PairedTest with TER."""
    from sacrebleu.metrics import TER

    refs = lines(wmt["ref"])[:300]  # (TER is slow: a tenth of news-test-2014 shows the same)
    systems = [(os.path.basename(p), lines(p)[:300]) for p in wmt["hyps"][:2]]
    metric = make_metrics(refs, "fr", ["TER"])["TER"]
    assert metric.signature == "nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:2.6.0"
    stats = metric.stats(systems[0][1])
    whole = sacrebleu.corpus_ter(systems[0][1], [refs])
    assert metric.score(stats) == pytest.approx(whole.score, abs=1e-9) and 0 < whole.score < 100
    rows = np.arange(0, len(refs), 7)
    subset = sacrebleu.corpus_ter([systems[0][1][i] for i in rows], [[refs[i] for i in rows]])
    assert metric.score(stats, rows) == pytest.approx(subset.score, abs=1e-9)
    ours = paired_bootstrap(systems, metric, samples=100)
    sigs, theirs = PairedTest(systems, {"TER": TER()}, [refs], test_type="bs", n_samples=100)()
    assert ours["signature"] == sigs["TER"].format()
    for row, result in zip(ours["systems"], theirs["TER"]):
        assert (row["score"], row["mean"], row["ci"], row["p_value"]) == (
            result.score, result.mean, result.ci, result.p_value)


def test_bootstrap_equals_sacrebleu_paired_test(wmt):
    refs = lines(wmt["ref"])
    systems = [(os.path.basename(p), lines(p)) for p in wmt["hyps"]]
    ours = paired_bootstrap(systems, make_metrics(refs, "fr", ["BLEU"])["BLEU"], samples=200)
    sigs, theirs = PairedTest(systems, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200)()
    assert ours["signature"] == sigs["BLEU"].format() and "bs:200" in ours["signature"]
    for row, result in zip(ours["systems"], theirs["BLEU"]):
        assert (row["score"], row["mean"], row["ci"], row["p_value"]) == (
            result.score, result.mean, result.ci, result.p_value)
    assert ours["systems"][0]["p_value"] is None and all(0 < r["p_value"] <= 1 for r in ours["systems"][1:])


def test_bootstrap_resamples_are_bounded_in_the_library_too(wmt):
    """paired_bootstrap, called from Python, refuses a resample count it would allocate at once (sacreBLEU holds
    (resamples x sentences) rows) before drawing anything, as nmt-score's --bootstrap does."""
    from nmtkit.errors import InputError

    refs = lines(wmt["ref"])
    systems = [(os.path.basename(p), lines(p)) for p in wmt["hyps"][:2]]
    metric = make_metrics(refs, "fr", ["BLEU"])["BLEU"]
    for samples in (0, 10_001, 10**9):
        with pytest.raises(InputError, match=f"--bootstrap must be from 1 to 10,000 resamples \\(got {samples};"):
            paired_bootstrap(systems, metric, samples=samples)
    assert paired_bootstrap(systems, metric, samples=10)["samples"] == 10


def test_no_unk_subset_and_length_buckets_against_independent_counts(wmt, shortlist):
    data_dir, ckpt = shortlist
    src, refs = lines(wmt["src"]), lines(wmt["ref"])
    hyps = lines(wmt["hyps"][0])
    report = evaluate(ScoreConfig(reference=wmt["ref"], hypotheses=wmt["hyps"][:1], source=wmt["src"],
                                  metrics=["BLEU", "chrF", "BLEU-tok"],
                                  vocab=data_dir, by_length=True))
    # independent: sacremoses normalisation + tokenisation, vocabulary files read as text
    known = {}
    for lang in ("en", "fr"):
        entries = lines(os.path.join(data_dir, f"vocab.{lang}"))[1:]
        known[lang] = {e.split("\t")[0] for e in entries} - {"<pad>", "<unk>", "<s>", "</s>"}

    norm = {lang: MosesPunctNormalizer(lang=lang) for lang in ("en", "fr")}
    tok = {lang: MosesTokenizer(lang=lang) for lang in ("en", "fr")}

    def words(line, lang):
        return tok[lang].tokenize(norm[lang].normalize(line), escape=False)

    subset = [i for i in range(len(src)) if set(words(src[i], "en")) <= known["en"]
              and set(words(refs[i], "fr")) <= known["fr"]]
    no_unk = report["no_unk"]
    assert no_unk["sentences"] == len(subset) and no_unk["of"] == 3003
    assert 100 < len(subset) < 3003
    name = SYSTEMS[0]
    expected = sacrebleu.corpus_bleu([hyps[i] for i in subset], [[refs[i] for i in subset]]).score
    assert no_unk["scores"][name]["BLEU"] == pytest.approx(expected, abs=1e-9)
    # the same shortlists read from the checkpoint give the same subset
    from nmtkit.data import checkpoint
    from nmtkit.score import no_unk_rows, shortlist_from_checkpoint

    rows = no_unk_rows(src, refs, shortlist_from_checkpoint(checkpoint.load(ckpt), ckpt))
    assert rows.tolist() == subset

    by = report["by_length"]
    assert by["labels"] == ["0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60+"]
    assert sum(by["counts"]) == 3003
    lengths = [len(tok["en"].tokenize(s, escape=False)) for s in src]
    assert by["counts"] == [sum(1 for n in lengths if min(n // 10, 6) == k) for k in range(7)]
    for k in (1, 6):
        rows = [i for i, n in enumerate(lengths) if min(n // 10, 6) == k]
        expected = sacrebleu.corpus_bleu([hyps[i] for i in rows], [[refs[i] for i in rows]]).score
        assert by["scores"][name][k] == pytest.approx(expected, abs=1e-9)


def test_model_nll_equals_sentence_by_sentence_log_softmax(wmt, shortlist):
    import torch

    from nmtkit.data import checkpoint
    from nmtkit.models import build_from_checkpoint
    from nmtkit.data.text import Preprocessor, TextConfig
    from nmtkit.data.vocab import BOS, EOS, UNK

    _, ckpt = shortlist
    src, refs = lines(wmt["src"])[590:614], lines(wmt["ref"])[590:614]  # some seen, some with unknown words
    payload = checkpoint.load(ckpt)
    result = model_nll(payload, src, refs, batch_size=5)
    model = build_from_checkpoint(payload).eval()
    sv = {t: i for i, t in enumerate(payload["vocab"]["src"])}
    tv = {t: i for i, t in enumerate(payload["vocab"]["tgt"])}
    sp, tp = Preprocessor(TextConfig("en")), Preprocessor(TextConfig("fr"))
    expected, tokens, words = [], 0, 0
    with torch.no_grad():
        for s, r in zip(src, refs):
            x = [sv.get(w, UNK) for w in sp.words(s)] + [EOS]
            y = [tv.get(w, UNK) for w in tp.words(r)]
            logits = model(torch.tensor([x]), torch.tensor([len(x)]), torch.tensor([[BOS] + y]))
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            expected.append(-sum(logp[t, tok].item() for t, tok in enumerate(y + [EOS])))
            tokens, words = tokens + len(y) + 1, words + len(y)
    np.testing.assert_allclose(result["nll"], expected, rtol=1e-4)
    assert result["tokens"] == tokens and result["words"] == words and result["sentences"] == 24
    assert result["per_sentence"] == pytest.approx(sum(expected) / 24, rel=1e-4)
    assert result["per_token"] == pytest.approx(sum(expected) / tokens, rel=1e-4)
    assert result["per_word"] == pytest.approx(sum(expected) / words, rel=1e-4)
    assert result["perplexity"] == pytest.approx(math.exp(result["per_token"]))


def test_model_nll_on_the_reference_backend(wmt, shortlist, monkeypatch):
    """``backend="reference"`` (nmt-score --backend) computes the NLL with the paper's equations as they read:
    the same figures, from nmtkit.models.reference."""
    from nmtkit.data import checkpoint
    from nmtkit.models import reference

    _, ckpt = shortlist
    src, refs = lines(wmt["src"])[590:602], lines(wmt["ref"])[590:602]
    payload = checkpoint.load(ckpt)
    fast = model_nll(payload, src, refs, batch_size=5)
    calls = []
    by_the_equations = reference.teacher_forced
    monkeypatch.setattr(reference, "teacher_forced", lambda *a, **k: calls.append(1) or by_the_equations(*a, **k))
    slow = model_nll(payload, src, refs, batch_size=5, backend="reference")
    assert len(calls) == 3  # three batches of at most 5
    np.testing.assert_allclose(slow["nll"], fast["nll"], rtol=1e-5)
    with pytest.raises(InputError, match="unknown backend 'slow'"):
        model_nll(payload, src, refs, backend="slow")


def test_by_length_plot_is_a_readable_png(tmp_path):
    import matplotlib.image

    from nmtkit.plots import plot_by_length

    out = tmp_path / "len.png"
    plot_by_length(["0-9", "10-19", "20-29", "30+"], [10, 20, 5, 0],
                   {"RNNsearch": [20.0, 22.5, 21.0, None], "RNNencdec": [19.0, 15.0, 9.5, None]}, out,
                   note="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(out)
    assert 500 < img.shape[1] < 3000 and 400 < img.shape[0] < 2000
    assert img[..., :3].std() > 0.05  # not blank
    for ext, magic in (("svg", b"<?xml"), ("pdf", b"%PDF")):
        plot_by_length(["0-9"], [1], {"a": [1.0]}, tmp_path / f"x.{ext}")
        assert (tmp_path / f"x.{ext}").read_bytes().startswith(magic)
    assert sorted(os.listdir(tmp_path)) == ["len.png", "x.pdf", "x.svg"]  # no temporary files left


# -- the command -----------------------------------------------------------------------------------------------


def run_score(*args, check=True, stdin: str | None = None):
    proc = subprocess.run(SCORE + [str(a) for a in args], capture_output=True, text=True, env=ENV, timeout=300,
                          input=stdin)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.slow
def test_command_reports_everything_as_json(small, shortlist, tmp_path):
    data_dir, ckpt = shortlist
    plot = tmp_path / "by-length.png"
    proc = run_score("-r", small["ref"], "-s", small["src"], "-m", ckpt, "--by-length", "--plot", plot,
                     "--bootstrap", 20, "-n", "moses", "-n", "kit", "-n", "rbmt", "--json", *small["hyps"])
    report = json.loads(proc.stdout)
    refs = lines(small["ref"])
    assert [s["name"] for s in report["systems"]] == ["moses", "kit", "rbmt"]
    for system, path in zip(report["systems"], small["hyps"]):
        assert system["scores"]["BLEU"]["score"] == pytest.approx(
            sacrebleu.corpus_bleu(lines(path), [refs]).score, abs=1e-9)
    assert 0 < report["no_unk"]["sentences"] < SMALL
    assert sum(report["by_length"]["counts"]) == SMALL
    assert [b["metric"] for b in report["bootstrap"]] == ["BLEU", "chrF", "TER", "BLEU-tok"]
    assert report["nll"]["sentences"] == SMALL and report["nll"]["per_word"] > 0
    assert report["plot"] == str(plot) and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_command_text_output_carries_signatures(small):
    out = run_score("-r", small["ref"], "-s", small["src"], "--by-length", "--bucket-width", 20, "--bootstrap", 10,
                    *small["hyps"][:2]).stdout
    table = out.split("\n")
    header = next(line for line in table if line.startswith("system"))
    assert header.split() == ["system", "BLEU", "chrF", "TER", "BLEU-tok"]
    assert any(line.startswith("TER ") and "tok:tercom" in line and "lower is better" in line for line in table)
    assert any(line.startswith("BLEU ") and "tok:13a" in line for line in table)
    assert any(line.startswith("BLEU-tok ") and "NOT comparable" in line for line in table)
    assert any(line.startswith("chrF ") and "nc:6" in line for line in table)
    lengths = table[table.index(next(line for line in table if line.startswith("length"))):]
    assert [row.split()[0] for row in lengths[1:6]] == ["0-19", "20-39", "40-59", "60+", "all"]
    assert sum(int(row.split()[1]) for row in lengths[1:5]) == int(lengths[5].split()[1]) == SMALL
    assert "Paired bootstrap resampling, BLEU (10 resamples" in out and "seed:12345" in out
    assert next(line for line in table if line.startswith(SYSTEMS[0]) and "baseline" in line)


def test_a_byte_order_mark_is_not_scored_as_text(small, tmp_path):
    """A hypothesis file saved with a UTF-8 byte-order mark (file or stdin) scores as the same file without it."""
    plain = run_score("-r", small["ref"], "--json", small["hyps"][0]).stdout
    marked = tmp_path / "marked.fr"
    marked.write_bytes(b"\xef\xbb\xbf" + open(small["hyps"][0], "rb").read())
    from_file = run_score("-r", small["ref"], "--json", marked).stdout
    from_stdin = run_score("-r", small["ref"], "--json", "-", stdin=marked.read_bytes().decode("utf-8")).stdout
    for out in (from_file, from_stdin):
        assert [s["scores"] for s in json.loads(out)["systems"]] == [s["scores"] for s in json.loads(plain)["systems"]]


def test_empty_lines_are_scored_as_sacrebleu_scores_them(small, tmp_path):
    refs, hyps = lines(small["ref"]), lines(small["hyps"][0])
    holes = write(tmp_path / "holes.fr", ["" if k % 3 == 0 else h for k, h in enumerate(hyps)])
    blank = write(tmp_path / "blank.fr", [""] * len(refs))
    report = evaluate(ScoreConfig(reference=small["ref"], hypotheses=[holes, blank]))
    for system, path in zip(report["systems"], (holes, blank)):
        h = lines(path)
        assert system["scores"]["BLEU"]["score"] == pytest.approx(sacrebleu.corpus_bleu(h, [refs]).score, abs=1e-9)
        assert system["scores"]["chrF"]["score"] == pytest.approx(sacrebleu.corpus_chrf(h, [refs]).score, abs=1e-9)
        assert system["scores"]["TER"]["score"] == pytest.approx(sacrebleu.corpus_ter(h, [refs]).score, abs=1e-9)
    assert report["systems"][1]["scores"]["BLEU"]["score"] == 0.0


@pytest.mark.slow
def test_command_bad_inputs_are_one_line_errors(small, tmp_path):
    short = write(tmp_path / "short.fr", lines(small["hyps"][1])[:-1])
    empty = write(tmp_path / "empty.fr", [])
    plot = tmp_path / "plot.png"
    cases = [
        (["-r", small["ref"], small["hyps"][0], short], [short, f"{SMALL - 1} lines", small["ref"], str(SMALL)]),
        (["-r", small["ref"], empty], [empty, "0 lines", str(SMALL)]),
        (["-r", small["ref"], "-s", short, "--plot", plot, small["hyps"][0]], ["source", short, f"{SMALL - 1}"]),
        (["-r", small["ref"], "--by-length", small["hyps"][0]], ["-s SRC"]),
        (["-r", small["ref"], "-s", small["src"], "--plot", tmp_path / "p.jpg", small["hyps"][0]], [".png"]),
        (["-r", empty, empty], ["empty"]),
        (["-r", small["ref"], "--backend", "reference", small["hyps"][0]], ["--backend", "-m CHECKPOINT"]),
    ]
    for args, needles in cases:
        proc = run_score(*args, check=False)
        assert proc.returncode == 1, (args, proc.stderr)
        err = proc.stderr.strip().split("\n")
        assert len(err) == 1 and err[0].startswith("nmt-score: error: "), proc.stderr
        assert all(n in err[0] for n in needles), err[0]
        assert proc.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["empty.fr", "short.fr"]  # no plot, no temporary file


def test_a_line_too_long_for_the_models_nll_is_one_line(shortlist, tmp_path):
    """--model's NLL scores each pair whole (teacher forcing holds a source x target attention matrix): a side of
    more than 1,000 model tokens is refused before anything is computed, naming its file and line."""
    _, ckpt = shortlist
    src = write(tmp_path / "src.en", ["A cat sleeps .", "Two dogs play .", "It rains ."])
    ref = write(tmp_path / "ref.fr", ["Un chat dort .", " ".join(["chat"] * 1001), "Il pleut ."])
    hyp = write(tmp_path / "hyp.fr", ["Un chat dort .", "Deux chiens jouent .", "Il pleut ."])
    proc = run_score("-r", ref, "-s", src, "-m", ckpt, "--metrics", "BLEU", hyp, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"nmt-score: error: {ref}:2: has 1,001 model tokens, more than the 1,000 a pair scored whole may have "
        "(--model's NLL scores each pair whole): shorten or remove the line, or score without --model"]


def test_a_huge_bootstrap_and_a_closed_stdin_are_one_line_errors(tmp_path):
    ref = write(tmp_path / "ref.fr", ["Un chat dort .", "Il pleut ."])
    proc = run_score("-r", ref, "--bootstrap", "99999999999999999999", ref, check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "nmt-score: error: --bootstrap must be from 0 to 10,000 resamples (got 99999999999999999999; sacreBLEU's "
        "default is 1,000, and each resample holds a statistics row per sentence)"]
    proc = subprocess.run(SCORE + ["-r", ref, "-"], capture_output=True, text=True, env=ENV, timeout=300,
                          preexec_fn=lambda: os.close(0))  # (nmt-score -r ref.fr - <&-)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.strip().splitlines() == [
        "nmt-score: error: standard input: is closed: give the file's name instead of '-', or pipe the text in"]


def test_help_does_not_import_torch():
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from nmtkit.cli import score\n"
            "r = CliRunner().invoke(score.main, ['--help'])\n"
            "assert r.exit_code == 0 and '--bootstrap' in r.output, r.output\n"
            "assert 'torch' not in sys.modules and 'sacrebleu' not in sys.modules, 'heavy import'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
