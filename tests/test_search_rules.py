"""Decoding rules as plug-ins (nmtkit/translate/rules.py): ``--min-length-ratio``, the rule added through the seam,
batched against the reference search both ways (on and off), in greedy decoding and sampling, and on the command
line; and a rule written here, outside the library, plugged into every search by its place in ``searchstep.RULES``."""

from __future__ import annotations

import math
import os
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
from nmtkit.translate import rules, searchstep
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import collate_prefixes
from nmtkit.translate.sampling import sample
from nmtkit.translate.search import beam_search, beam_search_reference, greedy

from conftest import REPO, lines_of

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]


@pytest.fixture(scope="module")
def model(trained):
    payload = checkpoint.load(trained[1])
    return build_from_checkpoint(payload).eval(), payload


@pytest.fixture(scope="module")
def sents(model, data_dir):
    _, payload = model
    pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
    vocab = Vocabulary(payload["vocab"]["src"])
    return [vocab.encode(pre.tokenize(line)) for line in lines_of(data_dir / "multi30k" / "val.en", 10)]


def _batch(sentences):
    return collate_source([np.asarray(s) for s in sentences])


def _same(batched, ref):
    assert [h.tokens for h in batched] == [h.tokens for h in ref]
    assert np.allclose([h.score for h in batched], [h.score for h in ref], atol=1e-4)


def test_min_length_ratio_holds_every_hypothesis_and_batched_equals_the_reference(model, sents):
    m, _ = model
    src, lens = _batch(sents)
    ratio = 1.6
    on, off = DecodeConfig(beam=5, nbest=3, min_length_ratio=ratio), DecodeConfig(beam=5, nbest=3)
    longer, plain = beam_search(m, src, lens, on), beam_search(m, src, lens, off)
    assert beam_search(m, src, lens, off.replace(min_length_ratio=0.0))[0][0].tokens == plain[0][0].tokens
    changed = 0
    for s, hyps, before in zip(sents, longer, plain):
        assert hyps and all(len(h.tokens) >= math.ceil(ratio * len(s)) for h in hyps)
        changed += [h.tokens for h in hyps] != [h.tokens for h in before]
        _same(hyps, beam_search_reference(m, list(s), on))  # the rule on ...
        _same(before, beam_search_reference(m, list(s), off))  # ... and off
    # the model's own translations of these captions are mostly shorter than 1.6 times the source: the rule acts
    assert changed > 0
    assert any(len(h[0].tokens) < math.ceil(ratio * len(s)) for s, h in zip(sents, plain))


def test_min_length_ratio_gives_way_to_the_length_limit_and_a_prefix_counts(model, sents):
    """A minimum past the length limit ends at the limit (never a row with nothing allowed); a forced prefix's
    tokens count towards the minimum, batched as in the reference."""
    m, _ = model
    src, lens = _batch(sents)
    tight = DecodeConfig(beam=4, nbest=2, max_len_a=0.5, max_len_b=1, min_length_ratio=3.0)
    for s, hyps in zip(sents, beam_search(m, src, lens, tight)):
        limit = int(0.5 * len(s) + 1)
        assert hyps and all(len(h.tokens) == limit for h in hyps) and all(math.isfinite(h.score) for h in hyps)
        _same(hyps, beam_search_reference(m, list(s), tight))
    plain = beam_search(m, src, lens, DecodeConfig(beam=4, nbest=4))
    prefixes = [h[-1].tokens[:2] for h in plain]
    prefix, prefix_lens = collate_prefixes([np.asarray(p, dtype=np.int64) for p in prefixes])
    on = DecodeConfig(beam=4, nbest=2, min_length_ratio=1.3)
    for s, p, hyps in zip(sents, prefixes, beam_search(m, src, lens, on, prefix=prefix, prefix_lens=prefix_lens)):
        assert all(h.tokens[: len(p)] == p and len(h.tokens) >= math.ceil(1.3 * len(s)) for h in hyps)
        _same(hyps, beam_search_reference(m, list(s), on, prefix=p))


def test_min_length_ratio_in_greedy_decoding_and_sampling(model, sents):
    m, _ = model
    src, lens = _batch(sents)
    on = DecodeConfig(beam=1, min_length_ratio=1.5)
    for s, h, b in zip(sents, greedy(m, src, lens, on), beam_search(m, src, lens, on)):
        assert len(h.tokens) >= math.ceil(1.5 * len(s)) and h.tokens == b[0].tokens  # greedy = beam 1
    drawn = sample(m, src, lens, list(range(len(sents))), DecodeConfig(sampling="topk:5", nbest=3,
                                                                       min_length_ratio=1.5))
    assert all(len(h.tokens) >= math.ceil(1.5 * len(s)) for s, hyps in zip(sents, drawn) for h in hyps)


def test_min_length_ratio_on_the_command_line(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = tmp_path / "in.en"
    inp.write_text("".join(line + "\n" for line in lines_of(data_dir / "multi30k" / "val.en", 12)), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*args):
        return subprocess.run(TRANSLATE + ["-m", ckpt, "-i", inp, "--beam", "4", *args], capture_output=True,
                              env=env, timeout=300)

    plain, longer = run(), run("--min-length-ratio", "1.6")
    assert plain.returncode == 0 and longer.returncode == 0, longer.stderr.decode()
    a, b = plain.stdout.decode().splitlines(), longer.stdout.decode().splitlines()
    assert len(a) == len(b) == 12 and a != b
    assert sum(len(x.split()) for x in b) > sum(len(x.split()) for x in a)  # what the user reads is longer
    bad = run("--min-length-ratio", "-1")
    assert bad.returncode == 1 and bad.stderr.decode().strip().splitlines()[-1].endswith(
        "--min-length-ratio must be a finite number of at least 0 (got -1.0)")


class _NoToken(rules.Rule):
    """A rule written outside the library: one token is never written (the test's own plug-in)."""

    token = None

    @classmethod
    def build(cls, decode, search):
        return cls() if cls.token is not None else None

    def mask(self, logp, step):
        logp[:, self.token] = -math.inf

    def banned(self, tokens, t, ending):
        return {self.token}


def test_a_new_rule_is_one_class_in_the_list_and_every_search_obeys_it(model, sents, monkeypatch):
    m, _ = model
    src, lens = _batch(sents)
    decode = DecodeConfig(beam=4, nbest=2)
    plain = beam_search(m, src, lens, decode)
    counts = torch.bincount(torch.tensor([t for h in plain for t in h[0].tokens if t != EOS]))
    _NoToken.token = int(counts.argmax())  # the token the model writes most
    monkeypatch.setattr(searchstep, "RULES", searchstep.RULES[:1] + (_NoToken,) + searchstep.RULES[1:])
    banned = beam_search(m, src, lens, decode)
    for s, hyps in zip(sents, banned):
        assert hyps and all(_NoToken.token not in h.tokens for h in hyps)
        _same(hyps, beam_search_reference(m, list(s), decode))
    assert all(_NoToken.token not in h.tokens for h in greedy(m, src, lens, decode))
