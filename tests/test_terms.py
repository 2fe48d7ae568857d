"""A glossary the translation obeys (``nmt-translate --terms``, nmtkit/translate/glossary.py, terms.py, banks.py):
the file's format and its errors, finding a line's terms, what counts as a term written; the batched search equals
the slow reference search with terms (and with numbers and terms together) at beams 1, 3 and 6, and a sentence
without terms reads as without the option; on the command line, a model that never writes a glossary's target word
writes it when told to, and says in ``--scores`` and the n-best list which terms it met."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.data.vocab import EOS
from nmtkit.errors import InputError
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.glossary import CompiledGlossary, parse, read
from nmtkit.translate.search import beam_search, beam_search_reference
from nmtkit.translate.sourcenumbers import DigitTable, SourceNumbers
from nmtkit.translate.terms import SourceTerms, WordBounds

from conftest import one_line_error, randomize_, run_tool, tiny

# the tiny model's 29 target tokens: SentencePiece-like, digits that continue a word, three words
VOCAB = ["<pad>", "<unk>", "<s>", "</s>", "▁", ",", *"0123456789", *[f"▁{d}" for d in "0123456789"], "▁a", "▁b",
         "▁c"]
ID = {t: i for i, t in enumerate(VOCAB)}


def ids(*tokens: str) -> tuple[int, ...]:
    return tuple(ID[t] for t in tokens)


# -- the file -------------------------------------------------------------------------------------------------------

def test_the_file_gives_terms_their_variants_and_skips_comments():
    entries = parse("# a comment\n\nHouse\tChambre\tassemblée\n  # another\r\nthe House of Commons\tla Chambre des "
                    "communes\r\nHouse\tmaison\nHouse\tChambre\n")
    assert [(e.source, e.targets, e.line) for e in entries] == [
        ("House", ("Chambre", "assemblée", "maison"), 3), ("the House of Commons", ("la Chambre des communes",), 5)]


@pytest.mark.parametrize("text, line, problem", [
    ("House\tChambre\nno tab here\n", 2, "no tab"),
    ("\tChambre\n", 1, "empty source term"),
    ("House\t\n", 1, "empty target term"),
    ("ok\tbien\nHouse\tCham\x00bre\n", 2, "control character (U+0000)"),
    ("House\tCham\ud800bre\n", 1, "lone surrogate"),
])
def test_a_malformed_line_is_one_error_naming_it(text, line, problem):
    with pytest.raises(InputError) as e:
        parse(text, "g.tsv")
    assert f"g.tsv:{line}" in str(e.value) and problem in str(e.value)


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_bytes(b"House\tChambre\nfee\tcaf\xe9\n")
    with pytest.raises(InputError, match=r"g\.tsv:2.*not UTF-8"):
        read(path)


def _compiled(text: str, ignore_case: bool = False, index=None) -> CompiledGlossary:
    index = index if index is not None else {w: i for i, w in enumerate("<pad> <unk> <s> </s> la Chambre comité "
                                                                        "des finances grand".split())}
    return CompiledGlossary(parse(text), str.split, str.split, index, 1, ignore_case)


def test_terms_are_found_longest_first_once_each_and_by_case_if_asked():
    g = _compiled("Committee on Finance\tcomité des finances\nthe Standing Committee on Finance\tla comité des "
                  "finances\nFinance\tfinances\nHouse\tChambre\nbig House\tgrand Chambre\n")
    words = "the Standing Committee on Finance met in the House , the big House and Finance".split()
    found = [g.terms[i].source for i in g.find(words)]
    # the longest wins where terms overlap; "House" alone where it stands alone, once; "Finance" at the end
    assert found == ["the Standing Committee on Finance", "House", "big House", "Finance"]
    assert g.find("the house".split()) == []
    folded = _compiled("House\tChambre\n", ignore_case=True)
    assert [folded.terms[i].source for i in folded.find(["the", "HOUSE"])] == ["House"]


def test_a_target_term_the_vocabulary_cannot_write_is_an_error_naming_its_line():
    with pytest.raises(InputError, match=r"<terms>:2.*'grand salon' cannot be written: salon"):
        _compiled("House\tChambre\nbig House\tgrand salon\n")


# -- what counts as written -----------------------------------------------------------------------------------------

def test_a_term_is_met_as_whole_words_only():
    terms = SourceTerms(WordBounds(VOCAB), [[(ids("▁1", "2"), ids("▁a"))]])
    met = lambda *toks: terms.missed(list(ids(*toks)), 0) == []  # noqa: E731
    assert met("▁b", "▁1", "2", "▁c") and met("▁1", "2") and met("▁a")
    assert not met("▁1", "2", "3")  # "123" is not "12"
    assert not met("▁1", "1", "2")  # nor is "112"
    assert not met("▁b", "▁c")
    # begun: the tokens of a variant written so far, below the shortest variant's length (the term's level)
    assert terms.state(list(ids("▁b", "▁1")), 0).begun == (0,)
    one = SourceTerms(WordBounds(VOCAB), [[(ids("▁1", "2", "3"),)]])
    s = one.state(list(ids("▁b", "▁1", "2")), 0)
    assert not s.met[0] and s.begun == (2,) and ID["3"] in s.ahead and ID["▁1"] in s.ahead
    assert one.level(s, 0, ID["3"]) == 3 and one.level(s, 0, ID["▁c"]) == 0


# -- the search ----------------------------------------------------------------------------------------------------

def _model():
    m = randomize_(tiny("rnnsearch")).eval()
    with torch.no_grad():
        m.b_y[EOS] += 5.0  # (hypotheses that end by themselves, before their length limit)
        m.b_y[ID["▁c"]] -= 6.0  # (a word the model hardly writes by itself)
    return m


TERMS = [[(ids("▁c", "▁a"),)], [], [(ids("▁c"), ids("▁b", "▁b")), (ids("▁7", "3"),)], [(ids("▁c"),)],
         [(ids("▁a", "▁c", "▁c"),)], [(ids("▁5"),), (ids("▁c", "▁b"),)]]


@pytest.mark.parametrize("beam, second", [(1, 0), (3, 0), (6, 0), (3, 6)])  # (second: --constrained-beam)
@pytest.mark.parametrize("with_numbers", [False, True])
def test_batched_equals_the_reference_and_the_terms_are_written(beam, second, with_numbers):
    m = _model()
    rng = random.Random(beam)
    sents = [[rng.randint(4, 22) for _ in range(rng.randint(2, 9))] for _ in TERMS]
    numbers = [["2014"], ["42"], [], ["10", "30"], [], ["5"]]
    src, lens = collate_source([np.asarray(s) for s in sents])
    decode = DecodeConfig(beam=beam, nbest=beam, max_len_a=2.0, max_len_b=8, source_numbers=with_numbers,
                          all_numbers=with_numbers, constrained_beam=second)
    bounds, table = WordBounds(VOCAB), DigitTable(VOCAB)
    nf = SourceNumbers(table, numbers) if with_numbers else None
    got = beam_search(m, src, lens, decode, numbers_from=nf, terms=SourceTerms(bounds, TERMS))
    plain = beam_search(m, src, lens, decode, numbers_from=nf)
    written = 0
    for k, s in enumerate(sents):
        terms = SourceTerms(bounds, [TERMS[k]])
        ref = beam_search_reference(m, s, decode, numbers_from=SourceNumbers(table, [numbers[k]]) if nf else None,
                                    terms=terms)
        assert [h.tokens for h in got[k]] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in got[k]], [h.score for h in ref], atol=1e-4)
        assert [h.missed for h in got[k]] == [terms.missed(h.tokens, 0) for h in got[k]]
        if not TERMS[k]:  # a sentence without terms reads as without the option
            assert [h.tokens for h in got[k]] == [h.tokens for h in plain[k]]
        plain_missed = terms.missed(plain[k][0].tokens, 0)
        written += bool(plain_missed) and not got[k][0].missed
        if not plain_missed and not (nf and nf.missing(plain[k][0].tokens, k)):
            assert got[k][0].tokens == plain[k][0].tokens  # met by itself: never searched again
    assert written or beam == 1  # the second search wrote terms the first left out (beam 1: no place to share)


# -- on the command line ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(trained):
    root, ckpt = trained
    vocab = checkpoint.load(ckpt)["vocab"]["tgt"]
    return ckpt, vocab


def test_a_word_the_model_never_writes_is_written_when_the_glossary_says_so(model, tmp_path):
    ckpt, vocab = model
    lines = ["A dog runs on the grass .", "Two men are talking .", "A woman sits ."]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plain = run_tool("nmt-translate", "-m", ckpt, "--tokenized", "-i", str(src), "--threads", "1")
    assert plain.returncode == 0, plain.stderr
    outputs = plain.stdout.split("\n")[:3]
    never = next(w for w in vocab[4:] if w.isalpha() and not any(w in o.split() for o in outputs))
    gloss = tmp_path / "g.tsv"
    gloss.write_text(f"# test\ndog\t{never}\n", encoding="utf-8")
    res = run_tool("nmt-translate", "-m", ckpt, "--tokenized", "-i", str(src), "--threads", "1", "--terms",
                   str(gloss), "--scores", str(tmp_path / "scores"), "--nbest", "2", "--nbest-file",
                   str(tmp_path / "nbest"))
    assert res.returncode == 0, res.stderr
    got = res.stdout.split("\n")[:3]
    assert never in got[0].split()
    assert got[1:] == outputs[1:]  # lines without the term: as without the option
    scores = (tmp_path / "scores").read_text(encoding="utf-8").splitlines()
    assert [s.split("\t")[1:] for s in scores] == [["1/1"], ["0/0"], ["0/0"]]
    nbest = (tmp_path / "nbest").read_text(encoding="utf-8").splitlines()
    assert all(" terms-missed= " in e for e in nbest) and nbest[0].split(" ||| ")[1] == got[0]


@pytest.mark.parametrize("text, fragment", [
    ("dog\n", "g.tsv:1: is not 'source term<TAB>target term' (no tab)"),
    ("dog\tzzzunknownword\n", "g.tsv:1: its target term 'zzzunknownword' cannot be written"),
])
def test_a_bad_glossary_is_one_line_and_nothing_written(model, tmp_path, text, fragment):
    ckpt, _ = model
    gloss = tmp_path / "g.tsv"
    gloss.write_text(text, encoding="utf-8")
    out = tmp_path / "out.fr"
    res = run_tool("nmt-translate", "-m", ckpt, "--terms", str(gloss), "-o", str(out), stdin="A dog .\n")
    assert fragment in one_line_error(res, "nmt-translate")
    assert not out.exists()


@pytest.mark.parametrize("options", [("--sampling", "topk:5"), ("--beam", "1")])
def test_terms_need_a_beam_to_share(model, tmp_path, options):
    ckpt, _ = model
    gloss = tmp_path / "g.tsv"
    gloss.write_text("dog\tchien\n", encoding="utf-8")
    res = run_tool("nmt-translate", "-m", ckpt, "--terms", str(gloss), *options, stdin="A dog .\n")
    assert "--terms needs beam search with --beam 2 or more" in one_line_error(res, "nmt-translate")


def test_nmt_score_gives_the_share_of_the_glossarys_terms_each_translation_writes(tmp_path):
    import json

    files = {"src.en": ["The House met .", "The Standing Committee on Finance and the House .", "It rains ."],
             "ref.fr": ["La Chambre s' est réunie .", "Le Comité permanent des finances et la Chambre .",
                        "Il pleut ."],
             "hyp.fr": ["La Chambre s' est réunie .", "La commission des finances et la chambre .", "Il pleut ."],
             "g.tsv": ["House\tChambre\tassemblée", "Standing Committee on Finance\tComité permanent des finances"]}
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["-r", tmp_path / "ref.fr", "-s", tmp_path / "src.en", "--terms", tmp_path / "g.tsv", "--metrics", "BLEU",
            tmp_path / "hyp.fr"]
    res = run_tool("nmt-score", *args)
    assert res.returncode == 0, res.stderr
    assert "terms 33.3% used (1 of 3; reference 100.0%)" in res.stdout  # "chambre": not the glossary's case
    res = run_tool("nmt-score", *args, "--json")
    terms = json.loads(res.stdout)["systems"][0]["diagnostics"]["terms"]
    assert terms["lines"] == [{"line": 2, "missed": ["Standing Committee on Finance", "House"]}]
    res = run_tool("nmt-score", "-r", tmp_path / "ref.fr", "--terms", tmp_path / "g.tsv", tmp_path / "hyp.fr")
    one_line_error(res, "nmt-score", "--terms needs the source (-s SRC)")


def test_nmt_serve_obeys_a_requests_terms_and_the_servers_and_says_which_it_used(model, tmp_path):
    from test_serve import Server

    ckpt, vocab = model
    lines = ["A dog runs on the grass .", "Two men are talking ."]
    plain = run_tool("nmt-translate", "-m", ckpt, "--tokenized", "--threads", "1", stdin="\n".join(lines) + "\n")
    assert plain.returncode == 0, plain.stderr
    outputs = plain.stdout.split("\n")[:2]
    never = [w for w in vocab[4:] if w.isalpha() and not any(w in o.split() for o in outputs)][:2]
    gloss = tmp_path / "g.tsv"
    gloss.write_text(f"men\t{never[1]}\n", encoding="utf-8")
    server = Server(ckpt, "--terms", str(gloss), "--tokenized")
    try:
        server.ready()
        got = server.translate(lines, terms=[["dog", never[0]]])  # the request's term, and the server's
        assert never[0] in got[0]["tgt"].split() and never[1] in got[1]["tgt"].split()
        assert [g["terms"] for g in got] == [{"used": ["dog"], "missed": []}, {"used": ["men"], "missed": []}]
        got = server.translate(lines)  # the server's only
        assert got[0]["tgt"] == outputs[0] and got[0]["terms"] == {"used": [], "missed": []}
        for terms, problem in (([["dog"]], "must be a list of [source term, target term, ...]"),
                               ([["dog", ""]], "'' is empty"),
                               ([["dog", "zzzunknownword"]], "'zzzunknownword' cannot be written")):
            status, body, _ = server.call("/translate", {"src": lines, "terms": terms})
            assert status == 400 and problem in body["error"] and "\n" not in body["error"], body
        status, body, _ = server.call("/translate", {"src": lines, "terms": [["dog", "chien"]], "beam": 1})
        assert status == 400 and "--terms needs beam search with --beam 2 or more" in body["error"]
    finally:
        assert server.stop() == 0


def test_a_prefix_and_an_ensemble_obey_the_glossary(model, tmp_path):
    """With a prefix and two checkpoints decoded as an ensemble, the terms are written, after the prefix.  (A
    SentencePiece vocabulary's terms, and numbers and terms together, are the reference tests' above: the tests'
    SentencePiece model is too young to end a sentence by itself.)"""
    ckpt, vocab = model
    lines = ["A dog runs on the grass .", "Two men are talking ."]
    src, prefix, gloss = tmp_path / "in.en", tmp_path / "prefix.fr", tmp_path / "g.tsv"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix.write_text("Un\n\n", encoding="utf-8")
    plain = run_tool("nmt-translate", "-m", ckpt, "-m", ckpt, "--tokenized", "-i", src, "--prefix", prefix,
                     "--threads", "1")
    assert plain.returncode == 0, plain.stderr
    never = [w for w in vocab[4:] if w.isalpha() and w not in plain.stdout.split()][:2]
    gloss.write_text(f"dog\t{never[0]}\nmen\t{never[1]}\n", encoding="utf-8")
    res = run_tool("nmt-translate", "-m", ckpt, "-m", ckpt, "--tokenized", "-i", src, "--prefix", prefix, "--terms",
                   gloss, "--scores", tmp_path / "scores", "--threads", "1")
    assert res.returncode == 0, res.stderr
    out = [line.split() for line in res.stdout.split("\n")[:2]]
    assert out[0][0] == "Un" and never[0] in out[0][1:] and never[1] in out[1], out
    assert [s.split("\t")[1] for s in (tmp_path / "scores").read_text(encoding="utf-8").splitlines()] == ["1/1", "1/1"]
