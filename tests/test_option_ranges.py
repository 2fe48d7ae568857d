"""Options whose values overflowed the arithmetic behind them (#57 item 10): each has a range, and a value past it is
one line from the tool and a non-zero exit, never a traceback -- nmt-translate's decoding options (and the same
settings in an nmt-serve request: a 400), nmt-train's --seed and --average-last, and a resumed state whose counts
are negative."""

from __future__ import annotations

import math

import pytest
import torch

from nmtkit.errors import InputError
from nmtkit.train.config import MAX_SEED, TrainConfig
from nmtkit.train.resume import check_training_state
from nmtkit.translate.config import (MAX_BEAM, MAX_LEN_A, MAX_LEN_B, MAX_LENPEN, MAX_SAMPLES, MIN_TEMPERATURE,
                                     DecodeConfig)

from conftest import one_line_error, run_tool
from test_serve import Server

HUGE = "100000000000000000000"  # 1e20 as a whole number: past int64, what a float of it is too


# -- nmt-translate --------------------------------------------------------------------------------------------------

# (a tool process costs seconds on a loaded machine: three through nmt-translate, the rest of the cases in process
# and through the server below)
@pytest.mark.parametrize("options, line", [
    (["--lenpen", "400", "--source-numbers", "--all-numbers"], "--lenpen must be at most 10 (got 400)"),
    (["--max-len-b", HUGE], "--max-len-b must be at most 10,000 (got 1e+20)"),
    (["--sampling", "topk:5", "--max-len-a", "1e9"], "--max-len-a must be at most 100 (got 1e+09)"),
], ids=["lenpen-all-numbers", "max-len-b", "max-len-a-sampling"])
def test_a_decoding_option_past_its_range_is_one_line(small_model, options, line):
    res = run_tool("nmt-translate", "-m", small_model, "-q", *options, stdin="A dog.\n")
    assert one_line_error(res, "nmt-translate") == f"nmt-translate: error: {line}"
    assert res.stdout == ""


def test_the_ranges_hold_their_ends():
    """Each end of a range is a setting (the search's arithmetic holds there); one step past it is refused."""
    DecodeConfig(beam=MAX_BEAM, nbest=MAX_BEAM, lenpen=MAX_LENPEN, max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B,
                 min_length_ratio=MAX_LEN_A)
    DecodeConfig(sampling="topk:5", nbest=MAX_SAMPLES, lenpen=MAX_LENPEN)
    DecodeConfig(sampling=f"temperature:{MIN_TEMPERATURE}")
    assert (MAX_LEN_A * 1_000_000 + MAX_LEN_B + 1) ** MAX_LENPEN < 1e300  # (a million-token source: no overflow)
    for past, line in (({"beam": MAX_BEAM + 1}, "--beam must be at most 1,000 (got 1001)"),
                       ({"beam": int(HUGE)}, f"--beam must be at most 1,000 (got {HUGE})"),
                       ({"sampling": "topk:5", "nbest": 100_000}, "--nbest must be at most 10,000 (got 100000)"),
                       ({"lenpen": 10.01}, "--lenpen must be at most 10 (got 10.01)"),
                       ({"lenpen": 400.0, "sampling": "topk:5"}, "--lenpen must be at most 10 (got 400)"),
                       ({"max_len_a": 100.5}, "--max-len-a must be at most 100 (got 100.5)"),
                       ({"max_len_b": MAX_LEN_B + 1}, "--max-len-b must be at most 10,000 (got 10001)"),
                       ({"min_length_ratio": 1e300}, "--min-length-ratio must be at most 100 (got 1e+300)"),
                       ({"sampling": "temperature:1e-320"}, "--sampling: the temperature must be at least 0.01, "
                        "where sampling is all but greedy decoding (got 1e-320)")):
        with pytest.raises(InputError) as e:
            DecodeConfig(**past)
        assert str(e.value) == line


def test_sampling_at_the_lowest_temperature_scores_finitely(small_model, tmp_path):
    """(1e-320 wrote NaN scores: every token's p^(1/T) underflowed)"""
    res = run_tool("nmt-translate", "-m", small_model, "-q", "--sampling", f"temperature:{MIN_TEMPERATURE}",
                   "--nbest", "3", "--nbest-file", str(tmp_path / "nbest"), stdin="A dog runs on the grass.\n")
    assert res.returncode == 0, res.stderr
    scores = [float(x.split(" ||| ")[-1]) for x in (tmp_path / "nbest").read_text(encoding="utf-8").splitlines()]
    assert len(scores) == 3 and all(math.isfinite(s) for s in scores), scores


