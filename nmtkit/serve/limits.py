"""What one request may cost ``nmt-serve``, known before it is queued (:func:`cost`): its lines are read into
model tokens as the translator reads them (its preprocessing, pieces of at most ``--max-source-len`` tokens, its
prefixes), and from them and its settings come the most each line may cost.

Why measured, not guessed from characters: the cost of a decoding is its hypotheses times the target tokens each may
run to, ``max(max_len_a × source tokens + max_len_b, prefix tokens)`` per piece (nmtkit/translate/searchstep.py),
and a character is anything from a tenth of a token (a long word) to several (SentencePiece's small units, a
number's digits).  Reading a request costs what its preprocessing costs in decoding, off the event loop, once;
the decoding it bounds can cost minutes.

- ``--max-beam``, ``--max-nbest``: the hypotheses of a line (``beam``, or the samples with ``sampling``);
- ``--max-target-len``: the target tokens one piece may be decoded to: its prefix, and the length limit its
  ``max_len_a``/``max_len_b`` allow (also the length of each sample);
- ``--max-attention-cells``: what ``attention``, ``alignment`` and ``replace_unk`` keep per line, a source × target
  matrix (11.5 GB of lists for one 20 kB request before this limit, issue #57 reports), at the longest
  translation allowed;
- each line's *work*, hypotheses × target tokens allowed, is what :mod:`nmtkit.serve.batcher` fills a batch with
  (``--batch-work``) and orders the queue by.

Text the preprocessing cannot read is that request's own 400, before it can share a batch with others' lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmtkit.errors import InputError


class TooCostly(Exception):
    """The request asks for more than a limit allows (413); the message names the limit and its option."""


@dataclass
class Cost:
    """The most a request may cost: each line's work (hypotheses × target tokens allowed) and its attention
    cells (source × target tokens, when the settings keep attention)."""

    work: list[int]
    cells: int


def cost(request, translator, cfg) -> Cost:
    """The request's :class:`Cost` under ``cfg``'s limits (:class:`TooCostly` past one of them; :class:`InputError`
    for a line the preprocessing cannot read).  ``translator``: the service's, whose preprocessing decodes it."""
    from nmtkit.translate import linetext

    decode = request.decode
    rows = decode.nbest if decode.sampling is not None else decode.widest
    if decode.sampling is None and decode.widest > cfg.max_beam:
        which = "constrained_beam" if decode.constrained_beam > decode.beam else "beam"
        raise TooCostly(f"{which} {decode.widest}: at most {cfg.max_beam} a request (--max-beam)")
    if decode.nbest > cfg.max_nbest:
        what = "samples" if decode.sampling is not None else "n-best"
        raise TooCostly(f"nbest {decode.nbest} ({what} a line): at most {cfg.max_nbest} a request (--max-nbest)")
    attends = request.attention or request.alignment or decode.replace_unk
    work, cells = [], 0
    for k, line in enumerate(request.lines):
        name = f"\"src\"[{k}]"
        try:
            tokens = translator.src_pre.subwords(translator.source_words(line))
            pieces = linetext.pieces(translator.src_pre, tokens, translator.max_source_len) if tokens else []
            prefix = request.prefixes[k] if request.prefixes is not None else ""
            forced = len(translator.tgt_pre.subwords(translator.target_words(prefix))) if prefix else 0
        except Exception as e:  # (text that breaks the preprocessing: this request's error, nobody else's)
            raise InputError(f"{name} cannot be read: {type(e).__name__}: {e}".splitlines()[0]) from None
        if forced > cfg.max_target_len:
            raise TooCostly(f"\"prefix\"[{k}]: {forced} target tokens: at most {cfg.max_target_len} "
                            "(--max-target-len)")
        steps = 0
        for n, piece in enumerate(pieces):
            allowed = max(1, int(decode.max_len_a * len(piece) + decode.max_len_b))
            if allowed > cfg.max_target_len:
                raise TooCostly(f"{name}: max_len_a {decode.max_len_a:g} and max_len_b {decode.max_len_b} allow "
                                f"{allowed} target tokens for its {len(piece)} source tokens: at most "
                                f"{cfg.max_target_len} (--max-target-len)")
            steps += max(allowed, forced if n == 0 else 0) + 1  # (+1: the </s> step)
        work.append(rows * steps)
        if attends:
            cells += (len(tokens) + 1) * (max(steps, forced + 1))
    if cells > cfg.max_attention_cells:
        raise TooCostly(f"attention of up to {cells:,} source × target tokens: at most {cfg.max_attention_cells:,} a "
                        "request (--max-attention-cells; fewer or shorter lines)")
    return Cost(work, cells)
