"""Checkpoint files: round trip with weights_only loading, atomic writes, clear one-line errors on bad files."""

from __future__ import annotations

import copy
import os
import re
import warnings

import pytest
import torch

from nmtkit import __version__
from nmtkit.data import checkpoint
from nmtkit.data.vocab import SPECIALS
from nmtkit.models import build_from_checkpoint
from nmtkit.errors import InputError

from conftest import tiny_multi30k_run


pytestmark = pytest.mark.usefixtures("restore_threads")


@pytest.fixture(scope="module")
def real_checkpoint(data_dir, tmp_path_factory):
    """A checkpoint written by a real (2-update) training run of the tiny RNNsearch on 60 Multi30K pairs."""
    return tiny_multi30k_run(data_dir, tmp_path_factory.mktemp("ckpt"), valid_bleu_sentences=2) / "checkpoint2.pt"


_CACHE: dict = {}


def _payload():
    """A tiny model and a checkpoint payload for it (built once; each caller gets its own copy)."""
    if not _CACHE:
        _CACHE["v"] = _build_payload()
    return copy.deepcopy(_CACHE["v"])


def _build_payload():
    from nmtkit.models import build_model

    torch.manual_seed(0)
    model = build_model("rnnsearch-tiny", 12, 14)
    return model, {
        "arch": model.arch,
        "config": model.config.to_dict(),
        "source_lang": "en",
        "target_lang": "fr",
        "vocab": {"src": list(SPECIALS) + [f"s{i}" for i in range(4, 12)],
                  "tgt": list(SPECIALS) + [f"t{i}" for i in range(4, 14)]},
        "preprocessing": {"src": {"lang": "en"}, "tgt": {"lang": "fr"}},
        "model": model.state_dict(),
        "train": {"optimizer": torch.optim.Adadelta(model.parameters()).state_dict(),
                  "rng": {"torch": torch.get_rng_state()}, "state": {"update": 3, "history": [{"valid_loss": 1.5}]}},
    }


def _assert_one_line(err: InputError, *words: str) -> None:
    text = str(err)
    assert "\n" not in text.strip()
    assert "\x1b" not in text and "weights_only" not in text  # no terminal escapes, no advice to load unsafely
    for w in words:
        assert w in text, (w, text)


def test_round_trip(tmp_path):
    model, payload = _payload()
    path = tmp_path / "c.pt"
    checkpoint.save(payload, path)
    loaded = checkpoint.load(path)
    assert loaded["format"] == checkpoint.FORMAT_NAME and loaded["format_version"] == checkpoint.FORMAT_VERSION
    for key in ("arch", "config", "source_lang", "target_lang", "vocab", "preprocessing"):
        assert loaded[key] == payload[key]
    assert loaded["model"].keys() == payload["model"].keys()
    for k, v in payload["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert torch.equal(loaded["train"]["rng"]["torch"], payload["train"]["rng"]["torch"])
    assert loaded["train"]["state"] == payload["train"]["state"]
    # the model rebuilt from the file computes what the original computes
    rebuilt = build_from_checkpoint(loaded).eval()
    model.eval()
    src = torch.tensor([[4, 5, 6, 3], [7, 3, 0, 0]])
    lens = torch.tensor([4, 2])
    tgt_in = torch.tensor([[2, 8, 9], [2, 10, 0]])
    with torch.no_grad():
        assert torch.equal(rebuilt(src, lens, tgt_in), model(src, lens, tgt_in))


def test_vocabularies_are_stored_as_one_string_and_version_1_lists_still_load(tmp_path):
    _, payload = _payload()
    path = tmp_path / "c.pt"
    checkpoint.save(payload, path)
    raw = torch.load(path, weights_only=True)
    assert raw["format_version"] == 2 and raw["vocab"]["src"] == "\n".join(payload["vocab"]["src"])
    old = {**raw, "format_version": 1, "vocab": payload["vocab"]}  # what nmtkit wrote before version 2
    torch.save(old, tmp_path / "v1.pt")
    for p in (path, tmp_path / "v1.pt"):
        assert checkpoint.load(p)["vocab"] == payload["vocab"]


def test_real_checkpoint_loads_with_plain_weights_only_torch_load(real_checkpoint):
    raw = torch.load(real_checkpoint, weights_only=True)  # no nmtkit class needed: tensors and containers only
    assert raw["format"] == "nmtkit-checkpoint"
    assert {"arch", "config", "vocab", "preprocessing", "model", "train"} <= raw.keys()
    assert raw["train"]["optimizer"]["state"]  # Adadelta's running averages are there for resuming
    assert checkpoint.load(real_checkpoint)["train"]["state"]["update"] == 2


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    _, payload = _payload()
    path = tmp_path / "c.pt"
    checkpoint.save(payload, path)
    checkpoint.save(payload, path)  # overwrite
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    _, payload = _payload()
    path = tmp_path / "c.pt"
    checkpoint.save(payload, path)
    before = path.read_bytes()
    with pytest.raises(Exception):
        checkpoint.save({**payload, "bad": lambda: None}, path)  # cannot be pickled: fails mid-write
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]


