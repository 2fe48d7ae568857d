"""Text preprocessing, as Moses users know it: punctuation normalisation, tokenisation, lowercasing, subwords.

The paper tokenised with the Moses scripts and trained on words (a 30,000-word shortlist per language, no
subwords); that is the default path here. Two subword segmentations are optional, each shared by both languages:
byte-pair encoding (Sennrich et al., subword-nmt; units end in ``@@`` when a word goes on) and a SentencePiece
model (Kudo & Richardson; units that begin a word start with ``▁``). SentencePiece here segments the Moses words,
as BPE does, so that every tool (alignments, ``--replace-unk``, scoring) works on the same words whichever
segmentation is chosen; its model is learned with the identity normalisation, so that the units of a word join
back into exactly that word.

Everything a later tool needs to preprocess new input the same way, and to undo it on output, is recorded by
:meth:`Preprocessor.to_dict` (it goes into the prepared corpus's manifest and from there into checkpoints).
Moses escaping of ``& < > ' " [ ] |`` is never applied, so tokens are the characters of the text and
detokenisation needs no unescaping.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

BPE_SEPARATOR = "@@"
SPM_SPACE = "\u2581"  # "▁": SentencePiece's mark on the unit that begins a word
_SPM_ESCAPE = "\ue001"  # stands for a literal "▁" inside a word while SentencePiece sees it
UNK_TOKEN = "<unk>"  # how the unknown-word token is written in text (nmtkit.data.vocab.SPECIALS[1])
_UNK_PLACEHOLDER = "\ue000"  # a private-use character: Moses keeps it as a token of its own


@dataclass(frozen=True)
class TextConfig:
    """How one language's text is turned into tokens (all plain types: it is stored in manifests and checkpoints)."""

    lang: str
    normalize_punctuation: bool = True  # sacremoses' port of normalize-punctuation.perl
    aggressive_dash_splits: bool = False  # tokenizer.perl -a (splits "e-mail" into "e @-@ mail")
    lowercase: bool = False
    bpe_codes: str | None = None  # the text of a subword-nmt codes file, shared by both languages; None = words
    bpe_separator: str = BPE_SEPARATOR
    spm_model: str | None = None  # a SentencePiece model (base64 of its bytes), shared by both languages

    def to_dict(self) -> dict:
        """The settings as plain types; ``spm_model`` only when set (so that word and BPE settings read as before
        SentencePiece existed, by an older nmtkit too)."""
        d = asdict(self)
        if d["spm_model"] is None:
            del d["spm_model"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TextConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown text preprocessing setting(s): {', '.join(sorted(unknown))}")
        return cls(**d)


class Preprocessor:
    """Turns raw lines of one language into tokens and tokens back into text.

    >>> p = Preprocessor(TextConfig("en"))
    >>> p.words("Hello, world!")
    ['Hello', ',', 'world', '!']
    >>> p.detokenize(['Hello', ',', 'world', '!'])
    'Hello, world!'
    """

    def __init__(self, config: TextConfig):
        from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

        self.config = config
        self._normalizer = MosesPunctNormalizer(lang=config.lang) if config.normalize_punctuation else None
        self._tokenizer = MosesTokenizer(lang=config.lang)
        self._detokenizer = MosesDetokenizer(lang=config.lang)
        self._bpe = None
        if config.bpe_codes is not None:
            from subword_nmt.apply_bpe import BPE

            problem = bpe_codes_problem(config.bpe_codes)
            if problem is not None:  # (subword-nmt would print its own message and exit the process)
                raise ValueError(f"bad BPE codes: {problem}")
            self._bpe = BPE(io.StringIO(config.bpe_codes), separator=config.bpe_separator)
        self._spm = None
        if config.spm_model is not None:
            if config.bpe_codes is not None:
                raise ValueError("BPE codes and a SentencePiece model exclude each other")
            self._spm = spm_processor(config.spm_model)

    def words(self, line: str) -> list[str]:
        """Normalise, Moses-tokenise and (optionally) lowercase one line; never contains whitespace or line breaks.

        The unknown-word token ``<unk>`` (as written in translations) is kept as one token.
        """
        protect = UNK_TOKEN in line
        if protect:  # "<unk>" in our own output stays one token (Moses would split it into "<", "unk", ">")
            line = line.replace(UNK_TOKEN, f" {_UNK_PLACEHOLDER} ")
        if self._normalizer is not None:
            line = self._normalizer.normalize(line)
        tokens = self._tokenizer.tokenize(
            line, aggressive_dash_splits=self.config.aggressive_dash_splits, escape=False
        )
        # str.split() inside the tokenizer already split on every whitespace character (\r, U+2028, U+0085, ...).
        if protect:
            tokens = [UNK_TOKEN if t == _UNK_PLACEHOLDER else t for t in tokens]
        if self.config.lowercase:
            tokens = [t.lower() for t in tokens]
        return tokens

    @property
    def segmented(self) -> bool:
        """Whether model tokens are subword units (BPE or SentencePiece) rather than words."""
        return self._bpe is not None or self._spm is not None

    def subwords(self, words: list[str]) -> list[str]:
        """Segment words into units: BPE (``"un@@ believ@@ able"``) or SentencePiece (``"▁un believ able"``);
        the identity on the word-level path."""
        if self._spm is not None:
            if not words:
                return []
            escaped = [w.replace(SPM_SPACE, _SPM_ESCAPE) for w in words]
            return [unit for units in self._spm.encode(escaped, out_type=str) for unit in units]
        if self._bpe is None:
            return words
        return self._bpe.segment_tokens(words)

    def words_of(self, tokens: list[str]) -> tuple[list[str], list[int]]:
        """Model tokens → (words, index of the word each token belongs to): the inverse of :meth:`subwords`."""
        if self._spm is not None:
            return spm_words_of(tokens)
        if self._bpe is None:
            return list(tokens), list(range(len(tokens)))
        return words_of(tokens, self.config.bpe_separator)

    def tokenize(self, line: str) -> list[str]:
        """What the model sees for one raw line: :meth:`words` then :meth:`subwords`."""
        return self.subwords(self.words(line))

    def merge_subwords(self, tokens: list[str]) -> list[str]:
        """Undo the segmentation: join each word's units back into the word.

        Give it model tokens (units), never words already merged: it is not idempotent.  SentencePiece's words
        carry no ``▁``, so a second merge reads every word as the continuation of the one before and glues the
        sentence into one word (BPE's second merge is harmless only while no word ends in ``@@``)."""
        return self.words_of(tokens)[0] if self.segmented else tokens

    def detokenize(self, tokens: list[str]) -> str:
        """Model tokens (units) back to running text: merge subwords, then Moses detokenisation.

        This method owns the merge, so callers pass the units as the model wrote them, not merged words (see
        :meth:`merge_subwords`); on the word-level path units are words and the merge is the identity."""
        return self._detokenizer.detokenize(self.merge_subwords(tokens), return_str=True, unescape=False)


def words_of(tokens: list[str], sep: str = BPE_SEPARATOR) -> tuple[list[str], list[int]]:
    """Merge subword units into words: (words, index of the word each unit belongs to).

    >>> words_of(["un@@", "believ@@", "able", "man"])
    (['unbelievable', 'man'], [0, 0, 0, 1])
    """
    words, owner, pending = [], [], ""
    for tok in tokens:
        owner.append(len(words))
        if tok.endswith(sep):
            pending += tok[: -len(sep)]
        else:
            words.append(pending + tok)
            pending = ""
    if pending:
        words.append(pending)
    return words, owner


def spm_words_of(tokens: list[str]) -> tuple[list[str], list[int]]:
    """Join SentencePiece units into words: a unit starting with ``▁`` begins a word (a lone ``▁`` makes the unit
    after it begin one), any other continues the word before it; (words, index of the word each unit belongs to).

    >>> spm_words_of(["\u2581un", "believ", "able", "\u2581man"])
    (['unbelievable', 'man'], [0, 0, 0, 1])
    """
    words: list[str] = []
    owner: list[int] = []
    starts = True
    for tok in tokens:
        if tok.startswith(SPM_SPACE):
            starts, tok = True, tok[len(SPM_SPACE):]
        if not tok:  # a lone "▁" belongs to the word it begins
            owner.append(len(words))
            continue
        if starts or not words:
            words.append(tok)
            starts = False
        else:
            words[-1] += tok
        owner.append(len(words) - 1)
    last = max(len(words) - 1, 0)  # (a trailing lone "▁" begins no word: it joins the last one)
    return [w.replace(_SPM_ESCAPE, SPM_SPACE) for w in words], [min(o, last) for o in owner]


def spm_processor(model_b64: str):
    """A SentencePiece processor from a model's base64 text; ValueError if it is not a SentencePiece model."""
    import base64
    import binascii

    import sentencepiece

    try:
        proto = base64.b64decode(model_b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("the SentencePiece model is not base64 text") from None
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError):
        raise ValueError("not a SentencePiece model (its bytes do not parse)") from None
    if processor.get_piece_size() == 0:
        raise ValueError("not a SentencePiece model (no pieces)")
    return processor


def learn_spm_model(sentences: Iterable[str], vocab_size: int, model_type: str = "unigram",
                    split_digits: bool = False) -> str:
    """Learn a SentencePiece model of ``vocab_size`` units on lines of space-separated words (the Moses tokens of
    both languages); returns it as base64 text.  Identity normalisation (the words are already normalised, and
    every unit must join back into its word), all characters covered, one thread (the model must not depend on
    the number of threads); ``split_digits``: every digit a unit of its own.  ValueError with SentencePiece's
    reason when it cannot learn one (too few types)."""
    import base64

    import sentencepiece

    model = io.BytesIO()
    escaped = (line.replace(SPM_SPACE, _SPM_ESCAPE) for line in sentences)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=escaped, model_writer=model, vocab_size=vocab_size, model_type=model_type,
            character_coverage=1.0, normalization_rule_name="identity", split_digits=split_digits,
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=1, max_sentence_length=1 << 16,
            train_extremely_large_corpus=False, minloglevel=2)
    except RuntimeError as e:  # ("INTERNAL: src/trainer_interface.cc(744) [...] Vocabulary size too high ...")
        raise ValueError(str(e).strip().splitlines()[-1].rpartition("] ")[2]) from None
    return base64.b64encode(model.getvalue()).decode("ascii")


