"""Raw parallel text → a prepared directory that training reads (the library behind ``nmt-prepare``).

The pipeline, streaming so that memory is bounded by the vocabulary counts, not by the corpus (but for the candidate
table of step 5, which samples at most 20 million source × target token pairs: about 1.1 GB):

1. **Tokenise** every split (``--workers`` processes, results kept in input order): Moses punctuation
   normalisation and tokenisation, optional lowercasing → ``<split>.tok.<lang>``, one line per input line.
2. **Subwords** (optional): learn joint BPE codes on the training words (subword-nmt) or a joint SentencePiece
   model on them, or take the given codes or model.
3. **Filter and count**: training pairs with an empty side or a side longer than ``max_len`` model tokens are
   removed (counted per reason); valid and test sets are never filtered. Token counts of the kept training pairs
   give the shortlists (:meth:`nmtkit.data.vocab.Vocabulary.build`).
4. **Binarize** each split and language (:mod:`nmtkit.data.corpus`), record coverage.
5. **Candidates**: the table of likely translations ``nmt-translate --candidates`` decodes with
   (:mod:`nmtkit.data.candidates`, ``candidates.npz``); then ``manifest.json``.

Everything is built in a temporary sibling of the destination and renamed into place at the end; the same inputs
and settings give byte-identical outputs, whatever the number of workers.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator

from nmtkit import __version__
from nmtkit.data import candidates, manifest as manifest_format
from nmtkit.data.corpus import Corpus, CorpusWriter, dtype_for_vocab
from nmtkit.data.text import Preprocessor, TextConfig
from nmtkit.data.vocab import Vocabulary
from nmtkit.errors import InputError
from nmtkit.files import WRITE_ERRORS, atomic_dir, is_sgml, read_parallel, resolve_prefix
from nmtkit.parallel import CHUNK, Mapper
from nmtkit.prepare.config import PrepareConfig
from nmtkit.progress import Ticker
from nmtkit.prepare.subwords import given_subwords, read_tokens, subword_segmentation, vocabs_from

log = logging.getLogger("nmtkit.prepare")

__all__ = ["CHUNK", "PrepareConfig", "prepare"]


# -- parallel tokenisation ---------------------------------------------------------------------------------------

_worker_state: dict = {}


def _init_worker(src_cfg: dict, tgt_cfg: dict) -> None:
    _worker_state["pre"] = (Preprocessor(TextConfig.from_dict(src_cfg)), Preprocessor(TextConfig.from_dict(tgt_cfg)))


def _tokenize_chunk(pairs: list[tuple[str, str]]) -> list[tuple[list[str], list[str]]]:
    src, tgt = _worker_state["pre"]
    return [(src.words(s), tgt.words(t)) for s, t in pairs]


def _subword_chunk(pairs: list[tuple[list[str], list[str]]]) -> list[tuple[list[str], list[str]]]:
    src, tgt = _worker_state["pre"]
    return [(src.subwords(s), tgt.subwords(t)) for s, t in pairs]


class _Mapper(Mapper):
    """The shared ordered process pool (:class:`nmtkit.parallel.Mapper`) with the two languages' preprocessors."""

    def __init__(self, workers: int, src_cfg: TextConfig, tgt_cfg: TextConfig):
        super().__init__(workers, _init_worker, (src_cfg.to_dict(), tgt_cfg.to_dict()), CHUNK)

    def __exit__(self, exc_type, *exc) -> None:
        super().__exit__(exc_type, *exc)
        _worker_state.clear()


# -- the pipeline --------------------------------------------------------------------------------------------------


