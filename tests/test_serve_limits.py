"""nmt-serve under abuse (#57): what one request may cost, on real servers on 127.0.0.1 with real sockets.

A lone surrogate is its own request's 400, never its batch's 500 (a SentencePiece model, whose preprocessing it
broke, and a word-level one); a line that breaks the decoding fails its own request alone, with one log line and no
traceback; the limits a request meets before it is queued (--max-beam, --max-nbest, --max-target-len,
--max-attention-cells, prefixes in --max-chars) are 413s naming the option; client errors that were 500s are 400s;
a one-line request that comes while an expensive one decodes is answered after one batch of it, not all of it (a
batch is cut to --batch-work), and a request that times out leaves the engine: its lines not yet decoded never are.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import test_serve
from conftest import fault_train_cfg, lines_of, tiny_multi30k_run
from test_serve import Server, nmt_translate

# the decoding of a request holding the line "POISON" fails (as a line that breaks the search would): its batch's
# other requests must not fail with it
POISON = """
from nmtkit.serve import service as _service
_translate = _service.TranslationService.translate

def _poisoned(self, requests, stop=None):
    if any(line == "POISON" for r in requests for line in r.lines):
        raise RuntimeError("this line breaks the decoding")
    return _translate(self, requests, stop)

_service.TranslationService.translate = _poisoned
"""


def _server(ckpt, *options, poison: bool = False) -> Server:
    """A Server with the test hooks (``queued``, ``decoding`` lines), and with ``poison`` the POISON one."""
    hooks = test_serve.SERVE_HOOKS
    if poison:
        test_serve.SERVE_HOOKS = POISON + hooks
    try:
        return Server(str(ckpt), *options, hooks=True)
    finally:
        test_serve.SERVE_HOOKS = hooks


@pytest.fixture(scope="module")
def spm_ckpt(multi30k_200, tmp_path_factory):
    """200 Multi30K pairs with a joint SentencePiece model of 300 units, the tiny RNNsearch after 2 updates."""
    import torch

    from nmtkit.prepare import PrepareConfig, prepare
    from nmtkit.train.trainer import train

    root = tmp_path_factory.mktemp("spm-serve")
    prepare(PrepareConfig("en", "fr", [str(multi30k_200 / "train")], str(root / "data"),
                          valid=str(multi30k_200 / "valid"), spm_vocab_size=300))
    threads = torch.get_num_threads()
    try:
        train(fault_train_cfg(root / "data", root / "run", max_updates=2, valid_bleu_sentences=0))
    finally:
        torch.set_num_threads(threads)
    return root / "run" / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def word_ckpt(data_dir, tmp_path_factory):
    """A word-level model: 60 Multi30K pairs, vocabularies of 50 and 60 words, 2 updates."""
    return tiny_multi30k_run(data_dir, tmp_path_factory.mktemp("word-serve")) / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def spm_server(spm_ckpt):
    s = _server(spm_ckpt, "--batch-wait-ms", "300", poison=True)
    s.ready()
    yield s
    assert s.stop() == 0


# limits small enough to meet with a few lines; a batch holds about one line of the expensive request below
LIMITS = ("--max-beam", "60", "--max-nbest", "4", "--max-target-len", "300", "--max-attention-cells", "20000",
          "--max-chars", "6000", "--batch-work", "10000", "--batch-wait-ms", "50", "--timeout", "8")


@pytest.fixture(scope="module")
def word_server(word_ckpt):
    s = _server(word_ckpt, *LIMITS)
    s.ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def val(data_dir):
    return lines_of(data_dir / "multi30k" / "val.en", 60)


def _together(server, bodies: list[dict]) -> list[tuple]:
    """Send the bodies at once: (status, body) of each."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return [got[:2] for got in pool.map(lambda body: server.call("/translate", body), bodies)]


# -- one request's bad text is that request's error ---------------------------------------------------------------