def bpe_codes_problem(codes: str) -> str | None:
    """What is wrong with the text of a subword-nmt codes file (None: nothing): after an optional ``#version``
    header, every line must be two subword units separated by whitespace."""
    for n, line in enumerate(codes.split("\n"), start=1):
        if (n == 1 and line.startswith("#version")) or not line:
            continue
        if len(line.rstrip("\r").split()) != 2:
            return f"line {n} is not two subword units separated by a space ({line[:40]!r})"
    return None


def learn_bpe_codes(word_counts: Mapping[str, int], merges: int, min_frequency: int = 2) -> str:
    """Learn ``merges`` BPE merge operations (subword-nmt) from word counts; returns the codes file text.

    The words are sorted (count descending, then word) before learning, so the codes do not depend on the
    order in which they were met.
    """
    from subword_nmt.learn_bpe import learn_bpe

    ordered = sorted(word_counts.items(), key=lambda wc: (-wc[1], wc[0]))
    infile = io.StringIO("".join(f"{w} {c}\n" for w, c in ordered))
    outfile = io.StringIO()
    # subword-nmt draws a progress bar on stderr: useful on a terminal, noise in logs.
    quiet = contextlib.nullcontext() if sys.stderr.isatty() else contextlib.redirect_stderr(io.StringIO())
    with quiet:
        learn_bpe(infile, outfile, merges, min_frequency=min_frequency, is_dict=True)
    return outfile.getvalue()
