"""Guided alignment (nmt-train --guided-alignment, nmtkit/train/guided.py): the attention's cross-entropy against word
links, the same in both backends with its gradients; the links carried from words to BPE units (deterministic and
BPE-dropout's); a run guided towards links aligns by them where an unguided one does not; resume under guidance is
exact; and every bad links file is one error naming its file and line.  examples/guide_links.py makes the links with
eflomal on a prepared corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.manifest import PreparedData
from nmtkit.errors import InputError
from nmtkit.models import reference
from nmtkit.models.attention import attention_cross_entropy
from nmtkit.models.params import paper_weights
from nmtkit.prepare import PrepareConfig, prepare
from nmtkit.train.guided import GuidedAlignment
from nmtkit.train.trainer import Trainer, train

from conftest import REPO, make_batch, pharaoh_links, randomize_, tiny, train_cfg

SRC_LENS, TGT_LENS = [4, 6, 2, 5], [5, 3, 4, 6]  # (not sorted by source length: the fast loss reorders the batch)


def _random_guide(seed: int = 3) -> torch.Tensor:
    """Rows of one or two links for most target positions of make_batch's batch (every third row unguided)."""
    g = torch.Generator().manual_seed(seed)
    B, Ty, Tx = len(SRC_LENS), max(TGT_LENS) + 1, max(SRC_LENS)
    guide = torch.zeros(B, Ty, Tx, dtype=torch.float64)
    for b in range(B):
        for i in range(TGT_LENS[b] + 1):
            if i % 3 != 1:
                guide[b, i, torch.randint(0, SRC_LENS[b], (2,), generator=g)] = 1.0
    return guide / guide.sum(-1, keepdim=True).clamp_min(1.0)


def _grads(model, loss) -> dict:
    model.zero_grad()
    loss.backward()
    return {k: p.grad.to_dense().clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_attention_loss_is_the_same_in_both_backends_with_its_gradients(dtype):
    model = randomize_(tiny("rnnsearch")).to(dtype)
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    guide = _random_guide().to(dtype)
    model.backend = "fast"
    loss, nll, align = model.training_loss(src, lens, tgt_in, tgt_out, 0.1, guide)
    fast = _grads(model, loss + 0.7 * align)
    # by hand: Σ −Ã log α over the guided entries, α from the reference's teacher forcing
    _, alpha = reference.teacher_forced(paper_weights(model), src, lens, tgt_in, attention=True)
    where = guide > 0
    by_hand = -(guide[where] * alpha[where].log()).sum()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(align.detach(), by_hand.detach().to(align.dtype), **tol)
    model.backend = "reference"
    loss_r, nll_r, align_r = model.training_loss(src, lens, tgt_in, tgt_out, 0.1, guide)
    ref = _grads(model, loss_r + 0.7 * align_r)
    torch.testing.assert_close(align.detach(), align_r.detach(), **tol)
    torch.testing.assert_close(loss.detach(), loss_r.detach(), **tol)
    assert fast.keys() == ref.keys()
    for k in fast:
        torch.testing.assert_close(fast[k], ref[k], msg=k, **tol)
    # and the attention's own gradient is there: the guide alone moves the attention's weights
    only = _grads(model, model.training_loss(src, lens, tgt_in, tgt_out, 0.0, guide)[2])
    assert float(only["attention.v_a"].abs().sum()) > 0 and float(only["attention.W_a"].abs().sum()) > 0
    assert float(only.get("W_o", torch.zeros(1)).abs().sum()) == 0  # (the output layer does not read α)


def test_a_guide_needs_attention_and_the_batch_shape():
    src, lens, tgt_in, tgt_out = make_batch(SRC_LENS, TGT_LENS)
    with pytest.raises(ValueError, match="rnnencdec has none"):
        tiny("rnnencdec").training_loss(src, lens, tgt_in, tgt_out, 0.0, _random_guide().float())
    with pytest.raises(ValueError, match="want \\(B, Ty, Tx\\)"):
        tiny("rnnsearch").training_loss(src, lens, tgt_in, tgt_out, 0.0, _random_guide().float()[:, :, :-1])


def test_attention_cross_entropy_reads_only_the_guided_entries():
    alpha = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])
    guide = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])  # the second row unguided; α = 0 is not read
    assert float(attention_cross_entropy(alpha, guide)) == pytest.approx(-np.log(0.5))


# -- links of a real prepared corpus -----------------------------------------------------------------------------


def _diagonal(n: int, m: int) -> list[tuple[int, int]]:
    """Target word j linked to the source word at the same relative position (a monotone alignment)."""
    return [(min(n - 1, round(j * (n - 1) / max(m - 1, 1))), j) for j in range(m)]


