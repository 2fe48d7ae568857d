"""nmtkit.select.lm: n-gram counting, interpolated modified Kneser–Ney, ARPA output, scoring.

Checked against (1) values worked out by hand for a tiny corpus (bigram and trigram), (2) a plain-Python
dictionary implementation of the same formulas written here, on real sentences, (3) normalisation: every context's
distribution sums to 1, and (4) KenLM reading the ARPA file written by nmtkit (``pip install kenlm``).
"""

from __future__ import annotations

import functools
import io
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from nmtkit.select.lm import BOS, EOS, UNK, LMVocab, NgramLM, kneser_ney_discounts
from nmtkit.select.lm_arpa import write_arpa
from nmtkit.select.lm_count import NgramCounter

# -- helpers -----------------------------------------------------------------------------------------------------


def train(sentences, order, min_count=1, discounts=None, batch=1 << 20):
    vocab = LMVocab.build(Counter(w for s in sentences for w in s), min_count)
    counter = NgramCounter(order, len(vocab), min_batch_tokens=batch)
    for s in sentences:
        counter.add(vocab.ids(s))
    return NgramLM.estimate(counter.finish(), vocab, discounts)


def real_sentences(data_dir, name="newstest2010", n=400, lang="en"):
    """The first ``n`` lines of a news test set, tokenised as nmt-prepare does."""
    return [list(s) for s in _tokenized(str(data_dir / "wmt-news-older" / f"{name}.{lang}"), lang)[:n]]


@functools.lru_cache(maxsize=None)
def _tokenized(path, lang):
    from nmtkit.data.text import Preprocessor, TextConfig

    pre = Preprocessor(TextConfig(lang))
    with open(path, encoding="utf-8", newline="\n") as f:
        return tuple(tuple(pre.words(line.rstrip("\n"))) for _, line in zip(range(1500), f))


def padded(sentence):
    return ["<s>", *sentence, "</s>"]


def ngram_counter(sentences, order):
    """All n-grams of orders 1..order of <s> w… </s>, counted with collections.Counter."""
    counts = Counter()
    for s in sentences:
        p = padded(s)
        for k in range(1, order + 1):
            for i in range(len(p) - k + 1):
                counts[tuple(p[i:i + k])] += 1
    return counts


def reference_kn(sentences, order, vocab_words, discounts=None):
    """Interpolated modified Kneser–Ney with dictionaries, straight from the formulas (Chen & Goodman 1998; <s>-
    initial n-grams keep raw counts, as KenLM's lmplz). Returns p(w, context_tuple) -> probability."""
    known = set(vocab_words)
    sents = [[w if w in known else "<unk>" for w in s] for s in sentences]
    raw = ngram_counter(sents, order)
    adjusted = {}
    for g, c in raw.items():
        if len(g) == order or g[0] == "<s>":
            adjusted[g] = c
    left = defaultdict(set)
    for g in raw:
        if len(g) >= 2:
            left[g[1:]].add(g[0])
    for g in raw:
        if len(g) < order and g[0] != "<s>":
            adjusted[g] = len(left[g])
    adjusted.pop(("<s>",), None)
    disc = {}
    for k in range(1, order + 1):
        if discounts:
            disc[k] = discounts[k - 1]
            continue
        n = Counter(min(a, 5) for g, a in adjusted.items() if len(g) == k)
        n1, n2, n3, n4 = (n[r] for r in (1, 2, 3, 4))
        y = n1 / (n1 + 2 * n2)
        disc[k] = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)

    def D(k, a):
        return 0.0 if a == 0 else disc[k][min(a, 3) - 1]

    by_context = defaultdict(dict)
    for g, a in adjusted.items():
        by_context[g[:-1]][g[-1]] = a
    predictable = [w for w in vocab_words if w != "<s>"]

    def p(w, h):
        h = tuple(h)[-(order - 1):] if order > 1 else ()
        k = len(h) + 1
        if k == 1:
            cont = by_context[()]
            total = sum(cont.values())
            gamma = sum(D(1, a) for a in cont.values()) / total
            return (cont.get(w, 0) - D(1, cont.get(w, 0))) / total + gamma / len(predictable)
        cont = by_context.get(h)
        if not cont:
            return p(w, h[1:])
        total = sum(cont.values())
        gamma = sum(D(k, a) for a in cont.values()) / total
        a = cont.get(w, 0)
        return (a - D(k, a)) / total + gamma * p(w, h[1:])

    return p, disc


