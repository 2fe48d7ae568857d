"""nmt-align and nmtkit.align: AER on hand-computed cases and on the real Hansards trial gold set (37 sentences,
Och & Ney's Sure/Possible annotation), gold readers against each other, soft → hard alignments, plots, errors.

The trial set's figures are recomputed in the test from the files with plain string code, never with nmtkit's
readers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nmtkit.align import (Aligner, GoldAlignment, alignment_error, hard_links, parse_pharaoh, read_naacl,
                          read_pharaoh, read_text, strip_wrapper, word_matrix)
from nmtkit.errors import InputError

from conftest import REPO, pharaoh_links
from nmtkit.translate.config import DecodeConfig

ALIGN = [sys.executable, str(REPO / "bin" / "nmt-align")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def gold(sure, possible=()) -> GoldAlignment:
    g = GoldAlignment()
    for i, j in sure:
        g.add(i, j, True, 1, f"{i}-{j}")
    for i, j in possible:
        g.add(i, j, False, 1, f"{i}-{j}-P")
    return g


# -- AER, precision, recall by hand ----------------------------------------------------------------------------


def test_aer_on_hand_computed_cases():
    # A = {0-0, 1-1, 2-1}; S = {0-0}; P = S + {1-1}: |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 1
    s = alignment_error([{(0, 0), (1, 1), (2, 1)}], [gold([(0, 0)], [(1, 1)])])
    assert (s.links, s.sure, s.possible, s.hits_sure, s.hits_possible) == (3, 1, 2, 1, 2)
    assert s.precision == pytest.approx(2 / 3) and s.recall == 1.0 and s.aer == pytest.approx(1 - 3 / 4)
    # perfect on Sure links only: AER 0 even though Possible links are missed
    s = alignment_error([{(0, 0), (1, 1)}], [gold([(0, 0), (1, 1)], [(2, 2)])])
    assert (s.precision, s.recall, s.aer) == (1.0, 1.0, 0.0)
    # nothing right
    s = alignment_error([[(0, 1)]], [gold([(0, 0)])])
    assert (s.precision, s.recall, s.aer) == (0.0, 0.0, 1.0)
    # counts add over sentences: (A∩S + A∩P) = (1 + 1) + (0 + 1), |A| + |S| = (1 + 1) + (2 + 1)
    s = alignment_error([[(0, 0)], [(1, 0), (5, 5)]], [gold([(0, 0)]), gold([(3, 3)], [(1, 0)])])
    assert s.aer == pytest.approx(1 - 3 / 5)
    assert s.precision == pytest.approx(2 / 3) and s.recall == pytest.approx(1 / 2)
    # a link given as both Sure and Possible is Sure; no links at all: undefined, not a crash
    g = gold([(0, 0)], [(0, 0)])
    assert g.sure == {(0, 0)} and g.possible == {(0, 0)}
    s = alignment_error([set()], [GoldAlignment()])
    assert (s.precision, s.recall, s.aer) == (None, None, None)


def test_pharaoh_links_and_order():
    g = parse_pharaoh("0-1 2-3-P 4?5 1-1-S")
    assert g.sure == {(0, 1), (1, 1)} and g.possible == {(0, 1), (2, 3), (4, 5), (1, 1)}
    g = parse_pharaoh("0-1 2-3-P", order="tgt-src")
    assert g.sure == {(1, 0)} and g.possible == {(1, 0), (3, 2)}
    with pytest.raises(InputError, match=r"x\.align:7: '3:4' is not a Pharaoh link"):
        parse_pharaoh("0-0 3:4", path="x.align", line=7)


def test_wrapper_and_text_reading(tmp_path):
    assert strip_wrapper("<s snum=1001> each of them . </s>") == ("1001", "each of them .")
    assert strip_wrapper('<s snum="7">x  </s>  ') == ("7", "x")
    assert strip_wrapper("a <s> b </s>") == (None, "a <s> b </s>")
    p = tmp_path / "t.e"
    p.write_bytes(b"<s snum=12> a b </s>\nplain \xe2\x80\xa8 line\n")
    rows = read_text(str(p))
    assert [(r.line, r.snum, r.text) for r in rows] == [(1, "12", "a b"), (2, None, "plain \u2028 line")]
    assert rows[0].name == "sentence 12 (line 1)" and rows[1].name == "sentence 2"


# -- the Hansards trial set ------------------------------------------------------------------------------------


def trial_files(data_dir):
    d = data_dir / "hansards-trial"
    return {k: str(d / n) for k, n in (("e", "trial.e"), ("f", "trial.f"), ("align", "trial.align"),
                                       ("naacl", "trial.wa.nonullalign"))}


def independent_trial(data_dir):
    """(english words, french words, sure, possible) per sentence, from the files with plain string code."""
    t = trial_files(data_dir)

    def unwrap(path):
        out = []
        for line in open(path, encoding="utf-8").read().split("\n"):
            if line:
                assert line.startswith("<s snum=") and line.rstrip().endswith("</s>")
                out.append(line.split(">", 1)[1].rsplit("</s>", 1)[0].split())
        return out

    e, f = unwrap(t["e"]), unwrap(t["f"])
    sure, possible = [], []
    for line in open(t["align"], encoding="utf-8").read().split("\n")[: len(e)]:
        s, p = set(), set()
        for link in line.split():
            parts = link.split("-")
            fi, ei = int(parts[0]), int(parts[1])  # French first
            p.add((ei, fi))
            if len(parts) == 2:
                s.add((ei, fi))
        sure.append(s)
        possible.append(p)
    return e, f, sure, possible


def test_gold_readers_agree_on_the_trial_set(data_dir):
    t = trial_files(data_dir)
    sentences = read_text(t["e"])
    assert len(sentences) == 37 and sentences[0].snum == "1001" and sentences[-1].snum == "1039"
    pharaoh = read_pharaoh(t["align"], order="tgt-src")  # written f-e: target first
    naacl = read_naacl(t["naacl"], [s.snum for s in sentences], order="src-tgt")  # written e f: source first
    assert [(g.sure, g.possible) for g in pharaoh] == [(g.sure, g.possible) for g in naacl]
    assert sum(len(g.sure) for g in pharaoh) == 338
    assert sum(len(g.possible - g.sure) for g in pharaoh) == 1446  # README: 338 Sure + 1,446 Possible
    _, _, sure, possible = independent_trial(data_dir)
    assert [g.sure for g in pharaoh] == sure and [g.possible for g in pharaoh] == possible


def test_diagonal_aligner_on_the_trial_set(data_dir):
    e, f, sure, possible = independent_trial(data_dir)
    # a trivial aligner: target word j ↔ source word min(j, last), through the soft → hard path
    hyps = []
    for src, tgt in zip(e, f):
        alpha = np.zeros((len(tgt) + 1, len(src) + 1))
        for j in range(len(tgt) + 1):
            alpha[j, min(j, len(src))] = 1.0
        hyps.append(hard_links(alpha))
    diagonal = [{(j, j) for j in range(min(len(src), len(tgt)))} for src, tgt in zip(e, f)]
    a = sum(len(h) for h in hyps)
    a_s = sum(len(set(h) & s) for h, s in zip(hyps, sure))
    a_p = sum(len(set(h) & p) for h, p in zip(hyps, possible))
    s_n = sum(len(s) for s in sure)
    t = trial_files(data_dir)
    scores = alignment_error(hyps, read_pharaoh(t["align"], order="tgt-src"))
    assert scores.aer == pytest.approx(1 - (a_s + a_p) / (a + s_n))
    assert scores.precision == pytest.approx(a_p / a) and scores.recall == pytest.approx(a_s / s_n)
    assert 0.3 < scores.aer < 0.9  # Hansards are close to monotone: the diagonal is a poor but real aligner
    plain = alignment_error(diagonal, read_pharaoh(t["align"], order="tgt-src"))
    d_a, d_s = sum(map(len, diagonal)), sum(len(d & s) for d, s in zip(diagonal, sure))
    d_p = sum(len(d & p) for d, p in zip(diagonal, possible))
    assert plain.aer == pytest.approx(1 - (d_s + d_p) / (d_a + s_n))


# -- soft → hard -----------------------------------------------------------------------------------------------


def test_word_matrix_merges_subwords():
    src = ["the", "un@@", "believ@@", "able", "man"]
    tgt = ["l@@", "'@@", "homme", "in@@", "croy@@", "able"]
    rng = np.random.default_rng(0)
    alpha = rng.dirichlet(np.ones(len(src) + 1), size=len(tgt) + 1)  # rows sum to 1, </s> last
    w = word_matrix(src, tgt, alpha)
    assert w.shape == (2 + 1, 3 + 1)  # l'homme, incroyable + </s>; the, unbelievable, man + </s>
    np.testing.assert_allclose(w.sum(1), 1.0)
    # target word 1 ("incroyable") = mean of token rows 3..5; source word 1 ("unbelievable") = sum of cols 1..3
    assert w[1, 1] == pytest.approx(alpha[3:6, 1:4].sum(1).mean())
    assert w[0, 3] == pytest.approx(alpha[0:3, 5].mean())  # "l'homme" on </s>
    # argmax per target word over the source words (</s> left out), computed directly from the token matrix
    src_groups, tgt_groups = [[0], [1, 2, 3], [4]], [[0, 1, 2], [3, 4, 5]]
    expected = []
    for j, rows in enumerate(tgt_groups):
        scores = [alpha[rows][:, cols].sum(1).mean() for cols in src_groups]
        expected.append((int(np.argmax(scores)), j))
    assert hard_links(w) == expected


def test_hard_link_rules():
    w = np.array([[0.6, 0.3, 0.1],
                  [0.45, 0.45, 0.1],
                  [0.1, 0.2, 0.7]])  # two target words, two source words, </s> last
    assert hard_links(w) == [(0, 0), (0, 1)]
    assert hard_links(w, "threshold", 0.4) == [(0, 0), (0, 1), (1, 1)]
    assert hard_links(w, "threshold", 0.99) == [(0, 0), (0, 1)]  # the argmax link always stays
    assert hard_links(np.ones((1, 3))) == []


def test_attention_plot_is_a_readable_png(tmp_path):
    import matplotlib.image

    from nmtkit.plots import plot_attention

    src = "the agreement on the European Economic Area was signed in August 1992 . </s>".split()
    tgt = "l' accord sur la zone économique européenne a été signé en août 1992 . </s>".split()
    alpha = np.full((len(tgt), len(src)), 0.02)
    order = [0, 1, 2, 3, 6, 5, 4, 7, 7, 8, 9, 10, 11, 12, 13]  # Figure 3's reordering: zone ↔ Area first
    for j, i in enumerate(order):
        alpha[j, i] = 0.9
    out = tmp_path / "fig3.png"
    plot_attention(src, tgt, alpha, out, title="Figure 3 (a) style")
    img = matplotlib.image.imread(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 300 < img.shape[0] < 3000 and 300 < img.shape[1] < 3000
    gray = img[..., :3].mean(-1)
    assert gray.min() < 0.1 and gray.max() > 0.9  # black cells and white cells (and white background)
    with pytest.raises(ValueError, match="shape"):
        plot_attention(src, tgt[:-1], alpha, tmp_path / "bad.png")



def test_the_plot_limit_counts_words_not_the_closing_eos(tmp_path):
    """nmt-align says "more than 100 words on a side" of the lines it does not plot: a line of exactly 100 words
    and its </s> is drawn, one of 101 is not."""
    from nmtkit.plots import MAX_PLOT_WORDS, write_attention_plots

    def item(line, words):
        src = [f"w{k}" for k in range(words)] + ["</s>"]
        tgt = ["x", "</s>"]
        return line, "", src, tgt, np.full((len(tgt), len(src)), 1.0 / len(src))

    names, skipped = write_attention_plots(str(tmp_path / "plots"), [item(1, MAX_PLOT_WORDS),
                                                                     item(2, MAX_PLOT_WORDS + 1)], fmt="svg")
    assert names == ["0001.svg"] and skipped == [2]
    assert (tmp_path / "plots" / "0001.svg").stat().st_size > 0

# -- with a model ----------------------------------------------------------------------------------------------


def random_trial_model(data_dir, d, src: str = "en", tgt: str = "fr") -> str:
    """A tiny RNNsearch translating ``src`` to ``tgt`` with random non-uniform weights and vocabularies from the
    Hansards train sample (lowercased, as the trial set is), saved under directory ``d``: its checkpoint's path."""
    import torch

    from nmtkit.data import checkpoint
    from nmtkit.data.manifest import PreparedData
    from nmtkit.models import build_model
    from nmtkit.prepare import PrepareConfig, prepare

    torch.set_num_threads(1)
    sample = data_dir / "hansards-trial" / "train-sample"
    for ext, lang in (("e", "en"), ("f", "fr")):
        with open(d / f"train.{lang}", "wb") as out:
            for name in sorted(os.listdir(sample)):
                if name.endswith(f".{ext}"):
                    out.write((sample / name).read_bytes())
    prepare(PrepareConfig(src, tgt, train=[str(d / "train")], dest=str(d / f"data-{src}-{tgt}"),
                          src_vocab_size=2000, tgt_vocab_size=2000, lowercase=True))
    data = PreparedData.open(d / f"data-{src}-{tgt}")
    sv, tv = data.vocab(src), data.vocab(tgt)
    torch.manual_seed(0 if src == "en" else 1)
    m = build_model("rnnsearch-tiny", len(sv), len(tv))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    path = str(d / f"model-{src}-{tgt}.pt")
    checkpoint.save({"arch": m.arch, "config": m.config.to_dict(), "source_lang": src, "target_lang": tgt,
                     "vocab": {"src": sv.tokens, "tgt": tv.tokens},
                     "preprocessing": {"src": data.text_config(src).to_dict(),
                                       "tgt": data.text_config(tgt).to_dict()},
                     "model": m.state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def model(data_dir, tmp_path_factory):
    return random_trial_model(data_dir, tmp_path_factory.mktemp("align"))


def test_forced_attention_of_own_translation_equals_beam_attention(model):
    from nmtkit.data.batching import collate_source
    from nmtkit.translate.search import beam_search

    aligner = Aligner(model, tokenized=True, decode=DecodeConfig(beam=3))
    words = [s.split() for s in ("the house is small .", "we must act now", "")]
    soft = aligner.align_words(words)
    src_ids = [aligner.src_vocab.encode(w) for w in words]
    src, lens = collate_source(src_ids)
    hyps = beam_search([aligner.model], src, lens, aligner.decode, need_attention=True)
    for k, (a, h) in enumerate(zip(soft, hyps)):
        assert a.target == aligner.tgt_vocab.decode(h[0].tokens)
        beam_alpha = h[0].attention[:, : len(words[k]) + 1].numpy()
        np.testing.assert_allclose(a.alpha, beam_alpha, atol=1e-4)  # word = token level here (no BPE)
        np.testing.assert_allclose(a.alpha.sum(1), 1.0, atol=1e-5)
        assert not words[k] or a.alpha[:-1, :-1].std() > 0  # the random weights attend unevenly


def test_reference_backend_aligns_as_the_fast_one(model, monkeypatch):
    """``Aligner(backend="reference")`` (nmt-align --backend reference): the attention of the paper's equations as
    they read (nmtkit.models.reference), the same as the fast backend's."""
    from nmtkit.models import reference

    words = [s.split() for s in ("the house is small .", "we must act now")]
    targets = [s.split() for s in ("la maison est petite .", "nous devons agir")]
    fast = Aligner(model, tokenized=True).align_words(words, targets)
    calls = []
    by_the_equations = reference.teacher_forced
    monkeypatch.setattr(reference, "teacher_forced", lambda *a, **k: calls.append(1) or by_the_equations(*a, **k))
    slow = Aligner(model, tokenized=True, backend="reference").align_words(words, targets)
    assert calls
    for a, b in zip(fast, slow):
        assert a.target == b.target
        np.testing.assert_allclose(b.alpha, a.alpha, atol=1e-5)


def run_align(*args, check=True):
    proc = subprocess.run(ALIGN + [str(a) for a in args], capture_output=True, text=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def read_pharaoh_plain(path):
    return [set(pharaoh_links(line)) for line in open(path, encoding="utf-8").read().split("\n")[:-1]]


@pytest.mark.slow
def test_command_on_the_trial_set(model, data_dir, tmp_path):
    import matplotlib.image

    t = trial_files(data_dir)
    out, plots = tmp_path / "trial.hyp.align", tmp_path / "plots"
    proc = run_align("-m", model, "-s", t["e"], "-t", t["f"], "--tokenized", "--gold", t["align"], "--gold-order",
                     "tgt-src", "--pharaoh", out, "--plot-dir", plots, "--plot-sentences", "2,5-6", "--json")
    report = json.loads(proc.stdout)
    e, f, sure, possible = independent_trial(data_dir)
    hyps = read_pharaoh_plain(out)
    assert len(hyps) == 37
    for h, src, tgt in zip(hyps, e, f):  # one link per target word, inside the sentence
        assert sorted(j for _, j in h) == list(range(len(tgt))) and all(i < len(src) for i, _ in h)
    a_s = sum(len(h & s) for h, s in zip(hyps, sure))
    a_p = sum(len(h & p) for h, p in zip(hyps, possible))
    a, s_n = sum(map(len, hyps)), sum(map(len, sure))
    assert report["aer"] == pytest.approx(1 - (a_s + a_p) / (a + s_n))
    assert report["precision"] == pytest.approx(a_p / a) and report["recall"] == pytest.approx(a_s / s_n)
    assert sorted(os.listdir(plots)) == ["0002.png", "0005.png", "0006.png", "index.tsv"]
    img = matplotlib.image.imread(plots / "0005.png")
    assert min(img.shape[:2]) > 200
    index = (plots / "index.tsv").read_text(encoding="utf-8").split("\n")
    assert index[0] == "line\tfile\tsource\ttarget" and index[1].startswith("2\t0002.png\t" + " ".join(e[1]))
    # the NAACL gold gives the same figures; the Pharaoh output goes to stdout and the report to stderr
    proc = run_align("-m", model, "-s", t["e"], "-t", t["f"], "--tokenized", "--gold", t["naacl"], "--pharaoh", "-",
                     "--json")
    assert json.loads(proc.stderr) == {**report, "gold": t["naacl"]}
    assert [set(pharaoh_links(line)) for line in proc.stdout.split("\n")[:-1]] == hyps
    # the README's example, exactly as written, on the files of the trial set it names: the same AER
    line = next(x.strip() for x in (REPO / "README.rst").read_text(encoding="utf-8").splitlines()
                if x.strip().startswith("nmt-align "))
    given = {"model.pt": model, **{os.path.basename(v): v for v in t.values()}, "plots": tmp_path / "readme-plots"}
    args = line.split()[1:]
    assert {"-s", "-t", "--gold"} <= set(args)
    for flag in ("-s", "-t", "--gold"):
        assert args[args.index(flag) + 1] in given, f"the README names {args[args.index(flag) + 1]}: not in the data"
    proc = run_align(*[given.get(a, a) for a in args], "--json")
    assert json.loads(proc.stdout)["aer"] == pytest.approx(report["aer"])  # (no --pharaoh: the report on stdout)
    # --backend reference: the paper's equations as they read give the same links
    proc = run_align("-m", model, "-s", t["e"], "-t", t["f"], "--tokenized", "--backend", "reference", "--pharaoh",
                     "-", "-q")
    assert [set(pharaoh_links(line)) for line in proc.stdout.split("\n")[:-1]] == hyps


def call_in_process(args, capsys) -> tuple[int, str, str]:
    """nmt-align's command in this process (torch is loaded already): (exit code, stdout, stderr)."""
    import logging

    from nmtkit.cli.align import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(SystemExit) as exit_info:
            main.main([str(a) for a in args], prog_name="nmt-align")
    finally:  # the command configures logging onto the captured stderr: put the test run's back
        root.handlers[:], root.level = handlers, level
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.slow
def test_command_bad_inputs_are_one_line_errors(model, data_dir, tmp_path, capsys):
    t = trial_files(data_dir)
    lines = open(t["f"], encoding="utf-8").read().split("\n")[:-1]
    short = tmp_path / "short.f"
    short.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    gold_lines = open(t["align"], encoding="utf-8").read().split("\n")
    gold_lines[11] += " 40-3"  # line 12 = sentence 1014: French word 40 does not exist
    bad_gold = tmp_path / "bad.align"
    bad_gold.write_text("\n".join(gold_lines), encoding="utf-8")
    n_f = len(lines[11].split()) - 3  # without "<s", "snum=…>" and "</s>"
    bad_naacl = tmp_path / "bad.wa"
    bad_naacl.write_text(open(t["naacl"], encoding="utf-8").read().replace("\n1012 ", "\n1099 ", 1))
    out, plots = tmp_path / "out.align", tmp_path / "plots"
    common = ["-m", model, "-s", t["e"], "--tokenized", "--pharaoh", out, "--plot-dir", plots]
    cases = [
        (["-t", short], [str(short), "36 sentences", "37"]),
        (["-t", t["f"], "--gold", bad_gold, "--gold-order", "tgt-src"],
         [f"{bad_gold}:12", "sentence 1014 (line 12)", "link 40-3", f"target has {n_f} words"]),
        (["-t", t["f"], "--gold", bad_naacl], [str(bad_naacl), "sentence 1099 is not in the text"]),
        (["-t", t["f"], "--gold", t["align"]], ["--gold-order"]),  # f-e read as e-f: out of range
        (["--gold", t["align"]], ["-t TGT"]),
        (["-t", t["f"], "--plot-sentences", "3-99"], ["3-99", "1-37"]),
    ]
    for k, (args, needles) in enumerate(cases):
        if k < 2:  # the real executable
            proc = run_align(*common, *args, check=False)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            code, stdout, stderr = call_in_process(common + args, capsys)
        assert code == 1, (args, stderr)
        err = stderr.strip().split("\n")
        assert len(err) == 1 and err[0].startswith("nmt-align: error: "), stderr
        assert all(str(n) in err[0] for n in needles), err[0]
        assert stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["bad.align", "bad.wa", "short.f"]  # nothing written
    with pytest.raises(InputError, match="rnnsearch"):
        encdec = tmp_path / "encdec.pt"
        from nmtkit.data import checkpoint
        from nmtkit.models import build_model

        payload = checkpoint.load(model)
        m = build_model("rnnencdec-tiny", len(payload["vocab"]["src"]), len(payload["vocab"]["tgt"]))
        checkpoint.save({**payload, "arch": m.arch, "config": m.config.to_dict(), "model": m.state_dict()}, encdec)
        Aligner(str(encdec))
