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
(never filtered, never reordered: sentence *i* is input line *i*).  Validation decodes and scores each ``valid``
pair whole, so that split holds at least one pair, of at most :data:`MAX_EVAL_TOKENS` model tokens a side.
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
# the most model tokens a side of a pair that a model scores whole (validation, nmt-score -m's NLL): teacher forcing
# holds a source x target attention matrix per pair, so a 200,000-token line would ask for a terabyte
MAX_EVAL_TOKENS = 1000


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
        """Open a prepared directory, its manifest and both languages' preprocessing checked (:meth:`text_config`):
        a damaged one is refused here, before a run starts, not when a checkpoint is saved or read."""
        data = cls(os.fspath(directory), load(directory))
        for lang in (data.source_lang, data.target_lang):
            data.text_config(lang)
        return data

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
        """A split's binarized corpus of one language, its ids checked against the vocabulary's size (and the
        ``valid`` split's sentences against :data:`MAX_EVAL_TOKENS`: refused before a run, not at its first
        validation)."""
        if split not in self.manifest["splits"]:
            raise InputError(f"no split '{split}' (this corpus has: {', '.join(self.splits)})", self.directory)
        corpus = Corpus(self.path(f"{split}.{lang}"))
        size = self.manifest["vocab"].get(lang, {}).get("size")
        if size is not None:
            corpus.check_ids(size)
        if split == "valid":
            check_eval_lengths(corpus.sizes, self.path(f"{split}.{lang}.idx"), "the validation set")
        return corpus

    def text_config(self, lang: str) -> TextConfig:
        """The full preprocessing of one language, its subword model included: what a checkpoint must carry.  An
        unknown setting, BPE codes that are not subword-nmt's or a file that is not a SentencePiece model is an
        InputError naming the manifest or the file."""
        from nmtkit.data.text import bpe_codes_problem, spm_processor

        settings = dict(self.manifest["preprocessing"][lang])
        where = self.path(MANIFEST)  # (the file the subword model came from, for messages)
        bpe = self.manifest.get("bpe")
        if bpe is not None:
            where = self._subword_file(bpe, "bpe", "codes_file")
            try:
                settings["bpe_codes"] = self._read(where).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"damaged BPE codes: invalid UTF-8 at byte {e.start}", where) from None
        spm = self.manifest.get("sentencepiece")
        if spm is not None:
            import base64

            where = self._subword_file(spm, "sentencepiece", "model_file")
            settings["spm_model"] = base64.b64encode(self._read(where)).decode("ascii")
        try:
            config = TextConfig.from_dict(settings)
        except (TypeError, ValueError) as e:
            raise InputError(f"malformed manifest: 'preprocessing.{lang}' is not understood: {e}",
                             self.path(MANIFEST)) from None
        if config.bpe_codes is not None:
            problem = bpe_codes_problem(config.bpe_codes) if isinstance(config.bpe_codes, str) else "not text"
            if problem is not None:
                raise InputError(f"damaged BPE codes: {problem}", where)
        if config.spm_model is not None:
            try:
                spm_processor(config.spm_model)
            except (TypeError, ValueError) as e:
                raise InputError(f"damaged SentencePiece model: {e}", where) from None
        return config

    def _subword_file(self, entry, field: str, key: str) -> str:
        """The path of the subword model file the manifest's ``field`` entry names."""
        if not isinstance(entry, dict) or not isinstance(entry.get(key), str) or not entry[key]:
            raise InputError(f"malformed manifest: '{field}.{key}' is missing or not a file name", self.path(MANIFEST))
        return self.path(entry[key])

    def _read(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror}", path) from None


def check_eval_lengths(sizes, path: str, what: str) -> None:
    """Refuse ``what`` (sentence lengths ``sizes``, from ``path``) when it is empty or a sentence has more than
    :data:`MAX_EVAL_TOKENS` model tokens: a model scores each pair whole."""
    import numpy as np

    sizes = np.asarray(sizes)
    if len(sizes) == 0:
        raise InputError(f"{what} has no sentence: it needs at least one pair", path)
    longest = int(sizes.argmax())
    if sizes[longest] > MAX_EVAL_TOKENS:
        raise InputError(f"sentence {longest + 1} of {what} has {int(sizes[longest]):,} model tokens, more than the "
                         f"{MAX_EVAL_TOKENS:,} a pair scored whole may have: shorten or remove it", path)