# -- counting ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 7, 1 << 20])
def test_counts_match_a_plain_counter_whatever_the_batches(data_dir, batch):
    sentences = real_sentences(data_dir, n=150)
    vocab = LMVocab.build(Counter(w for s in sentences for w in s), min_count=2)
    counter = NgramCounter(4, len(vocab), min_batch_tokens=batch)  # batch 1: one merge per sentence
    for s in sentences:
        counter.add(vocab.ids(s))
    counts = counter.finish()
    words = vocab.words
    expected = ngram_counter([[w if w in vocab.index else "<unk>" for w in s] for s in sentences], 4)
    got = {}
    for k in range(1, 5):
        for ids, c in zip(counts.ngram_ids(k).tolist(), counts.counts[k].tolist()):
            if c:
                got[tuple(words[i] for i in ids)] = c
    assert got == dict(expected)
    assert counts.sentences == len(sentences) and counts.tokens == sum(map(len, sentences))
    for k in range(2, 5):
        assert (np.diff(counts.keys[k]) > 0).all()  # sorted and unique


def test_counter_handles_empty_and_short_sentences():
    c = NgramCounter(4, 5)
    for s in ([], [3], [3, 4], []):
        c.add(s)
    counts = c.finish()
    assert counts.counts[1].tolist() == [0, 4, 4, 2, 1]
    assert counts.sizes() == [4, 5, 3, 1]  # from <s> </s> (twice), <s> 3 </s> and <s> 3 4 </s>
    with pytest.raises(ValueError):
        NgramCounter(2, 5).add_all([[5]]).finish()


# -- Kneser–Ney by hand --------------------------------------------------------------------------------------------

# The corpus "a b" / "a b a" / "b", i.e. <s> a b </s> | <s> a b a </s> | <s> b </s>, vocabulary <unk> <s> </s> a b.
TINY = [["a", "b"], ["a", "b", "a"], ["b"]]
D1, D2, D3 = (0.4, 0.9, 1.3), (0.6, 1.1, 1.7), (0.7, 1.2, 1.8)  # given discounts (D_1, D_2, D_3+) per order


def tiny_unigrams():
    # continuation counts: a ← {<s>, b}, b ← {a, <s>}, </s> ← {b, a}: 2 each; <unk> 0; 4 predictable ids
    gamma = 3 * D1[1] / 6  # 3 words with a() = 2 discounted by D_2 = 0.9, over Σ a = 6
    p_word = (2 - D1[1]) / 6 + gamma / 4
    return p_word, gamma / 4  # p(a) = p(b) = p(</s>), p(<unk>)


