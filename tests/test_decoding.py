"""Decoding controls of nmt-translate on a small model trained on real Multi30K pairs: prefix-constrained decoding,
Wu et al.'s coverage penalty and sampling (top-k, nucleus, temperature), each against an independent oracle."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import collate_prefixes
from nmtkit.models import build_from_checkpoint
from nmtkit.translate.sampling import Sampling, parse_sampling, reshape, sample
from nmtkit.translate.search import beam_search, beam_search_reference
from nmtkit.data.text import Preprocessor, TextConfig
from nmtkit.data.vocab import BOS, EOS, PAD, UNK, Vocabulary

from conftest import REPO, lines_of

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model(trained):
    payload = checkpoint.load(trained[1])
    return build_from_checkpoint(payload).eval(), payload


def _sources(data_dir, payload, n=8):
    pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
    vocab = Vocabulary(payload["vocab"]["src"])
    return [vocab.encode(pre.tokenize(line)) for line in lines_of(data_dir / "multi30k" / "val.en", n)]


def _batch(sentences):
    return collate_source([np.asarray(s) for s in sentences])


def _prefix_batch(prefixes):
    return collate_prefixes([np.asarray(p, dtype=np.int64) for p in prefixes])


def translate(args, stdin: bytes = b"", check=True):
    proc = subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


# -- prefix-constrained decoding ---------------------------------------------------------------------------------------

def _prefixes(model, sents):
    """For each sentence a real target prefix that is not the model's own start: the first tokens of its 3rd-best
    hypothesis (the model would not have chosen them), of 1 to 3 tokens, and one <unk>."""
    m, _ = model
    src, lens = _batch(sents)
    hyps = beam_search(m, src, lens, DecodeConfig(beam=4, nbest=4))
    out = []
    for k, h in enumerate(hyps):
        toks = h[min(2, len(h) - 1)].tokens
        out.append(toks[: 1 + k % 3] or [UNK])
    out[-1] = [UNK] + out[-1][:1]
    return out


def test_prefix_starts_every_hypothesis_and_batched_equals_the_reference(model, data_dir):
    m, payload = model
    sents = _sources(data_dir, payload)
    prefixes = _prefixes(model, sents)
    src, lens = _batch(sents)
    prefix, prefix_lens = _prefix_batch(prefixes)
    batched = beam_search(m, src, lens, DecodeConfig(beam=5, nbest=3, no_unk=True), prefix=prefix,
                          prefix_lens=prefix_lens)
    for s, p, hyps in zip(sents, prefixes, batched):
        assert hyps and all(h.tokens[: len(p)] == p for h in hyps)  # also the forced <unk>, despite no_unk
        ref = beam_search_reference(m, list(s), DecodeConfig(beam=5, nbest=3, no_unk=True), prefix=p)
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)


@torch.no_grad()
def test_with_a_prefix_the_rest_is_the_search_from_the_state_the_prefix_leads_to(model, data_dir):
    """Beam 1 with a prefix = feed the prefix through decode_step by hand, then greedy from there; its score is
    the model's teacher-forced log-probability of the whole output, prefix included."""
    m, payload = model
    sents = _sources(data_dir, payload, 6)
    prefixes = _prefixes(model, sents)
    src, lens = _batch(sents)
    prefix, prefix_lens = _prefix_batch(prefixes)
    hyps = beam_search(m, src, lens, DecodeConfig(beam=1, lenpen=0.0), prefix=prefix, prefix_lens=prefix_lens)
    for k, (s, p) in enumerate(zip(sents, prefixes)):
        s_src, s_lens = _batch([s])
        enc = m.prepare_decoding(m.encode(s_src, s_lens))
        state, y, toks, total = m.init_decoder(enc), BOS, [], 0.0
        for t in range(60):
            logits, state, _ = m.decode_step(torch.tensor([y]), state, enc)
            logp = torch.log_softmax(logits.float(), dim=-1)[0]
            if t < len(p):
                y = p[t]
            else:
                logp[PAD] = logp[BOS] = -math.inf
                y = int(logp.argmax())
            total += float(logp[y])
            if y == EOS:
                break
            toks.append(y)
        assert hyps[k][0].tokens == toks
        assert math.isclose(hyps[k][0].score, total, abs_tol=1e-3)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_prefix_file_on_the_command_line(trained, data_dir, tmp_path):
    _, ckpt = trained
    src = lines_of(data_dir / "multi30k" / "test_2016_flickr.en", 6)
    src[3] = ""
    prefixes = ["Un homme", "", "Deux Zyxwvut", "Le chat", "Une femme est", ""]
    inp = _write(tmp_path / "in.en", src)
    pre = _write(tmp_path / "prefix.fr", prefixes)
    nbest, attention = tmp_path / "nbest.txt", tmp_path / "attention.json"
    out = translate(["-m", ckpt, "-i", inp, "--prefix", pre, "--beam", "4", "--nbest", "2", "--nbest-file", nbest,
                     "--attention", attention]).stdout.decode().split("\n")
    plain = translate(["-m", ckpt, "-i", inp, "--beam", "4"]).stdout.decode().split("\n")
    assert len(out) == len(src) + 1 and out[-1] == ""
    for k, p in enumerate(prefixes):
        if p:
            assert out[k].startswith(p + " ") or out[k] == p, (p, out[k])  # an unknown word comes out as given
        elif src[k]:
            assert out[k] == plain[k]  # no prefix: as without --prefix
    assert out[3] == "Le chat"  # an empty source line with a prefix: the prefix itself
    # ... and its n-best entry and attention are shaped like any decoded line's: its tokens and </s>
    entries = [line.split(" ||| ") for line in nbest.read_text(encoding="utf-8").splitlines()]
    empty = [e for e in entries if e[0] == "3"]
    assert [e[1] for e in empty] == ["Le chat"] and "length= 3" in empty[0][2]  # Le, chat, </s>
    rows = [json.loads(x) for x in attention.read_text(encoding="utf-8").splitlines()]
    att = next(r for r in rows if r["line"] == 4)
    assert att["source"] == ["</s>"] and att["target"][-1] == "</s>" and len(att["alpha"]) == len(att["target"]) == 3
    # the same with the prefix alone on stdin's lines and worker processes
    out2 = translate(["-m", ckpt, "--prefix", pre, "--beam", "4", "--workers", "2", "--threads", "2",
                      "--batch-size", "2", "--window", "3"], "".join(x + "\n" for x in src).encode())
    assert out2.stdout.decode().split("\n") == out
    # --replace-unk replaces the search's <unk>s, never the prefix's own words
    out3 = translate(["-m", ckpt, "-i", inp, "--prefix", pre, "--beam", "4", "--replace-unk"]).stdout.decode()
    assert out3.split("\n")[2].startswith("Deux Zyxwvut ")
    # a "</s>" or "<s>" written in a (tokenised) prefix is a word like any other, not the end of the sentence
    special = _write(tmp_path / "special.fr", ["</s> <s> un", "", "", "", "", ""])
    out4 = translate(["-m", ckpt, "-i", inp, "--prefix", special, "--beam", "4", "--tokenized"]).stdout.decode()
    first = out4.split("\n")[0].split()
    assert first[:3] == ["</s>", "<s>", "un"] and len(first) > 3


