"""DecodeConfig (nmtkit/translate/config.py): every decoding option written once, and the same object from Python,
from JSON and from nmt-translate's command line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmtkit.errors import InputError
from nmtkit.translate.config import DecodeConfig, field_kind

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def test_every_field_is_an_option_of_nmt_translate_with_its_default_and_help():
    """nmt-translate's decoding options are made from the fields: one option per field, same default, same help."""
    from nmtkit.cli.translate import main

    params = {p.name: p for p in main.params}
    for f in dataclasses.fields(DecodeConfig):
        p = params[f.name]
        assert p.opts[0] == "--" + f.name.replace("_", "-")
        assert p.help == f.metadata["help"]
        if field_kind(f.name) is bool:
            assert p.is_flag and p.default is False
        else:
            kind = "choice" if f.metadata["choices"] else {int: "integer", float: "float", str: "text"}[field_kind(f.name)]
            assert p.default == f.default and p.type.name == kind
            if f.metadata["choices"]:
                assert tuple(p.type.choices) == f.metadata["choices"]
    assert params["beam"].opts == ["--beam", "-b"]


def test_json_round_trip_and_keyword_construction_agree():
    decode = DecodeConfig(beam=5, nbest=2, lenpen=0.6, no_repeat_ngram=3, coverage_penalty=0.2, max_len_b=4)
    text = json.dumps(decode.to_dict())
    assert DecodeConfig.from_dict(json.loads(text)) == decode
    assert DecodeConfig.from_dict({}) == DecodeConfig()
    assert DecodeConfig(lenpen=1) == DecodeConfig(lenpen=1.0) and isinstance(DecodeConfig(lenpen=1).lenpen, float)
    assert decode.replace(beam=7).beam == 7 and decode.beam == 5
    assert decode.second is decode and decode.widest == 5  # (the second search of --all-numbers: --beam wide)
    wider = decode.replace(constrained_beam=16)
    assert wider.second == decode.replace(beam=16) and wider.widest == 16
    sampled = DecodeConfig(sampling="topk:10,temperature:0.8", nbest=4, seed=3)
    assert (sampled.how.topk, sampled.how.temperature) == (10, 0.8) and DecodeConfig().how is None


@pytest.mark.parametrize("settings, message", [
    ({"beem": 5}, "unknown decoding setting 'beem' (known: beam, nbest,"),
    ({"beam": 0}, "need beam >= 1 and 1 <= nbest <= beam (got beam 0, nbest 1)"),
    ({"beam": 4, "nbest": 5}, "need beam >= 1 and 1 <= nbest <= beam (got beam 4, nbest 5)"),
    ({"beam": "5"}, "--beam must be a whole number (got '5')"),
    ({"beam": 5.0}, "--beam must be a whole number (got 5.0)"),
    ({"no_unk": 1}, "--no-unk must be true or false (got 1)"),
    ({"beam": True}, "--beam must be a whole number (got True)"),
    ({"lenpen": float("inf")}, "--lenpen must be a finite number of at least 0 (got inf)"),
    ({"max_len_b": -2}, "--max-len-b must be a finite number of at least 0 (got -2)"),
    ({"coverage_penalty": 1e308}, "--coverage-penalty must be a finite number of at least 0 and at most 10"),
    ({"no_repeat_ngram": -1}, "--no-repeat-ngram must be a whole number of at least 0"),
    ({"sampling": "topk:0"}, "--sampling: bad sampling 'topk:0': topk must be at least 1"),
    ({"sampling": "topk:5", "coverage_penalty": 0.2}, "--coverage-penalty ranks beam search's hypotheses"),
    ({"sampling": 3}, "--sampling must be text (got 3)"),
    ({"constrained_beam": -1}, "--constrained-beam is the beam of a second beam search"),
    ({"constrained_beam": 2, "beam": 4, "nbest": 3}, "--constrained-beam is the beam of a second beam search: it has "
     "no meaning with --sampling, and holds the n-best (need 0 or nbest <= K <= 1,000; got 2, nbest 3)"),
    ({"constrained_beam": 4, "sampling": "topk:5"}, "--constrained-beam is the beam of a second beam search"),
    ({"constrained_beam": 1001}, "--constrained-beam must be at most 1,000 (got 1001)"),
])
def test_a_bad_setting_is_one_error_naming_it(settings, message):
    with pytest.raises(InputError) as e:
        DecodeConfig.from_dict(settings)
    assert str(e.value).startswith(message), str(e.value)


def test_settings_that_are_not_an_object_are_refused():
    with pytest.raises(InputError, match="decoding settings must be an object of names and values"):
        DecodeConfig.from_dict([("beam", 5)])


def test_a_removed_setting_is_no_field_and_is_refused_with_its_reason():
    """The settings that were removed (nmtkit/translate/retired.py) are no fields any more; a request naming one is
    refused with the line that says why and what to use instead (nmt-serve's 400; nmt-translate's options: test_cli)."""
    from nmtkit.translate.retired import RETIRED, refuse

    assert set(RETIRED) == {"block_numbers", "missing_numbers", "replace_unk_by"}
    assert not set(RETIRED) & {f.name for f in dataclasses.fields(DecodeConfig)}
    for name, message in RETIRED.items():
        with pytest.raises(InputError) as e:
            refuse({"src": ["a"], "beam": 5, name: 1})
        assert str(e.value) == f"\"{name}\": {message}" and message.startswith("removed: ")
    refuse({"src": ["a"], "beam": 5})  # (nothing removed: nothing to say)


def test_the_python_object_translates_as_the_command_line_does(trained, data_dir):
    """What a user reads: nmt-translate --beam 3 --no-repeat-ngram 2 --lenpen 0.5 on real Multi30K lines, against a
    Translator given DecodeConfig(beam=3, no_repeat_ngram=2, lenpen=0.5): the same text, line for line; and the
    settings change the text (the default decoding differs somewhere)."""
    from nmtkit.translate.translator import Translator

    _, ckpt = trained
    lines = (data_dir / "multi30k" / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:40]
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", ckpt, "--beam", "3",
                           "--no-repeat-ngram", "2", "--lenpen", "0.5", "--workers", "1", "-q"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with Translator([ckpt], DecodeConfig(beam=3, no_repeat_ngram=2, lenpen=0.5), workers=1) as tr:
        ours = tr.translate_lines(lines)
    with Translator([ckpt], workers=1) as tr:
        plain = tr.translate_lines(lines)
    assert proc.stdout.splitlines() == ours and len(ours) == 40 and all(ours)
    assert ours != plain


def test_a_bad_option_on_the_command_line_is_one_line(trained):
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "nmt-translate"), "-m", trained[1], "--beam", "2",
                           "--nbest", "3"], input="a man .\n", capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "nmt-translate: error: need beam >= 1 and 1 <= nbest <= beam (got beam 2, nbest 3)"]
