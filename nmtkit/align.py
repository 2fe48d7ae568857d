"""Word alignments from attention, and their evaluation: the library behind ``nmt-align`` (the paper's Figure 3).

- **Soft alignments**: :class:`Aligner` runs a checkpoint's RNNsearch teacher-forced over given sentence pairs
  (forced decoding of the target, or of the model's own beam translation) and keeps the weights α_ij. They are
  mapped from model tokens to words as ``nmt-translate`` maps them (:func:`word_matrix`, :func:`hard_links`): a
  target word's row is the mean of its subwords' rows, a source word's column the sum of its subwords' columns;
  the ``</s>`` row and column are kept last (the figures show them, hard alignments leave them out).
- **The alignment posterior** (:func:`nmtkit.posterior.forced_posterior`, ``nmt-align --method posterior``): the
  attention reweighted by how well each source word alone predicts the target word, p(a_i = j | y_i, …) ∝
  α_ij p(y_i | y_<i, c_i = h_j); it aligns much better than α (tests/bench/results/bench_posterior.txt), at Tx
  times the cost.
- **Hard alignments** (:func:`hard_links`): for every target word the source word with the most attention
  (``argmax``), or every source word with α ≥ a threshold together with the argmax (``threshold``, a union rule that
  never leaves a target word unaligned). Written in Pharaoh format: ``i-j``, 0-based, source-target.
- **Gold alignments** with Sure and Possible links: Pharaoh (``i-j`` Sure, ``i-j-P`` or ``i?j`` Possible, 0-based)
  and NAACL 2003 (``sent a b [S|P] [confidence]`` per line, 1-based, 0 = NULL), either side written first.
  Sentences wrapped as ``<s snum=N> … </s>`` (the NAACL 2003 Hansards data) are unwrapped; NAACL sentence numbers
  are matched to lines through ``snum`` (else they are line numbers).
- **AER** (Och & Ney 2003): with S ⊆ P, AER = 1 − (|A∩S| + |A∩P|)/(|A| + |S|), precision = |A∩P|/|A|,
  recall = |A∩S|/|S|, counted over the whole corpus (:func:`alignment_error`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nmtkit.errors import InputError
from nmtkit.settings import model_backend, setting
from nmtkit.symmetrize import METHODS
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.wordalign import hard_links, word_matrix

_WRAPPER = re.compile(r'^\s*<s\s+snum\s*=\s*"?([^\s">]+)"?\s*>(.*?)</s>\s*$', re.DOTALL)
_NAACL = re.compile(r"^\s*\S+\s+\d+\s+\d+(\s+[SP](\s+\S+)?)?\s*$")


@dataclass
class TextLine:
    """One sentence of an input file: its 1-based line, its ``snum`` when wrapped, its text without the wrapper."""

    line: int
    snum: str | None
    text: str

    @property
    def name(self) -> str:
        return f"sentence {self.snum} (line {self.line})" if self.snum else f"sentence {self.line}"


def strip_wrapper(text: str) -> tuple[str | None, str]:
    """``<s snum=1001> words </s>`` → ("1001", "words"); any other line → (None, line)."""
    m = _WRAPPER.match(text)
    return (m.group(1), m.group(2).strip()) if m else (None, text)


def read_text(path: str) -> list[TextLine]:
    """The sentences of a text file (``\\n`` line ends only, strict UTF-8), unwrapped where wrapped."""
    from nmtkit.files import read_segments

    return [TextLine(seg.line, *strip_wrapper(seg.text)) for seg in read_segments(path)]


def check_pairs(src: list[TextLine], tgt: list[TextLine], src_path: str, tgt_path: str) -> None:
    """Equal sentence counts, and equal ``snum`` where both sides carry one."""
    if len(src) != len(tgt):
        raise InputError(f"has {len(tgt)} sentences but the source {src_path} has {len(src)}", tgt_path)
    for s, t in zip(src, tgt):
        if s.snum != t.snum:
            raise InputError(f"line {t.line} is sentence {t.snum} but line {s.line} of {src_path} is sentence "
                             f"{s.snum}", tgt_path, t.line)


# -- soft → hard -----------------------------------------------------------------------------------------------


@dataclass
class SoftAlignment:
    """Word-level attention of one sentence pair: ``alpha[j, i]`` is target word j's weight on source word i,
    with the ``</s>`` row and column last, shape (len(target) + 1, len(source) + 1)."""

    source: list[str]
    target: list[str]
    alpha: np.ndarray


# -- gold alignments and AER -----------------------------------------------------------------------------------


@dataclass
class GoldAlignment:
    """The gold links of one sentence: ``sure`` ⊆ ``possible``, as (source i, target j), 0-based; ``where`` maps
    each link to (file line, the link as written there) for error messages."""

    sure: set = field(default_factory=set)
    possible: set = field(default_factory=set)
    where: dict = field(default_factory=dict)

    def add(self, i: int, j: int, sure: bool, line: int, raw: str) -> None:
        self.possible.add((i, j))
        if sure:
            self.sure.add((i, j))
        self.where.setdefault((i, j), (line, raw))


_PHARAOH_LINK = re.compile(r"^(\d+)([-?])(\d+)(?:-([SP]))?$")


def parse_pharaoh(text: str, order: str = "src-tgt", path: str | None = None, line: int | None = None
                  ) -> GoldAlignment:
    """One Pharaoh line: ``i-j`` (Sure), ``i-j-S``, ``i-j-P`` or ``i?j`` (Possible); ``order`` says which side
    comes first (``src-tgt`` or ``tgt-src``)."""
    gold = GoldAlignment()
    for raw in text.split():
        m = _PHARAOH_LINK.match(raw)
        if m is None:
            raise InputError(f"'{raw}' is not a Pharaoh link (i-j, i-j-P or i?j)", path, line)
        a, b = int(m.group(1)), int(m.group(3))
        i, j = (a, b) if order == "src-tgt" else (b, a)
        gold.add(i, j, m.group(2) == "-" and m.group(4) != "P", line, raw)
    return gold


def read_pharaoh(path: str, order: str = "src-tgt") -> list[GoldAlignment]:
    """A Pharaoh file: one line per sentence."""
    from nmtkit.files import read_segments

    return [parse_pharaoh(seg.text, order, path, seg.line) for seg in read_segments(path)]


def read_naacl(path: str, sentence_ids: Sequence[str], order: str = "src-tgt") -> list[GoldAlignment]:
    """A NAACL 2003 file (``sent a b [S|P] [confidence]``, 1-based, 0 = NULL and dropped; no label = Sure), as
    one GoldAlignment per sentence of ``sentence_ids`` (the sentences' numbers, in text order)."""
    from nmtkit.files import read_segments

    position = {sid: k for k, sid in enumerate(sentence_ids)}
    gold = [GoldAlignment() for _ in sentence_ids]
    for seg in read_segments(path):
        fields = seg.text.split()
        if not fields:
            continue
        if not _NAACL.match(seg.text):
            raise InputError("expected 'sentence position position [S|P] [confidence]'", path, seg.line)
        if fields[0] not in position:
            known = f"{sentence_ids[0]}–{sentence_ids[-1]}" if sentence_ids else "none"
            raise InputError(f"sentence {fields[0]} is not in the text (its sentences are numbered {known})",
                             path, seg.line)
        a, b = int(fields[1]), int(fields[2])
        if a == 0 or b == 0:
            continue  # a link to NULL
        i, j = (a - 1, b - 1) if order == "src-tgt" else (b - 1, a - 1)
        sure = len(fields) < 4 or fields[3] == "S"
        gold[position[fields[0]]].add(i, j, sure, seg.line, " ".join(fields[:4]))
    return gold


def sniff_gold_format(path: str) -> str:
    """``naacl`` when the first non-empty line reads ``sent a b [S|P]``, else ``pharaoh``."""
    from nmtkit.files import read_segments

    for seg in read_segments(path):
        if seg.text.strip():
            return "naacl" if _NAACL.match(seg.text) else "pharaoh"
    return "pharaoh"


def check_gold(gold: Sequence[GoldAlignment], src_words: Sequence[int], tgt_words: Sequence[int], path: str,
               names: Sequence[str], hint: str = "") -> None:
    """Every gold link inside its sentence: an InputError names the file line, the sentence, the link and the
    side's length. ``src_words``/``tgt_words`` are word counts; ``names`` the sentences' names."""
    if len(gold) != len(src_words):
        raise InputError(f"has {len(gold)} sentences of alignments but the text has {len(src_words)}", path)
    for k, g in enumerate(gold):
        for (i, j), (line, raw) in sorted(g.where.items(), key=lambda kv: kv[1][0] or 0):
            for side, pos, n in (("source", i, src_words[k]), ("target", j, tgt_words[k])):
                if pos >= n:
                    raise InputError(f"{names[k]}: link {raw} but the {side} has {n} words{hint}", path, line)


@dataclass
class AlignmentScores:
    """Corpus-level alignment quality; counts are summed over sentences."""

    precision: float | None
    recall: float | None
    aer: float | None
    links: int  # |A|
    sure: int  # |S|
    possible: int  # |P| (Sure links included)
    hits_sure: int  # |A ∩ S|
    hits_possible: int  # |A ∩ P|

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def alignment_error(hypotheses: Sequence[set | Sequence[tuple[int, int]]], gold: Sequence[GoldAlignment]
                    ) -> AlignmentScores:
    """Precision, recall and AER of hypothesis links against gold Sure/Possible links (Och & Ney 2003)."""
    if len(hypotheses) != len(gold):
        raise ValueError(f"{len(hypotheses)} hypothesis sentences but {len(gold)} gold sentences")
    a = s = p = a_s = a_p = 0
    for hyp, g in zip(hypotheses, gold):
        hyp = set(hyp)
        possible = g.possible | g.sure
        a, s, p = a + len(hyp), s + len(g.sure), p + len(possible)
        a_s, a_p = a_s + len(hyp & g.sure), a_p + len(hyp & possible)
    return AlignmentScores(a_p / a if a else None, a_s / s if s else None,
                           1 - (a_s + a_p) / (a + s) if a + s else None, a, s, p, a_s, a_p)


def load_gold(path: str, fmt: str, order: str, sentences: Sequence[TextLine]) -> list[GoldAlignment]:
    """Gold alignments for ``sentences`` from a Pharaoh or NAACL file (``fmt``: pharaoh, naacl or auto)."""
    if order not in ("src-tgt", "tgt-src"):
        raise InputError(f"unknown gold order '{order}' (src-tgt or tgt-src)")
    fmt = sniff_gold_format(path) if fmt == "auto" else fmt
    if fmt == "pharaoh":
        return read_pharaoh(path, order)
    if fmt == "naacl":
        return read_naacl(path, [s.snum or str(s.line) for s in sentences], order)
    raise InputError(f"unknown gold format '{fmt}' (pharaoh, naacl or auto)")


# -- attention from a model ------------------------------------------------------------------------------------


def forced_attention(model, src_ids: Sequence[np.ndarray], tgt_ids: Sequence[np.ndarray], batch_size: int = 32,
                     device: str = "cpu") -> list[np.ndarray]:
    """Teacher-forced α of an attention model: for each pair an array (len(tgt) + 1, len(src) + 1), the rows for
    the target tokens and ``</s>``, the columns for the source tokens and ``</s>``. Batched by length."""
    from nmtkit.data.batching import forced_blocks

    def alpha(b):
        return model(b.src, b.src_lens, b.tgt_in, return_attention=True)[1].float().cpu().numpy()  # (B, Ty, Tx)

    return forced_blocks(src_ids, tgt_ids, batch_size, device, alpha)


SOFT_ALIGNMENTS = ("attention", "posterior")  # what nmt-align reads links from (Aligner's ``method``)


@dataclass
class AlignConfig:
    """The settings of one ``nmt-align`` run: one field per option (:mod:`nmtkit.settings`; its help is written
    here, once).  The checks of the settings together are made here; those of the inputs, by :func:`align_files`."""

    model: str = setting(help="An RNNsearch checkpoint.", short="-m", path=True)
    source: str = setting(help="Source sentences.", short="-s", path=True)
    target: str | None = setting(
        None, "Target sentences to force-decode [the model's own beam translations].", short="-t", path=True)
    tokenized: bool = setting(
        False, "The text is whitespace-separated words already (as gold alignments count them); only the model's "
               "lowercasing and BPE are applied.")
    pharaoh: str | None = setting(
        None, "Write hard alignments here, 'i-j' 0-based source-target [stdout when nothing else is asked].",
        path="-")
    method: str = setting(
        "attention", "What links are read from: the attention α (the paper's Figure 3), or the posterior α_ij p(y_i | "
                     "c_i = h_j), normalised over j: the attention reweighted by how well each source word alone "
                     "predicts the target word (nmtkit/posterior.py; Tx times the computation, and it aligns better: "
                     "tests/bench/results/bench_posterior.txt).", choices=SOFT_ALIGNMENTS)
    rule: str = setting(
        "argmax", "Hard links: the most attended source word per target word, or also every α >= --threshold.",
        choices=("argmax", "threshold"))
    threshold: float = setting(
        0.5, "Weight threshold of --rule threshold (of α, or of the posterior with --method posterior).")
    plot_dir: str | None = setting(
        None, "Draw each sentence's α here, one image per sentence (with an index.tsv).", path="dir")
    plot_format: str = setting("png", choices=("png", "pdf", "svg"))
    plot_sentences: str | None = setting(None, "Which lines to draw, e.g. 1,3,5-9 [all].", metavar="LINES")
    force: bool = setting(False, "Replace an earlier --plot-dir.")
    gold: str | None = setting(None, "Gold alignments to compute AER against (needs -t).", path=True)
    gold_format: str = setting(
        "auto", "Pharaoh (i-j Sure, i-j-P Possible, 0-based) or NAACL 2003 (sent a b S|P, 1-based).",
        choices=("auto", "pharaoh", "naacl"))
    gold_order: str = setting("src-tgt", "Which side the gold file writes first.", choices=("src-tgt", "tgt-src"))
    reverse_model: str | None = setting(
        None, "An RNNsearch of the other direction (target to source): the target sentences are aligned to the "
              "source by it too, and the two directions' links symmetrised (needs -t).", path=True)
    symmetrization: str = setting(
        "grow-diag-final", "How --reverse-model's links and the model's are combined (Koehn et al. 2003; Moses's "
                           "symal), or 'soft': their attention, before links are read off (nmtkit/symmetrize.py); the "
                           "AER report lists every way.", choices=METHODS, flag="--symmetrize")
    beam: int = setting(DecodeConfig.beam, "Beam size for the model's translations (no -t).")
    batch_size: int = setting(32)
    device: str = setting("cpu")
    backend: str | None = model_backend("alignments")

    def __post_init__(self):
        if self.plot_sentences is not None and self.plot_dir is None:
            raise InputError("--plot-sentences chooses what --plot-dir draws: give --plot-dir DIR")


class Aligner:
    """A checkpoint's RNNsearch and its preprocessing: sentence pairs → word-level :class:`SoftAlignment`.

    ``tokenized``: the text is whitespace-separated words already (as gold alignments count them); only the
    model's lowercasing and BPE are applied. Otherwise the checkpoint's full preprocessing is.
    """

    def __init__(self, checkpoint_path: str, device: str = "cpu", tokenized: bool = False, batch_size: int = 32,
                 decode: DecodeConfig | None = None, backend: str | None = None, method: str = "attention"):
        """``decode``: how the model's own translations are searched for when no target is given (None: the
        defaults of :class:`nmtkit.translate.config.DecodeConfig`); ``method``: the soft alignment given, the
        attention α (:func:`forced_attention`, the paper's Figure 3) or the posterior (:func:`forced_posterior`)."""
        if method not in SOFT_ALIGNMENTS:
            raise InputError(f"unknown alignment method '{method}' (choose from {', '.join(SOFT_ALIGNMENTS)})")
        self.method = method
        from nmtkit.data import checkpoint
        from nmtkit.models import model_for_inference
        from nmtkit.data.text import Preprocessor, TextConfig
        from nmtkit.data.vocab import Vocabulary

        if batch_size < 1:
            raise InputError(f"--batch-size must be at least 1 (got {batch_size})")
        from nmtkit.device import resolve_device

        device = resolve_device(str(device))
        payload = checkpoint.load(checkpoint_path)
        self.model = model_for_inference(payload, checkpoint_path, device, backend)
        if not self.model.attentive:
            raise InputError(f"nmt-align needs an attention model (rnnsearch); this checkpoint is "
                             f"{payload['arch']}", checkpoint_path)
        self.src_vocab, self.tgt_vocab = Vocabulary(payload["vocab"]["src"]), Vocabulary(payload["vocab"]["tgt"])
        self.src_pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["src"]))
        self.tgt_pre = Preprocessor(TextConfig.from_dict(payload["preprocessing"]["tgt"]))
        self.device, self.tokenized, self.batch_size = device, tokenized, batch_size
        self.decode = DecodeConfig() if decode is None else decode

    def words(self, text: str, side: str = "src") -> list[str]:
        """The words of one line of the source (``src``) or target (``tgt``) side: what links are counted in."""
        pre = self.src_pre if side == "src" else self.tgt_pre
        if not self.tokenized:
            return pre.words(text)
        words = text.split()
        return [w.lower() for w in words] if pre.config.lowercase else words

    def align_words(self, src_words: Sequence[list[str]], tgt_words: Sequence[list[str]] | None = None
                    ) -> list[SoftAlignment]:
        """Soft word alignments of tokenized pairs; without targets, of the model's own beam translations."""
        src_tokens = [self.src_pre.subwords(w) for w in src_words]
        src_ids = [self.src_vocab.encode(t) for t in src_tokens]
        if tgt_words is None:
            tgt_ids = self._translate(src_ids)
            tgt_tokens = [self.tgt_vocab.decode(t) for t in tgt_ids]
        else:
            tgt_tokens = [self.tgt_pre.subwords(w) for w in tgt_words]
            tgt_ids = [self.tgt_vocab.encode(t) for t in tgt_tokens]
        from nmtkit.posterior import forced_posterior

        soft = forced_posterior if self.method == "posterior" else forced_attention
        alphas = soft(self.model, src_ids, tgt_ids, self.batch_size, self.device)
        out = []
        for s, t, a in zip(src_tokens, tgt_tokens, alphas):
            out.append(SoftAlignment(self.src_pre.merge_subwords(s), self.tgt_pre.merge_subwords(t),
                                     word_matrix(s, t, a, self.src_pre.words_of, self.tgt_pre.words_of)))
        return out

    def _translate(self, src_ids: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        from nmtkit.data.batching import collate_source, eval_batches
        from nmtkit.translate.ngramblock import number_tokens
        from nmtkit.translate.search import beam_search

        out: list[np.ndarray] = [None] * len(src_ids)  # type: ignore[list-item]
        for ids in eval_batches(np.array([len(s) for s in src_ids]), None, self.batch_size):
            src, lens = collate_source([src_ids[i] for i in ids])
            with torch.no_grad():
                hyps = beam_search([self.model], src.to(self.device), lens.to(self.device), self.decode,
                                   numbers=number_tokens(self.tgt_vocab.tokens))
            for i, h in zip(ids, hyps):
                out[i] = np.asarray(h[0].tokens, dtype=np.int64)
        return out


@dataclass
class AlignResult:
    """What :func:`align_files` gives: per sentence its text line, soft alignment and hard links (symmetrised when a
    reverse model was given); the scores against gold when a gold file was given, and with a reverse model the
    scores of each direction and each symmetrisation (``by_method``: forward, backward, then
    :data:`nmtkit.symmetrize.METHODS`)."""

    sentences: list[TextLine]
    soft: list[SoftAlignment]
    links: list[list[tuple[int, int]]]
    scores: AlignmentScores | None = None
    by_method: dict[str, AlignmentScores] | None = None


def check_reverse(aligner: Aligner, reverse: Aligner, reverse_path: str) -> None:
    """The reverse model must translate the other way: its source language the model's target language."""
    there = (aligner.src_pre.config.lang, aligner.tgt_pre.config.lang)
    back = (reverse.src_pre.config.lang, reverse.tgt_pre.config.lang)
    if back != there[::-1]:
        raise InputError(f"translates {back[0]}->{back[1]}; the reverse of the model's {there[0]}->{there[1]} is "
                         f"{there[1]}->{there[0]}", reverse_path)


def align_files(aligner: Aligner, source: str, target: str | None = None, gold: str | None = None,
                gold_format: str = "auto", gold_order: str = "src-tgt", rule: str = "argmax",
                threshold: float = 0.5, reverse: Aligner | None = None,
                symmetrization: str = "grow-diag-final") -> AlignResult:
    """Align a source file with its target file (or with the model's translations when ``target`` is None),
    and score the hard links against ``gold``.  With ``reverse`` (an aligner of a model of the other direction,
    checked by :func:`check_reverse`) the target file is also aligned to the source by that model, and the two
    directions' links are symmetrised (:func:`nmtkit.symmetrize.symmetrize`, ``symmetrization``).  Every input is
    read and checked (counts, sentence numbers, gold links within their sentences, both models' words of each
    pair) before a model runs."""
    from nmtkit.symmetrize import HEURISTICS, METHODS, SOFT, soft_links, symmetrize, transpose

    if gold is not None and target is None:
        raise InputError("--gold needs the target sentences the gold links refer to: give -t TGT")
    if reverse is not None and target is None:
        raise InputError("--reverse-model aligns the target sentences to the source: give -t TGT")
    if rule not in ("argmax", "threshold") or not 0.0 < threshold <= 1.0:
        raise InputError(f"need rule argmax or threshold and 0 < threshold <= 1 (got {rule}, {threshold})")
    if symmetrization not in METHODS:
        raise InputError(f"unknown symmetrization {symmetrization!r} (choose from {', '.join(METHODS)})")
    src = read_text(source)
    tgt = read_text(target) if target is not None else None
    if tgt is not None:
        check_pairs(src, tgt, source, target)
    src_words = [aligner.words(s.text, "src") for s in src]
    tgt_words = [aligner.words(t.text, "tgt") for t in tgt] if tgt is not None else None
    if reverse is not None:
        for k, (s, t) in enumerate(zip(src, tgt)):
            if reverse.words(t.text, "src") != tgt_words[k] or reverse.words(s.text, "tgt") != src_words[k]:
                raise InputError("the two models read this pair into different words (their tokenisation or "
                                 "lowercasing differ): their links cannot be combined", target, k + 1)
    gold_links = None
    if gold is not None:
        gold_links = load_gold(gold, gold_format, gold_order, src)
        hint = " (is --gold-order right?" + ("" if aligner.tokenized else " is the text tokenized as the gold is? "
                                             "see --tokenized") + ")"
        check_gold(gold_links, [len(w) for w in src_words], [len(w) for w in tgt_words], gold,
                   [s.name for s in src], hint)
    soft = aligner.align_words(src_words, tgt_words)
    links = [hard_links(a.alpha, rule, threshold) for a in soft]
    by_method = None
    if reverse is not None:
        back_soft = reverse.align_words(tgt_words, src_words)
        backward = [transpose(hard_links(a.alpha, rule, threshold)) for a in back_soft]
        methods = {"forward": links, "backward": backward}
        methods.update({h: [sorted(symmetrize(f, b, h), key=lambda ij: (ij[1], ij[0])) for f, b in zip(links, backward)]
                        for h in HEURISTICS})  # (sorted as hard_links sorts: by target, then source)
        methods[SOFT] = [soft_links(f.alpha, b.alpha, len(s), len(t))
                         for f, b, s, t in zip(soft, back_soft, src_words, tgt_words)]
        links = methods[symmetrization]
        if gold_links is not None:
            by_method = {name: alignment_error(ls, gold_links) for name, ls in methods.items()}
    scores = alignment_error(links, gold_links) if gold_links is not None else None
    return AlignResult(src, soft, links, scores, by_method)
