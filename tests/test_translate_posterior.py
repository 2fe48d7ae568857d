"""nmt-translate --alignments --alignment-method posterior: the links of each translation read from the alignment
posterior of the model's own translation (nmtkit.posterior.forced_posterior, as ``nmt-align --method posterior``
computes it), in every decoding path -- this process, worker processes -- with the translation, its n-best list, its
scores and its attention file unchanged; an option that would change nothing is refused in one line.  And
--replace-unk, which writes for each <unk> the most attended source word (``--replace-unk-by posterior``, the source
word of the largest posterior at that <unk>, lost on every set and was removed: it is refused in one line).  The
server's
``"alignment_method"`` is tested beside nmt-translate in tests/test_serve.py.  A small model trained here on real
Multi30K pairs (the ``trained`` fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, lines_of, pharaoh_links

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
FILES = ("out", "nbest", "scores", "attention", "align")


def _translate(ckpt, src, d, *options, check=True):
    d.mkdir(exist_ok=True)
    proc = subprocess.run([*TRANSLATE, "-m", ckpt, "-i", str(src), "-o", str(d / "out"), "--beam", "4", "--nbest",
                           "2", "--nbest-file", str(d / "nbest"), "--scores", str(d / "scores"), "--attention",
                           str(d / "attention"), "--alignments", str(d / "align"), "--batch-size", "4", *options],
                          capture_output=True, text=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
        return {f: (d / f).read_text(encoding="utf-8") for f in FILES}
    return proc


@pytest.fixture(scope="module")
def source(trained, data_dir, tmp_path_factory):
    lines = lines_of(data_dir / "multi30k" / "val.en", 24)
    lines[4:4] = [""]  # (an empty line gets an empty alignment line)
    path = tmp_path_factory.mktemp("posterior") / "in.en"
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path, lines


def test_posterior_links_are_the_posterior_of_the_translation_in_every_decoding_path(trained, source, tmp_path):
    import torch

    from nmtkit.data import checkpoint
    from nmtkit.data.text import Preprocessor, TextConfig
    from nmtkit.data.vocab import Vocabulary
    from nmtkit.models import build_from_checkpoint
    from nmtkit.posterior import forced_posterior
    from nmtkit.translate.wordalign import hard_links, pharaoh, word_matrix

    _, ckpt = trained
    src, lines = source
    attention = _translate(ckpt, src, tmp_path / "attention")
    posterior = _translate(ckpt, src, tmp_path / "posterior", "--alignment-method", "posterior")
    workers = _translate(ckpt, src, tmp_path / "workers", "--alignment-method", "posterior", "--workers", "2",
                         "--threads", "2")
    assert workers == posterior  # the worker processes compute it as this process does
    for f in ("out", "nbest", "scores", "attention"):  # the links alone change
        assert posterior[f] == attention[f], f
    out, links = posterior["out"].splitlines(), posterior["align"].splitlines()
    assert len(out) == len(links) == len(lines) and links[4] == "" and out[4] == ""
    changed = sum(a != p for a, p in zip(attention["align"].splitlines(), links))
    assert changed >= 2, "the posterior links every line as the attention does: is it read at all?"

    # what each line's links must be: the posterior of the model's own translation, computed here from the tokens
    # the attention file records (model tokens, </s> last), merged into the words the links count
    payload = checkpoint.load(ckpt)
    model = build_from_checkpoint(payload).eval()
    torch.set_num_threads(1)
    vocab = {side: Vocabulary(payload["vocab"][side]) for side in ("src", "tgt")}
    pre = {side: Preprocessor(TextConfig.from_dict(payload["preprocessing"][side])) for side in ("src", "tgt")}
    records = [json.loads(x) for x in posterior["attention"].splitlines()]
    for k, (line, record) in enumerate(zip(lines, records)):
        if not line:
            continue
        s_tok, t_tok = record["source"][:-1], record["target"][:-1]
        (p,) = forced_posterior(model, [vocab["src"].encode(s_tok)], [vocab["tgt"].encode(t_tok)])
        np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-5)
        words = word_matrix(s_tok, t_tok, p, pre["src"].words_of, pre["tgt"].words_of)
        assert pharaoh(hard_links(words)) == links[k], (k, line, out[k])
        # one link per target word of the translation's tokenised words, within both sentences
        n_src, n_tgt = len(pre["src"].words_of(s_tok)[0]), len(pre["tgt"].words_of(t_tok)[0])
        got = pharaoh_links(links[k])
        assert [j for _, j in got] == list(range(n_tgt)) and all(0 <= i < n_src for i, _ in got)


def test_posterior_links_of_lines_cut_into_pieces_and_of_prefixed_lines(trained, source, tmp_path):
    """Lines longer than --max-source-len are translated in pieces, each piece's posterior its own block: every
    target word links to a source word of its own piece (where the block-diagonal attention is not zero); prefixed
    lines link the prefix's words too; worker processes give the same links."""
    from nmtkit.data import checkpoint
    from nmtkit.data.text import Preprocessor, TextConfig
    from nmtkit.translate.wordalign import word_matrix

    _, ckpt = trained
    src, lines = source
    prefixes = tmp_path / "prefix.fr"
    prefixes.write_text("".join(("Un homme" if k % 3 == 0 and line else "") + "\n" for k, line in enumerate(lines)),
                        encoding="utf-8")
    options = ("--alignment-method", "posterior", "--max-source-len", "6", "--prefix", str(prefixes))
    got = _translate(ckpt, src, tmp_path / "one", *options)
    assert _translate(ckpt, src, tmp_path / "two", *options, "--workers", "2", "--threads", "2") == got
    payload = checkpoint.load(ckpt)
    pre = {side: Preprocessor(TextConfig.from_dict(payload["preprocessing"][side])) for side in ("src", "tgt")}
    records = [json.loads(x) for x in got["attention"].splitlines()]
    out, links = got["out"].splitlines(), got["align"].splitlines()
    pieced = 0
    for k, (line, record) in enumerate(zip(lines, records)):
        if not line:
            continue
        if k % 3 == 0:
            assert out[k].startswith("Un homme"), out[k]
        s_tok, t_tok = record["source"][:-1], record["target"][:-1]
        words = word_matrix(s_tok, t_tok, np.asarray(record["alpha"]), pre["src"].words_of, pre["tgt"].words_of)
        n_src, n_tgt = words.shape[1] - 1, words.shape[0] - 1
        pieced += bool((words[:-1, :-1] == 0).any())  # (a block-diagonal attention: the line was cut)
        got_links = pharaoh_links(links[k])
        assert [j for _, j in got_links] == list(range(n_tgt)) and all(0 <= i < n_src for i, _ in got_links)
        assert all(words[j, i] > 0 for i, j in got_links), (k, line, links[k])  # within the word's own piece
    assert pieced >= 5