@pytest.mark.parametrize("lines, message", [(3, r"prefix\.fr:4: has fewer lines than the input"),
                                            (6, r"prefix\.fr:5: has more lines than the input \(4\)")])
def test_a_prefix_file_of_another_length_is_a_one_line_error(trained, data_dir, tmp_path, lines, message):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", lines_of(data_dir / "multi30k" / "val.en", 4))
    pre = _write(tmp_path / "prefix.fr", ["Un"] * lines)
    proc = translate(["-m", ckpt, "-i", inp, "-o", str(tmp_path / "out.fr"), "--prefix", pre], check=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out.fr").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "prefix.fr"]


# -- coverage penalty --------------------------------------------------------------------------------------------------

def test_coverage_penalty_ranks_by_the_penalised_score_and_batched_equals_the_reference(model, data_dir):
    m, payload = model
    sents = _sources(data_dir, payload, 10)
    src, lens = _batch(sents)
    beta = 0.5
    batched = beam_search(m, src, lens, DecodeConfig(beam=5, nbest=5, coverage_penalty=beta), need_attention=True)
    changed = 0
    plain = beam_search(m, src, lens, DecodeConfig(beam=5, nbest=5))
    for s, hyps, unpenalised in zip(sents, batched, plain):
        for h in hyps:  # the ranking score, recomputed from the hypothesis' own attention (rows: its tokens + </s>)
            cov = h.attention[:, : len(s)].sum(0).clamp(min=1e-12, max=1.0)
            expected = h.score / (len(h.tokens) + 1) + beta * float(cov.log().sum())
            assert math.isclose(h.norm_score, expected, abs_tol=1e-4)
        assert [h.norm_score for h in hyps] == sorted((h.norm_score for h in hyps), reverse=True)
        assert {tuple(h.tokens) for h in hyps} == {tuple(h.tokens) for h in unpenalised}  # the same beam...
        changed += [h.tokens for h in hyps] != [h.tokens for h in unpenalised]  # ...ranked another way
        ref = beam_search_reference(m, list(s), DecodeConfig(beam=5, nbest=5, coverage_penalty=beta))
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.norm_score for h in hyps], [h.norm_score for h in ref], atol=1e-4)
    assert changed > 0