def test_a_lone_surrogate_is_its_own_400_and_its_batch_is_translated(spm_server, val):
    """10 clients at once with a SentencePiece model, two of them holding a lone surrogate (in "src" and in
    "prefix"): those two get a 400 of one line, before their lines are queued; the other 8 get what each gets
    alone, decoded in shared batches.  (Before: 500 for all 10, SentencePiece's TypeError.)"""
    alone = [spm_server.translate([line])[0]["tgt"] for line in val[:8]]
    start, logged = len(spm_server.lines), len(spm_server.batches())
    bodies = [{"src": [line]} for line in val[:8]]
    bodies[3:3] = [{"src": ["A dog \ud800 runs."]}]
    bodies[7:7] = [{"src": ["A dog runs."], "prefix": ["Un \udfff"]}]
    got = _together(spm_server, bodies)
    assert got[3] == (400, {"error": "\"src\"[0] holds a lone surrogate (U+D800 at character 6): not text"})
    assert got[7] == (400, {"error": "\"prefix\"[0] holds a lone surrogate (U+DFFF at character 3): not text"})
    rest = [g for k, g in enumerate(got) if k not in (3, 7)]
    assert [status for status, _ in rest] == [200] * 8
    assert [body["translations"][0]["tgt"] for _, body in rest] == alone
    spm_server.logged(logged + 8)
    assert max(spm_server.batches()[logged:]) > 1  # (decoded together: the test means something)
    assert sum("test hook: queued" in line for line in spm_server.lines[start:]) == 8
    assert "Traceback" not in "".join(spm_server.lines)


def test_a_lone_surrogate_is_a_400_with_a_word_level_model_too(word_server):
    status, body, _ = word_server.call("/translate", raw=b'{"src": ["A cat.", "A \\ud800 dog."]}')
    assert (status, body) == (400, {"error": "\"src\"[1] holds a lone surrogate (U+D800 at character 2): not text"})


def test_a_line_that_breaks_the_decoding_fails_its_own_request_alone_in_one_log_line(spm_server, val):
    """A request whose line breaks the decoding (a fault the tests inject) shares a batch with 7 others: it gets
    its 500 of one line; the others their translations; the log names the request in one line, no traceback.
    (Before: 500 for all 8, and a traceback for each in the log.)"""
    alone = [spm_server.translate([line])[0]["tgt"] for line in val[20:27]]
    start, logged = len(spm_server.lines), len(spm_server.batches())
    bodies = [{"src": [line]} for line in val[20:27]]
    bodies.insert(4, {"src": ["POISON"]})
    got = _together(spm_server, bodies)
    assert got[4] == (500, {"error": "internal error: RuntimeError: this line breaks the decoding"})
    del got[4]
    assert [(status, body["translations"][0]["tgt"]) for status, body in got] == [(200, x) for x in alone]
    spm_server.logged(logged + 7)
    log = spm_server.lines[start:]
    assert max(spm_server.batches()[logged:]) > 1 and any("decoding them one at a time" in x for x in log)
    failed = [x for x in log if "ERROR" in x]
    assert len(failed) == 1 and failed[0].rstrip().endswith(
        "POST /translate failed: internal error: RuntimeError: this line breaks the decoding")
    assert not any("Traceback" in x or x.startswith(" ") for x in log), "".join(log)


# -- what one request may cost, before it is queued -----------------------------------------------------------------

LONG = " ".join(["A man in a blue shirt is standing on a ladder cleaning windows ."] * 10)  # 140 tokens


