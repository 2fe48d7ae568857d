"""Damaged prepared data (nmtkit.data: the manifest, BPE codes, a vocabulary, the corpus's .bin and .idx, the
validation set), refused as nmt-train opens it -- one line naming the file, before any training -- never a
traceback at the first checkpoint, nor a model trained on garbage.
"""

from __future__ import annotations

import json

import pytest

from nmtkit.errors import InputError
from nmtkit.train.trainer import Trainer

from conftest import fault_train_cfg as _cfg
from conftest import one_line_error as _one_line_error
from conftest import run_tool as _nmt


def _damage_manifest(d, edit):
    manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    edit(manifest)
    (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _drop_vocab_line(d):
    lines = (d / "vocab.fr").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "vocab.fr").write_text("".join(lines[:10] + lines[11:]), encoding="utf-8")


def _poke_bin(d):  # the 5th id of train.fr becomes 60000 (the vocabulary has 134 entries)
    import numpy as np

    data = np.fromfile(d / "train.fr.bin", dtype="<u2")
    data[4] = 60000
    data.tofile(d / "train.fr.bin")


def _poke_idx(d, which: str):
    import struct

    import numpy as np

    raw = bytearray((d / "train.en.idx").read_bytes())
    n = struct.unpack_from("<Q", raw, 16)[0]
    if which == "offsets":  # offsets 2 and 3 swapped: not monotonic
        offsets = np.frombuffer(bytes(raw[24: 24 + 8 * (n + 1)]), dtype="<i8").copy()
        offsets[[2, 3]] = offsets[[3, 2]]
        raw[24: 24 + 8 * (n + 1)] = offsets.tobytes()
    else:  # the length of sentence 3 negative
        start = 24 + 8 * (n + 1) + 4 * 2
        raw[start: start + 4] = struct.pack("<i", -4)
    (d / "train.en.idx").write_bytes(bytes(raw))


def _valid_corpus(d, sentences):  # the valid split's source side replaced (as a directory prepared earlier may have)
    from nmtkit.data.corpus import CorpusWriter

    with CorpusWriter(d / "valid.en", "uint16") as w:
        for n in sentences:
            w.add([5] * n)


@pytest.mark.parametrize("damage, where, fragment", [
    (lambda d: _damage_manifest(d, lambda m: m["preprocessing"]["en"].update(stemming=True)), "manifest.json",
     "malformed manifest: 'preprocessing.en' is not understood: unknown text preprocessing setting(s): stemming"),
    (lambda d: (d / "bpe.codes").write_text("#version: 0.2\nt h\nth e the\n", encoding="utf-8"), "bpe.codes",
     "damaged BPE codes: line 3 is not two subword units separated by a space ('th e the')"),
    (lambda d: _valid_corpus(d, []), "valid.en.idx", "the validation set has no sentence: it needs at least one pair"),
    (lambda d: _valid_corpus(d, [3, 1001, 2]), "valid.en.idx",
     "sentence 2 of the validation set has 1,001 model tokens, more than the 1,000 a pair scored whole may have"),
    (lambda d: _damage_manifest(d, lambda m: m.pop("vocab")), "manifest.json",
     "malformed manifest: 'vocab' is missing or not a dict"),
    (lambda d: _damage_manifest(d, lambda m: m.update(source_lang="de")), "manifest.json",
     "malformed manifest: 'vocab' has no entry for 'de', a language the manifest names (it has: en, fr)"),
    (_drop_vocab_line, "vocab.fr", "holds 133 entries, the manifest says 134 (a line lost or added"),
    (_poke_bin, "train.fr.bin", "sentence 1 holds token id 60000, but the vocabulary has 134 entries"),
    (lambda d: _poke_idx(d, "offsets"), "train.en.idx",
     "index offsets are not the running sum of the sentence lengths (from sentence 2 on): corrupt"),
    (lambda d: _poke_idx(d, "length"), "train.en.idx", "index gives sentence 3 a negative length (-4): corrupt"),
], ids=["unknown-preprocessing-setting", "bpe-codes", "valid-empty", "valid-too-long", "manifest-no-vocab",
        "manifest-other-language", "vocab-line-missing", "bin-id-too-large",
        "idx-offsets", "idx-negative-length"])
def test_damaged_prepared_data_is_refused_when_opened(small, tmp_path, damage, where, fragment):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    damage(data)
    with pytest.raises(InputError) as e:
        Trainer(_cfg(data, tmp_path / "run", max_updates=1))
    line = str(e.value)
    assert fragment in line and (str(data / where) in line or (where == "manifest.json" and str(data) in line)), line
    assert not list((tmp_path / "run").glob("checkpoint*.pt"))


def test_damaged_prepared_data_is_one_line_from_the_command(small, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    _poke_bin(data)
    res = _nmt("nmt-train", data, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--max-updates", "1",
               "--threads", "1")
    _one_line_error(res, "nmt-train", f"{data / 'train.fr.bin'}: sentence 1 holds token id 60000")


def test_damaged_preprocessing_is_refused_before_training_not_after(small, tmp_path):
    """Found only when a checkpoint is saved, an unknown setting was a traceback at the first save (and damaged BPE
    codes trained to the end, for nmt-translate to refuse every checkpoint)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(small, data)
    _damage_manifest(data, lambda m: m["preprocessing"]["en"].update(stemming=True))
    res = _nmt("nmt-train", data, "-a", "rnnsearch-tiny", "--save-dir", tmp_path / "run", "--max-updates", "2",
               "--valid-every", "1", "--valid-bleu-sentences", "0", "--threads", "1")
    _one_line_error(res, "nmt-train", f"{data / 'manifest.json'}: malformed manifest: 'preprocessing.en' is not "
                                      "understood: unknown text preprocessing setting(s): stemming")
    assert not (tmp_path / "run").exists()