def test_coverage_penalty_option(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", lines_of(data_dir / "multi30k" / "val.en", 12))
    plain = translate(["-m", ckpt, "-i", inp, "--beam", "5"]).stdout
    assert translate(["-m", ckpt, "-i", inp, "--beam", "5", "--coverage-penalty", "0"]).stdout == plain
    assert translate(["-m", ckpt, "-i", inp, "--beam", "5", "--coverage-penalty", "0.4"]).stdout.count(b"\n") == 12
    for bad, message in ((["--coverage-penalty", "-1"], "--coverage-penalty must be a finite number of at least 0"),
                         (["--coverage-penalty", "0.2", "--sampling", "topk:5"], "no meaning with --sampling")):
        proc = translate(["-m", ckpt, "-i", inp, *bad], check=False)
        assert proc.returncode == 1 and message in proc.stderr.decode()


# -- sampling ----------------------------------------------------------------------------------------------------------

def test_parse_sampling():
    assert parse_sampling("topk:10") == Sampling(topk=10)
    assert parse_sampling("topp:0.9") == Sampling(topp=0.9)
    assert parse_sampling("temperature:0.7, topk:5") == Sampling(temperature=0.7, topk=5)
    for bad in ("topk", "topk:0", "topk:x", "topp:0", "topp:1.5", "temperature:0", "beam:3", "topk:3,topk:4",
                "temperature:nan"):
        with pytest.raises(ValueError):
            parse_sampling(bad)


@torch.no_grad()
def _first_step(m, s):
    """The model's log-probabilities of the first target token for source s, as the search masks them."""
    src, lens = _batch([s])
    enc = m.prepare_decoding(m.encode(src, lens))
    logits, _, _ = m.decode_step(torch.tensor([BOS]), m.init_decoder(enc), enc)
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[0, PAD] = logp[0, BOS] = -math.inf
    return logp


@pytest.mark.parametrize("spec", ["temperature:1", "temperature:0.5", "topk:5", "topp:0.9", "temperature:2,topp:0.5", "topk:20,temperature:2"])
def test_samples_follow_the_reshaped_distribution(model, data_dir, spec):
    """4,000 one-token samples of one sentence against the distribution computed by hand: the support is exactly
    what top-k / nucleus keep, and every frequency lies within 4.5 binomial standard deviations of its
    probability (tokens expected fewer than 5 times pooled into one bin)."""
    m, payload = model
    s = _sources(data_dir, payload, 1)[0]
    how = parse_sampling(spec)
    logp = _first_step(m, s)[0]
    z = logp.double() / how.temperature
    order = z.argsort(descending=True)
    keep = torch.ones_like(z, dtype=torch.bool)
    if how.topk:
        keep[order[how.topk:]] = False
    p = torch.softmax(z.masked_fill(~keep, -math.inf), dim=0)
    if how.topp < 1:  # the smallest set of most probable tokens whose mass reaches topp
        mass, nucleus = 0.0, []
        for v in order.tolist():
            nucleus.append(v)
            mass += float(p[v])
            if mass >= how.topp:
                break
        keep = torch.zeros_like(keep)
        keep[nucleus] = True
        p = torch.softmax(z.masked_fill(~keep, -math.inf), dim=0)
    assert torch.allclose(reshape(logp[None], how)[0], p, atol=1e-9)
    n = 4000
    src, lens = _batch([s])
    hyps = sample(m, src, lens, [(7,)], DecodeConfig(nbest=n, sampling=spec, max_len_a=0.0, max_len_b=1))[0]
    first = torch.tensor([h.tokens[0] if h.tokens else EOS for h in hyps])
    counts = torch.bincount(first, minlength=p.numel()).double()
    assert counts.sum() == n and counts[~keep].sum() == 0 and counts[PAD] == counts[BOS] == 0
    big = n * p >= 5  # tokens expected at least 5 times: each on its own; the rare ones pooled into one bin
    bins_p = torch.cat([p[big], p[~big].sum()[None]])
    bins_c = torch.cat([counts[big], counts[~big].sum()[None]])
    sd = (n * bins_p * (1 - bins_p)).sqrt()
    assert bool(((bins_c - n * bins_p).abs() <= 4.5 * sd + 1).all()), (bins_c, n * bins_p)
    assert int((counts > 0).sum()) > 1  # it does sample: more than the argmax


@torch.no_grad()
def test_sample_scores_are_teacher_forced_log_probabilities_and_prefixes_are_kept(model, data_dir):
    m, payload = model
    sents = _sources(data_dir, payload, 4)
    src, lens = _batch(sents)
    prefix, prefix_lens = _prefix_batch([[5], [], [7, 8], []])
    hyps = sample(m, src, lens, [(1, k) for k in range(4)], DecodeConfig(nbest=3, sampling="topk:30"),
                  prefix=prefix, prefix_lens=prefix_lens)
    for k, s in enumerate(sents):
        for h in hyps[k]:
            assert h.tokens[: int(prefix_lens[k])] == prefix[k, : int(prefix_lens[k])].tolist()
            y = torch.tensor([[BOS] + h.tokens])
            logp = torch.log_softmax(m(src[k: k + 1, : lens[k]], lens[k: k + 1], y).float(), dim=-1)[0]
            forced = float(logp.gather(1, torch.tensor(h.tokens + [EOS])[:, None]).sum())
            assert math.isclose(h.score, forced, abs_tol=1e-3)
        assert [h.norm_score for h in hyps[k]] == sorted((h.norm_score for h in hyps[k]), reverse=True)


def test_sampling_is_reproducible_from_the_seed_whatever_the_batching(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", lines_of(data_dir / "multi30k" / "val.en", 20))
    base = ["-m", ckpt, "-i", inp, "--sampling", "topk:20", "--nbest", "2", "--nbest-file", "-"]
    first = translate(base + ["--seed", "3"]).stdout
    assert first.count(b"\n") == 40
    again = translate(base + ["--seed", "3", "--batch-size", "3", "--window", "7", "--workers", "2", "--threads", "2"])
    # the same samples; their log-probabilities to float tolerance (a batch of other sentences sums differently)
    assert _texts(again.stdout) == _texts(first)
    assert np.allclose(_logprobs(again.stdout), _logprobs(first), atol=1e-4)
    other = translate(base + ["--seed", "4"]).stdout
    assert _texts(other) != _texts(first) and other.count(b"\n") == 40
    # a line's samples do not depend on the other lines
    changed = lines_of(inp)
    changed[3], changed[15] = "Two cats sleep on a red sofa .", "A man ."
    inp2 = _write(tmp_path / "in2.en", changed)
    second = translate(["-m", ckpt, "-i", inp2, *base[4:], "--seed", "3"]).stdout
    assert [t for t in _texts(second) if t[0] == "9"] == [t for t in _texts(first) if t[0] == "9"]


def _texts(nbest: bytes) -> list[tuple[str, str]]:
    return [tuple(line.split(" ||| ")[:2]) for line in nbest.decode().splitlines()]


def _logprobs(nbest: bytes) -> list[float]:
    return [float(line.split(" ||| ")[2].split()[1]) for line in nbest.decode().splitlines()]


def test_bad_sampling_is_a_one_line_error(trained, data_dir, tmp_path):
    _, ckpt = trained
    inp = _write(tmp_path / "in.en", ["A dog ."])
    proc = translate(["-m", ckpt, "-i", inp, "--sampling", "topq:3"], check=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1 and "--sampling" in err and "topk:K" in err


# -- start-up: worker processes only for an input worth them -----------------------------------------------------------

def test_automatic_workers_start_only_once_the_input_fills_a_window(trained, data_dir):
    from nmtkit.translate.translator import Translator

    _, ckpt = trained
    lines = list(enumerate(lines_of(data_dir / "multi30k" / "val.en", 20), start=1))
    with Translator([ckpt], DecodeConfig(beam=3), batch_size=4, window=8, workers=0, threads=2) as tr:
        assert tr.workers == 2
        few = [t.text for t in tr.translate(lines[:7])]  # less than a window: decoded here, no process started
        assert tr.worker_pids == [] and len(few) == 7
        many = [t.text for t in tr.translate(lines)]  # a full first window: the two workers start
        assert len(tr.worker_pids) == 2 and many[:7] == few
    with Translator([ckpt], DecodeConfig(beam=3), batch_size=4, window=8, workers=1, threads=1) as tr:
        assert [t.text for t in tr.translate(lines)] == many and tr.worker_pids == []