def test_bigram_by_hand():
    lm = train(TINY, 2, discounts=[D1, D2])
    p_word, p_unk = tiny_unigrams()
    assert math.isclose(p_word, 0.29583333333, rel_tol=1e-9) and math.isclose(p_unk, 0.1125, rel_tol=1e-12)
    assert math.isclose(10 ** lm.logprob("a"), p_word, rel_tol=1e-12)
    assert math.isclose(10 ** lm.logprob("zzz"), p_unk, rel_tol=1e-12)
    # top order: raw counts. After a: b twice, </s> once → Σ = 3, γ(a) = (D_2 + D_1) / 3
    gamma_a = (D2[1] + D2[0]) / 3
    expect = {"b": (2 - D2[1]) / 3 + gamma_a * p_word,  # 0.3 + 0.1676389
              "</s>": (1 - D2[0]) / 3 + gamma_a * p_word,
              "a": gamma_a * p_word,  # unseen after a: backs off
              "<unk>": gamma_a * p_unk}
    assert math.isclose(expect["b"], 0.46763888889, rel_tol=1e-9)
    for w, p in expect.items():
        assert math.isclose(10 ** lm.logprob(w, ["a"]), p, rel_tol=1e-12), w
    assert math.isclose(sum(expect.values()), 1.0, rel_tol=1e-12)
    # the backoff weight of context a is γ(a)
    assert math.isclose(10 ** lm.backoff[1][lm.vocab.index["a"]], gamma_a, rel_tol=1e-12)
    # a whole sentence: p(a | <s>) p(b | a) p(</s> | b), with <s> followed by a twice and b once
    p_a_bos = (2 - D2[1]) / 3 + (D2[1] + D2[0]) / 3 * p_word
    p_end_b = (2 - D2[1]) / 3 + (D2[1] + D2[0]) / 3 * p_word  # b: </s> twice, a once
    assert math.isclose(10 ** lm.sentence_logprobs([["a", "b"]])[0], p_a_bos * expect["b"] * p_end_b, rel_tol=1e-12)


def test_trigram_by_hand():
    lm = train(TINY, 3, discounts=[D1, D2, D3])
    p_word, p_unk = tiny_unigrams()
    # order 2, adjusted counts: (a b) ← {<s>} = 1, (a </s>) ← {b} = 1, (b </s>) ← {a, <s>} = 2, (b a) ← {a} = 1;
    # <s>-initial bigrams keep raw counts: (<s> a) = 2, (<s> b) = 1
    p2_b_a = (1 - D2[0]) / 2 + (2 * D2[0] / 2) * p_word  # after a: b 1, </s> 1 → γ(a) = 0.6
    p2_end_a = p2_b_a
    p2_a_a = (2 * D2[0] / 2) * p_word
    gamma_b = (D2[1] + D2[0]) / 3  # after b: </s> 2, a 1
    p2_end_b = (2 - D2[1]) / 3 + gamma_b * p_word
    p2_a_b = (1 - D2[0]) / 3 + gamma_b * p_word
    p2_a_bos = (2 - D2[1]) / 3 + gamma_b * p_word  # after <s>: a 2, b 1 (raw counts)
    assert math.isclose(p2_b_a, 0.3775, rel_tol=1e-12)
    # order 3, raw counts: (<s> a b) 2, (a b </s>) 1, (a b a) 1, (b a </s>) 1, (<s> b </s>) 1
    p3_b_bos_a = (2 - D3[1]) / 2 + (D3[1] / 2) * p2_b_a  # 0.4 + 0.6 × 0.3775 = 0.6265
    p3_end_ab = (1 - D3[0]) / 2 + (2 * D3[0] / 2) * p2_end_b
    p3_a_ab = (1 - D3[0]) / 2 + (2 * D3[0] / 2) * p2_a_b
    p3_end_ba = (1 - D3[0]) / 1 + D3[0] * p2_end_a  # 0.3 + 0.7 × 0.3775 = 0.56425
    assert math.isclose(p3_b_bos_a, 0.6265, rel_tol=1e-12) and math.isclose(p3_end_ba, 0.56425, rel_tol=1e-12)
    checks = [("b", ["<s>", "a"], p3_b_bos_a), ("</s>", ["a", "b"], p3_end_ab), ("a", ["a", "b"], p3_a_ab),
              ("</s>", ["b", "a"], p3_end_ba), ("a", ["<s>"], p2_a_bos),
              ("a", ["<s>", "a"], (D3[1] / 2) * p2_a_a),  # (<s> a a) unseen: γ(<s> a) p(a | a)
              ("a", ["b", "b"], p2_a_b),  # context (b b) never seen: no backoff weight, straight to p(a | b)
              ("<unk>", ["a", "b"], (2 * D3[0] / 2) * gamma_b * p_unk)]
    for w, h, p in checks:
        assert math.isclose(10 ** lm.logprob(w, h), p, rel_tol=1e-12), (w, h)
    assert math.isclose(10 ** lm.sentence_logprobs([["a", "b"]])[0], p2_a_bos * p3_b_bos_a * p3_end_ab,
                        rel_tol=1e-12)


