"""The repeated-n-gram block of decoding (``nmt-translate --no-repeat-ngram N``, fairseq's
``--no-repeat-ngram-size``): no hypothesis may produce an n-gram of target tokens it has already produced.

Briefly trained RNN decoders loop ("à Ottawa, à Ottawa, à Ottawa"); once a hypothesis has written an n-gram, the
block forbids the token that would write it again. At a step where a hypothesis' last n−1 tokens equal an earlier
(n−1)-gram of it, every token that followed that earlier (n−1)-gram gets −inf before the search ranks the
expansions (for n = 1: every token it has produced, so no token repeats). A forced prefix's tokens count as the
hypothesis' history, but the prefix itself is never blocked (the caller applies the block before forcing it), and
``</s>`` is never blocked, so a hypothesis can always end.

**Number tokens are never blocked.** A token with a digit in it, or what joins a number's digits in the target
vocabulary (SentencePiece's bare word boundary, comma or point; :func:`number_tokens`), may always follow: a number repeats its
pieces ("1 000 000" with SentencePiece's split digits is ``▁ 1 ▁ 0 0 0 ▁ 0 0 0``, whose 3-grams ``0 0 ▁`` and
``▁ 0 0`` come twice) and a text repeats its numbers ("en 1995 et en 1996"); blocking them cost numbers
(``tests/bench/results/bench_recipe.txt``, "after the hour").  Every other token is
blocked as before, also after a window that holds digits, so a loop through a number ("en 1995, en 1995, ...") is
still cut, at its first word or punctuation mark.  (fairseq's rule blocks numbers too; ``--block-numbers``, which
offered it, carried fewer numbers and was removed.)

:func:`ban_repeats` does it for all hypotheses at once on their (R, t) token tensor: the last n−1 tokens are
compared with every earlier window of n−1 tokens (``unfold``), and the tokens that followed the matching windows are
set to −inf with one ``scatter_reduce`` (min), which handles a token banned twice without a Python loop. It was
measured against fairseq's way (``ban_repeats_dict`` in the benchmark: per hypothesis a dict from (n−1)-gram to the
tokens that followed it, rebuilt from the token lists each step, in Python) at beam 12 on 500 sentences, and kept
as the faster (``tests/bench/bench_ngramblock.py``; figures in ``tests/bench/results/bench_ngramblock.txt``).
:func:`banned_after` is the same rule for one token list in plain Python: the reference search's yardstick.
"""

from __future__ import annotations

import math

import torch

from nmtkit.data.vocab import EOS


# what joins the parts of a number between its digits, in a SentencePiece vocabulary: the word boundary alone
# ("1 000 000" is the pieces ▁ 1 ▁ 0 0 0 ▁ 0 0 0 with split digits), and a bare comma or point ("1,5", "3.25": with a
# space before them, "▁," and "▁." are sentence punctuation and stay blocked)
NUMBER_GLUE = frozenset({"▁", ",", "."})
# in a subword-nmt BPE vocabulary: a comma or point inside a word ("3@@ .@@ 25"); a bare "," or "." ends a word there,
# as in a word vocabulary, where numbers are whole tokens ("1995", "3,5") and "," and "." are only punctuation
BPE_NUMBER_GLUE = frozenset({",@@", ".@@"})


def number_tokens(tokens: list[str]) -> torch.Tensor:
    """bool (V,): which entries of a target vocabulary (its token strings, in id order) belong to numbers: those
    that hold a decimal digit -- a digit piece, a subword or a whole word such as "1995" or "3,5" -- and what
    joins a number's digits in that kind of vocabulary: :data:`NUMBER_GLUE` in a SentencePiece one (it has pieces
    beginning with "▁"), :data:`BPE_NUMBER_GLUE` in another (in a word vocabulary none of those is a token)."""
    glue = NUMBER_GLUE if any(tok.startswith("\u2581") for tok in tokens) else BPE_NUMBER_GLUE
    return torch.tensor([tok in glue or any(c.isdecimal() for c in tok) for tok in tokens], dtype=torch.bool)


def ban_repeats(logp: torch.Tensor, history: torch.Tensor, n: int, free: torch.Tensor | None = None) -> None:
    """In place: logp (R, V) of R hypotheses whose tokens so far are history (R, t) → each row's tokens that would
    repeat one of its n-grams set to −inf (``</s>`` never, nor with ``free``, bool (V,), a free token). Nothing to
    do before a hypothesis has n tokens."""
    R, t = history.shape
    if n < 1 or t < n:
        return
    nxt = history[:, n - 1:]  # (R, t-n+1): the token that followed the window starting at 0 .. t-n
    if n == 1:
        hit = nxt != EOS  # (R, t): every token produced so far
    else:
        windows = history[:, : t - 1].unfold(1, n - 1, 1)  # (R, t-n+1, n-1) the earlier windows, as a view
        last = history[:, t - n + 1:].unsqueeze(1)  # (R, 1, n-1) the hypothesis' last n-1 tokens
        hit = (windows == last).all(dim=2) & (nxt != EOS)  # (R, t-n+1)
    if free is not None:
        hit &= ~free[nxt]  # (R, t-n+1) a free token is never the one banned
    # min(logp, -inf) where banned, min(logp, +inf) = logp elsewhere: duplicates in nxt are harmless
    bans = torch.full(nxt.shape, math.inf, dtype=logp.dtype, device=logp.device).masked_fill_(hit, -math.inf)
    logp.scatter_reduce_(1, nxt, bans, reduce="amin")


def banned_after(tokens: list[int], n: int, free: set[int] = frozenset()) -> set[int]:
    """The tokens that may not follow ``tokens`` (one hypothesis) under the n-gram block: those that followed an
    earlier occurrence of its last n−1 tokens (``</s>`` never, nor a token of ``free``; none when off or shorter
    than n)."""
    if n < 1 or len(tokens) < n:
        return set()
    tail = tokens[len(tokens) - n + 1:]
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i: i + n - 1] == tail} - {EOS} - free