@pytest.mark.parametrize("body, message", [
    ({"src": ["A dog."], "beam": 61}, "beam 61: at most 60 a request (--max-beam)"),
    ({"src": ["A dog."], "beam": 6, "constrained_beam": 61}, "constrained_beam 61: at most 60 a request (--max-beam)"),
    ({"src": ["A dog."], "beam": 5, "nbest": 5}, "nbest 5 (n-best a line): at most 4 a request (--max-nbest)"),
    ({"src": ["A dog."], "sampling": "topk:5", "nbest": 5},
     "nbest 5 (samples a line): at most 4 a request (--max-nbest)"),
    ({"src": ["A dog.", "A cat."], "prefix": ["", " ".join(["un"] * 301)]},
     "\"prefix\"[1]: 301 target tokens: at most 300 (--max-target-len)"),
    ({"src": ["A man in a blue shirt ."], "max_len_a": 50}, "\"src\"[0]: max_len_a 50 and max_len_b 10 allow 360 "
                                                            "target tokens for its 7 source tokens: at most 300"),
    ({"src": ["A dog."], "sampling": "topk:5", "max_len_b": 400}, "allow 406 target tokens"),
    ({"src": [LONG], "attention": True}, "attention of up to 41,031 source × target tokens: at most 20,000 a "
                                         "request (--max-attention-cells"),
    ({"src": [LONG], "alignment": True}, "(--max-attention-cells"),
    ({"src": [LONG], "replace_unk": True}, "(--max-attention-cells"),
    ({"src": ["A dog."], "prefix": ["x" * 5996]}, "6002 characters: at most 6000 a request (--max-chars)"),
])
def test_what_a_request_may_cost_is_a_413_naming_the_limit_before_it_is_queued(word_server, body, message):
    start = len(word_server.lines)
    status, answer, _ = word_server.call("/translate", body)
    assert status == 413 and message in answer["error"] and "\n" not in answer["error"], answer
    status, answer, _ = word_server.call("/translate", {"src": ["A dog."]})
    assert status == 200  # (the server goes on)
    assert sum("test hook: queued" in line for line in word_server.lines[start:]) == 1  # (the 413 never was)


def test_within_the_limits_a_request_is_translated(word_server):
    long = word_server.translate([LONG[:150]], attention=True)[0]["attention"]
    assert len(long["weights"]) == len(long["tgt"]) and len(long["weights"][0]) == len(long["src"])
    assert len(word_server.translate(["A dog."], beam=60, nbest=4)[0]["nbest"]) == 4
    assert word_server.translate(["A dog."], prefix=[" ".join(["un"] * 300)])[0]["tgt"].startswith("un un")


@pytest.mark.parametrize("raw, message", [
    # a temperature that left no finite probability (scores JSON cannot carry): was a 500, then "a score of nan"
    (b'{"src": ["A dog."], "sampling": "temperature:1e-320"}', "--sampling: the temperature must be at least 0.01"),
    # a message quoting a lone surrogate, which JSON's UTF-8 cannot carry: was a 500
    (b'{"src": ["A dog."], "sampling": "topk:\\ud800"}', "--sampling: bad sampling 'topk:\\ud800'"),
    # huge numbers (were 500s, or held the engine for good): 400 (the decoding option's range) or 413 (the server's
    #   limit), whichever says it first
    (b'{"src": ["A dog."], "beam": 100000000000000000000}', "beam"),
    (b'{"src": ["A dog."], "max_len_b": 100000000000000000000}', "max"),
    (b'{"src": ["A dog."], "max_len_a": 1e18}', "max"),
    (b'{"src": ["A dog."], "beam": 12.5}', "--beam must be a whole number"),
    (b'{"src": ["A dog."], "prefix": [["Un"]]}', "\"prefix\" must be a list of strings"),
    (b'{"src": ["A dog."], "attention": "yes"}', "\"attention\" must be true or false"),
    (b'{"src": {"0": "A dog."}}', "\"src\" must be a list of strings"),
])
def test_client_errors_are_a_400_of_one_line(word_server, raw, message):
    status, body, _ = word_server.call("/translate", raw=raw)
    assert status in ((400, 413) if b"000000" in raw else (400,)), body
    assert set(body) == {"error"} and message in body["error"], body
    assert "\n" not in body["error"] and word_server.call("/health")[0] == 200


def test_a_client_that_leaves_before_its_body_is_sent_is_no_server_error(word_server):
    """A client that sends half its body and closes the connection: a 400 in the request log, no ERROR line (was a
    500 and an error naming ClientDisconnect)."""
    import socket
    from urllib.parse import urlparse

    start = len(word_server.lines)
    url = urlparse(word_server.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"src\": [\"A dog")
    word_server.wait_for_log(r"POST /translate \d{3} ", start=start)
    log = word_server.lines[start:]
    assert any("POST /translate 400 " in x for x in log) and not any("ERROR" in x for x in log), "".join(log)