@pytest.fixture(scope="module")
def corpus(multi30k_200, tmp_path_factory):
    """The 200 real pairs with BPE (150 merges), shortlists of 400 units and --max-len 24 (so that train.kept skips some
    lines), a diagonal links file with a line per line of train.tok (``diagonal.align``, source-target) and its
    transpose (``diagonal.tgt-src``)."""
    root = tmp_path_factory.mktemp("guided")
    data = root / "data"
    prepare(PrepareConfig("en", "fr", [str(multi30k_200 / "train")], str(data), valid=str(multi30k_200 / "valid"),
                          src_vocab_size=400, tgt_vocab_size=400, bpe_merges=150, max_len=24))
    src = (data / "train.tok.en").read_text(encoding="utf-8").splitlines()
    tgt = (data / "train.tok.fr").read_text(encoding="utf-8").splitlines()
    links = [_diagonal(len(s.split()), len(t.split())) for s, t in zip(src, tgt)]
    (root / "diagonal.align").write_text("".join(" ".join(f"{i}-{j}" for i, j in ls) + "\n" for ls in links),
                                         encoding="utf-8")
    (root / "diagonal.tgt-src").write_text("".join(" ".join(f"{j}-{i}" for i, j in ls) + "\n" for ls in links),
                                           encoding="utf-8")
    kept = [int(x) for x in (data / "train.kept").read_text().split()]
    assert 20 < len(kept) < len(src)  # (some lines left out: the links must be read through train.kept)
    return root


def _views(data):
    d = PreparedData.open(str(data))
    return d, (d.corpus("train", "en"), d.corpus("train", "fr"))


def test_word_links_become_unit_rows_through_the_kept_lines(corpus):
    d, views = _views(corpus / "data")
    guide = GuidedAlignment(str(corpus / "diagonal.align"), d)
    assert len(guide) == len(views[0])
    kept = [int(x) for x in (corpus / "data" / "train.kept").read_text().split()]
    src_lines = (corpus / "data" / "train.tok.en").read_text(encoding="utf-8").splitlines()
    tgt_lines = (corpus / "data" / "train.tok.fr").read_text(encoding="utf-8").splitlines()
    sv, tv = d.vocab("en"), d.vocab("fr")
    ids = np.arange(len(views[0]))
    Ty = max(len(views[1][k]) for k in ids) + 1
    Tx = max(len(views[0][k]) for k in ids) + 1
    targets, rows = guide.targets(ids, views, (Ty, Tx))
    assert targets.shape == (len(ids), Ty, Tx)
    split_words = checked = 0
    for k in ids:
        x_words, y_words = src_lines[kept[k] - 1].split(), tgt_lines[kept[k] - 1].split()
        x_units, y_units = sv.decode(views[0][k]), tv.decode(views[1][k])
        if "<unk>" in x_units + y_units:  # (read by their "@@" below: an unknown unit hides where a word ends)
            continue
        x_of, y_of = _word_of(x_units), _word_of(y_units)
        assert (x_of[-1] + 1, y_of[-1] + 1) == (len(x_words), len(y_words))
        split_words += len(x_units) > len(x_words)
        checked += 1
        link = dict((j, i) for i, j in _diagonal(len(x_words), len(y_words)))
        for t, j in enumerate(y_of):  # every unit of target word j: uniform over the units of its source word
            want = np.array([1.0 if x_of[s] == link[j] else 0.0 for s in range(len(x_of))])
            np.testing.assert_allclose(targets[k, t, : len(x_of)].numpy(), want / want.sum(), rtol=1e-6)
        assert targets[k, len(y_of), len(x_of)] == 1.0  # </s> to </s>
        assert float(targets[k, len(y_of) + 1:].sum()) == 0.0 and float(targets[k, :, len(x_of) + 1:].sum()) == 0
    assert checked > 40 and split_words > 10  # (BPE split words in many pairs: the carrying was exercised)
    assert rows == sum(len(views[1][k]) + 1 for k in ids)
    assert not guide.unreadable
    # the same links written target first, read with order tgt-src: the same targets
    other = GuidedAlignment(str(corpus / "diagonal.tgt-src"), d, order="tgt-src")
    assert torch.equal(other.targets(ids, views, (Ty, Tx))[0], targets)


def _word_of(units: list[str]) -> list[int]:
    """The word of each BPE unit: a unit ending in ``@@`` continues into the next."""
    out, w = [], 0
    for u in units:
        out.append(w)
        w += not u.endswith("@@")
    return out


