"""The prepared-corpus directory: ``manifest.json`` and how to open what it lists.

``nmt-prepare`` writes a directory ``DIR`` holding::

    manifest.json              this format's description of everything below (see :func:`load`)
    vocab.<src>, vocab.<tgt>   the shortlists (nmtkit.vocab format)
    bpe.codes                  subword-nmt codes, when BPE is used (shared by both languages)
    <split>.<lang>.idx/.bin    the binarized corpus of each split (nmtkit.corpus format)
    <split>.tok.<lang>         Moses-tokenised words of every input line of the split, for scoring and inspection
    train.kept                 for each training pair that passed the filters, its 1-based input line number

Splits are ``train`` (all ``--train`` inputs concatenated, filtered), ``valid`` and ``test``, ``test1``, …
(never filtered, never reordered: sentence *i* is input line *i*).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from nmtkit.corpus import Corpus
from nmtkit.errors import InputError
from nmtkit.text import TextConfig
from nmtkit.vocab import Vocabulary

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
    return manifest


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
        return Vocabulary.load(self.path(self.manifest["vocab"][lang]["file"]))

    def corpus(self, split: str, lang: str) -> Corpus:
        if split not in self.manifest["splits"]:
            raise InputError(f"no split '{split}' (this corpus has: {', '.join(self.splits)})", self.directory)
        return Corpus(self.path(f"{split}.{lang}"))

    def text_config(self, lang: str) -> TextConfig:
        """The full preprocessing of one language, BPE codes included: what a checkpoint must carry."""
        settings = dict(self.manifest["preprocessing"][lang])
        bpe = self.manifest.get("bpe")
        if bpe is not None:
            with open(self.path(bpe["codes_file"]), encoding="utf-8", newline="") as f:
                settings["bpe_codes"] = f.read()
        return TextConfig.from_dict(settings)
