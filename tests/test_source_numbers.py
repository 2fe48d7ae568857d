"""Numbers held to the source (``nmt-translate --source-numbers``, nmtkit/translate/sourcenumbers.py): the source's
numbers as digit strings; the rule on SentencePiece and word vocabularies; the batched search equals the slow
reference search with it on (a random model that writes digits everywhere, so the constraint acts at every step);
and on the command line, with a model made to prefer digits, what the user reads: no digit outside the source's
numbers, a source number written out, the same through worker processes and with sampling; --missing-numbers, which
was removed, refused in one line."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.data.vocab import EOS
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import DecodeSetup, SourceBatch, decode_batch
from nmtkit.translate.search import beam_search, beam_search_reference, greedy
from nmtkit.translate.sourcenumbers import DigitTable, SourceNumbers, source_numbers

from conftest import REPO, randomize_, tiny

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_the_source_numbers_are_digit_strings():
    assert source_numbers("more than 63% between 1985 and 1995, and $1,975,500 at 10:30") == \
        ["63", "1985", "1995", "1975500", "10", "30", "100"]
    assert source_numbers("3.5 million, 1 000 people, 5, 6 and 7") == ["35", "1000", "5", "6", "7"]
    assert source_numbers("No number here.") == []
    # a clock time is two numbers ("18 h 15", "5 h 30"); each "%" allows one French "p. 100"
    assert source_numbers("It being 6.15 p.m., at 5.30am, 4.5 billion") == ["6", "15", "5", "30", "45"]
    assert source_numbers("from 55% to 50%") == ["55", "50", "100", "100"]


SPM = ["<pad>", "<unk>", "<s>", "</s>", "▁", "1", "9", "7", "5", "0", "▁1", "▁2", ",", ".", "▁le", "▁p", "1er"]


def _ids(tokens, text):
    return [tokens.index(x) for x in text.split()]


def _allowed(rule, tokens, text, sentence=0):
    banned = rule.banned(_ids(tokens, text) if text else [], sentence)
    return sorted(tokens[i] for i in rule.ids if i not in banned)


def test_the_rule_on_sentencepiece_pieces():
    table = DigitTable(SPM)
    assert table.sentencepiece and table.digits[SPM.index("1er")] == "1"
    rule = SourceNumbers(table, [source_numbers("$1,975,500 in 1995"), []])
    assert _allowed(rule, SPM, "") == ["1", "1er", "▁1"]  # a number begins with a source number's first digit
    assert _allowed(rule, SPM, "▁le") == ["1", "1er", "▁1"]
    assert _allowed(rule, SPM, "▁1") == ["9"]  # only "19…": "1" is no number of the source, it must go on
    assert _allowed(rule, SPM, "▁1 9") == ["7", "9"]  # 197… (1975500) or 199… (1995)
    assert _allowed(rule, SPM, "▁1 ▁ 9 7 5 ▁ 5 0") == ["0"]  # French grouping: the same digits
    assert _allowed(rule, SPM, "▁1 ▁ 9 7 5 ▁ 5 0 0") == ["▁1"]  # 1975500 is whole: it does not run on
    assert _allowed(rule, SPM, "▁1 ▁ 9 7 5 ▁ 5 0 0 ▁") == ["1", "1er", "▁1"]  # a new number may begin
    assert _allowed(rule, SPM, "", sentence=1) == []  # a source without numbers: no digit at all
    state = rule.state(_ids(SPM, "▁1 9 9 5 ,"), 0)
    assert (state.run, state.apart, state.glued) == ("1995", True, True)
    # each number as often as the source has it: once both are written, no digit may follow
    assert _allowed(rule, SPM, "▁1 9 9 5 ▁le") == ["1", "1er", "▁1"]  # (1975500 is left)
    assert _allowed(rule, SPM, "▁1 ▁ 9 7 5 ▁ 5 0 0 ▁le ▁1 9 9 5 ▁le") == []
    # a number is not cut short: after "199" only its digits (or glue, once) may follow, and no </s> ...
    banned = rule.banned(_ids(SPM, "▁le ▁1 9 9"))
    assert {"▁le", "▁p", "</s>", "9", "▁1"} <= {SPM[i] for i in banned} and SPM.index("5") not in banned
    assert SPM.index(",") not in banned and SPM.index(",") in rule.banned(_ids(SPM, "▁le ▁1 9 9 ,"))
    # ... but at the length limit the hypothesis may end, and a whole number may end anywhere
    assert EOS not in rule.banned(_ids(SPM, "▁le ▁1 9 9"), ending=True)
    assert {SPM.index("▁le"), EOS}.isdisjoint(rule.banned(_ids(SPM, "▁le ▁1 9 9 5")))


def test_the_numbers_a_finished_hypothesis_leaves_out():
    rule = SourceNumbers(DigitTable(SPM), [source_numbers("$1,975,500 in 1995"), source_numbers("from 55% to 50%")])
    assert rule.missing([], 0) == 2
    assert rule.missing(_ids(SPM, "▁le ▁1 9 9 5"), 0) == 1  # (the last run is taken: it is whole)
    assert rule.missing(_ids(SPM, "▁1 ▁ 9 7 5 ▁ 5 0 0 ▁le ▁1 9 9 5 ."), 0) == 0
    assert rule.missing(_ids(SPM, "▁1 9 9"), 0) == 2  # cut short (at the length limit): not written
    # each "%" allowed a "100" (the French "p. 100"); a translation that writes "%" instead leaves nothing out
    assert rule.percents == [0, 2]
    assert rule.missing(_ids(SPM, "▁ 5 5 ▁le ▁ 5 0"), 1) == 0 and rule.missing(_ids(SPM, "▁ 5 5"), 1) == 1


def test_the_rule_on_words_and_bpe():
    words = ["<pad>", "<unk>", "<s>", "</s>", "19@@", "95", "1995", "5", "9", "le", "1"]
    rule = SourceNumbers(DigitTable(words), [["1995"]])
    assert not rule.table.sentencepiece
    assert _allowed(rule, words, "le") == ["1", "1995", "19@@"]
    assert _allowed(rule, words, "19@@") == ["9", "95"]  # a BPE piece goes on with the same number (199…, 1995)
    # a word is apart, so it may go on with the number (digits grouped, "1 995"); "1" is not whole: it must
    assert _allowed(rule, words, "1") == ["9"]
    assert _allowed(rule, words, "1995") == []  # the source's one 1995 is written
    # where no token can go on with a number, it may end there (a hypothesis is never left without a way out)
    rule = SourceNumbers(DigitTable(words), [["1987"]])
    assert _allowed(rule, words, "19@@") == [] and EOS not in rule.banned(_ids(words, "19@@"))


def _digit_vocab() -> list[str]:
    """29 target tokens for the tiny model: half of them digits and digit glue."""
    return ["<pad>", "<unk>", "<s>", "</s>", "▁", ",", *"0123456789", *[f"▁{d}" for d in "0123456789"], "▁a", "▁b",
            "▁c"]


@pytest.mark.parametrize("beam", [1, 3, 6])
def test_batched_equals_the_reference_on_a_random_model(beam):
    """A random tiny model over a vocabulary that is half digits writes digits at every step: the constraint
    acts everywhere, in sentences that finish at different steps (the batch shrinks, the rows' states follow their
    hypotheses).  Every token of every hypothesis is one the rule allows after the tokens before it, and without the
    constraint the same search writes digits the sources do not have."""
    vocab = _digit_vocab()
    assert len(vocab) == 29
    m = randomize_(tiny("rnnsearch")).eval()
    rng = random.Random(beam)
    sents = [[rng.randint(4, 22) for _ in range(rng.randint(1, 9))] for _ in range(6)]
    numbers = [["1975500", "35"], [], ["2014"], ["10", "30", "100"], ["7", "7"], ["999"]]
    src, lens = collate_source([np.asarray(s) for s in sents])
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.5, max_len_b=6, source_numbers=True)
    table = DigitTable(vocab)
    batched = beam_search(m, src, lens, decode, numbers_from=SourceNumbers(table, numbers))
    for k, (s, hyps) in enumerate(zip(sents, batched)):
        rule = SourceNumbers(table, [numbers[k]])
        ref = beam_search_reference(m, s, decode, numbers_from=rule)
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)
        assert np.allclose([h.norm_score for h in hyps], [h.norm_score for h in ref], atol=1e-4)
        limit = int(1.5 * len(s) + 6)
        for h in hyps:  # each token, and the end, allowed where it came
            assert all(h.tokens[i] not in rule.banned(h.tokens[:i]) for i in range(len(h.tokens)))
            assert EOS not in rule.banned(h.tokens, ending=len(h.tokens) >= limit)
    plain = beam_search(m, src, lens, DecodeConfig(beam=beam, max_len_a=1.5, max_len_b=6))
    assert any(h[0].tokens[i] in SourceNumbers(table, [numbers[k]]).banned(h[0].tokens[:i])
               for k, h in enumerate(plain) for i in range(len(h[0].tokens)))
    # greedy and sampling share one loop: the rule holds there too, and the search refuses to run without numbers
    rule = SourceNumbers(table, numbers)
    for h, k in zip(greedy(m, src, lens, DecodeConfig(beam=1, source_numbers=True), numbers_from=rule), range(6)):
        one = SourceNumbers(table, [numbers[k]])
        assert all(h.tokens[i] not in one.banned(h.tokens[:i]) for i in range(len(h.tokens)))
    with pytest.raises(ValueError, match="source's numbers"):
        beam_search(m, src, lens, decode)
    hyps = decode_batch([m], SourceBatch([np.asarray(s) for s in sents], keys=[(k,) for k in range(6)],
                                         numbers=numbers), "cpu",
                        DecodeSetup(DecodeConfig(nbest=2, sampling="topk:10", source_numbers=True), digit_table=table))
    for k, sentence in enumerate(hyps):
        one = SourceNumbers(table, [numbers[k]])
        assert len(sentence) == 2
        assert all(h.tokens[i] not in one.banned(h.tokens[:i]) for h in sentence for i in range(len(h.tokens)))


def translate(args, stdin: bytes):
    proc = subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def test_what_the_user_reads_on_the_command_line(trained, tmp_path):
    """The trained tiny checkpoint made to prefer digits ("9", "1" and "5" -- its own entries, or rare ones renamed --
    their output biases raised, "9" first): without the constraint every line is nines; with it a line without
    numbers has no digit, and a line with 1995 gets 1995 once and whole (greedy: "1 9 9", then not the "9" it
    prefers, since "1999" is not the source's and "199" is no number of it, but "5"; then no digit).  The same through worker processes, and under sampling."""
    _, ckpt = trained
    payload = checkpoint.load(ckpt)
    tokens = payload["vocab"]["tgt"]
    tokens = tokens.split("\n") if isinstance(tokens, str) else list(tokens)
    rare = iter(range(len(tokens) - 1, 4, -1))  # (the rarest entries: nothing else of the model needs them)
    nine, one, five = (tokens.index(d) if d in tokens else next(rare) for d in ("9", "1", "5"))
    tokens[nine], tokens[one], tokens[five] = "9", "1", "5"
    payload["vocab"]["tgt"] = tokens
    b_y = payload["model"]["b_y"].clone()
    b_y[nine], b_y[one], b_y[five] = 80.0, 70.0, 60.0
    payload["model"]["b_y"] = b_y
    checkpoint.save(payload, tmp_path / "digits.pt")
    base = ["-m", str(tmp_path / "digits.pt"), "--beam", "1", "--max-len-a", "0", "--max-len-b", "6"]
    lines = b"A man is sleeping .\nIn 1995 a dog ran .\n"
    assert translate(base, lines) == "9 9 9 9 9 9\n9 9 9 9 9 9\n"
    held = translate(base + ["--source-numbers"], lines).splitlines()
    assert len(held) == 2 and not re.search(r"[0-9]", held[0]) and held[0].strip()
    assert held[1].startswith("1 9 9 5 ") and re.sub(r"[^0-9]", "", held[1]) == "1995"  # whole, and once
    pooled = translate(base + ["--source-numbers", "--workers", "2", "--threads", "2", "--batch-size", "1",
                               "--window", "2"], lines * 3).splitlines()
    assert pooled == held * 3
    sampled = translate(base + ["--source-numbers", "--sampling", "topk:3", "--nbest", "3", "--nbest-file", "-"], lines)
    for row in sampled.splitlines():
        line, text = int(row.split(" ||| ")[0]), row.split(" ||| ")[1]
        digits = "".join(re.findall(r"[0-9]", text))
        assert digits == "" if line == 0 else "1995".startswith(digits)


def test_missing_numbers_was_removed_and_is_refused_in_one_line(trained, tmp_path):
    """--missing-numbers (finished hypotheses ranked lower by a penalty per source number left out) changed no line
    (tests/bench/results/bench_recipe.txt) and was removed: it is refused in one line that says so and names
    --all-numbers, exit code 2, nothing written."""
    _, ckpt = trained
    proc = subprocess.run(TRANSLATE + ["-m", ckpt, "-o", str(tmp_path / "out"), "--source-numbers", "--missing-numbers",
                                       "10"], input=b"In 1995 a dog ran .\n", capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and proc.stdout == b"" and not (tmp_path / "out").exists()
    assert proc.stderr.decode().splitlines() == [
        "nmt-translate: error: --missing-numbers: removed: it changed no line (bench_recipe.txt); use --all-numbers"]
