"""nmt-translate and the search behind it, with a small model trained here on real Multi30K pairs."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from nmtkit.data import checkpoint
from nmtkit.data.batching import collate_source
from nmtkit.models import build_from_checkpoint, build_model
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.decoding import SourceBatch
from nmtkit.translate.search import beam_search, beam_search_reference, greedy
from nmtkit.data.text import TextConfig
from nmtkit.data.vocab import BOS, EOS, UNK

from conftest import REPO, pharaoh_links
from conftest import lines_of as _lines

TRANSLATE = [sys.executable, str(REPO / "bin" / "nmt-translate")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}




def run_translate(args, stdin: bytes, check=True):
    proc = subprocess.run(TRANSLATE + args, input=stdin, capture_output=True, env=ENV, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


@pytest.fixture(scope="module")
def model(trained):
    payload = checkpoint.load(trained[1])
    return build_from_checkpoint(payload).eval(), payload


def _batch(sentences):
    return collate_source([np.asarray(s) for s in sentences])


def test_lines_are_kept_one_for_one_and_in_order(trained, data_dir):
    _, ckpt = trained
    ordinary = _lines(data_dir / "multi30k" / "test_2016_flickr.en", 6)
    long_line = " ".join(_lines(data_dir / "wmt14" / "newstest2014.en", 40))  # ~1,000 tokens: beyond the limit
    lines = [ordinary[0].encode(), b"", ordinary[1].encode(), long_line.encode(), b"!!! ... ?",
             b"A dog \xff\xfe runs .", ordinary[2].encode(), b"", ordinary[3].encode()]
    proc = run_translate(["-m", ckpt, "--max-source-len", "100", "--beam", "3"], b"\n".join(lines) + b"\n")
    out = proc.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    out = out[:-1]
    assert out[1] == "" and out[7] == ""
    assert out[3] and out[4] and out[5]
    err = proc.stderr.decode()
    assert "<stdin>:6: invalid UTF-8" in err
    assert "line 4:" in err and "pieces" in err
    # each ordinary line translates as it does alone, so nothing was shifted or swapped
    for k, text in ((0, ordinary[0]), (2, ordinary[1]), (6, ordinary[2]), (8, ordinary[3])):
        alone = run_translate(["-m", ckpt, "--beam", "3"], (text + "\n").encode()).stdout.decode()
        assert alone == out[k] + "\n"


def test_a_byte_order_mark_on_the_first_line_changes_nothing(trained, data_dir):
    _, ckpt = trained
    text = ("\n".join(_lines(data_dir / "multi30k" / "test_2016_flickr.en", 3)) + "\n").encode()
    plain = run_translate(["-m", ckpt], text).stdout
    assert run_translate(["-m", ckpt], b"\xef\xbb\xbf" + text).stdout == plain


def test_batch_and_window_sizes_do_not_change_the_output(trained, data_dir):
    _, ckpt = trained
    text = ("\n".join(_lines(data_dir / "multi30k" / "test_2016_flickr.en", 40)) + "\n").encode()
    outs = [run_translate(["-m", ckpt, "--beam", "4", *opts], text).stdout
            for opts in ([], ["--batch-size", "1", "--window", "1"], ["--batch-size", "7", "--window", "13"])]
    assert outs[0] == outs[1] == outs[2]
    assert len(outs[0].decode().split("\n")) == 41


def _real_batch(data_dir, model_payload, n=12):
    from nmtkit.data.text import Preprocessor
    from nmtkit.data.vocab import Vocabulary

    _, payload = model_payload
    pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
    vocab = Vocabulary(payload["vocab"]["src"])
    lines = _lines(data_dir / "multi30k" / "val.en", n)
    return [vocab.encode(pre.tokenize(line)) for line in lines]


def test_beam_1_equals_greedy(model, data_dir):
    m, _ = model
    sents = _real_batch(data_dir, model)
    src, lens = _batch(sents)
    g = greedy(m, src, lens)
    b = beam_search(m, src, lens, DecodeConfig(beam=1, lenpen=0.0))
    assert [h.tokens for h in g] == [h[0].tokens for h in b]
    assert np.allclose([h.score for h in g], [h[0].score for h in b], atol=1e-4)


@pytest.mark.parametrize("block", [None, 7])  # the search's top-k: plain topk (V = 800 is narrow), and blocked
def test_batched_beam_equals_the_reference_search(model, data_dir, block, speed_policy):
    if block is not None:
        speed_policy(topk_block=block)
    m, _ = model
    sents = _real_batch(data_dir, model)
    src, lens = _batch(sents)
    batched = beam_search(m, src, lens, DecodeConfig(beam=5, nbest=3, lenpen=1.0))
    for s, hyps in zip(sents, batched):
        ref = beam_search_reference(m, list(s), DecodeConfig(beam=5, nbest=3, lenpen=1.0))
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)


@torch.no_grad()
def test_scores_are_the_models_teacher_forced_log_probabilities(model, data_dir):
    m, _ = model
    sents = _real_batch(data_dir, model, 8)
    src, lens = _batch(sents)
    hyps = beam_search(m, src, lens, DecodeConfig(beam=4, lenpen=1.0))
    for k, s in enumerate(sents):
        h = hyps[k][0]
        y = torch.tensor([[BOS] + h.tokens])
        logp = torch.log_softmax(m(src[k: k + 1, : lens[k]], lens[k: k + 1], y).float(), dim=-1)[0]
        gold = torch.tensor(h.tokens + [EOS])
        forced = float(logp.gather(1, gold[:, None]).sum())
        assert math.isclose(h.score, forced, abs_tol=1e-3)
        assert math.isclose(h.norm_score, forced / (len(h.tokens) + 1), abs_tol=1e-3)


@pytest.mark.parametrize("shape", [(5, 96000), (3, 94764), (4, 1000), (2, 7 * 64 * 8 * 24 + 1)])
def test_blocked_top_k_equals_topk(shape):
    """search.top_k (block maxima, best blocks, top-k among their values) = torch.topk: values and indices, for
    widths that the block (the policy's topk_block) divides and that it does not, with -inf entries (masked words,
    dead hypotheses) and values repeated within a block (neither promises an order among equal values: there the
    same set of indices)."""
    from nmtkit.translate.search import top_k

    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g) * 3
    x[:, ::97] = -math.inf
    x[0, 128:140] = x[0].max() + 1.0  # equal values at the top, inside one block
    x[-1, -3:] = x[-1].max() + 2.0  # the best values in the short last block
    for k in (1, 24):
        values, indices = top_k(x, k)
        expected = x.topk(k, dim=1)
        assert torch.equal(values, expected.values)
        assert torch.equal(x.gather(1, indices), values)
        assert torch.equal(indices.sort(dim=1).values, expected.indices.sort(dim=1).values)
        untied = torch.cat([values[:, 1:] != values[:, :-1], torch.ones_like(values[:, :1], dtype=torch.bool)], 1)
        untied &= torch.cat([torch.ones_like(values[:, :1], dtype=torch.bool), values[:, 1:] != values[:, :-1]], 1)
        assert torch.equal(indices[untied], expected.indices[untied])


@torch.no_grad()
def test_wide_beam_equals_exhaustive_enumeration():
    """Vocabulary of 2 words + specials, 3 output tokens at most: 1 + 3 + 9 + 27 = 40 hypotheses in all."""
    torch.manual_seed(3)
    m = build_model("rnnsearch-tiny", 12, 6).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # a peaked, non-uniform model
    src, lens = _batch([[4, 5, 6]])
    # source of 3 words: limit = a * 3 + b = 3 tokens with a = 0, b = 3
    for lenpen in (0.0, 1.0):
        best = beam_search(m, src, lens, DecodeConfig(beam=40, nbest=40, max_len_a=0.0, max_len_b=3, lenpen=lenpen))[0]
        assert len(best) == 40
        enumerated = []
        for n in range(4):
            for seq in itertools.product([UNK, 4, 5], repeat=n):
                y_in = torch.tensor([[BOS, *seq]])
                logp = torch.log_softmax(m(src, lens, y_in), dim=-1)[0]
                lp = float(logp.gather(1, torch.tensor([*seq, EOS])[:, None]).sum())
                enumerated.append((lp / (n + 1) ** lenpen, lp, list(seq)))
        enumerated.sort(key=lambda e: -e[0])
        assert best[0].tokens == enumerated[0][2]
        assert math.isclose(best[0].score, enumerated[0][1], abs_tol=1e-5)
        assert np.allclose(sorted(h.norm_score for h in best), sorted(e[0] for e in enumerated), atol=1e-5)


def test_nbest_alignment_score_and_attention_files_stay_in_step(trained, data_dir, tmp_path):
    import json

    _, ckpt = trained
    lines = _lines(data_dir / "multi30k" / "val.en", 10)
    lines.insert(3, "")
    inp = tmp_path / "in.en"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_translate(["-m", ckpt, "-i", str(inp), "-o", str(tmp_path / "out.fr"), "--beam", "4", "--nbest", "3",
                   "--nbest-file", str(tmp_path / "nbest"), "--alignments", str(tmp_path / "align"),
                   "--scores", str(tmp_path / "scores"), "--attention", str(tmp_path / "attn"), "--tokenized"], b"")
    out = _lines(tmp_path / "out.fr")
    assert len(out) == len(lines)
    nbest = _lines(tmp_path / "nbest")
    ids = [int(line.split(" ||| ")[0]) for line in nbest]
    assert sorted(set(ids)) == list(range(len(lines)))  # one block per input line, ids 0-based, in order
    assert ids == sorted(ids)
    for i in range(len(lines)):
        block = [line.split(" ||| ") for line in nbest if int(line.split(" ||| ")[0]) == i]
        assert len(block) == (1 if lines[i] == "" else 3)
        assert block[0][1] == out[i]  # the 1-best is the translation
        totals = [float(b[3]) for b in block]
        assert totals == sorted(totals, reverse=True)
    align = _lines(tmp_path / "align")
    scores = _lines(tmp_path / "scores")
    attn = [json.loads(line) for line in _lines(tmp_path / "attn")]
    assert len(align) == len(scores) == len(attn) == len(lines)
    for src, tgt, al, a in zip(lines, out, align, attn):
        links = pharaoh_links(al)
        assert len(links) == len(tgt.split())  # one link per target word
        assert all(0 <= i < len(src.split()) and 0 <= j < len(tgt.split()) for i, j in links)
        alpha = np.asarray(a["alpha"])
        assert alpha.shape == (len(a["target"]), len(a["source"]))
        if src:
            assert np.allclose(alpha.sum(1), 1.0, atol=1e-4)


def _biased_checkpoint(ckpt, tmp_path):
    """The trained model with the <unk> output bias raised, so that it generates <unk> everywhere."""
    payload = checkpoint.load(ckpt)
    payload["model"]["b_y"][UNK] += 50.0
    path = tmp_path / "unk.pt"
    checkpoint.save({k: v for k, v in payload.items() if k not in ("format", "format_version", "nmtkit_version")},
                    path)
    return str(path)


def test_no_unk_and_replace_unk(trained, data_dir, tmp_path):
    _, ckpt = trained
    biased = _biased_checkpoint(ckpt, tmp_path)
    text = ("\n".join(_lines(data_dir / "multi30k" / "val.en", 8)) + "\n").encode()
    plain = run_translate(["-m", biased, "--tokenized", "--beam", "3"], text).stdout.decode()
    assert "<unk>" in plain  # the test means something: the biased model does generate <unk>
    no_unk = run_translate(["-m", biased, "--tokenized", "--beam", "3", "--no-unk"], text).stdout.decode()
    assert "<unk>" not in no_unk and len(no_unk.split("\n")) == 9
    replaced = run_translate(["-m", biased, "--tokenized", "--beam", "3", "--replace-unk"], text).stdout.decode()
    assert "<unk>" not in replaced
    src_lines = text.decode().split("\n")
    for src, out in zip(src_lines, replaced.split("\n")):
        assert set(out.split()) <= set(src.split())  # every <unk> became a source word
    # --unk-dict: the dictionary's translation of the attended source word, where it has one (first entry wins)
    vocabulary = sorted({w for line in src_lines for w in line.split()})
    table = tmp_path / "unk.dict"
    table.write_text("".join(f"{w} {w}_fr\n{w} second_entry\n" for w in vocabulary[::2]) + "\n", encoding="utf-8")
    looked_up = run_translate(["-m", biased, "--tokenized", "--beam", "3", "--replace-unk", "--unk-dict", table],
                              text).stdout.decode()
    translated = {f"{w}_fr" for w in vocabulary[::2]}
    for plain_line, line in zip(replaced.split("\n"), looked_up.split("\n")):
        assert line.split() == [f"{w}_fr" if f"{w}_fr" in translated else w for w in plain_line.split()]
    assert any(w in translated for w in looked_up.split())
    bad = tmp_path / "bad.dict"
    bad.write_text("maison house\nchat\tcat extra\n", encoding="utf-8")
    proc = run_translate(["-m", biased, "--replace-unk", "--unk-dict", bad], text, check=False)
    assert proc.returncode == 1 and proc.stderr.decode().strip() == (
        f"nmt-translate: error: {bad}:2: expected 'source_word target_word'"), proc.stderr


def test_ensemble_of_one_model_twice_equals_the_model(trained, data_dir):
    _, ckpt = trained
    text = ("\n".join(_lines(data_dir / "multi30k" / "val.en", 10)) + "\n").encode()
    single = run_translate(["-m", ckpt, "--beam", "3"], text).stdout
    double = run_translate(["-m", ckpt, "-m", ckpt, "--beam", "3"], text).stdout
    assert single == double


@pytest.mark.parametrize("workers", [1, 2])
def test_output_streams_before_input_ends(trained, data_dir, workers):
    _, ckpt = trained
    lines = _lines(data_dir / "multi30k" / "val.en", 30)
    proc = subprocess.Popen(TRANSLATE + ["-m", ckpt, "--beam", "2", "--batch-size", "2", "--window", "4",
                                         "--workers", str(workers), "--threads", str(workers)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        proc.stdin.write(("\n".join(lines[:10]) + "\n").encode())
        proc.stdin.flush()
        start = time.time()
        first = proc.stdout.readline()  # stdin is still open: this only returns if output streams
        assert first.strip() and time.time() - start < 120
    finally:
        proc.stdin.close()
        rest = proc.stdout.read()
        proc.wait(timeout=120)
    assert len((first + rest).decode().split("\n")) == 11


def test_worker_processes_change_nothing_in_the_output(trained, data_dir, tmp_path):
    """--workers 2: batches decoded in two processes (one thread each), results put back in input order; the
    translation and every side file are those of one process with one thread."""
    _, ckpt = trained
    lines = _lines(data_dir / "multi30k" / "val.en", 40)
    lines[5:5] = ["", "... !!! ???"]
    inp = tmp_path / "in.en"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = []
    for workers in (1, 2):
        d = tmp_path / f"w{workers}"
        d.mkdir()
        run_translate(["-m", ckpt, "-i", str(inp), "-o", str(d / "out"), "--beam", "4", "--nbest", "2",
                       "--nbest-file", str(d / "nbest"), "--alignments", str(d / "align"), "--scores",
                       str(d / "scores"), "--batch-size", "3", "--window", "7", "--workers", str(workers),
                       "--threads", str(workers)], b"")
        outputs.append({f: (d / f).read_text(encoding="utf-8") for f in ("out", "nbest", "align", "scores")})
    assert len(outputs[0]["out"].split("\n")) == len(lines) + 1
    assert outputs[0] == outputs[1]


def test_worker_processes_stop_with_the_translator_and_a_dead_one_is_an_error(trained, data_dir):
    import signal

    from nmtkit.errors import WorkerError
    from nmtkit.translate.translator import Translator

    _, ckpt = trained
    lines = list(enumerate(_lines(data_dir / "multi30k" / "val.en", 30), start=1))
    with Translator([ckpt], DecodeConfig(beam=2), batch_size=4, window=8, workers=2, threads=2) as tr:
        procs = [w.proc for w in tr._pool._workers]
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        expected = [t.text for t in tr.translate(lines)]
        stream = tr.translate(lines)
        next(stream)  # the reader stops early, batches still pending: the workers are killed, not waited for
    assert all(p.poll() is not None for p in procs)
    with Translator([ckpt], DecodeConfig(beam=2), batch_size=4, window=8, workers=2, threads=2) as tr:
        assert [t.text for t in tr.translate(lines)] == expected
        os.kill(tr._pool._workers[1].proc.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"decoding worker 1 \(pid \d+\) stopped unexpectedly"):
            list(tr.translate(lines))


def test_automatic_workers_that_fail_leave_the_translation_to_this_process(trained, data_dir, caplog, monkeypatch):
    # --workers 0 (the default): workers start once the input fills a window; one that dies mid-stream, or workers
    # that cannot start, do not cost the user the output: the rest is translated here, the same lines in order
    import logging
    import signal

    from nmtkit.translate import pool as decodepool
    from nmtkit.translate.translator import Translator

    _, ckpt = trained
    lines = list(enumerate(_lines(data_dir / "multi30k" / "val.en", 40), start=1))
    with Translator([ckpt], DecodeConfig(beam=2), batch_size=4, window=8, workers=1) as alone:
        expected = [t.text for t in alone.translate(lines)]
    with caplog.at_level(logging.WARNING, logger="nmtkit.translate"):
        with Translator([ckpt], DecodeConfig(beam=2), batch_size=4, window=8, workers=0, threads=2) as tr:
            stream = tr.translate(lines)
            got = [next(stream).text]
            assert len(tr.worker_pids) == 2  # the first full window started them
            os.kill(tr.worker_pids[1], signal.SIGKILL)
            got += [t.text for t in stream]
            assert tr.worker_pids == []
    assert got == expected
    assert "decoding worker processes failed (decoding worker 1 (pid" in caplog.text
    caplog.clear()

    def cannot_start(*a, **k):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(decodepool.DecodePool, "__init__", cannot_start)
    with caplog.at_level(logging.WARNING, logger="nmtkit.translate"):
        with Translator([ckpt], DecodeConfig(beam=2), batch_size=4, window=8, workers=0, threads=2) as tr:
            assert [t.text for t in tr.translate(lines)] == expected
    assert "Resource temporarily unavailable); translating on in this process" in caplog.text


def test_empty_input_gives_empty_output(trained):
    proc = run_translate(["-m", trained[1]], b"")
    assert proc.stdout == b"" and proc.returncode == 0


@pytest.mark.parametrize("problem", ["missing", "corrupt", "truncated", "version"])
def test_bad_checkpoints_are_one_line_errors(trained, tmp_path, problem):
    path = tmp_path / "bad.pt"
    if problem == "corrupt":
        path.write_bytes(b"this is not a checkpoint at all")
    elif problem == "truncated":
        data = open(trained[1], "rb").read()
        path.write_bytes(data[: len(data) // 2])
    elif problem == "version":
        payload = checkpoint.load(trained[1])
        torch.save({**payload, "format_version": 99}, path)
    out = tmp_path / "out.fr"
    proc = run_translate(["-m", str(path), "-o", str(out)], b"A dog runs.\n", check=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1
    assert len(err.splitlines()) == 1 and err.startswith("nmt-translate: error: ") and str(path) in err
    assert {"missing": "no such", "corrupt": "not a readable", "truncated": "not a readable",
            "version": "version 99"}[problem] in err
    assert not out.exists()


# -- options, stdin and prefixes given carelessly ------------------------------------------------------------------

@pytest.mark.parametrize("args, closed, message", [
    (["--threads", "-1"], False, "--threads must be at least 0 (got -1; 0 = automatic)"),
    (["--coverage-penalty", "1e308"], False,
     "--coverage-penalty must be a finite number of at least 0 and at most 10 (got 1e+308; Wu et al. use 0.2)"),
    (["--prefix", "-"], False, "--prefix - and the input both name standard input: give the input with -i FILE or "
                               "the prefixes as a file"),
    ([], True, "standard input: is closed: give --input a file, or pipe the text in"),
], ids=["threads", "coverage-penalty", "prefix-and-input-on-stdin", "stdin-closed"])
def test_bad_options_and_a_closed_stdin_are_one_line_errors(trained, tmp_path, args, closed, message):
    _, ckpt = trained
    out = tmp_path / "out.fr"
    proc = subprocess.run(TRANSLATE + ["-m", ckpt, "-o", str(out), *args], input=None if closed else b"a man .\n",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, timeout=300,
                          preexec_fn=(lambda: os.close(0)) if closed else None)  # (nmt-translate <&-)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode().splitlines() == [f"nmt-translate: error: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_prefixes_from_stdin_come_out_as_written_and_the_largest_coverage_penalty_scores_finitely(trained, data_dir,
                                                                                                  tmp_path):
    """--prefix - reads the prefixes from stdin when the input is a file; each translation starts with its prefix
    exactly as written, which the preprocessing alone does not give back ("</s> <s>" reads "< / s > < s >", the
    spacing and "l'" are Moses'), n-best entries too; an empty source line gives its prefix alone."""
    _, ckpt = trained
    src = _lines(data_dir / "multi30k" / "val.en", 5)
    src[4] = ""
    prefixes = ["</s> <s>", "Un  homme,", "l' homme", "", "« Le chat »"]
    inp = tmp_path / "in.en"
    inp.write_text("".join(s + "\n" for s in src), encoding="utf-8")
    nbest = tmp_path / "out.nbest"
    proc = run_translate(["-m", ckpt, "-i", str(inp), "--prefix", "-", "--beam", "3", "--nbest", "3",
                          "--nbest-file", str(nbest), "--coverage-penalty", "10"],
                         "".join(p + "\n" for p in prefixes).encode())
    out = proc.stdout.decode().split("\n")
    assert len(out) == 6 and out[-1] == ""
    for k, p in enumerate(prefixes[:4]):
        if p:
            assert out[k].startswith(p) and len(out[k]) > len(p), (p, out[k])
    assert out[4] == "« Le chat »"
    entries = [line.split(" ||| ") for line in nbest.read_text(encoding="utf-8").splitlines()]
    assert {int(e[0]) for e in entries} == set(range(5))
    for line, text, _, score in entries:
        assert text.startswith(prefixes[int(line)]) and math.isfinite(float(score)), (line, text, score)


def test_configured_translators_share_the_workers_from_several_threads_at_once(trained, data_dir):
    """A server's way of decoding (nmtkit/serve): translators configured from one with two worker processes, each
    with its own settings, translate from four threads at once; each gets exactly what a translator of its settings
    decoding alone in this process gives.  A batch that fails in a worker fails only for the thread that asked for
    it; the workers go on decoding the others."""
    from concurrent.futures import ThreadPoolExecutor

    from nmtkit.errors import WorkerError
    from nmtkit.translate.translator import Translator

    _, ckpt = trained
    lines = list(enumerate(_lines(data_dir / "multi30k" / "val.en", 24), start=1))
    settings = [DecodeConfig(beam=2), DecodeConfig(beam=4, nbest=2), DecodeConfig(beam=1),
                DecodeConfig(beam=3, no_repeat_ngram=1)]
    expected = []
    for decode in settings:
        with Translator([ckpt], decode, batch_size=4, workers=1) as alone:
            expected.append([(t.text, t.nbest) for t in alone.translate(lines)])
    with Translator([ckpt], DecodeConfig(), batch_size=4, workers=2, threads=2) as shared:
        assert len(shared.worker_pids) == 2 and shared.models == []
        each = [shared.configured(decode) for decode in settings]

        def run(k):
            return [(t.text, t.nbest) for t in each[k].translate(lines)]

        def same(got, want):  # the texts; the scores up to the order of float sums (one thread against several)
            return all(a[0] == b[0] and [x[0] for x in a[1]] == [x[0] for x in b[1]]
                       and np.allclose([x[1:] for x in a[1]], [x[1:] for x in b[1]], atol=1e-4)
                       for a, b in zip(got, want, strict=True))

        for _ in range(2):  # (twice: the threads meet the workers at other moments)
            with ThreadPoolExecutor(4) as pool:
                assert all(same(got, want) for got, want in zip(pool.map(run, range(4)), expected, strict=True))
        pool_ = shared._pool
        bad = pool_.submit(SourceBatch([np.array([5, 6, 7])]), ("not a DecodeConfig", False))
        good = pool_.submit(SourceBatch([np.array([5, 6, 7])]))
        assert len(pool_.result(good)) == 1
        with pytest.raises(WorkerError, match="decoding failed in decoding worker"):
            pool_.result(bad)
        assert same(run(2), expected[2])  # the workers are still there