def test_discounts_by_hand():
    # count-of-counts n1..n4 = 10, 5, 3, 2 (and some larger counts, which do not matter)
    adjusted = np.array([1] * 10 + [2] * 5 + [3] * 3 + [4] * 2 + [9, 30, 0])
    (d1, d2, d3), fallback = kneser_ney_discounts(adjusted)
    y = 10 / (10 + 2 * 5)  # 0.5
    assert not fallback
    assert math.isclose(d1, 1 - 2 * y * 5 / 10) and math.isclose(d1, 0.5)
    assert math.isclose(d2, 2 - 3 * y * 3 / 5) and math.isclose(d2, 1.1)
    assert math.isclose(d3, 3 - 4 * y * 2 / 3) and math.isclose(d3, 5 / 3)
    assert kneser_ney_discounts(np.array([1, 1, 2, 3])) == ((0.5, 1.0, 1.5), True)  # n4 = 0


# -- against an independent implementation, and normalisation ------------------------------------------------------


@pytest.mark.parametrize("order", [2, 3, 4])
def test_matches_a_dictionary_implementation(data_dir, order):
    sentences = real_sentences(data_dir, n=300)
    lm = train(sentences, order, min_count=2)
    ref, disc = reference_kn(sentences, order, lm.vocab.words)
    assert not any(lm.discount_fallback[1:])
    for k in range(1, order + 1):
        assert np.allclose(lm.discounts[k], disc[k], rtol=1e-12)
    words = lm.vocab.words
    contexts = [[]] + [[words[i] for i in row] for k in range(1, order) for row in lm.ngram_ids(k)[::37].tolist()]
    targets = [3, 4, 10, 50, UNK, EOS, len(words) - 1]
    for h in contexts:
        if h and h[-1] == "</s>":
            continue
        got = 10 ** lm.conditional(h)
        for w in targets:
            assert math.isclose(got[w], ref(words[w], h), rel_tol=1e-9), (h, words[w])


@pytest.mark.parametrize("order", [2, 3, 4])
def test_every_seen_context_sums_to_one(data_dir, order):
    sentences = real_sentences(data_dir, n=120)
    lm = train(sentences, order, min_count=2)
    assert lm.logp[1][UNK] > -np.inf and lm.vocab.index.get("<unk>") == UNK
    words = lm.vocab.words
    n_contexts = 0
    for k in range(0, order):
        rows = [[]] if k == 0 else lm.ngram_ids(k).tolist()
        for row in rows:
            if row and row[-1] == EOS:
                continue  # nothing follows </s>
            p = 10 ** lm.conditional([words[i] for i in row])  # vocabulary + </s> + <unk>; p(<s>) = 0
            assert p[BOS] == 0.0 and (p[np.arange(len(p)) != BOS] > 0).all()
            assert abs(p.sum() - 1.0) < 1e-9, row
            n_contexts += 1
    assert n_contexts > 250 * (order - 1)  # every vocabulary word and every seen (k < N)-gram


def test_discounts_fall_back_on_tiny_corpora():
    lm = train(TINY, 3)
    assert lm.discount_fallback[1:] == [True, True, True] and lm.discounts[3] == (0.5, 1.0, 1.5)
    for h in ([], ["a"], ["<s>", "a"], ["a", "b"]):
        assert abs((10 ** lm.conditional(h)).sum() - 1) < 1e-12


