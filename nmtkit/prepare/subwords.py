"""Step 2 of the preparation: the subword segmentation, joint over both languages.

Learned on the training words (subword-nmt BPE codes, or a SentencePiece model), given (``--bpe-codes``,
``--spm-model``, checked before anything else is read), or inherited with the vocabularies from another prepared
directory (``--vocab-from``).  The segmentation travels as :class:`nmtkit.data.text.TextConfig` fields and is
written into the prepared directory as ``bpe.codes`` or ``spm.model``.
"""

from __future__ import annotations

import base64
import logging
import os
from collections import Counter
from collections.abc import Iterator

from nmtkit.errors import InputError
from nmtkit.files import BOM
from nmtkit.data.text import BPE_SEPARATOR, learn_bpe_codes, learn_spm_model, spm_processor
from nmtkit.prepare.config import PrepareConfig

log = logging.getLogger("nmtkit.prepare")

SUBWORD_FIELDS = ("bpe_codes", "spm_model")  # (the TextConfig fields that hold a segmentation model)


def read_tokens(path: str) -> Iterator[list[str]]:
    """The lines of a tokenised file (one space between tokens) as token lists."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line[:-1] if line.endswith("\n") else line
            yield line.split(" ") if line else []


def vocabs_from(directory: str, src: str, tgt: str, text_cfg: dict) -> tuple[dict, dict, float]:
    """The vocabularies, subword segmentation and BPE-dropout of another prepared directory (same languages and
    text settings)."""
    from nmtkit.data.manifest import PreparedData

    other = PreparedData.open(directory)
    if (other.source_lang, other.target_lang) != (src, tgt):
        raise InputError(f"is a {other.source_lang}-{other.target_lang} corpus, not {src}-{tgt}", directory)
    subwords: dict = {}
    for lang in (src, tgt):
        theirs = other.text_config(lang)
        subwords = {k: getattr(theirs, k) for k in SUBWORD_FIELDS if getattr(theirs, k) is not None}
        mine = {k: v for k, v in text_cfg[lang].to_dict().items() if k not in SUBWORD_FIELDS}
        differ = [f"{k} {theirs.to_dict()[k]!r} there, {v!r} here" for k, v in mine.items()
                  if theirs.to_dict()[k] != v]
        if differ:
            raise InputError(f"its {lang} text settings differ ({', '.join(differ)}); prepare with the same "
                             "--lowercase/--no-normalize/--aggressive-dash-splits", directory)
    dropout = (other.manifest.get("bpe") or {}).get("dropout", 0.0)
    return {lang: other.vocab(lang) for lang in (src, tgt)}, subwords, dropout


def given_subwords(cfg: PrepareConfig) -> dict:
    """The BPE codes or SentencePiece model named by ``--bpe-codes``/``--spm-model``, read and checked."""
    if cfg.bpe_codes is not None:
        try:
            with open(cfg.bpe_codes, encoding="utf-8", newline="") as f:
                codes = f.read().removeprefix(BOM.decode("utf-8"))  # a byte-order mark at the start is not text
        except (FileNotFoundError, IsADirectoryError):
            raise InputError("no such file (BPE codes)", cfg.bpe_codes) from None
        except UnicodeDecodeError as e:
            raise InputError(f"invalid UTF-8 at byte {e.start} (BPE codes)", cfg.bpe_codes) from None
        check_bpe_codes(codes, cfg.bpe_codes)
        return {"bpe_codes": codes}
    if cfg.spm_model is not None:
        try:
            with open(cfg.spm_model, "rb") as f:
                model = base64.b64encode(f.read()).decode("ascii")
        except (FileNotFoundError, IsADirectoryError):
            raise InputError("no such file (SentencePiece model)", cfg.spm_model) from None
        try:
            spm_processor(model)
        except ValueError as e:
            raise InputError(str(e), cfg.spm_model) from None
        return {"spm_model": model}
    return {}


def subword_segmentation(cfg: PrepareConfig, out: str, splits: dict, given: dict) -> tuple[dict, dict | None]:
    """Step 2: the TextConfig fields of the segmentation (learned on the training words of both languages, or
    ``given``) and its manifest entry; the model is written into the prepared directory (``bpe.codes`` or
    ``spm.model``).  ({}, None) on the word-level path."""
    src, tgt = cfg.source_lang, cfg.target_lang
    train_words = [os.path.join(out, f"train.tok.{lang}") for lang in (src, tgt)]
    subwords = dict(given)
    if cfg.bpe_merges is not None:
        word_counts: Counter = Counter()
        for path in train_words:
            for words in read_tokens(path):
                word_counts.update(words)
        codes = learn_bpe_codes(word_counts, cfg.bpe_merges)
        if not codes.partition("\n")[2].strip():
            raise InputError(f"no BPE merge could be learned (no pair of symbols occurs twice in the "
                             f"{len(word_counts)} training word types); drop --bpe-merges", splits["train"][0][0])
        log.info("learned %d BPE merges on %d training word types", cfg.bpe_merges, len(word_counts))
        subwords = {"bpe_codes": codes}
    if cfg.spm_vocab_size is not None:
        def lines():
            for path in train_words:
                with open(path, encoding="utf-8", newline="\n") as f:
                    yield from (line.rstrip("\n") for line in f)
        try:
            subwords = {"spm_model": learn_spm_model(lines(), cfg.spm_vocab_size, cfg.spm_type,
                                                         split_digits=cfg.spm_split_digits)}
        except ValueError as e:
            raise InputError(f"no SentencePiece model of {cfg.spm_vocab_size} units could be learned ({e}); "
                             "lower --spm-vocab-size", splits["train"][0][0]) from None
        log.info("learned a SentencePiece %s model of %d units on the training words", cfg.spm_type,
                 cfg.spm_vocab_size)
    given_from = cfg.bpe_codes or cfg.spm_model or cfg.vocab_from
    if "bpe_codes" in subwords:
        with open(os.path.join(out, "bpe.codes"), "w", encoding="utf-8", newline="\n") as f:
            f.write(subwords["bpe_codes"])
        return subwords, {"kind": "bpe", "codes_file": "bpe.codes", "learned_merges": cfg.bpe_merges,
                          "given_codes": given_from, "separator": BPE_SEPARATOR, "joint": True}
    if "spm_model" in subwords:
        with open(os.path.join(out, "spm.model"), "wb") as f:
            f.write(base64.b64decode(subwords["spm_model"]))
        return subwords, {"kind": "sentencepiece", "model_file": "spm.model",
                          "learned_units": cfg.spm_vocab_size,
                          "model_type": cfg.spm_type if cfg.spm_vocab_size is not None else None,
                          "split_digits": cfg.spm_split_digits if cfg.spm_vocab_size is not None else None,
                          "given_model": given_from, "joint": True}
    return {}, None


def check_bpe_codes(codes: str, path: str) -> None:
    """Check a subword-nmt codes file as subword-nmt reads it: it reports problems with ``sys.exit()`` and a
    two-line message of its own, so check first and report them as an InputError naming the line."""
    first, _, rest = codes.partition("\n")
    body, offset = codes, 1
    if first.startswith("#version:"):
        version = first.split()[-1]
        if not all(part.isascii() and part.isdigit() for part in version.split(".")):
            raise InputError(f"bad version line {first!r} (a subword-nmt codes file)", path, 1)
        body, offset = rest, 2
    for n, item in enumerate(body.rstrip("\n").split("\n")):
        if len(item.strip("\r\n ").split(" ")) != 2:
            raise InputError("expected a merge: two symbols separated by one space (a subword-nmt codes file)",
                             path, n + offset)