def test_link_names_the_same_checkpoint(tmp_path):
    _, payload = _payload()
    checkpoint.save(payload, tmp_path / "checkpoint3.pt")
    checkpoint.link(tmp_path / "checkpoint3.pt", tmp_path / "checkpoint_last.pt")
    checkpoint.link(tmp_path / "checkpoint3.pt", tmp_path / "checkpoint_last.pt")  # replacing works too
    os.unlink(tmp_path / "checkpoint3.pt")  # the link survives its source
    assert checkpoint.load(tmp_path / "checkpoint_last.pt")["train"]["state"]["update"] == 3
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_last.pt"]


def test_unknown_format_version(tmp_path):
    _, payload = _payload()
    path = tmp_path / "future.pt"
    torch.save({**payload, "format": "nmtkit-checkpoint", "format_version": 99}, path)
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path), "99")
    after = str(e.value).replace(str(path), "").replace(__version__, "").split("99", 1)[1]
    assert re.search(rf"\b{checkpoint.FORMAT_VERSION}\b", after), after  # names the version(s) this nmtkit reads


def test_truncated_real_checkpoint(real_checkpoint, tmp_path):
    data = real_checkpoint.read_bytes()
    path = tmp_path / "half.pt"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path), "truncated")


@pytest.mark.parametrize("content", [b"", b"\x00garbage\xff" * 100, b"PK\x03\x04" + b"\x01" * 64,
                                     "plain text\nover lines\n".encode()])
def test_garbage_file(tmp_path, content):
    path = tmp_path / "junk.pt"
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path), "not a readable checkpoint")


def test_bad_file_that_starts_like_a_pickle_gives_no_warning(tmp_path):
    # b"\x80\x9e": a pickle PROTO opcode with protocol 158; torch warns about the protocol before it fails.
    # Our error must be the only thing a user sees (a CI run once caught this with random bytes).
    path = tmp_path / "junk.pt"
    path.write_bytes(b"\x80\x9e" + bytes(range(256)) * 4)
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        with pytest.raises(InputError) as e:
            checkpoint.load(path)
    assert [str(w.message) for w in escaped] == []
    _assert_one_line(e.value, str(path), "not a readable checkpoint")


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as e:
        checkpoint.load(tmp_path / "nope.pt")
    _assert_one_line(e.value, str(tmp_path / "nope.pt"), "no such")


def test_foreign_torch_file(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path), "not an nmtkit checkpoint")


@pytest.mark.parametrize("missing", ["arch", "config", "vocab", "preprocessing", "model"])
def test_missing_keys(tmp_path, missing):
    _, payload = _payload()
    del payload[missing]
    path = tmp_path / "c.pt"
    checkpoint.save(payload, path)
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path), f"'{missing}'")


class _Evil:
    marker = None

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_runs_code_from_the_file(tmp_path):
    marker = tmp_path / "pwned"
    evil = _Evil()
    evil.marker = str(marker)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": "nmtkit-checkpoint", "format_version": 1, "x": evil}, f, pickle_protocol=2)
    with pytest.raises(InputError) as e:
        checkpoint.load(path)
    _assert_one_line(e.value, str(path))
    assert not marker.exists()


def test_differences_names_what_two_real_checkpoints_do_not_share(finished_run):
    """checkpoint.differences (check_commits.sh, the resume soak): nothing for a checkpoint and its copy; each
    weight, the optimizer state and the run state where they differ -- a dtype or one bit included."""
    a = checkpoint.load(finished_run / "checkpoint_last.pt")
    assert checkpoint.differences(a, copy.deepcopy(a)) == []
    b = copy.deepcopy(a)
    name = next(iter(b["model"]))
    w = b["model"][name].view(-1)
    w[0] = torch.nextafter(w[0], torch.tensor(float("inf"), dtype=w.dtype))  # one bit
    b["model"]["extra"] = torch.zeros(1)
    b["train"]["state"]["update"] += 1
    b["train"]["state"]["elapsed"] += 5.0  # (the time taken is not the run's state)
    found = checkpoint.differences(a, b)
    assert found[:2] == ["extra", name]
    assert found[2].startswith("run state ") and len(found) == 3
    c = copy.deepcopy(a)
    opt = c["train"]["optimizer"]["state"]
    first = next(iter(opt.values()))
    key = next(k for k, v in first.items() if torch.is_tensor(v) and v.is_floating_point() and v.numel() > 1)
    first[key] = first[key].double()
    assert checkpoint.differences(a, c) == ["optimizer state"]
