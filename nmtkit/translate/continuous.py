"""Continuous batching: beam searches that started at different times, stepped together (``nmt-serve``).

A server's requests arrive while earlier ones are being decoded.  Decoding each group of arrivals as a batch of its
own (and the next only once it is done) leaves the machine working on a shrinking batch: the sentences that finished
early have left, the longest one decides when the next batch may start.  Here every group of arrivals is a
:class:`~nmtkit.translate.cohort.BeamCohort` that joins the running search at its next step
(:meth:`~nmtkit.translate.cohort.BeamCohort.absorb`): its sentences become the search's, their encoder outputs
padded to the longest source and stacked (:func:`stack_encoder_out`), their histories padded on the left to the
search's step, their length limits and prefixes moved on by it.  One model step and one
:meth:`~nmtkit.translate.cohort.BeamCohort.advance` a step serve every sentence, where cohorts stepped side by side
each cost their own advance (tests/bench/results/bench_cohort.txt compares the two).  A cohort is done when its
sentences are, so a short sentence's answer does not wait for the longest one of its batch, and new sentences fill
the room that finished ones leave.

Each cohort's hypotheses are the ones it would find alone (``beam_search`` over the same sentences): the rows of a
sentence only ever read its own encoder output, padding is masked out of the attention, and the left padding of a
history is never a token a rule reads as one (``<pad>`` is no digit and never generated; it is stripped when a
hypothesis finishes) -- a tiny difference in the last bits of a product whose rows are batched differently is the
only one, as between any two batchings.
All cohorts of one :class:`ContinuousSearch` must share the decoding settings and ``need_attention``.
"""

from __future__ import annotations

import copy

import torch

from nmtkit.translate.cohort import BeamCohort, narrow_encoder_out, stack_encoder_out  # noqa: F401 (the helpers)


class ContinuousSearch:
    """The cohorts being decoded together with ``models`` (the same for all; one decoding setting), as one search:
    the first cohort's copy is the search (``host``), and each cohort added later joins it at its next step
    (:meth:`BeamCohort.absorb`).  ``cohorts``: those added and not done yet; a cohort is done (``done``, its
    ``results()`` readable) once the search holds none of its sentences."""

    def __init__(self, models):
        self.models = models
        self.cohorts: list[BeamCohort] = []
        self._host: BeamCohort | None = None
        self._ids: dict[int, range] = {}  # id(cohort) -> its sentences' ids in the host
        self._joining: list[BeamCohort] = []

    def add(self, cohort: BeamCohort) -> None:
        """A cohort joins at the next step (one that is already done is not added)."""
        if not cohort.done:
            self.cohorts.append(cohort)
            self._joining.append(cohort)

    def _join(self) -> None:
        for c in self._joining:
            if self._host is None:
                host = copy.copy(c)  # (its lists copied, the finished ones' inner lists shared with c)
                host.finished, host.count, host.start, host.lens_l = list(c.finished), list(c.count), \
                    list(c.start), list(c.lens_l)
                self._host, self._ids[id(c)] = host, range(len(c.finished))
            else:
                first = len(self._host.finished)
                self._host.absorb(c)
                self._ids[id(c)] = range(first, first + len(c.finished))
        self._joining = []

    @torch.no_grad()
    def step(self) -> list[BeamCohort]:
        """One step of every cohort; -> those done after it (they leave)."""
        self._join()
        host = self._host
        if host is None:
            return []
        host.step()
        alive = set(host.alive.tolist())
        done = [c for c in self.cohorts if host.done or not any(i in alive for i in self._ids[id(c)])]
        for c in done:
            c.done = True
            del self._ids[id(c)]
        if done:
            self.cohorts = [c for c in self.cohorts if not c.done]
        if host.done:
            self._host = None
        return done
