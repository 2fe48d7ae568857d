"""Continuous batching (nmtkit/translate/continuous.py, nmtkit/translate/cohort.py): batches that join a running
search at different steps, stepped together in one product, each get exactly what beam search gives that batch alone
-- tokens, scores, the ranking's scores and the attention -- whatever else shares the steps (sources of other
lengths, padded; batches that leave early); and a Translator's lines begun and ended that way are its
translate()'s text, on the tiny model trained on real Multi30K pairs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.continuous import ContinuousSearch, stack_encoder_out
from nmtkit.translate.decoding import decode_batch, finish_hypotheses, start_cohort
from nmtkit.translate.sourcenumbers import DigitTable

from conftest import V_SRC, V_TGT, lines_of, randomize_, tiny

DIGITS = ["<pad>", "<unk>", "<s>", "</s>", "▁", ",", *"0123456789", *[f"▁{d}" for d in "0123456789"], "▁a", "▁b",
          "▁c"]


def _batches(seed: int, n: int) -> list[list[np.ndarray]]:
    """n batches of 1-4 random sentences of 1-12 source ids: their lengths differ within and across batches."""
    rng = random.Random(seed)
    return [[np.asarray([rng.randint(4, V_SRC - 1) for _ in range(rng.randint(1, 12))])
             for _ in range(rng.randint(1, 4))] for _ in range(n)]


CASES = {
    "rnnsearch: n-best, attention, prefixes, repeated 2-grams blocked": (
        "rnnsearch", 1, DecodeConfig(beam=4, nbest=4, max_len_a=1.5, max_len_b=4, no_repeat_ngram=2), True, True),
    "rnnsearch: coverage penalty, length normalisation, source numbers held and counted": (
        "rnnsearch", 1, DecodeConfig(beam=3, nbest=2, lenpen=0.6, coverage_penalty=0.3, max_len_b=5,
                                     source_numbers=True, missing_numbers=0.5), False, False),
    "rnnsearch: every source number written (the beam shared by numbers written), prefixes": (
        "rnnsearch", 1, DecodeConfig(beam=4, nbest=3, max_len_a=1.5, max_len_b=5, source_numbers=True,
                                     all_numbers=True), False, True),
    "rnnsearch ensemble of two": ("rnnsearch", 2, DecodeConfig(beam=5, nbest=3, max_len_b=5), True, False),
    "rnnencdec": ("rnnencdec", 1, DecodeConfig(beam=5, nbest=5, max_len_b=5), False, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_batches_joining_at_different_steps_get_what_they_get_alone(case):
    arch, n_models, decode, need_attention, with_prefixes = CASES[case]
    models = [randomize_(tiny(arch), seed=1 + k).eval() for k in range(n_models)]
    batches = _batches(len(case), 6)
    rng = random.Random(7)
    prefixes = [[np.asarray([rng.randint(4, V_TGT - 1) for _ in range(rng.randint(1, 3))]) if rng.random() < 0.5
                 else None for _ in b] for b in batches] if with_prefixes else [None] * len(batches)
    numbers = [[rng.choice([[], ["12"], ["7", "305"]]) for _ in b] for b in batches]
    extras = dict(digit_table=DigitTable(DIGITS), numbers=None) if decode.source_numbers else {}

    def options(k):
        return dict(need_attention=need_attention, prefixes=prefixes[k],
                    **({**extras, "source_numbers": numbers[k]} if decode.source_numbers else {}))

    alone = [decode_batch(models, b, "cpu", decode, **options(k)) for k, b in enumerate(batches)]
    search, cohorts, joins = ContinuousSearch(models), {}, {0: [0, 1], 2: [2], 3: [3], 7: [4, 5]}
    step, most, widths = 0, 0, set()
    while len(cohorts) < len(batches) or search.cohorts:
        for k in joins.get(step, []):
            cohorts[k] = start_cohort(models, batches[k], "cpu", decode, **options(k))
            search.add(cohorts[k])
        most = max(most, len(search.cohorts))
        widths |= {c.Tx for c in search.cohorts} if len(search.cohorts) > 1 else set()
        search.step()
        step += 1
        assert step < 200
    assert most >= 3 and len(widths) >= 2  # (steps were shared, by sources of different lengths: padded)
    for k, want in enumerate(alone):
        got = finish_hypotheses(cohorts[k].results())
        assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in want]
        for g, w in zip((h for s in got for h in s), (h for s in want for h in s)):
            assert abs(g.score - w.score) < 1e-4 and abs(g.norm_score - w.norm_score) < 1e-4
            assert (g.attention is None) == (w.attention is None) == (not need_attention)
            if need_attention:
                assert g.attention.shape == w.attention.shape and np.allclose(g.attention, w.attention, atol=1e-5)


def test_a_search_that_never_ends_keeps_only_what_its_sentences_need():
    """A server's steady load: a batch joins every other step for 60 steps, so the search runs all along.  Each batch
    gets its alone hypotheses (prefixes and the n-gram block read the histories), while the search's token history
    stays within the longest life of a sentence in it (the columns of the sentences gone are dropped) and its
    source positions shrink back when the long sources are done."""
    m = randomize_(tiny("rnnsearch"), seed=3).eval()
    decode = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=3, no_repeat_ngram=2)
    rng = random.Random(11)
    batches = [[np.asarray([rng.randint(4, V_SRC - 1) for _ in range(rng.choice([2, 3, 12] if k < 4 else [2, 3]))])
                for _ in range(rng.randint(1, 2))] for k in range(30)]  # (long sources in the first batches only)
    prefixes = [[np.asarray([rng.randint(4, V_TGT - 1)]) if rng.random() < 0.4 else None for _ in b] for b in batches]
    alone = [decode_batch([m], b, "cpu", decode, prefixes=p) for b, p in zip(batches, prefixes)]
    search, cohorts, widths, sources = ContinuousSearch([m]), [], [], []
    for step in range(400):
        if step % 2 == 0 and len(cohorts) < len(batches):
            k = len(cohorts)
            cohorts.append(start_cohort([m], batches[k], "cpu", decode, prefixes=prefixes[k]))
            search.add(cohorts[k])
        if not search.cohorts and len(cohorts) == len(batches):
            break
        search.step()
        if search._host is not None:
            widths.append(search._host.tokens.shape[1])
            sources.append(search._host.Tx)
    longest = max(int(1.0 * len(s) + 3) for b in batches for s in b) + 1
    assert len(widths) > 50 and max(widths) <= longest + 1, (max(widths), longest)  # (not ~60 steps of history)
    assert max(sources) == 13 and any(b < a for a, b in zip(sources, sources[1:]))  # (12 words and </s>; shrank)
    for k, want in enumerate(alone):
        got = cohorts[k].results()
        assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in want]
        assert all(abs(g.score - w.score) < 1e-4 for x, y in zip(got, want) for g, w in zip(x, y))


def test_stacked_encoder_outputs_are_padded_along_the_source():
    m = randomize_(tiny("rnnsearch")).eval()
    short = start_cohort([m], [np.asarray([5, 6])], "cpu", DecodeConfig(beam=2))
    long = start_cohort([m], [np.asarray([5, 6, 7, 8, 9]), np.asarray([4])], "cpu", DecodeConfig(beam=2))
    one = stack_encoder_out([short.encs[0], long.encs[0]])
    assert one.src_mask.shape == (3, 6) and one.src_mask.sum(1).tolist() == [3, 6, 2]
    assert torch.equal(one.annotations[0, 3:], torch.zeros_like(one.annotations[0, 3:]))
    assert torch.equal(one.annotations[1:], long.encs[0].annotations)
    assert one.proj.shape[:2] == (3, 6) and torch.equal(one.init_state[:1], short.encs[0].init_state)


def test_translator_lines_begun_and_ended_are_its_translations(trained, data_dir):
    from nmtkit.translate.translator import Translator

    lines = lines_of(data_dir / "multi30k" / "val.en", 30)
    numbered = list(enumerate(lines[:20] + [""] + lines[20:], start=1))
    with Translator([str(trained[1])], DecodeConfig(beam=6, nbest=2), batch_size=8, workers=1,
                    need_attention=True) as t:
        want = list(t.translate(numbered))
        search = ContinuousSearch(t.models)
        w1, first = t.begin(numbered[:12])
        for c in first:
            search.add(c)
        for _ in range(3):
            search.step()
        w2, second = t.begin(numbered[12:])  # (joins the running search)
        for c in second:
            search.add(c)
        while search.cohorts:
            search.step()
        got = t.end(w1, first) + t.end(w2, second)
        assert [g.text for g in got] == [x.text for x in want] and got[20].text == ""
        assert [[n[0] for n in g.nbest] for g in got] == [[n[0] for n in x.nbest] for x in want]
        assert np.allclose([n[1] for g in got for n in g.nbest], [n[1] for x in want for n in x.nbest], atol=1e-3)
        assert [g.alignment for g in got] == [x.alignment for x in want]
        assert len(first) == 2 and len(second) == 3  # (batches of 8)
        assert t.end(*t.begin([])) == []
        with pytest.raises(ValueError, match="sampling"):
            t.configured(DecodeConfig(sampling="topk:5")).begin(numbered[:2])