def test_a_posterior_option_that_would_change_nothing_is_one_line(trained, source, tmp_path):
    _, ckpt = trained
    src, _ = source
    proc = subprocess.run([*TRANSLATE, "-m", ckpt, "-i", str(src), "-o", str(tmp_path / "out"), "--alignment-method",
                           "posterior"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 1 and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines() == [
        "nmt-translate: error: --alignment-method posterior says how --alignments are made: give --alignments FILE"]
    proc = _translate(ckpt, src, tmp_path / "bad", "--alignment-method", "viterbi", check=False)
    assert proc.returncode == 2 and "'viterbi' is not one of 'attention', 'posterior'" in proc.stderr
    assert not (tmp_path / "bad" / "out").exists()


@pytest.mark.parametrize("value", [["posterior"], ["attention"], []])
def test_replace_unk_by_was_removed_and_is_refused_in_one_line(trained, source, tmp_path, value):
    """--replace-unk-by posterior lost on every set (tests/bench/results/bench_replace_unk.txt) and was removed: the
    option, with whatever value, is refused in one line that says so and what --replace-unk does, exit code 2,
    nothing written."""
    _, ckpt = trained
    src, _ = source
    proc = _translate(ckpt, src, tmp_path / "removed", "--replace-unk", "--replace-unk-by", *value, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "nmt-translate: error: --replace-unk-by: removed: the posterior lost on every set (bench_replace_unk.txt); "
        "--replace-unk uses the attention"]
    assert not any((tmp_path / "removed" / f).exists() for f in FILES)


def test_the_posterior_of_some_words_is_the_posterior_there_and_the_attention_elsewhere(trained, source):
    """forced_posterior(words=...): the rows of the target positions that hold one of ``words`` are the whole
    posterior's rows, every other row the attention itself (nmt-align's)."""
    import torch

    from nmtkit.align import forced_attention
    from nmtkit.data import checkpoint
    from nmtkit.data.vocab import UNK, Vocabulary
    from nmtkit.models import build_from_checkpoint
    from nmtkit.posterior import forced_posterior

    _, ckpt = trained
    _, lines = source
    payload = checkpoint.load(ckpt)
    model = build_from_checkpoint(payload).eval()
    torch.set_num_threads(1)
    vocab = {side: Vocabulary(payload["vocab"][side]) for side in ("src", "tgt")}
    src = [vocab["src"].encode(line.lower().split()) for line in lines if line]
    tgt = [np.concatenate([t[:3], [UNK], t[3:]]) for t in src]  # (a target with an <unk> at position 3 of each)
    tgt = [vocab["tgt"].encode(["un", "homme"]) if k % 4 == 0 else t % len(vocab["tgt"].tokens)
           for k, t in enumerate(tgt)]  # (and some with none)
    whole = forced_posterior(model, src, tgt, batch_size=5)
    some = forced_posterior(model, src, tgt, batch_size=5, words=[UNK])
    alpha = forced_attention(model, src, tgt, batch_size=5)
    unks = 0
    for t, w, s, a in zip(tgt, whole, some, alpha):
        at = np.append(t == UNK, False)  # (the </s> row: never asked for)
        unks += int(at.sum())
        np.testing.assert_allclose(s[at], w[at], atol=1e-5)
        np.testing.assert_allclose(s[~at], a[~at], atol=1e-5)
    assert unks >= 10


def test_replace_unk_writes_the_source_word_of_the_attention(trained, source, tmp_path):
    """Each <unk> of the translation becomes the source word of the largest attention at that <unk>, in the text the
    user reads; nothing else changes, in this process and in worker processes alike."""
    _, ckpt = trained
    src, lines = source
    plain = _translate(ckpt, src, tmp_path / "plain")
    replaced = _translate(ckpt, src, tmp_path / "attention", "--replace-unk")
    assert _translate(ckpt, src, tmp_path / "workers", "--replace-unk", "--workers", "2", "--threads", "2") == replaced
    for f in ("scores", "align"):  # the search is the same: only the words written for <unk> change
        assert replaced[f] == plain[f], f
    records = {name: [json.loads(x) for x in got["attention"].splitlines()]
               for name, got in (("plain", plain), ("attention", replaced))}
    texts = {name: got["out"].splitlines() for name, got in (("plain", plain), ("attention", replaced))}
    unks = 0
    for k, record in enumerate(records["plain"]):
        s_tok, t_tok = record["source"][:-1], record["target"][:-1]
        at = [i for i, t in enumerate(t_tok) if t == "<unk>"]
        if not lines[k] or not at:
            assert texts["attention"][k] == texts["plain"][k]
            continue
        alpha = np.asarray(record["alpha"])
        want = list(t_tok)
        for i in at:
            want[i] = s_tok[int(alpha[i, : len(s_tok)].argmax())]
            # the --attention file rounds the weights to 6 decimals: a near-uniform row can tie there, and the tool
            # chose by the unrounded ones; any of the tied tokens is its argmax
            tied = {s_tok[j] for j in np.flatnonzero(alpha[i, : len(s_tok)] >= alpha[i, : len(s_tok)].max() - 1e-6)}
            if records["attention"][k]["target"][i] in tied:
                want[i] = records["attention"][k]["target"][i]
        unks += len(at)
        assert records["attention"][k]["target"][:-1] == want, (k, lines[k])
        assert "<unk>" not in texts["attention"][k]
        for i in at:  # what the user reads has the source word written
            assert want[i] in texts["attention"][k], texts["attention"][k]
    assert unks >= 10, unks
