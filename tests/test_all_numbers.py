"""Every source number written (``nmt-translate --all-numbers``, nmtkit/translate/numberbanks.py): the allocation of
the beam among levels; the batched search equals the slow reference search with it (a random model over a vocabulary
that is half digits); each finished hypothesis writes all of its sentence's numbers unless it reached its length
limit; a sentence without numbers, or a piece of a cut line, is searched as without the option; and on the command
line, with a model that never writes a digit by itself, what the user reads: the source's numbers, "2 p.m." as the
French "14", and a line without numbers unchanged."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import numpy as np
import torch
import pytest

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.data.vocab import EOS
from nmtkit.translate import numberbanks
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.cohort import BeamCohort
from nmtkit.translate.search import _reference, beam_search, beam_search_reference
from nmtkit.translate.sourcenumbers import DigitTable, SourceNumbers, source_numbers

from conftest import REPO, randomize_, tiny

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
DIGITS = ["<pad>", "<unk>", "<s>", "</s>", "▁", ",", *"0123456789", *[f"▁{d}" for d in "0123456789"], "▁a", "▁b",
          "▁c"]


def test_the_places_are_shared_among_levels():
    """12 places, levels 0..3: 6 kept for level 0, 2 for each of the others; from the top down a level short of
    candidates passes its places down; places left at the bottom go to the best remaining; the chosen come back
    best first."""
    keys = [(-float(k), k) for k in range(20)]  # candidate k scores -k
    levels = [0] * 12 + [1] * 2 + [2] * 5 + [3]
    picked = numberbanks.allocate(keys, levels, 12, 3)
    # level 3: its one (+1 passed down), level 2: 3 of 5, level 1: its 2, level 0: 6
    assert sorted(picked) == [0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 19]
    assert picked == sorted(picked)  # (best first: the scores fall with k)
    assert numberbanks.allocate(keys[:3], [2, 2, 2], 12, 3) == [0, 1, 2]  # fewer candidates than places
    # 9 levels for beam 4: level 0 keeps 2, the two highest one each; with nothing there, the spare ones go down
    assert sorted(numberbanks.allocate(keys, [k % 9 for k in range(20)], 4, 8)) == [0, 7, 8, 9]
    assert sorted(numberbanks.allocate(keys, [min(k, 3) for k in range(20)], 4, 8)) == [0, 1, 3, 4]


def test_source_numbers_on_the_24_hour_clock():
    assert source_numbers("The House met at 2 p.m. and rose at 7.43 pm.", clock24=True) == ["14", "19", "43"]
    assert source_numbers("The House met at 2 p.m. and rose at 7.43 pm.") == ["2", "7", "43"]
    assert source_numbers("at 12:05am, 11 a.m., 5:00 p.m. and 10:30", clock24=True) == ["0", "05", "11", "17", "10",
                                                                                       "30"]


def _banked(m, src, lens, decode, rule):
    """The second pass alone: a cohort whose beam is shared by numbers written, stepped to the end."""
    cohort = BeamCohort(m, src, lens, decode, numbers_from=rule, banks=True)
    while not cohort.done:
        cohort.step()
    return cohort.results()


@pytest.mark.parametrize("beam", [1, 3, 6])
def test_batched_equals_the_reference_and_every_number_is_written(beam):
    """The random tiny model over a vocabulary half of digits: the shared beam (the second pass alone) equals the
    reference's and every hypothesis of it that ends by itself has begun all its numbers; the two passes together
    equal the reference's, and each sentence has either the first pass's hypotheses (a sentence without numbers, a
    piece of a cut line, one whose best wrote them all, or one the second pass could not end) or the second's."""
    m = randomize_(tiny("rnnsearch")).eval()
    with torch.no_grad():
        m.b_y[EOS] += 4.0  # (hypotheses that end by themselves, before their length limit)
    rng = random.Random(beam)
    sents = [[rng.randint(4, 22) for _ in range(rng.randint(2, 9))] for _ in range(8)]
    numbers = [["1975500", "35"], [], ["2014"], ["10", "30", "100"], ["7", "7"], ["31415926"], ["42"], ["86420"]]
    whole = [True] * 6 + [False, True]  # the 7th: a piece of a cut line, not made to write its number
    src, lens = collate_source([np.asarray(s) for s in sents])
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_a=2.0, max_len_b=8, source_numbers=True, all_numbers=True)
    table = DigitTable(DIGITS)
    both = beam_search(m, src, lens, decode, numbers_from=SourceNumbers(table, numbers, whole))
    plain = beam_search(m, src, lens, decode.replace(all_numbers=False), numbers_from=SourceNumbers(table, numbers))
    banked = _banked(m, src, lens, decode, SourceNumbers(table, numbers, whole))
    taken = 0
    for k, s in enumerate(sents):
        rule = SourceNumbers(table, [numbers[k]], [whole[k]])
        ref_banked = _reference(m, s, decode, None, None, rule, shared=True)
        assert [h.tokens for h in banked[k]] == [h.tokens for h in ref_banked]
        assert np.allclose([h.score for h in banked[k]], [h.score for h in ref_banked], atol=1e-4)
        limit = int(2.0 * len(s) + 8)
        for h in banked[k]:
            assert all(h.tokens[i] not in rule.banned(h.tokens[:i]) for i in range(len(h.tokens)))
            if len(h.tokens) < limit:  # ended by itself: only once every number (not a "%"'s 100) is written
                assert numberbanks.begun(rule, rule.state(h.tokens, 0), 0) == rule.required[0]
                assert h.unmet == 0 and (rule.missing(h.tokens, 0) == 0 or not whole[k])
        ref = beam_search_reference(m, s, decode, numbers_from=rule)
        assert [h.tokens for h in both[k]] == [h.tokens for h in ref]
        first_ok = not plain[k] or numberbanks.unmet(rule, plain[k][0].tokens, 0) == 0
        second_ok = banked[k] and banked[k][0].unmet == 0 and len(banked[k][0].tokens) < limit
        expect = plain[k] if first_ok or not second_ok else banked[k]
        assert [h.tokens for h in both[k]] == [h.tokens for h in expect]
        taken += expect is banked[k]
        if not numbers[k] or not whole[k]:
            assert [h.tokens for h in both[k]] == [h.tokens for h in plain[k]]
    assert taken or beam == 1  # (the second pass gave some sentence its numbers; beam 1 has no place to share)
    assert SourceNumbers(table, [["55", "100"]]).required == [1]  # (a last 100 is read as a "%" sign's)
    assert SourceNumbers(table, [["100", "55"]]).required == [2]
    assert SourceNumbers(table, [source_numbers("from 55% to 50%")]).required == [2]