def test_a_tool_decodes_at_the_top_of_the_length_penalty(small_model):
    res = run_tool("nmt-translate", "-m", small_model, "-q", "--lenpen", "10", "--beam", "3", "--nbest", "3",
                   "--max-len-a", "0", "--max-len-b", "4", stdin="A dog runs on the grass.\n")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 3 and "Traceback" not in res.stderr


# -- the same settings in an nmt-serve request ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(small_model):
    s = Server(str(small_model))
    s.ready()
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("settings, line", [
    ({"lenpen": 400}, "--lenpen must be at most 10 (got 400)"),
    ({"lenpen": 1e308, "sampling": "topk:5"}, "--lenpen must be at most 10 (got 1e+308)"),
    ({"max_len_b": int(HUGE)}, "--max-len-b must be at most 10,000 (got 1e+20)"),
    ({"max_len_b": 1e20}, "--max-len-b must be a whole number (got 1e+20)"),
    ({"max_len_a": 1e9, "sampling": "topk:5"}, "--max-len-a must be at most 100 (got 1e+09)"),
    ({"min_length_ratio": 1e300}, "--min-length-ratio must be at most 100 (got 1e+300)"),
], ids=["lenpen", "lenpen-sampling", "max-len-b", "max-len-b-float", "max-len-a-sampling", "min-length-ratio"])
def test_a_request_past_a_range_is_a_400_of_one_line(server, settings, line):
    status, body, _ = server.call("/translate", {"src": ["A dog."], **settings})
    assert (status, body) == (400, {"error": line})
    assert server.call("/translate", {"src": ["A dog."], "beam": 2})[0] == 200  # (and the server goes on)


# -- nmt-train ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, line", [
    (["--seed", HUGE], f"--seed must be a whole number from 0 to 4,294,967,295 (got {HUGE})"),
    (["--average-last", "1"], "--average-last 1 averages nothing (the mean of one validation's weights is those "
                              "weights): give 2 or more, or 0 for no averaging"),
], ids=["seed", "average-last-1"])
def test_a_training_option_past_its_range_is_one_line(small, tmp_path, options, line):
    res = run_tool("nmt-train", small, "--arch", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--threads", "1",
                   "--max-updates", "1", *options)
    assert one_line_error(res, "nmt-train") == f"nmt-train: error: {line}"
    assert not (tmp_path / "run").exists()


def test_the_seeds_range_holds_its_ends(tmp_path):
    for seed in (0, MAX_SEED):
        TrainConfig(data="d", arch="rnnsearch-tiny", save_dir=str(tmp_path), seed=seed).check()
    for seed in (-1, MAX_SEED + 1):
        with pytest.raises(InputError, match=f"--seed must be a whole number from 0 to 4,294,967,295 .got {seed}."):
            TrainConfig(data="d", arch="rnnsearch-tiny", save_dir=str(tmp_path), seed=seed).check()


def test_a_resumed_state_whose_update_is_negative_is_one_line(small, small_model, tmp_path):
    """An update of -1 divided the warm-up by zero (a ZeroDivisionError): a malformed checkpoint, one line, nothing
    written."""
    run = tmp_path / "run"
    run.mkdir()
    payload = torch.load(small_model, weights_only=False)
    payload["train"]["state"]["update"] = -1
    torch.save(payload, run / "checkpoint_last.pt")
    before = sorted(p.name for p in run.iterdir()), (run / "checkpoint_last.pt").read_bytes()
    res = run_tool("nmt-train", small, "--arch", "rnnsearch-tiny", "--save-dir", run, "--resume", "--threads", "1",
                   "--batch-size", "16", "--pool-batches", "2", "--valid-every", "2", "--log-every", "1",
                   "--valid-bleu-sentences", "0", "--max-updates", "4")  # (small_model's settings)
    assert one_line_error(res, "nmt-train") == (f"nmt-train: error: {run / 'checkpoint_last.pt'}: malformed "
                                               "checkpoint: 'train.state.update' is -1, below 0")
    assert (sorted(p.name for p in run.iterdir()), (run / "checkpoint_last.pt").read_bytes()) == before


@pytest.mark.parametrize("section, key", [("state", "epoch"), ("state", "elapsed"), ("state", "best_update"),
                                          ("schedule", "bad"), ("log_window", "tok")])
def test_every_count_of_a_resumed_state_is_at_least_0(small_model, section, key):
    payload = torch.load(small_model, weights_only=False)
    check_training_state(payload, "ckpt.pt")  # (as saved: sound)
    payload["train"][section][key] = -1
    with pytest.raises(InputError) as e:
        check_training_state(payload, "ckpt.pt")
    assert str(e.value) == f"ckpt.pt: malformed checkpoint: 'train.{section}.{key}' is -1, below 0"
