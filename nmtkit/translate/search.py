"""Decoding over the model's step function (``encode`` / ``init_decoder`` / ``decode_step``).

Every search takes its settings as one :class:`nmtkit.translate.config.DecodeConfig` (defaults: ``nmt-translate``'s).

- :func:`beam_search`: batched beam search over many sentences at once (the paper decoded with beam search). Each sentence keeps ``beam`` hypotheses; at every step the best
  ``2 × beam`` expansions are ranked, ``</s>`` expansions ranked within the first ``beam`` are finished, and the
  first ``beam`` others continue. A sentence is done when it has ``beam`` finished hypotheses or reaches its length
  limit (``max_len_a × source words + max_len_b`` tokens, after which ``</s>`` is forced); done sentences leave
  the batch, so the work shrinks as sentences finish. Finished hypotheses are ranked by
  ``log p(y, </s> | x) / (|y| + 1) ** lenpen`` (``lenpen = 0``: raw log-probability), plus, with
  ``coverage_penalty`` β > 0, Wu et al. (2016)'s coverage penalty ``β Σ_j log min(Σ_i α_ij, 1)`` over the source
  words j (not the source's ``</s>``; the sum over i includes the ``</s>`` step): a hypothesis that left source words
  unattended ranks lower. As OpenNMT-py's non-stepwise coverage penalty does, it ranks finished hypotheses; it
  does not change which expansions stay in the beam.
- A target **prefix** per sentence (``prefix``, ``prefix_lens``; post-editing, interactive MT) is forced: while
  ``t < prefix_len`` the only expansion is the prefix's token, scored with the model's own log-probability (also
  when ``no_unk`` would forbid it), so every hypothesis starts with the prefix and the rest is the search continued
  from the state the prefix leads to. The length limit is at least the prefix's length.
- With ``no_repeat_ngram`` n > 0 (fairseq's ``--no-repeat-ngram-size``) no hypothesis produces an n-gram of target
  tokens twice: where its last n−1 tokens equal an earlier (n−1)-gram of it, the tokens that followed that earlier
  one get −inf before the top-k (:mod:`nmtkit.translate.ngramblock`); a forced prefix counts as history but is never
  blocked, ``</s>`` never is. The history is the hypothesis' own token row, reordered with it after each top-k.
  Given ``numbers`` (bool (V,): the target tokens holding a digit, :func:`~nmtkit.translate.ngramblock.number_tokens`),
  those tokens are never blocked, unless ``block_numbers``.
- With ``source_numbers`` (a :class:`~nmtkit.translate.sourcenumbers.SourceNumbers` for the batch: the decoding's
  ``source_numbers`` setting) a token holding a digit may only continue or begin one of the sentence's source
  numbers; the others get −inf before the top-k, after the n-gram block (:mod:`nmtkit.translate.sourcenumbers`).
  With ``missing_numbers`` γ > 0 besides, a finished hypothesis ranks with γ subtracted for each source number it
  leaves out (:meth:`~nmtkit.translate.sourcenumbers.SourceNumbers.missing`): it ranks, it does not steer the beam.
- :func:`greedy`: the plain batched greedy decoder (validation during training; equal to ``beam = 1``).
- :func:`beam_search_reference`: one sentence at a time with Python lists — slow, obviously right, and the yardstick
  the batched search is tested against.

Several models with the same vocabularies decode as an ensemble (:class:`Ensemble`): their log-probabilities are
averaged at every step. ``<pad>`` and ``<s>`` are never generated; ``no_unk`` also forbids ``<unk>`` (Table 1's
"no unknown words" setting). Scores are the models' own log-probabilities (never renormalised after masking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nmtkit.data.vocab import BOS, EOS, PAD, UNK
from nmtkit.models.fast.policy import policy
from nmtkit.translate.config import DecodeConfig
from nmtkit.translate.ngramblock import ban_repeats, banned_after
from nmtkit.translate.sourcenumbers import SourceNumbers

DEFAULT = DecodeConfig()  # (nmt-translate's defaults: beam 12, ...)


@dataclass
class Hypothesis:
    tokens: list[int]  # ids, without </s>
    score: float  # log p(tokens, </s> | source): the model's own log-probability
    norm_score: float  # score / (len(tokens) + 1) ** lenpen, what ranks hypotheses
    attention: torch.Tensor | None = None  # (len(tokens) + 1, Tx) α for each output token and </s>, or None


class Ensemble:
    """One or more models decoded together: averaged log-probabilities and attention."""

    def __init__(self, models):
        self.models = list(models) if isinstance(models, (list, tuple)) else [models]

    def encode(self, src, src_lens):
        return [m.prepare_decoding(m.encode(src, src_lens)) for m in self.models]

    def init(self, encs):
        return [m.init_decoder(e) for m, e in zip(self.models, encs)]

    def step(self, y, states, encs):
        """y (N,) → averaged log-probabilities (N, V) float32, new states, averaged α (N, Tx) or None."""
        logps, new_states, alphas = [], [], []
        for m, s, e in zip(self.models, states, encs):
            logits, s_new, alpha = m.decode_step(y, s, e)
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            new_states.append(s_new)
            if alpha is not None:
                alphas.append(alpha.float())
        logp = logps[0] if len(logps) == 1 else torch.stack(logps).mean(0)
        alpha = None if not alphas else alphas[0] if len(alphas) == 1 else torch.stack(alphas).mean(0)
        return logp, new_states, alpha


def check_numbers_from(decode: DecodeConfig, numbers_from: SourceNumbers | None) -> None:
    """A search asked for ``source_numbers`` must be given the sentences' numbers (the searches and sampling)."""
    if decode.source_numbers and numbers_from is None:
        raise ValueError("decode.source_numbers needs the source's numbers (numbers_from): decode through "
                         "decoding.decode_batch or a Translator, which read them from the source lines")