def test_bpe_dropout_units_are_carried_with_the_epochs_segmentation(corpus, tmp_path, monkeypatch):
    from nmtkit.data.bpedropout import DropoutCorpus

    d = PreparedData.open(str(corpus / "data"))
    codes = d.text_config("en").bpe_codes
    views = tuple(DropoutCorpus(d.directory, lang, side, codes, 0.5, d.vocab(lang), 1, len(d.corpus("train", lang)))
                  for side, lang in enumerate(("en", "fr")))
    guide = GuidedAlignment(str(corpus / "diagonal.align"), d)
    kept = [int(x) for x in (corpus / "data" / "train.kept").read_text().split()]
    src_lines = (corpus / "data" / "train.tok.en").read_text(encoding="utf-8").splitlines()
    tgt_lines = (corpus / "data" / "train.tok.fr").read_text(encoding="utf-8").splitlines()
    ids = np.arange(len(kept))
    seen = []
    for epoch in (0, 1):
        for v in views:
            v.epoch = epoch
        units = [[d.vocab(lang).decode(views[side][k]) for k in ids] for side, lang in enumerate(("en", "fr"))]
        Ty, Tx = max(map(len, units[1])) + 1, max(map(len, units[0])) + 1
        targets, rows = guide.targets(ids, views, (Ty, Tx))
        assert not guide.unreadable and rows == sum(map(len, units[1])) + len(ids)
        for k in ids:  # each unit's row: uniform over the units of the source word its word is linked to
            x_of, y_of = _word_of(units[0][k]), _word_of(units[1][k])
            if "<unk>" in units[0][k] + units[1][k]:  # (the epoch's own segmentation then tells the words)
                x_of = np.repeat(np.arange(len(src_lines[kept[k] - 1].split())), views[0].units_per_word(k))
                y_of = np.repeat(np.arange(len(tgt_lines[kept[k] - 1].split())), views[1].units_per_word(k))
            link = dict((j, i) for i, j in _diagonal(len(src_lines[kept[k] - 1].split()),
                                                     len(tgt_lines[kept[k] - 1].split())))
            want = np.array([[x_of[s] == link[j] for s in range(len(x_of))] for j in y_of], dtype=np.float32)
            np.testing.assert_allclose(targets[k, : len(y_of), : len(x_of)].numpy(),
                                       want / want.sum(1, keepdims=True), rtol=1e-6)
        seen.append(units)
    assert seen[0] != seen[1]  # (two epochs, two segmentations: both carried)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_unknown_units_inside_words_are_placed_by_segmenting_the_words_again(small, tmp_path, monkeypatch, dropout):
    """With small shortlists (120 and 130 units) many pairs hold ``<unk>`` units, which hide where their words end:
    the words of the pair's line are segmented again (the prepared segmentation, or the epoch's BPE-dropout one)."""
    from nmtkit.data.bpedropout import DropoutCorpus

    d = PreparedData.open(str(small))
    n = len(d.corpus("train", "en"))
    lines = [int(x) - 1 for x in (small / "train.kept").read_text().split()] if (small / "train.kept").is_file() \
        else list(range(n))
    words = [[len(line.split()) for line in (small / f"train.tok.{lang}").read_text(encoding="utf-8").splitlines()]
             for lang in ("en", "fr")]
    links = tmp_path / "links"
    text = [""] * len(words[0])
    for k in lines:
        text[k] = " ".join(f"{i}-{j}" for i, j in _diagonal(words[0][k], words[1][k]))
    links.write_text("".join(t + "\n" for t in text), encoding="utf-8")
    if dropout:
        codes = d.text_config("en").bpe_codes
        views = tuple(DropoutCorpus(d.directory, lang, side, codes, dropout, d.vocab(lang), 1, n)
                      for side, lang in enumerate(("en", "fr")))
    else:
        views = (d.corpus("train", "en"), d.corpus("train", "fr"))
    ids = np.arange(n)
    unk = [k for k in ids if 1 in views[0][k] or 1 in views[1][k]]  # (<unk> is id 1)
    assert len(unk) > 20
    calls = []
    if dropout:
        real = DropoutCorpus.units_per_word
        monkeypatch.setattr(DropoutCorpus, "units_per_word", lambda self, k: calls.append(k) or real(self, k))
    guide = GuidedAlignment(str(links), d)
    lengths = [[len(views[side][k]) for k in ids] for side in (0, 1)]
    targets, rows = guide.targets(ids, views, (max(lengths[1]) + 1, max(lengths[0]) + 1))
    assert not guide.unreadable and rows == sum(lengths[1]) + n  # every unit of every pair guided
    for k in unk:
        m = lengths[1][k] + 1
        assert torch.allclose(targets[k, :m].sum(-1), torch.ones(m))
    assert not dropout or set(calls) >= set(unk[:5])