# -- one request does not starve the others ------------------------------------------------------------------------

def test_a_cheap_request_waits_for_one_batch_of_an_expensive_one_and_a_timed_out_one_leaves_the_engine(
        word_server, val):
    """An expensive request (100 lines, beam 50, every hypothesis forced to 10 tokens a source token: about one line
    a batch under --batch-work, 0.2-0.5 s each) decodes; a two-line request sent once its first batch decodes is
    answered after at most that batch, long before the expensive one, which then times out (504 after --timeout
    8 s) and leaves the engine: its lines not yet decoded never are.  (Before: one batch of 100 lines held the
    engine; the cheap request waited for all of it, into its own 504.)"""
    line = "A man in an orange hat starring at something ."  # (10 tokens: work 50 x (10 x 10 + 10 + 1) = 5,550)
    heavy = {"src": [line] * 100, "beam": 50, "max_len_a": 10, "min_length_ratio": 10}
    done = {}

    def send_heavy():
        done["heavy"] = word_server.call("/translate", heavy)[:2]
        done["heavy_at"] = len(word_server.lines)

    start = len(word_server.lines)
    client = threading.Thread(target=send_heavy)
    client.start()
    word_server.wait_for_log(r"^test hook: decoding 1 line", start=start)  # (the expensive request decodes)
    cheap = word_server.translate(val[:2])
    assert "heavy" not in done  # (answered while the expensive one still decodes)
    client.join()
    assert done["heavy"] == (504, {"error": "no translation within 8 s (--timeout)"})
    # after its 504 no batch of it is formed: the next requests are decoded at once, and nothing after them
    after = done["heavy_at"]
    assert word_server.translate(val[:2]) == cheap
    assert word_server.translate(val[2:4])
    hooks = [x for x in word_server.lines[after:] if x.startswith("test hook: decoding")]
    assert [x.startswith("test hook: decoding 2 line(s)") for x in hooks[-2:]] == [True, True], hooks
    assert len(hooks) <= 3, hooks  # (and at most the batch of it that was decoding at its 504)
    decoded = sum(x.startswith("test hook: decoding 1 line") for x in word_server.lines[start:])
    assert 1 < decoded < 100  # (some of its 100 lines, one a batch)


def test_a_request_of_more_lines_than_a_batch_is_decoded_in_parts_numbered_as_one_file(word_server, word_ckpt, val,
                                                                                      tmp_path):
    """40 lines sampled (the draws depend on each line's number) with --max-batch 32: two batches, the same
    samples as nmt-translate draws for the file of 40 lines."""
    logged = len(word_server.batches())
    got = word_server.translate(val[:40], sampling="topk:5", seed=7, nbest=2)
    want = nmt_translate(str(word_ckpt), tmp_path, val[:40], "--sampling", "topk:5", "--seed", "7", "--nbest", "2",
                         "--nbest-file", str(tmp_path / "out.nbest"))["nbest"].splitlines()
    assert [h["tgt"] for r in got for h in r["nbest"]] == [x.split(" ||| ")[1] for x in want]
    word_server.logged(logged + 1)
    assert any(re.search(r"40 lines, batch of 32 \(2 batches\)", x) for x in word_server.lines)


def test_the_limits_are_documented_with_their_defaults():
    from nmtkit.serve.config import ServeConfig

    cfg = ServeConfig(checkpoints=["x"])
    for doc in ("tools.rst", "conventions.rst"):
        text = " ".join((test_serve.REPO / "docs" / doc).read_text(encoding="utf-8").split())
        for name in ("max_beam", "max_nbest", "max_target_len", "max_attention_cells", "batch_work"):
            flag = "--" + name.replace("_", "-")
            assert re.search(rf"``{flag}``(?:[^()]*\(|, ){getattr(cfg, name):,}[;),]", text), (doc, flag)