def test_perplexity_and_scores_are_consistent(data_dir):
    sentences = real_sentences(data_dir, n=300)
    lm = train(sentences[:250], 3, min_count=2)
    held = sentences[250:]
    logp = lm.sentence_logprobs(held)
    assert (logp < 0).all()
    ppl = 10 ** (-logp.sum() / (sum(map(len, held)) + len(held)))
    assert math.isclose(lm.perplexity(held), ppl) and 20 < ppl < 2000
    # a batch scores each sentence as it would be scored alone, empty sentences included
    for s in held[:5] + [[]]:
        assert math.isclose(lm.sentence_logprobs([s])[0], logp[held.index(s)] if s else lm.logprob("</s>", ["<s>"]))
    # per token: the sum of conditionals along the sentence
    s = held[0]
    p = padded(s)
    by_hand = sum(lm.logprob(p[i], p[max(0, i - 2):i]) for i in range(1, len(p)))
    assert math.isclose(by_hand, logp[0], rel_tol=1e-12)


# -- ARPA, and KenLM reading it ------------------------------------------------------------------------------------


def test_arpa_layout():
    lm = train(TINY, 3, discounts=[D1, D2, D3])
    f = io.StringIO()
    write_arpa(lm, f)
    text = f.getvalue()
    assert text.startswith("# ARPA back-off model written by nmtkit")
    body = text[text.index("\\data\\"):]
    assert body.split("\n")[1:4] == ["ngram 1=5", "ngram 2=6", "ngram 3=5"]
    lines = dict((line.split("\t")[1], line.split("\t")) for line in body.split("\n") if line.count("\t"))
    assert lines["<s>"][0] == "-99"
    assert float(lines["a"][0]) == pytest.approx(math.log10(tiny_unigrams()[0]), abs=1e-6)
    assert float(lines["<s> a b"][0]) == pytest.approx(math.log10(0.6265), abs=1e-6)
    assert len(lines["a b"]) == 3 and len(lines["b a"]) == 3  # contexts of trigrams carry a backoff weight,
    assert len(lines["a </s>"]) == 2 and len(lines["<s> a b"]) == 2  # others (and the top order) none
    assert float(lines["a b"][2]) == pytest.approx(math.log10(2 * D3[0] / 2), abs=1e-6)
    assert body.rstrip("\n").endswith("\\end\\")


@pytest.mark.parametrize("order,lang", [(3, "en"), (4, "en"), (4, "fr"), (5, "fr")])
def test_kenlm_reads_the_arpa_file_and_agrees(data_dir, tmp_path, order, lang, kenlm):
    sentences = real_sentences(data_dir, "newstest2009", n=1500, lang=lang)
    lm = train(sentences[:1200], order, min_count=2)
    held = [s for s in sentences[1200:] if s]
    path = tmp_path / "lm.arpa"
    with open(path, "w", encoding="utf-8") as f:
        write_arpa(lm, f)
    model = kenlm.Model(str(path))
    assert model.order == order
    ours = lm.sentence_logprobs(held + sentences[:50])  # unseen sentences, and training sentences
    theirs = np.array([model.score(" ".join(s), bos=True, eos=True) for s in held + sentences[:50]])
    assert sum(w not in lm.vocab.index for s in held for w in s) > 100  # plenty of <unk>
    assert np.abs(ours - theirs).max() < 1e-4
    assert np.abs(ours - theirs).mean() < 2e-5
    # literal <s>, </s> and <unk> inside sentences: <s> costs -99 (its ARPA value) in both, and works as a context
    odd = [s[:3] + ["<s>"] + s[3:] for s in held[:10]] + [s[:2] + ["</s>", "<unk>"] + s[2:] for s in held[:10]]
    ours = lm.sentence_logprobs(odd)
    theirs = np.array([model.score(" ".join(s), bos=True, eos=True) for s in odd])
    assert (ours[:10] < -99).all() and np.abs(ours - theirs).max() < 2e-4  # float32 in KenLM: ~1e-7 relative