def free_tokens(decode: DecodeConfig, numbers: torch.Tensor | None, device) -> torch.Tensor | None:
    """The tokens the n-gram block leaves free (bool (V,) on ``device``), or None: ``numbers`` unless
    ``decode.block_numbers`` (or no block)."""
    if numbers is None or not decode.no_repeat_ngram or decode.block_numbers:
        return None
    return torch.as_tensor(numbers, dtype=torch.bool).to(device)


def _limits(src_lens: torch.Tensor, max_len_a: float, max_len_b: int,
            prefix_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Most output tokens (without </s>) per sentence; src_lens count the source's </s>; at least the prefix."""
    limits = (max_len_a * (src_lens - 1).float() + max_len_b).long().clamp(min=1)
    return limits if prefix_lens is None else torch.maximum(limits, prefix_lens.to(limits.device))


def _mask_step(logp: torch.Tensor, no_unk: bool, t: int, prefix: torch.Tensor | None = None,
               prefix_lens: torch.Tensor | None = None, sentences: torch.Tensor | None = None, K: int = 1,
               history: torch.Tensor | None = None, no_repeat_ngram: int = 0,
               free: torch.Tensor | None = None, numbers_from: SourceNumbers | None = None,
               ending: torch.Tensor | None = None) -> None:
    """In place, at step t: :func:`_mask`, with ``no_repeat_ngram`` the n-gram block over the rows' tokens so
    far, history (rows, t), with ``numbers_from`` the source-numbers constraint over the same (``ending``: the rows
    at their length limit); then rows (K per
    sentence, ``sentences`` (A,) their batch ids) whose prefix is longer than t may only continue with its token t,
    at its log-probability before the masking (so never blocked)."""
    forcing = None
    if prefix is not None and t < prefix.shape[1]:
        rows = (t < prefix_lens[sentences]).repeat_interleave(K).nonzero().squeeze(1)  # (R,)
        if rows.numel():
            tok = prefix[sentences, t].repeat_interleave(K)[rows]  # (R,)
            forcing = rows, tok, logp[rows, tok]  # (a copy of R values, taken before the masking)
    _mask(logp, no_unk)
    if no_repeat_ngram:
        ban_repeats(logp, history, no_repeat_ngram, free)
    if numbers_from is not None:
        numbers_from.apply(logp, history, sentences.repeat_interleave(K).tolist(), ending)
    if forcing is not None:
        rows, tok, kept = forcing
        logp[rows] = -math.inf
        logp[rows, tok] = kept


def _only_eos(logp: torch.Tensor, forced: torch.Tensor) -> None:
    """In place: the rows ``forced`` (bool (N,)), at their length limit, may only end (``</s>``)."""
    if bool(forced.any()):
        eos = torch.arange(logp.shape[1], device=logp.device) == EOS
        logp[forced] = torch.where(eos, logp[forced], -math.inf)


def coverage(cov: torch.Tensor, words: torch.Tensor, beta: float) -> torch.Tensor:
    """Wu et al. (2016)'s coverage penalty: cov (N, Tx) Σ_i α_ij so far, words (N, Tx) bool, the source words (not
    </s>, not padding) -> β Σ_j log min(cov_j, 1) (N,), at most 0 (a word never attended counts log 10⁻¹²)."""
    return beta * (cov.clamp(min=1e-12, max=1.0).log() * words).sum(dim=1)


def _mask(logp: torch.Tensor, no_unk: bool) -> None:
    logp[:, PAD] = -math.inf
    logp[:, BOS] = -math.inf
    if no_unk:
        logp[:, UNK] = -math.inf


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=1)`` for a wide (A, N) tensor, in three cheap passes instead of one slow one.

    Cut each row into blocks of ``BLOCK`` values (the speed policy's ``topk_block``; the last block shorter when
    BLOCK does not divide N); the k largest values of a row lie in the k blocks with the largest maxima (those k
    maxima are k values at least as large as the k-th block maximum τ, and any value ≥ τ sits in a block whose
    maximum is ≥ τ). So: block maxima (one fast reduction), the k best blocks, then top-k among their values,
    gathered in index order. The same values and indices as ``topk`` (among exactly equal values neither promises
    an order; with fewer than k finite values in a row, the -inf ones returned may differ); faster than ``topk`` over beam search's (sentences, K·V)
    candidates (tests/bench/results/bench_kernels.txt, row "top 24 of (80, 12 · 7,897)"). Narrow rows go to
    ``topk``.
    """
    A, N = x.shape
    BLOCK = policy().topk_block
    nb = N // BLOCK
    if nb < 8 * k:
        return x.topk(k, dim=1)
    maxima = x[:, : nb * BLOCK].view(A, nb, BLOCK).amax(dim=2)  # (A, nb)
    if nb * BLOCK < N:  # the short last block
        maxima = torch.cat([maxima, x[:, nb * BLOCK:].amax(dim=1, keepdim=True)], dim=1)
    blocks = maxima.topk(k, dim=1, sorted=False).indices.sort(dim=1).values  # (A, k)
    cols = (blocks.unsqueeze(2) * BLOCK + torch.arange(BLOCK, device=x.device)).view(A, k * BLOCK)  # index order
    outside = cols >= N  # past the end of the short last block
    values = x.gather(1, cols.clamp_(max=N - 1)).masked_fill_(outside, -math.inf)  # (A, k·BLOCK)
    values, j = values.topk(k, dim=1)  # (A, k)
    return values, cols.gather(1, j)


@torch.no_grad()
def one_token_at_a_time(models, src: torch.Tensor, src_lens: torch.Tensor, choose, n: int = 1,
                        max_len_a: float = 2.0, max_len_b: int = 10, no_unk: bool = False,
                        need_attention: bool = False, prefix: torch.Tensor | None = None,
                        prefix_lens: torch.Tensor | None = None,
                        no_repeat_ngram: int = 0, free: torch.Tensor | None = None,
                        numbers_from: SourceNumbers | None = None
                        ) -> tuple[list[list[int]], list[float], torch.Tensor | None]:
    """The left-to-right loop of greedy decoding and of sampling: ``n`` rows per sentence of src (B, Tx) with
    ``</s>``, each extended by one token a step, ``choose(logp (B·n, V), t) -> y (B·n,)`` picking it from the masked
    log-probabilities (``<pad>``, ``<s>``, with ``no_unk`` ``<unk>``; with ``no_repeat_ngram`` the tokens that would
    repeat an n-gram of the row, never a ``free`` token; with ``numbers_from`` digits that are no part of a source
    number; a prefix's token t where it is longer than t; only ``</s>`` at the length limit),
    until every row has ended.  -> each row's tokens (without ``</s>``), its log-probability, and with
    ``need_attention`` α (B·n, T, Tx)."""
    if no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be at least 0 (got {no_repeat_ngram})")
    ens = Ensemble(models)
    dev = src.device
    B = src.shape[0]
    if prefix is not None:
        prefix, prefix_lens = prefix.to(dev), prefix_lens.to(dev)
    encs = ens.encode(src, src_lens)  # (the n rows of a sentence share its encoder output)
    states = [s.repeat_interleave(n, dim=0) for s in ens.init(encs)]  # (B·n, n')
    limits = _limits(src_lens, max_len_a, max_len_b, prefix_lens).to(dev).repeat_interleave(n)  # (B·n,)
    sentences = torch.arange(B, device=dev)
    y = torch.full((B * n,), BOS, dtype=torch.long, device=dev)
    done = torch.zeros(B * n, dtype=torch.bool, device=dev)
    scores = torch.zeros(B * n, dtype=torch.float64, device=dev)
    out, alphas = [], []
    T = int(limits.max()) + 1
    # with the block or the numbers' constraint: each row's tokens so far, (B·n, T), filled a column a step (rows do
    # not move here)
    history = torch.zeros((B * n, T), dtype=torch.long, device=dev) if no_repeat_ngram or numbers_from else None
    for t in range(T):
        logp, states, alpha = ens.step(y, states, encs)  # (B·n, V), α (B·n, Tx)
        at_limit = t >= limits
        _mask_step(logp, no_unk, t, prefix, prefix_lens, sentences, n,
                   history[:, :t] if history is not None else None, no_repeat_ngram, free, numbers_from, at_limit)
        _only_eos(logp, at_limit)  # (at the limit only </s> may follow)
        y = choose(logp, t)  # (B·n,)
        step = logp.gather(1, y[:, None]).squeeze(1).double()
        scores += torch.where(done, torch.zeros_like(step), step)
        out.append(torch.where(done, torch.full_like(y, EOS), y))
        if history is not None:
            history[:, t] = out[-1]
        if need_attention:
            alphas.append(alpha.float())
        done |= y == EOS
        if bool(done.all()):
            break
    ids = torch.stack(out, dim=1).tolist()  # (B·n, T)
    tokens = [row[: row.index(EOS)] if EOS in row else row for row in ids]
    return tokens, scores.tolist(), (torch.stack(alphas, dim=1) if need_attention else None)


def greedy(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
           numbers: torch.Tensor | None = None, numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """Batched greedy decoding: src (B, Tx) with ``</s>``, src_lens (B,) → one hypothesis per sentence, in order
    (``decode``'s max_len_a/b, no_unk and no_repeat_ngram with ``numbers`` free, ``numbers_from`` the source-numbers
    constraint; its beam is not read)."""
    check_numbers_from(decode, numbers_from)
    tokens, scores, _ = one_token_at_a_time(models, src, src_lens, lambda logp, t: logp.argmax(dim=-1),
                                            max_len_a=decode.max_len_a, max_len_b=decode.max_len_b,
                                            no_unk=decode.no_unk, no_repeat_ngram=decode.no_repeat_ngram,
                                            free=free_tokens(decode, numbers, src.device), numbers_from=numbers_from)
    return [Hypothesis(toks, score, score) for toks, score in zip(tokens, scores)]


@torch.no_grad()
def beam_search(models, src: torch.Tensor, src_lens: torch.Tensor, decode: DecodeConfig = DEFAULT,
                need_attention: bool = False, prefix: torch.Tensor | None = None,
                prefix_lens: torch.Tensor | None = None, numbers: torch.Tensor | None = None,
                numbers_from: SourceNumbers | None = None) -> list[list[Hypothesis]]:
    """Batched beam search: src (B, Tx) with ``</s>``, src_lens (B,), optionally prefix (B, P) target ids padded
    with ``<pad>`` and prefix_lens (B,) → for each sentence its ``decode.nbest`` best hypotheses, best first (see the
    module docstring for the exact procedure; ``decode``: beam, nbest, lenpen, max_len_a/b, no_unk, coverage_penalty,
    no_repeat_ngram, block_numbers; ``numbers``: the tokens the block leaves free; ``numbers_from``: the
    source-numbers constraint), with their attention when ``need_attention``."""
    check_numbers_from(decode, numbers_from)
    beam, nbest, lenpen, no_unk = decode.beam, decode.nbest, decode.lenpen, decode.no_unk
    coverage_penalty, no_repeat_ngram = decode.coverage_penalty, decode.no_repeat_ngram
    ens = Ensemble(models)
    dev = src.device
    free = free_tokens(decode, numbers, dev)
    B, K = src.shape[0], beam
    if prefix is not None:
        prefix, prefix_lens = prefix.to(dev), prefix_lens.to(dev)
    encs = ens.encode(src, src_lens)  # one per sentence: the K hypotheses of a sentence share it
    states = [s.repeat_interleave(K, dim=0) for s in ens.init(encs)]  # (B*K, n): K rows per sentence, in order
    limits = _limits(src_lens, decode.max_len_a, decode.max_len_b, prefix_lens).to(dev)  # (B,)
    words = None  # with a coverage penalty: (B*K, Tx) which positions are source words, and Σ_i α_ij so far
    if coverage_penalty > 0:
        positions = torch.arange(src.shape[1], device=dev)
        words = (positions < (src_lens.to(dev) - 1).unsqueeze(1)).repeat_interleave(K, dim=0)
        cov = torch.zeros((B * K, src.shape[1]), device=dev)
    alive = torch.arange(B, device=dev)  # original ids of the sentences still decoding
    scores = torch.full((B, K), -math.inf, device=dev)
    scores[:, 0] = 0.0  # one live hypothesis to start with, so the first step does not repeat it K times
    tokens = torch.zeros((B * K, 0), dtype=torch.long, device=dev)  # (A*K, t)
    attn = torch.zeros((B * K, 0, src.shape[1]), device=dev) if need_attention else None  # (A*K, t, Tx)
    y = torch.full((B * K,), BOS, dtype=torch.long, device=dev)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    count = [0] * B  # finished hypotheses per sentence (Python-side bookkeeping: no tensor op per hypothesis)
    lens_l = src_lens.tolist()
    for t in range(int(limits.max()) + 1):
        A = alive.numel()
        logp, states, alpha = ens.step(y, states, encs)  # (A*K, V), α (A*K, Tx)
        V = logp.shape[1]
        at_limit = (t >= limits[alive]).repeat_interleave(K)  # (A*K,)
        _mask_step(logp, no_unk, t, prefix, prefix_lens, alive, K, tokens, no_repeat_ngram, free,
                   numbers_from, at_limit)  # tokens (A*K, t)
        if words is not None:
            if alpha is None:
                raise ValueError("the coverage penalty needs an attention model (rnnsearch)")
            cov = cov + alpha  # (A*K, Tx) Σ_i α_ij including this step
        _only_eos(logp, at_limit)  # at the limit only </s> may follow
        cand = logp.view(A, K, V).add_(scores.unsqueeze(2)).view(A, K * V)  # (A, K*V)   in place: logp is done
        top_scores, top_idx = top_k(cand, min(2 * K, K * V))  # (A, 2K)
        src_beam, tok = top_idx // V, top_idx % V  # (A, 2K)
        is_eos = (tok == EOS) & torch.isfinite(top_scores)
        if need_attention:
            attn = torch.cat([attn, alpha.unsqueeze(1)], dim=1)  # (A*K, t+1, Tx)
        # finish the </s> expansions ranked among the first K
        alive_l = alive.tolist()
        ends = is_eos[:, :K].nonzero().tolist()
        if ends:
            beams_l, scores_l = src_beam[:, :K].tolist(), top_scores[:, :K].tolist()
            penalty = coverage(cov, words, coverage_penalty).tolist() if words is not None else None  # (A*K,)
            for a, j in ends:
                sent = alive_l[a]
                if count[sent] >= K:
                    continue
                row = a * K + beams_l[a][j]
                toks = tokens[row].tolist()
                score = scores_l[a][j]
                att = attn[row, :, : lens_l[sent]].clone() if need_attention else None
                norm = score / (len(toks) + 1) ** lenpen + (penalty[row] if penalty is not None else 0.0)
                if decode.missing_numbers:
                    norm -= decode.missing_numbers * numbers_from.missing(toks, sent)
                finished[sent].append(Hypothesis(toks, score, norm, att))
                count[sent] += 1
        # the first K expansions that are not </s> continue
        positions = torch.arange(top_idx.shape[1], device=dev)
        key = (~(tok == EOS)).float() * (2 * K + 1) - positions  # (A, 2K): non-</s> first, in rank order
        sel = key.topk(K, dim=1).indices.sort(dim=1).values  # (A, K)
        scores = top_scores.gather(1, sel)  # (A, K)
        rows = (torch.arange(A, device=dev).unsqueeze(1) * K + src_beam.gather(1, sel)).view(-1)  # (A*K,)
        y = tok.gather(1, sel).view(-1)  # (A*K,)
        tokens = torch.cat([tokens.index_select(0, rows), y.unsqueeze(1)], dim=1)
        if need_attention:
            attn = attn.index_select(0, rows)
        states = [s.index_select(0, rows) for s in states]
        if words is not None:
            cov, words = cov.index_select(0, rows), words.index_select(0, rows)
        done = (torch.tensor([count[i] for i in alive_l], device=dev) >= K) | (t >= limits[alive])  # (A,)
        if bool(done.all()):
            break
        if bool(done.any()):  # drop finished sentences from the batch
            keep = (~done).nonzero().squeeze(1)  # (A',)
            keep_rows = (keep.unsqueeze(1) * K + torch.arange(K, device=dev)).view(-1)
            alive, scores, y, tokens = alive[keep], scores[keep], y[keep_rows], tokens[keep_rows]
            if need_attention:
                attn = attn[keep_rows]
            states = [s.index_select(0, keep_rows) for s in states]
            if words is not None:
                cov, words = cov[keep_rows], words[keep_rows]
            encs = [m.reorder_encoder_out(e, keep) for m, e in zip(ens.models, encs)]
        # (the K rows of a sentence share its encoder output, so reordering beams leaves ``encs`` as it is)
    results = []
    for hyps in finished:
        hyps.sort(key=lambda h: -h.norm_score)  # stable: equal scores keep the order they finished in
        results.append(hyps[:nbest])
    return results


@torch.no_grad()
def beam_search_reference(models, src_ids: list[int], decode: DecodeConfig = DEFAULT,
                          prefix: list[int] | None = None, numbers: torch.Tensor | None = None,
                          numbers_from: SourceNumbers | None = None) -> list[Hypothesis]:
    """The same search for one sentence (ids without ``</s>``), hypothesis by hypothesis with Python lists
    (``numbers_from``: the source-numbers constraint of a batch of this one sentence)."""
    free = free_tokens(decode, numbers, "cpu")
    free = frozenset() if free is None else frozenset(free.nonzero().flatten().tolist())
    beam, nbest, lenpen, no_unk = decode.beam, decode.nbest, decode.lenpen, decode.no_unk
    coverage_penalty, no_repeat_ngram = decode.coverage_penalty, decode.no_repeat_ngram
    ens = Ensemble(models)
    src = torch.tensor([list(src_ids) + [EOS]])
    src_lens = torch.tensor([len(src_ids) + 1])
    prefix = list(prefix or [])
    encs = ens.encode(src, src_lens)
    limit = max(int(_limits(src_lens, decode.max_len_a, decode.max_len_b)[0]), len(prefix))
    live = [([], 0.0, ens.init(encs), [0.0] * len(src_ids))]  # (tokens, score, states, Σ_i α_ij per source word)
    finished: list[Hypothesis] = []
    for t in range(limit + 1):
        expansions = []  # (score, order, tokens, token, states, coverage)
        for h, (toks, score, states, cov) in enumerate(live):
            y = torch.tensor([toks[-1] if toks else BOS])
            logp, new_states, alpha = ens.step(y, states, encs)
            raw = logp.clone()
            _mask(logp, no_unk)
            new_cov = cov if alpha is None else [c + float(a) for c, a in zip(cov, alpha[0])]
            banned = banned_after(toks, no_repeat_ngram, free)  # (the prefix counts as history; its tokens are forced)
            if numbers_from is not None:
                banned |= numbers_from.banned(toks, ending=t >= limit)
            for v in range(logp.shape[1]):
                lp = -math.inf if v in banned else float(logp[0, v])
                if t < len(prefix):
                    lp = float(raw[0, v]) if v == prefix[t] else -math.inf
                if t >= limit and v != EOS:
                    lp = -math.inf
                # exact ties (which real log-probabilities practically never have) go to the lower index here;
                # torch.topk promises no order among equal values
                expansions.append((score + lp, h * logp.shape[1] + v, toks, v, new_states, new_cov))
        expansions.sort(key=lambda e: (-e[0], e[1]))
        expansions = expansions[: 2 * beam]
        next_live = []
        for rank, (score, _, toks, v, states, cov) in enumerate(expansions):
            if v == EOS:
                if rank < beam and math.isfinite(score) and len(finished) < beam:
                    cp = coverage_penalty * sum(math.log(min(max(c, 1e-12), 1.0)) for c in cov)
                    if decode.missing_numbers:
                        cp -= decode.missing_numbers * numbers_from.missing(toks, 0)
                    finished.append(Hypothesis(toks, score, score / (len(toks) + 1) ** lenpen + cp))
            elif len(next_live) < beam:
                next_live.append((toks + [v], score, states, cov))
        live = next_live
        if len(finished) >= beam:
            break
    finished.sort(key=lambda h: -h.norm_score)
    return finished[:nbest]
