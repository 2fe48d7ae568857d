"""The repeated-n-gram block (``nmt-translate --no-repeat-ngram N``, nmtkit/translate/ngramblock.py) on the small
model trained on real Multi30K pairs, which loops ("sur un <unk> sur un <unk>"): the batched search equals the
slow reference search with the block on; no output repeats an n-gram with it, while some do without it (asserted,
so that the tests cannot pass on a model that never loops); a forced prefix is kept verbatim even where it repeats
itself; and the option off is byte for byte the decoding without it."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.data.text import Preprocessor, TextConfig
from nmtkit.data.vocab import EOS, Vocabulary
from nmtkit.models import build_from_checkpoint
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import collate_prefixes
from nmtkit.translate.ngramblock import ban_repeats, banned_after, number_tokens
from nmtkit.translate.sampling import sample
from nmtkit.translate.search import beam_search, beam_search_reference, greedy

from conftest import REPO, lines_of, randomize_, tiny

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LINES = 40  # Multi30K validation lines: the trained fixture repeats a word trigram in about a third of them


@pytest.fixture(scope="module")
def model(trained):
    payload = checkpoint.load(trained[1])
    return build_from_checkpoint(payload).eval(), payload


def _sources(data_dir, payload, n):
    pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
    vocab = Vocabulary(payload["vocab"]["src"])
    return [vocab.encode(pre.tokenize(line)) for line in lines_of(data_dir / "multi30k" / "val.en", n)]


def _batch(sentences):
    return collate_source([np.asarray(s) for s in sentences])


def repeats(seq, n: int, start: int = 0, free=None) -> bool:
    """Whether an n-gram of seq that ends at or after position ``start`` (0: any), and not in a token of ``free``
    (a bool (V,) tensor over ids, or a test of a token), occurred earlier in seq."""
    is_free = (lambda x: False) if free is None else free if callable(free) else (lambda x: bool(free[x]))
    seen = set()
    for i in range(len(seq) - n + 1):
        gram = tuple(seq[i: i + n])
        if gram in seen and i + n > start and not is_free(gram[-1]):
            return True
        seen.add(gram)
    return False


def translate(args, stdin: bytes = b"", check=True):
    proc = subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


# -- the block itself --------------------------------------------------------------------------------------------------

def test_the_vectorised_block_is_the_rule_written_out():
    """ban_repeats over a (rows, t) token tensor == banned_after, the rule in plain Python, row by row; histories
    of few distinct tokens (so that they repeat), some with </s> in them (never banned)."""
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    banned_some = 0
    for _ in range(400):
        rows, t, V, n = rng.randint(1, 6), rng.randint(0, 16), 9, rng.randint(1, 5)
        history = torch.randint(2, 2 + rng.randint(2, 6), (rows, t), generator=g)  # (rows, t), ids from EOS = 2 up
        logp = torch.randn(rows, V, generator=g)
        expected = logp.clone()
        for r in range(rows):
            for v in banned_after(history[r].tolist(), n):
                expected[r, v] = -float("inf")
        ban_repeats(logp, history, n)
        assert torch.equal(logp, expected), (history, n)
        assert torch.isfinite(logp[:, EOS]).all()
        banned_some += int((~torch.isfinite(logp)).sum())
    assert banned_some > 100
    assert banned_after([5, 6, 5, 6, 5], 3) == {6} and banned_after([5, 6, 7, 5, 6], 3) == {7}
    assert banned_after([5, 6, 7], 1) == {5, 6, 7} and banned_after([5, 6], 3) == set()
    assert banned_after([5, 5], 0) == set() and banned_after([5, EOS, 5], 2) == set()


def test_the_block_never_bans_a_free_token():
    """With ``free`` (the number tokens), the vectorised block is still the rule written out, and the rule never
    bans a free token, while other tokens are banned as before, after windows with free tokens too."""
    g = torch.Generator().manual_seed(1)
    rng = random.Random(1)
    banned_some = freed_some = 0
    for _ in range(400):
        rows, t, V, n = rng.randint(1, 6), rng.randint(0, 16), 9, rng.randint(1, 4)
        history = torch.randint(2, 2 + rng.randint(2, 6), (rows, t), generator=g)
        free = torch.rand(V, generator=g) < 0.3
        logp = torch.randn(rows, V, generator=g)
        expected, unfree = logp.clone(), logp.clone()
        free_set = set(free.nonzero().flatten().tolist())
        for r in range(rows):
            for v in banned_after(history[r].tolist(), n, free_set):
                expected[r, v] = -float("inf")
        ban_repeats(logp, history, n, free)
        ban_repeats(unfree, history, n)
        assert torch.equal(logp, expected), (history, n, free)
        assert torch.isfinite(logp[:, free]).all()
        banned_some += int((~torch.isfinite(logp)).sum())
        freed_some += int((~torch.isfinite(unfree)).sum() - (~torch.isfinite(logp)).sum())
    assert banned_some > 50 and freed_some > 50
    digits = {7, 8}
    assert banned_after([7, 8, 8, 7, 8], 3, frozenset(digits)) == set()  # "0 0 0 ... 0 0 0": a number repeats
    assert banned_after([5, 6, 7, 5, 6], 3, frozenset(digits)) == set()  # 7 would follow "5 6" again: free
    assert banned_after([5, 6, 9, 5, 6], 3, frozenset(digits)) == {9}  # words still may not loop
    assert banned_after([5, 7, 9, 5, 7], 3, frozenset(digits)) == {9}  # "en 1995, en 1995, ": cut at the comma
    assert banned_after([5, 7, 9], 1, frozenset(digits)) == {5, 9}
    assert number_tokens(["<unk>", "▁1", "0", "1995", "3,5", "▁le", "m²", "@@", "▁", ",", ".", "▁,", "▁."]).tolist() == \
        [False, True, True, True, True, False, False, False, True, True, True, False, False]
    # in a word vocabulary a comma or point is punctuation, never a number's glue ("<unk> . <unk> ." is a loop)
    assert number_tokens(["<unk>", "1995", "3,5", ",", ".", "le"]).tolist() == [False, True, True, False, False, False]
    # in a BPE one, the glue is a comma or point inside a word: "3@@ .@@ 25"
    assert number_tokens(["3@@", ".@@", "25", ".", ",", ",@@"]).tolist() == [True, True, True, False, False, True]


# -- (a) the batched search is the reference search, with the block on -------------------------------------------------

@pytest.mark.parametrize("n, beam, with_prefix", [(1, 3, False), (2, 5, True), (3, 5, False), (3, 1, True),
                                                  (4, 4, True)])
def test_batched_equals_the_reference_with_the_block(model, data_dir, n, beam, with_prefix):
    m, payload = model
    sents = _sources(data_dir, payload, 8)
    src, lens = _batch(sents)
    prefixes = [[int(s[0]) % 50 + 4] * (k % 3) for k, s in enumerate(sents)] if with_prefix else [[]] * len(sents)
    prefix, prefix_lens = collate_prefixes([np.asarray(p, dtype=np.int64) for p in prefixes])
    nbest = min(3, beam)
    batched = beam_search(m, src, lens, DecodeConfig(beam=beam, nbest=nbest, no_repeat_ngram=n), prefix=prefix,
                          prefix_lens=prefix_lens)
    plain = beam_search(m, src, lens, DecodeConfig(beam=beam, nbest=nbest), prefix=prefix, prefix_lens=prefix_lens)
    for s, p, hyps in zip(sents, prefixes, batched):
        ref = beam_search_reference(m, list(s), DecodeConfig(beam=beam, nbest=nbest, no_repeat_ngram=n), prefix=p)
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)
        assert hyps and all(h.tokens[: len(p)] == p and not repeats(h.tokens, n, len(p)) for h in hyps)
    if n <= 3:  # the block changed the search (a model that never repeated would make this test vacuous)
        assert [[h.tokens for h in x] for x in batched] != [[h.tokens for h in x] for x in plain]


@pytest.mark.parametrize("with_numbers", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("beam", [1, 2, 6])
def test_batched_equals_the_reference_on_a_random_model(n, beam, with_numbers):
    """A randomly initialised tiny model of 29 target tokens writes to its length limit and repeats everywhere:
    every step of every hypothesis exercises the block, and sentences finish at different steps (the batch
    shrinks, the histories must follow their hypotheses).  ``with_numbers``: a third of the tokens are free (as
    the number tokens are), which both searches must leave alone alike."""
    m = randomize_(tiny("rnnsearch")).eval()
    rng = random.Random(n * 10 + beam)
    sents = [[rng.randint(4, 22) for _ in range(rng.randint(1, 9))] for _ in range(6)]
    src, lens = _batch(sents)
    numbers = (torch.arange(29) % 3 == 1) if with_numbers else None  # (V,)
    decode = DecodeConfig(beam=beam, nbest=beam, no_repeat_ngram=n, max_len_a=1.5, max_len_b=4)
    batched = beam_search(m, src, lens, decode, numbers=numbers)
    for s, hyps in zip(sents, batched):
        ref = beam_search_reference(m, s, decode, numbers=numbers)
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)
        assert all(not repeats(h.tokens, n, free=numbers) for h in hyps)
    assert any(repeats(h[0].tokens, n) for h in beam_search(m, src, lens, DecodeConfig(beam=beam, max_len_a=1.5,
                                                                                       max_len_b=4)))


# -- (b) no output repeats a 3-gram with the block; without it some do ------------------------------------------------

def test_no_output_repeats_a_trigram_with_the_block(model, data_dir):
    m, payload = model
    src, lens = _batch(_sources(data_dir, payload, LINES))
    plain = beam_search(m, src, lens, DecodeConfig(beam=5))
    assert sum(repeats(h[0].tokens, 3) for h in plain) >= 3  # the model loops ...
    blocked = beam_search(m, src, lens, DecodeConfig(beam=5, nbest=5, no_repeat_ngram=3))
    assert not any(repeats(h.tokens, 3) for hyps in blocked for h in hyps)  # ... and with the block never
    assert all(len(hyps) == 5 for hyps in blocked)
    # greedy and sampling share one loop (search.one_token_at_a_time): the block holds there too
    assert any(repeats(h.tokens, 3) for h in greedy(m, src, lens))
    assert not any(repeats(h.tokens, 3) for h in greedy(m, src, lens, DecodeConfig(no_repeat_ngram=3)))
    keys = [(3, k) for k in range(LINES)]
    samples = sample(m, src, lens, keys, DecodeConfig(nbest=3, sampling="topk:20", no_repeat_ngram=3))
    assert all(len(s) == 3 for s in samples) and not any(repeats(h.tokens, 3) for s in samples for h in s)


# -- (d) a forced prefix that repeats itself is kept verbatim ----------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3])
def test_a_prefix_that_repeats_itself_is_kept_and_counts_as_history(model, data_dir, n):
    m, payload = model
    tgt = Vocabulary(payload["vocab"]["tgt"])
    loop = tgt.encode("un homme un homme un homme".split()).tolist()  # repeats its 2-grams and 3-grams
    assert repeats(loop, n)
    sents = _sources(data_dir, payload, 4)
    src, lens = _batch(sents)
    prefix, prefix_lens = collate_prefixes([np.asarray(loop, dtype=np.int64)] * len(sents))
    hyps = beam_search(m, src, lens, DecodeConfig(beam=4, nbest=4, no_repeat_ngram=n), prefix=prefix,
                       prefix_lens=prefix_lens)
    for s, sentence in zip(sents, hyps):
        for h in sentence:
            assert h.tokens[: len(loop)] == loop  # verbatim
            assert not repeats(h.tokens, n, len(loop))  # what follows repeats nothing, the prefix's n-grams neither
        ref = beam_search_reference(m, list(s), DecodeConfig(beam=4, nbest=4, no_repeat_ngram=n), prefix=loop)
        assert [h.tokens for h in sentence] == [h.tokens for h in ref]


# -- (c), (e) through nmt-translate -----------------------------------------------------------------------------------

def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_the_option_on_the_command_line(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", lines_of(data_dir / "multi30k" / "val.en", LINES))
    base = ["-m", ckpt, "-i", inp, "--beam", "5", "--workers", "1"]
    plain = translate(base).stdout.decode().splitlines()
    blocked = translate(base + ["--no-repeat-ngram", "3"]).stdout.decode().splitlines()
    assert len(plain) == len(blocked) == LINES
    assert sum(repeats(line.split(), 3) for line in plain) >= 3  # detokenised words: the loops are there ...
    assert not any(repeats(line.split(), 3) for line in blocked)  # ... and gone
    # the option travels to the worker processes
    pooled = translate(base[:-2] + ["--no-repeat-ngram", "3", "--workers", "2", "--threads", "2", "--batch-size", "4",
                                    "--window", "8"]).stdout.decode().splitlines()
    assert pooled == blocked
    # and to sampling: tokenised output shows the model's tokens
    sampled = translate(base + ["--no-repeat-ngram", "2", "--sampling", "topk:20", "--nbest", "2", "--nbest-file", "-",
                                "--tokenized"]).stdout.decode().splitlines()
    assert len(sampled) == 2 * LINES and not any(repeats(x.split(" ||| ")[1].split(), 2) for x in sampled)
    # a prefix that repeats itself comes out as given
    pre = _write(tmp_path / "prefix.fr", ["Un homme un homme un homme"] * 3)
    out = translate(["-m", ckpt, "--beam", "5", "--no-repeat-ngram", "2", "--prefix", pre],
                    "".join(x + "\n" for x in lines_of(inp, 3)).encode()).stdout.decode().splitlines()
    assert len(out) == 3 and all(x.startswith("Un homme un homme un homme") for x in out)


def test_numbers_repeat_their_digits_under_the_block_and_words_do_not(trained, tmp_path):
    """What the user reads: a model whose output layer prefers a number token ("000") and next a word ("oui"),
    made from the trained checkpoint (two rare target entries renamed, their biases raised).  Under
    ``--no-repeat-ngram 2`` the number repeats as a number must ("000 000 000 ..."), while a word that loops is
    still cut.  Through worker processes as well.  (``--block-numbers``, fairseq's rule, cut the number too; it lost
    numbers, tests/bench/results/bench_recipe.txt, and was removed: it is refused in one line, nothing written.)"""
    _, ckpt = trained
    payload = checkpoint.load(ckpt)
    tokens = payload["vocab"]["tgt"]
    tokens = tokens.split("\n") if isinstance(tokens, str) else list(tokens)
    num, word = len(tokens) - 1, len(tokens) - 2  # (the rarest entries: nothing else of the model needs them)
    tokens[num], tokens[word] = "000", "oui"
    payload["vocab"]["tgt"] = tokens
    b_y = payload["model"]["b_y"].clone()
    b_y[num], b_y[word] = 80.0, 70.0  # (logits of a few units elsewhere: "000" first, "oui" second, everywhere)
    payload["model"]["b_y"] = b_y
    checkpoint.save(payload, tmp_path / "numbers.pt")
    base = ["-m", str(tmp_path / "numbers.pt"), "--beam", "1", "--max-len-a", "0", "--max-len-b", "6"]
    line = b"A man is sleeping .\n"
    free = translate(base + ["--no-repeat-ngram", "2"], line).stdout.decode()
    assert free == "000 000 000 000 000 000\n"  # (a 6-token limit: six times the number)
    refused = translate(base + ["--no-repeat-ngram", "2", "--block-numbers", "-o", str(tmp_path / "out")], line,
                        check=False)
    assert refused.returncode == 2 and refused.stdout == b"" and not (tmp_path / "out").exists()
    assert refused.stderr.decode().splitlines() == [
        "nmt-translate: error: --block-numbers: removed: it blocked numbers' tokens and lost numbers "
        "(tests/bench/results/bench_recipe.txt); --no-repeat-ngram leaves numbers free"]
    # a word loop is cut as before, also after the number: with "oui" first, "oui oui" and "000 oui" come once
    b_y[num], b_y[word] = 70.0, 80.0
    checkpoint.save(payload, tmp_path / "words.pt")
    words = translate(["-m", str(tmp_path / "words.pt")] + base[2:] + ["--no-repeat-ngram", "2"], line)
    words = words.stdout.decode().split()
    assert words[:4] == ["oui", "oui", "000", "oui"] and not repeats(words, 2, free={"000"}.__contains__)
    pooled = translate(base + ["--no-repeat-ngram", "2", "--workers", "2", "--threads", "2", "--batch-size", "1",
                               "--window", "2"], line * 4).stdout.decode()
    assert pooled == free * 4


def test_off_is_byte_identical_to_not_passing_the_option(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", lines_of(data_dir / "multi30k" / "val.en", 12))
    base = ["-m", ckpt, "-i", inp, "--beam", "4", "--nbest", "3", "--nbest-file", "-", "--workers", "1"]
    assert translate(base + ["--no-repeat-ngram", "0"]).stdout == translate(base).stdout


@pytest.mark.parametrize("value, message", [("-1", "--no-repeat-ngram must be a whole number of at least 0"),
                                            ("two", "'two' is not a valid integer")])
def test_a_bad_value_is_one_clear_error(trained, tmp_path, value, message):
    _, ckpt = trained
    proc = translate(["-m", ckpt, "--no-repeat-ngram", value], b"A dog .\n", check=False)
    err = proc.stderr.decode()
    assert proc.returncode != 0 and message in err and proc.stdout == b""
    if value == "-1":
        assert proc.returncode == 1 and len(err.strip().splitlines()) == 1