def _read_split(files: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    for src_path, tgt_path in files:
        for s, t in read_parallel(src_path, tgt_path):
            yield s.text, t.text


def prepare(cfg: PrepareConfig) -> dict:
    """Run the whole preparation; returns the manifest written to ``cfg.dest/manifest.json``."""
    cfg.check()
    src, tgt = cfg.source_lang, cfg.target_lang
    splits: dict[str, list[tuple[str, str]]] = {"train": [resolve_prefix(p, src, tgt) for p in cfg.train]}
    if cfg.valid is not None:
        splits["valid"] = [resolve_prefix(cfg.valid, src, tgt)]
    for i, prefix in enumerate(cfg.test):
        splits["test" if i == 0 else f"test{i}"] = [resolve_prefix(prefix, src, tgt)]
    subwords = given_subwords(cfg)  # {"bpe_codes": ..., "spm_model": ...} when given, else {}
    text_cfg = {lang: TextConfig(lang, cfg.normalize_punctuation, cfg.aggressive_dash_splits, cfg.lowercase)
                for lang in (src, tgt)}
    given_vocabs, inherited_dropout = None, 0.0
    if cfg.vocab_from is not None:  # (a corpus to fine-tune a model of that directory on: the same ids)
        given_vocabs, subwords, inherited_dropout = vocabs_from(cfg.vocab_from, src, tgt, text_cfg)

    out = None
    try:
        with atomic_dir(cfg.dest, force=cfg.force, marker=manifest_format.MANIFEST, kind="a prepared corpus") as out:
            return _prepare_in(out, cfg, splits, subwords, text_cfg, given_vocabs, inherited_dropout)
    except OSError as e:  # (a full disk: the temporary directory is gone, DEST is as it was; say which output failed)
        if e.errno not in WRITE_ERRORS:
            raise
        raise InputError(f"cannot write: {os.strerror(e.errno).lower()}; nothing was written", cfg.dest) from None
    except InputError as e:  # (a file of the temporary directory named: name it as it would have been in DEST)
        if out is None or e.path is None or not e.path.startswith(out + os.sep):
            raise
        raise InputError(e.message, os.path.join(cfg.dest, os.path.relpath(e.path, out)), e.line) from None


def _prepare_in(out: str, cfg: PrepareConfig, splits, subwords, text_cfg, given_vocabs, inherited_dropout) -> dict:
    """The preparation's steps, building the prepared directory in ``out`` (a temporary one)."""
    src, tgt = cfg.source_lang, cfg.target_lang
    stats: dict[str, dict] = {}
    # 1. tokenise every split into words (each step says when it starts, and a long one how far it is: progress.Ticker)
    log.info("step 1/5: tokenising %s (%d worker%s)", ", ".join(splits), cfg.workers, "s" * (cfg.workers != 1))
    with _Mapper(cfg.workers, text_cfg[src], text_cfg[tgt]) as mapper:
        for split, files in splits.items():
            stats[split] = _tokenize_split(mapper, files, out, split, src, tgt)
            log.info("%s: %d pairs read and tokenised", split, stats[split]["lines_in"])
            if split == "valid" and stats[split]["lines_in"] == 0:
                raise InputError("is empty: a validation set needs at least one pair", files[0][0])

    # 2. subword segmentation: learned jointly on the training words, or given
    log.info("step 2/5: subwords: %s", f"learning {cfg.bpe_merges:,} joint BPE merges" if cfg.bpe_merges is not None
             else f"learning a joint SentencePiece model of {cfg.spm_vocab_size:,} units"
             if cfg.spm_vocab_size is not None else "the given ones" if subwords else "none (words)")
    subwords, subword_info = subword_segmentation(cfg, out, splits, subwords)
    model_cfg = {lang: TextConfig(**{**c.to_dict(), **subwords}) for lang, c in text_cfg.items()}

    # 3. model tokens, filtering (train only) and counts; 4. vocabularies and binarized corpora
    log.info("step 3/5: %sfiltering and counting the model tokens", "segmenting into subwords, " * bool(subwords))
    with _Mapper(cfg.workers if subwords else 1, model_cfg[src], model_cfg[tgt]) as mapper:
        counts = {}
        for split in splits:
            counts[split] = _filter_and_count(mapper, out, split, src, tgt, stats[split],
                                              cfg.max_len if split == "train" else None,
                                              cfg.max_ratio, cfg.dedup, whole=split == "valid")
        shortlist_counts = counts["train"]
        if cfg.bpe_dropout:  # the units BPE-dropout makes must be in the shortlists too
            shortlist_counts = _dropout_counts(mapper, out, src, tgt, cfg.bpe_dropout, counts["train"])
            subword_info["dropout"] = cfg.bpe_dropout
    if inherited_dropout:  # (--vocab-from: the shortlists were made for that directory's BPE-dropout)
        subword_info["dropout"] = inherited_dropout
    vocabs = given_vocabs or {src: Vocabulary.build(shortlist_counts[0], cfg.shortlist(src)),
                              tgt: Vocabulary.build(shortlist_counts[1], cfg.shortlist(tgt))}
    for lang, vocab in vocabs.items():
        vocab.save(os.path.join(out, f"vocab.{lang}"))
    log.info("step 4/5: binarizing %s", ", ".join(splits))
    for split in splits:
        for k, lang in enumerate((src, tgt)):
            _binarize(os.path.join(out, f".{split}.model.{lang}"), os.path.join(out, f"{split}.{lang}"),
                      vocabs[lang])
            stats[split]["coverage"][lang] = round(vocabs[lang].coverage(counts[split][k]), 6)
    # 5. the candidate table nmt-translate --candidates decodes with (nmtkit.data.candidates)
    log.info("step 5/5: the candidate table of likely translations (nmt-translate --candidates)")
    table = candidates.build(Corpus(os.path.join(out, f"train.{src}")), Corpus(os.path.join(out, f"train.{tgt}")),
                             vocabs[src].tokens, vocabs[tgt].tokens)
    candidates.save(table, os.path.join(out, candidates.FILE))
    manifest = _manifest(cfg, splits, stats, vocabs, counts["train"], model_cfg, subword_info)
    with open(os.path.join(out, manifest_format.MANIFEST), "w", encoding="utf-8", newline="\n") as f:
        f.write(manifest_format.dumps(manifest))
    _report(manifest)
    return manifest


def _tokenize_split(mapper: _Mapper, files, out: str, split: str, src: str, tgt: str) -> dict:
    n = 0
    with open(os.path.join(out, f"{split}.tok.{src}"), "w", encoding="utf-8", newline="\n") as fs, \
         open(os.path.join(out, f"{split}.tok.{tgt}"), "w", encoding="utf-8", newline="\n") as ft:
        with Ticker(log, f"{split}: tokenising", "pairs") as ticker:
            for s_words, t_words in mapper.map(_tokenize_chunk, _read_split(files)):
                fs.write(" ".join(s_words) + "\n")
                ft.write(" ".join(t_words) + "\n")
                n += 1
                ticker.update()
    return {"inputs": [list(f) for f in files], "lines_in": n, "coverage": {}}


def _filter_and_count(mapper: _Mapper, out: str, split: str, src: str, tgt: str, stats: dict,
                      max_len: int | None, max_ratio: float | None = None, dedup: bool = False, whole: bool = False
                      ) -> tuple[Counter, Counter]:
    """Write the model tokens of the kept lines to hidden files; return the token counts per language.  With
    ``max_len`` (the training split) pairs with an empty side, longer than ``max_len`` tokens, with a length ratio
    above ``max_ratio`` (clean-corpus-n.perl's) or repeating an earlier pair (``dedup``) are left out, counted.
    With ``whole`` (the validation split, which a model scores whole) a side longer than MAX_EVAL_TOKENS is an
    error naming its input line."""
    import hashlib

    src_counts, tgt_counts = Counter(), Counter()
    empty = too_long = kept = ratio = duplicate = 0
    seen: set[int] = set()  # (8-byte digests of the kept pairs: ~60 bytes of memory per pair)
    pairs = zip(read_tokens(os.path.join(out, f"{split}.tok.{src}")), read_tokens(os.path.join(out, f"{split}.tok.{tgt}")))
    kept_file = open(os.path.join(out, "train.kept"), "w", encoding="utf-8", newline="\n") if max_len else None
    with open(os.path.join(out, f".{split}.model.{src}"), "w", encoding="utf-8", newline="\n") as fs, \
         open(os.path.join(out, f".{split}.model.{tgt}"), "w", encoding="utf-8", newline="\n") as ft, \
         Ticker(log, f"{split}: model tokens", "pairs", stats["lines_in"]) as ticker:
        for line, (s, t) in enumerate(mapper.map(_subword_chunk, pairs), start=1):
            ticker.update()
            if whole and max(len(s), len(t)) > manifest_format.MAX_EVAL_TOKENS:
                side = 0 if len(s) >= len(t) else 1  # (the longer side's input file is named)
                _too_long_to_score(stats["inputs"][0][side], line, max(len(s), len(t)))
            if max_len is not None:
                if not s or not t:
                    empty += 1
                    continue
                if len(s) > max_len or len(t) > max_len:
                    too_long += 1
                    continue
                if max_ratio is not None and max(len(s), len(t)) > max_ratio * min(len(s), len(t)):
                    ratio += 1
                    continue
                if dedup:
                    key = int.from_bytes(hashlib.blake2b(("\t".join((" ".join(s), " ".join(t)))).encode(),
                                                         digest_size=8).digest(), "little")
                    if key in seen:
                        duplicate += 1
                        continue
                    seen.add(key)
                kept_file.write(f"{line}\n")
            kept += 1
            src_counts.update(s)
            tgt_counts.update(t)
            fs.write(" ".join(s) + "\n")
            ft.write(" ".join(t) + "\n")
    if kept_file is not None:
        kept_file.close()
    stats.update(lines_out=kept, tokens={src: sum(src_counts.values()), tgt: sum(tgt_counts.values())})
    if max_len is not None:
        removed = {"empty": empty, "too_long": too_long}
        if max_ratio is not None:
            removed["ratio"] = ratio
        if dedup:
            removed["duplicate"] = duplicate
        stats.update(removed=removed, kept_lines_file="train.kept")
        if kept == 0:
            raise InputError(f"no training pair is left after filtering ({empty} had an empty side, {too_long} "
                             f"were longer than {max_len} tokens)", stats["inputs"][0][0])
    return src_counts, tgt_counts


def _too_long_to_score(path: str, line: int, tokens: int) -> None:
    limit = manifest_format.MAX_EVAL_TOKENS
    where = (f"segment {line} is", None) if is_sgml(path) else ("is", line)
    raise InputError(f"{where[0]} {tokens:,} model tokens long, more than the {limit:,} a validation pair may have "
                     "(validation scores and decodes each pair whole): shorten or remove it", path, where[1])


def _dropout_chunk(items: list[tuple[int, list[str], list[str], float]]) -> list[tuple[list[str], list[str]]]:
    from nmtkit.data.bpedropout import BPEDropout, sentence_rng

    p = items[0][3] if items else 0.0
    if _worker_state.get("dropout", (None,))[0] != p:
        src, tgt = _worker_state["pre"]
        _worker_state["dropout"] = (p, BPEDropout(src.config.bpe_codes, p), BPEDropout(tgt.config.bpe_codes, p))
    _, src_bpe, tgt_bpe = _worker_state["dropout"]
    return [(src_bpe.words(s, sentence_rng(0, -1, k, 0)), tgt_bpe.words(t, sentence_rng(0, -1, k, 1)))
            for k, s, t, _ in items]


def _dropout_counts(mapper: _Mapper, out: str, src: str, tgt: str, p: float, counts: tuple[Counter, Counter]
                    ) -> tuple[Counter, Counter]:
    """The training token counts plus those of one BPE-dropout segmentation of the kept training pairs (drawn as
    epoch -1 of seed 0), so that the shortlists hold the units that training with BPE-dropout will meet."""
    with open(os.path.join(out, "train.kept"), encoding="utf-8") as f:
        kept = {int(line) for line in f}
    pairs = zip(read_tokens(os.path.join(out, f"train.tok.{src}")), read_tokens(os.path.join(out, f"train.tok.{tgt}")))
    items = ((k, s, t, p) for k, (s, t) in enumerate((s, t) for n, (s, t) in enumerate(pairs, start=1) if n in kept))
    src_counts, tgt_counts = Counter(counts[0]), Counter(counts[1])
    for s_units, t_units in mapper.map(_dropout_chunk, items):
        src_counts.update(s_units)
        tgt_counts.update(t_units)
    log.info("BPE-dropout %g: the shortlists also count one dropout segmentation of the training pairs", p)
    return src_counts, tgt_counts


def _binarize(model_path: str, prefix: str, vocab: Vocabulary) -> None:
    with CorpusWriter(prefix, dtype_for_vocab(len(vocab))) as writer:
        for tokens in read_tokens(model_path):
            writer.add(vocab.encode(tokens))
    os.unlink(model_path)


def _manifest(cfg: PrepareConfig, splits, stats, vocabs, train_counts, model_cfg, subword_info) -> dict:
    src, tgt = cfg.source_lang, cfg.target_lang
    # (the codes and the model live in their own files: bpe.codes, spm.model)
    preprocessing = {lang: {**{k: v for k, v in c.to_dict().items() if k != "spm_model"}, "bpe_codes": None}
                     for lang, c in model_cfg.items()}
    import sacremoses
    import subword_nmt

    kind = subword_info and subword_info["kind"]
    if kind == "sentencepiece":
        import sentencepiece

    return {
        "format": manifest_format.FORMAT_NAME,
        "format_version": manifest_format.FORMAT_VERSION,
        "nmtkit_version": __version__,
        "source_lang": src,
        "target_lang": tgt,
        "preprocessing": preprocessing,
        "tools": {"sacremoses": getattr(sacremoses, "__version__", "unknown"),
                  "subword_nmt": getattr(subword_nmt, "__version__", "unknown") if kind == "bpe" else None,
                  "sentencepiece": sentencepiece.__version__ if kind == "sentencepiece" else None},
        "bpe": subword_info if kind == "bpe" else None,
        "sentencepiece": subword_info if kind == "sentencepiece" else None,
        "filters": {"max_len": cfg.max_len, "unit": "model tokens (subword units with BPE or SentencePiece)", "splits": ["train"],
                    "remove_empty": True, "max_ratio": cfg.max_ratio, "dedup": cfg.dedup},
        "vocab": {
            lang: {"file": f"vocab.{lang}", "shortlist": size, "size": len(vocabs[lang]),
                   "specials": ["<pad>", "<unk>", "<s>", "</s>"], "types_in_training": len(train_counts[k]),
                   "dtype": str(dtype_for_vocab(len(vocabs[lang])))}
            for k, (lang, size) in enumerate(((src, len(vocabs[src]) - 4 if cfg.vocab_from else cfg.shortlist(src)),
                                              (tgt, len(vocabs[tgt]) - 4 if cfg.vocab_from else cfg.shortlist(tgt))))
        },
        "splits": stats,
    }


def _report(manifest: dict) -> None:
    src, tgt = manifest["source_lang"], manifest["target_lang"]
    for split, s in manifest["splits"].items():
        removed = s.get("removed")
        extra = (f", removed {removed['empty']} with an empty side and {removed['too_long']} longer than "
                 f"{manifest['filters']['max_len']} tokens") if removed else ""
        if removed and "ratio" in removed:
            extra += f", {removed['ratio']} with a length ratio above {manifest['filters']['max_ratio']:g}"
        if removed and "duplicate" in removed:
            extra += f", {removed['duplicate']} repeating an earlier pair"
        log.info("%s: %d pairs in, %d out%s; coverage %s %.2f%%, %s %.2f%%", split, s["lines_in"], s["lines_out"],
                 extra, src, 100 * s["coverage"][src], tgt, 100 * s["coverage"][tgt])
    for lang, v in manifest["vocab"].items():
        log.info("vocab.%s: %d entries (%d shortlist + 4 specials) of %d training types", lang, v["size"],
                 v["size"] - 4, v["types_in_training"])