def test_the_second_search_has_its_own_beam():
    """--constrained-beam: a first search 2 wide, the second 6 wide.  The batched search equals the reference; a
    sentence searched again has the 6-wide shared beam's hypotheses (not the 2-wide one's, which differ for some
    sentence here), and the others the 2-wide first search's."""
    m = randomize_(tiny("rnnsearch")).eval()
    with torch.no_grad():
        m.b_y[EOS] += 4.0
    rng = random.Random(7)
    sents = [[rng.randint(4, 22) for _ in range(rng.randint(2, 9))] for _ in range(8)]
    numbers = [["1975500", "35"], [], ["2014"], ["10", "30", "100"], ["7", "7"], ["31415926"], ["42"], ["86420"]]
    src, lens = collate_source([np.asarray(s) for s in sents])
    decode = DecodeConfig(beam=2, constrained_beam=6, max_len_a=2.0, max_len_b=8, source_numbers=True,
                          all_numbers=True)
    assert decode.second == DecodeConfig(beam=6, max_len_a=2.0, max_len_b=8, source_numbers=True, all_numbers=True)
    table = DigitTable(DIGITS)
    both = beam_search(m, src, lens, decode, numbers_from=SourceNumbers(table, numbers))
    plain = beam_search(m, src, lens, decode.replace(all_numbers=False, constrained_beam=0),
                        numbers_from=SourceNumbers(table, numbers))
    wide = _banked(m, src, lens, decode.second, SourceNumbers(table, numbers))
    narrow = _banked(m, src, lens, decode.replace(constrained_beam=0), SourceNumbers(table, numbers))
    assert any([h.tokens for h in w] != [h.tokens for h in n] for w, n in zip(wide, narrow))
    taken = 0
    for k, s in enumerate(sents):
        rule = SourceNumbers(table, [numbers[k]])
        assert [h.tokens for h in both[k]] == [h.tokens for h in beam_search_reference(m, s, decode,
                                                                                       numbers_from=rule)]
        limit = int(2.0 * len(s) + 8)
        again = numberbanks.unmet(rule, plain[k][0].tokens, 0) > 0
        takes = again and wide[k][0].unmet == 0 and len(wide[k][0].tokens) < limit
        assert [h.tokens for h in both[k]] == [h.tokens for h in (wide[k] if takes else plain[k])]
        taken += takes
    assert taken


def _silent_model(trained, tmp_path):
    """The trained tiny checkpoint with digits among its target words ("1", "4", "5", "9": its own entries, or rare
    ones renamed), each made far less likely than any word: left to itself it never writes one."""
    _, ckpt = trained
    payload = checkpoint.load(ckpt)
    tokens = payload["vocab"]["tgt"]
    tokens = tokens.split("\n") if isinstance(tokens, str) else list(tokens)
    rare = iter(range(len(tokens) - 1, 4, -1))
    ids = [tokens.index(d) if d in tokens else next(rare) for d in "1459"]
    b_y = payload["model"]["b_y"].clone()
    for i, d in zip(ids, "1459"):
        tokens[i] = d
        b_y[i] = -30.0
    payload["vocab"]["tgt"] = tokens
    payload["model"]["b_y"] = b_y
    checkpoint.save(payload, tmp_path / "silent.pt")
    return tmp_path / "silent.pt"


def translate(args, stdin: bytes) -> str:
    proc = subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def test_what_the_user_reads_on_the_command_line(trained, tmp_path):
    """A model that never writes a digit: with --source-numbers alone its translations have no number; with
    --all-numbers each line has its source's numbers, whole and once ("2 p.m." as "14": the checkpoint's target is
    French), and the line without numbers is the same as before.  Without --source-numbers the option is refused
    in one line."""
    model = _silent_model(trained, tmp_path)
    base = ["-m", str(model), "--beam", "5", "--source-numbers"]
    lines = b"A man is sleeping .\nIn 1995 a dog ran .\nAt 2 p.m. 5 dogs ran .\n"
    alone = translate(base, lines).splitlines()
    assert len(alone) == 3 and not re.search(r"[0-9]", "".join(alone))
    held = translate(base + ["--all-numbers"], lines).splitlines()
    assert len(held) == 3 and held[0] == alone[0]
    assert re.sub(r"[^0-9]", "", held[1]) == "1995", held[1]
    assert sorted(re.sub(r"[^0-9]", "", held[2])) == sorted("145"), held[2]  # 14 and 5 (its vocabulary has no "2")
    proc = subprocess.run(TRANSLATE + ["-m", str(model), "--all-numbers"], input=lines, capture_output=True,
                          env=ENV, timeout=300)
    assert proc.returncode != 0 and proc.stdout == b""
    assert len(proc.stderr.decode().strip().splitlines()) == 1 and "--source-numbers" in proc.stderr.decode()
