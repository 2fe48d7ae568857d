"""The prepared-corpus directory: ``manifest.json`` and how to open what it lists.

``nmt-prepare`` writes a directory ``DIR`` holding::

    manifest.json              this format's description of everything below (see :func:`load`)
    vocab.<src>, vocab.<tgt>   the shortlists (nmtkit.data.vocab format)
    bpe.codes                  subword-nmt codes, when BPE is used (shared by both languages)
    spm.model                  the SentencePiece model, when SentencePiece is used (shared by both languages)
    <split>.<lang>.idx/.bin    the binarized corpus of each split (nmtkit.data.corpus format)
    <split>.tok.<lang>         Moses-tokenised words of every input line of the split, for scoring and inspection
    train.kept                 for each training pair that passed the filters, its 1-based input line number

Splits are ``train`` (all ``--train`` inputs concatenated, filtered), ``valid`` and ``test``, ``test1``, …
(never filtered, never reordered: sentence *i* is input line *i*).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from nmtkit.data.corpus import Corpus
from nmtkit.errors import InputError
from nmtkit.data.text import TextConfig
from nmtkit.data.vocab import Vocabulary

FORMAT_NAME = "nmtkit-prepared-corpus"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def dumps(manifest: dict) -> str:
    """The canonical text of a manifest (sorted keys, so equal manifests are equal bytes)."""
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load(directory: str | os.PathLike) -> dict:
    """Read and check ``DIR/manifest.json``; an unknown format or version is an InputError."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise InputError("no manifest.json: not a directory made by nmt-prepare", directory) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"corrupt manifest: {e}", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise InputError(f"not an nmtkit prepared-corpus manifest (format should be '{FORMAT_NAME}')", path)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise InputError(f"prepared-corpus format version {version} is not understood (this nmtkit reads "
                         f"version {FORMAT_VERSION}); prepare the data again with this nmtkit", path)
    _check_fields(manifest, path)
    return manifest


def _check_fields(manifest: dict, path: str) -> None:
    """Every field the tools read, present and of its type: a damaged manifest is one line naming the field."""
    def bad(field: str, problem: str):
        return InputError(f"malformed manifest: {field} {problem}", path)

    langs = []
    for key in ("source_lang", "target_lang"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise bad(f"'{key}'", "is missing or not a language code")
        langs.append(manifest[key])
    if not isinstance(manifest.get("splits"), dict) or not manifest["splits"]:
        raise bad("'splits'", "is missing or empty")
    for key in ("vocab", "preprocessing"):
        if not isinstance(manifest.get(key), dict):
            raise bad(f"'{key}'", "is missing or not a dict")
        for lang in langs:
            if not isinstance(manifest[key].get(lang), dict):
                raise bad(f"'{key}'", f"has no entry for '{lang}', a language the manifest names "
                                       f"(it has: {', '.join(map(str, manifest[key])) or 'none'})")
    for lang in langs:
        entry = manifest["vocab"][lang]
        if not isinstance(entry.get("file"), str):
            raise bad(f"'vocab.{lang}.file'", "is missing")
        if "size" in entry and (not isinstance(entry["size"], int) or entry["size"] < 1):
            raise bad(f"'vocab.{lang}.size'", "is not a positive integer")


@dataclass
class PreparedData:
    """A prepared directory opened for training or evaluation."""

    directory: str
    manifest: dict

    @classmethod
    def open(cls, directory: str | os.PathLike) -> PreparedData:
        return cls(os.fspath(directory), load(directory))

    @property
    def source_lang(self) -> str:
        return self.manifest["source_lang"]

    @property
    def target_lang(self) -> str:
        return self.manifest["target_lang"]

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def vocab(self, lang: str) -> Vocabulary:
        path = self.path(self.manifest["vocab"][lang]["file"])
        vocab = Vocabulary.load(path)
        size = self.manifest["vocab"][lang].get("size")
        if size is not None and len(vocab) != size:
            raise InputError(f"holds {len(vocab)} entries, the manifest says {size} (a line lost or added since "
                             "nmt-prepare wrote it)", path)
        return vocab

    def corpus(self, split: str, lang: str) -> Corpus:
        """A split's binarized corpus of one language, its ids checked against the vocabulary's size."""
        if split not in self.manifest["splits"]:
            raise InputError(f"no split '{split}' (this corpus has: {', '.join(self.splits)})", self.directory)
        corpus = Corpus(self.path(f"{split}.{lang}"))
        size = self.manifest["vocab"].get(lang, {}).get("size")
        if size is not None:
            corpus.check_ids(size)
        return corpus

    def text_config(self, lang: str) -> TextConfig:
        """The full preprocessing of one language, its subword model included: what a checkpoint must carry."""
        import base64

        settings = dict(self.manifest["preprocessing"][lang])
        bpe = self.manifest.get("bpe")
        if bpe is not None:
            with open(self.path(bpe["codes_file"]), encoding="utf-8", newline="") as f:
                settings["bpe_codes"] = f.read()
        spm = self.manifest.get("sentencepiece")
        if spm is not None:
            with open(self.path(spm["model_file"]), "rb") as f:
                settings["spm_model"] = base64.b64encode(f.read()).decode("ascii")
        return TextConfig.from_dict(settings)
