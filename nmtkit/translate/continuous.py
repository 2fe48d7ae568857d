"""Continuous batching: beam searches that started at different times, stepped together (``nmt-serve``).

A server's requests arrive while earlier ones are being decoded.  Decoding each group of arrivals as a batch of its
own (and the next only once it is done) leaves the machine working on a shrinking batch: the sentences that finished
early have left, the longest one decides when the next batch may start.  Here every group of arrivals is a
:class:`~nmtkit.translate.cohort.BeamCohort` that joins the running search at its next step: one model step
computes the log-probabilities of all the cohorts' rows at once (their encoder outputs padded to the longest source
and stacked, :func:`stack_encoder_out`), and each cohort does the rest of its step on its own rows
(:meth:`BeamCohort.advance`).  A cohort leaves when its sentences are done, so a short sentence's answer does not
wait for the longest one of its batch, and new sentences fill the room that finished ones leave.

Each cohort's hypotheses are the ones it would find alone (``beam_search`` over the same sentences): the rows of a
sentence only ever read its own encoder output, and padding is masked out of the attention (a tiny difference in
the last bits of a product whose rows are batched differently is the only one, as between any two batchings).
All cohorts of one :class:`ContinuousSearch` must share the decoding settings and ``need_attention``.
"""

from __future__ import annotations

import torch

from nmtkit.models.backend import EncoderOut
from nmtkit.translate.cohort import BeamCohort
from nmtkit.translate.searchstep import Ensemble

_ALONG_SOURCE = ("annotations", "keys", "src_mask")  # EncoderOut fields (B, Tx, ...); "proj" too where attentive


def stack_encoder_out(encs: list[EncoderOut]) -> EncoderOut:
    """Several batches' encoder outputs as one: each (B_k, Tx_k, ...) field padded along Tx to the largest Tx (zeros;
    ``src_mask`` False) and stacked along the batch, the others stacked as they are."""
    if len(encs) == 1:
        return encs[0]
    Tx = max(e.src_mask.shape[1] for e in encs)
    attentive = encs[0].context is None

    def padded(t: torch.Tensor) -> torch.Tensor:
        if t.shape[1] == Tx:
            return t
        shape = (t.shape[0], Tx - t.shape[1], *t.shape[2:])
        return torch.cat([t, t.new_zeros(shape)], dim=1)  # (False for the bool mask)

    fields = {}
    for name in EncoderOut._fields:
        ts = [getattr(e, name) for e in encs]
        if any(t is None for t in ts):
            if not all(t is None for t in ts):
                raise ValueError(f"encoder outputs to stack differ in {name}: some have it, some do not")
            fields[name] = None
            continue
        along = name in _ALONG_SOURCE or (name == "proj" and attentive)
        fields[name] = torch.cat([padded(t) for t in ts] if along else ts, dim=0)
    return EncoderOut(**fields)


class ContinuousSearch:
    """The cohorts being decoded together with ``models`` (the same for all; one decoding setting)."""

    def __init__(self, models):
        self.ens = Ensemble(models)
        self.cohorts: list[BeamCohort] = []
        self._encs: list[EncoderOut] | None = None  # the cohorts' encoder outputs stacked, per model

    def add(self, cohort: BeamCohort) -> None:
        """A cohort joins at the next step (one that is already done is not added)."""
        if not cohort.done:
            self.cohorts.append(cohort)
            self._encs = None

    @property
    def rows(self) -> int:
        """Hypotheses in the search now (K per sentence still decoding)."""
        return sum(c.rows for c in self.cohorts)

    @torch.no_grad()
    def step(self) -> list[BeamCohort]:
        """One step of every cohort; -> those done after it (they leave)."""
        cohorts = self.cohorts
        if not cohorts:
            return []
        if len(cohorts) == 1:
            cohorts[0].step()
        else:
            if self._encs is None or any(c.changed for c in cohorts):
                self._encs = [stack_encoder_out([c.encs[m] for c in cohorts]) for m in range(len(self.ens.models))]
                for c in cohorts:
                    c.changed = False
            y = torch.cat([c.y for c in cohorts])  # (Σ A_c·K,)
            states = [torch.cat([c.states[m] for c in cohorts]) for m in range(len(self.ens.models))]
            logp, new_states, alpha = self.ens.step(y, states, self._encs)  # (Σ A_c·K, V), α (Σ A_c·K, Tx)
            at = 0
            for c in cohorts:
                a, b = at, at + c.rows
                c.advance(logp[a:b], [s[a:b] for s in new_states], None if alpha is None else alpha[a:b, : c.Tx])
                at = b
        done = [c for c in cohorts if c.done]
        if done:
            self.cohorts = [c for c in cohorts if not c.done]
            self._encs = None
        return done