def _replaced(lines: list[str], at: int, text: str) -> list[str]:
    return lines[: at - 1] + [text] + lines[at:]


@pytest.mark.parametrize("text, fragment", [
    (lambda lines, a, b: lines[:-1], "has 199 lines of links but"),
    (lambda lines, a, b: _replaced(lines, a, "0-0 1x2"), "diagonal.align:{a}: '1x2' is not a Pharaoh link"),
    (lambda lines, a, b: _replaced(lines, b, "0-0 0-40"), "diagonal.align:{b}: link 0-40 names target word 40 but "
                                                          "that side of the pair has"),
])
def test_a_bad_links_file_is_one_error_naming_its_line(corpus, tmp_path, text, fragment):
    lines = (corpus / "diagonal.align").read_text(encoding="utf-8").splitlines()
    a, b = [int(x) for x in (corpus / "data" / "train.kept").read_text().split()][:2]  # (lines of trained pairs)
    fragment = fragment.format(a=a, b=b)
    bad = tmp_path / "diagonal.align"
    bad.write_text("".join(line + "\n" for line in text(lines, a, b)), encoding="utf-8")
    with pytest.raises(InputError) as e:
        GuidedAlignment(str(bad), PreparedData.open(str(corpus / "data")))
    assert fragment in str(e.value)
    # through nmt-train: one line, non-zero exit, nothing written
    run = subprocess.run([str(REPO / "bin" / "nmt-train"), str(corpus / "data"), "--arch", "rnnsearch-tiny",
                          "--save-dir", str(tmp_path / "run"), "--guided-alignment", str(bad), "--threads", "1"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and fragment in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not list((tmp_path / "run").glob("checkpoint*.pt"))


def test_a_model_without_attention_is_refused(corpus, tmp_path):
    with pytest.raises(InputError, match="rnnencdec has none"):
        Trainer(train_cfg(corpus / "data", tmp_path / "run", arch="rnnencdec-tiny",
                          guided_alignment=str(corpus / "diagonal.align")))


# -- training under guidance -------------------------------------------------------------------------------------


def _aer_on_training_pairs(corpus, ckpt, tmp_path) -> float:
    """AER of a model's attention (nmt-align) on the kept training pairs, against the diagonal links as gold."""
    kept = [int(x) for x in (corpus / "data" / "train.kept").read_text().split()][:60]
    files = {}
    for name, source in (("s", "train.tok.en"), ("t", "train.tok.fr")):
        lines = (corpus / "data" / source).read_text(encoding="utf-8").splitlines()
        files[name] = tmp_path / f"pairs.{name}"
        files[name].write_text("".join(lines[k - 1] + "\n" for k in kept), encoding="utf-8")
    links = (corpus / "diagonal.align").read_text(encoding="utf-8").splitlines()
    (tmp_path / "gold").write_text("".join(links[k - 1] + "\n" for k in kept), encoding="utf-8")
    out = subprocess.run([str(REPO / "bin" / "nmt-align"), "-m", str(ckpt), "-s", str(files["s"]), "-t",
                          str(files["t"]), "--tokenized", "--gold", str(tmp_path / "gold"), "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["aer"]


def test_a_guided_run_aligns_by_its_links_and_an_unguided_one_does_not(corpus, tmp_path):
    common = dict(max_updates=100, valid_every=100, valid_bleu_sentences=0, optimizer="adam", lr=0.01)
    train(train_cfg(corpus / "data", tmp_path / "plain", **common))
    train(train_cfg(corpus / "data", tmp_path / "guided", guided_alignment=str(corpus / "diagonal.align"),
                    guided_alignment_weight=1.0, **common))
    plain = _aer_on_training_pairs(corpus, tmp_path / "plain" / "checkpoint_last.pt", tmp_path)
    guided = _aer_on_training_pairs(corpus, tmp_path / "guided" / "checkpoint_last.pt", tmp_path)
    assert guided < 0.55 and guided < plain - 0.25, (guided, plain)  # (measured: 0.44 and 0.80)
    # the log says how close the attention came: its cross-entropy per guided row, falling
    records = [json.loads(line) for line in (tmp_path / "guided" / "train.jsonl").read_text().splitlines()]
    align = [r["align_loss"] for r in records if r["type"] == "train"]
    assert len(align) == 100 and np.mean(align[-10:]) < 0.8 * np.mean(align[:10])  # (measured: 3.0 -> 2.0)
    assert all("align_loss" not in json.loads(line) for line in (tmp_path / "plain" / "train.jsonl").open())
    saved = checkpoint.load(tmp_path / "guided" / "checkpoint_last.pt")["train"]
    assert saved["guide"]["links"] == sum(len(line.split()) for k, line in enumerate(
        (corpus / "diagonal.align").read_text(encoding="utf-8").splitlines())
        if k + 1 in {int(x) for x in (corpus / "data" / "train.kept").read_text().split()})


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_resume_under_guidance_equals_the_uninterrupted_run(corpus, tmp_path, dropout):
    options = dict(guided_alignment=str(corpus / "diagonal.align"), guided_alignment_weight=0.5, bpe_dropout=dropout,
                   valid_every=3, log_every=2)
    train(train_cfg(corpus / "data", tmp_path / "A", max_updates=9, **options))
    train(train_cfg(corpus / "data", tmp_path / "B", max_updates=5, **options))
    train(train_cfg(corpus / "data", tmp_path / "B", max_updates=9, resume=True, **options))
    a, b = (checkpoint.load(tmp_path / x / "checkpoint_last.pt") for x in "AB")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    logs = [[{k: v for k, v in json.loads(line).items() if k not in ("elapsed", "tgt_tokens_per_s")}
             for line in (tmp_path / x / "train.jsonl").read_text().splitlines()] for x in "AB"]
    assert logs[0] == logs[1] and any("align_loss" in r for r in logs[0])


def test_guidance_added_or_dropped_on_resume_is_warned(corpus, tmp_path, caplog):
    train(train_cfg(corpus / "data", tmp_path / "run", guided_alignment=str(corpus / "diagonal.align"), max_updates=2,
                    valid_every=2))
    with caplog.at_level("WARNING", logger="nmtkit.train"):
        train(train_cfg(corpus / "data", tmp_path / "run", max_updates=3, valid_every=2, resume=True))
    assert "the checkpoint's run was guided by links (--guided-alignment), this one is not guided" in caplog.text


def test_its_options_without_links_are_refused(corpus, tmp_path):
    run = subprocess.run([str(REPO / "bin" / "nmt-train"), str(corpus / "data"), "--arch", "rnnsearch-tiny",
                          "--save-dir", str(tmp_path / "run"), "--guided-alignment-weight", "0.5"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "--guided-alignment-weight is read with --guided-alignment only" in run.stderr


def test_resume_with_other_links_is_refused(corpus, tmp_path):
    options = dict(guided_alignment=str(corpus / "diagonal.align"), max_updates=2, valid_every=2)
    train(train_cfg(corpus / "data", tmp_path / "run", **options))
    other = tmp_path / "other.align"
    lines = (corpus / "diagonal.align").read_text(encoding="utf-8").splitlines()
    other.write_text("".join(line + "\n" for line in ["0-0"] + lines[1:]), encoding="utf-8")
    with pytest.raises(InputError, match="the links differ from those the checkpoint's run was guided by"):
        train(train_cfg(corpus / "data", tmp_path / "run", **{**options, "guided_alignment": str(other),
                                                              "max_updates": 4, "resume": True}))


# -- examples/guide_links.py: eflomal's links of a prepared corpus -----------------------------------------------


def test_guide_links_aligns_the_training_pairs_with_eflomal(corpus, tmp_path):
    try:
        import eflomal  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("eflomal (a test extra) is not installed -- under CI this is a failure")
        pytest.skip("eflomal (pip install 'eflomal>=2.0,<3', a test extra) is not installed")
    out = tmp_path / "train.align"
    run = subprocess.run([sys.executable, str(REPO / "examples" / "guide_links.py"), str(corpus / "data"), "-o",
                          str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    src = (corpus / "data" / "train.tok.en").read_text(encoding="utf-8").splitlines()
    tgt = (corpus / "data" / "train.tok.fr").read_text(encoding="utf-8").splitlines()
    kept = {int(x) for x in (corpus / "data" / "train.kept").read_text().split()}
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(src)
    for k, line in enumerate(lines[:-1], 1):
        if k not in kept:
            assert line == ""  # a pair the corpus dropped: no links
            continue
        links = pharaoh_links(line)
        assert links and all(i < len(src[k - 1].split()) and j < len(tgt[k - 1].split()) for i, j in links)
    # what nmt-train reads
    assert len(GuidedAlignment(str(out), PreparedData.open(str(corpus / "data")))) == len(kept)
