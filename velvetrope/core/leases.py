"""Leases on a pool's shared slots, as the admission core sees them (the words as
``docs/design.md``'s glossary has them).

With a shared store each dispatched job has a *lease* on one of its pool's slots, counted
over every gateway replica.  The store grants leases (I/O); what the core keeps is which
jobs have one and which wait for theirs:

* :class:`Slot` is what a job asks of its pool: its tokens in flight against the pool's
  fleet-wide limits.
* :class:`LeaseBrake` (one per pool) is a capacity signal and dispatch tracker: while a
  job dispatched here waits for its lease, it holds this replica's further dispatches from
  that pool.  So at most one job per pool leaves the queue without a lease, and the
  policy's order is kept up to that one job.  It is told, never asks: the request machine
  (:mod:`velvetrope.core.request_machine`) reports each lease taken with a reservation
  (:meth:`LeaseBrake.leased`) and each lease granted later (:meth:`LeaseBrake.slotted`).
"""

from __future__ import annotations

from typing import NamedTuple

from velvetrope.core.job import Job

__all__ = ["LeaseBrake", "Slot"]


class Slot(NamedTuple):
    """A slot asked of ``pool``: the job's ``tokens`` in flight, against the pool's fleet-wide
    ``max_in_flight`` and ``max_tokens`` (``None``: no token budget)."""

    pool: str
    tokens: int
    max_in_flight: int
    max_tokens: int | None


class LeaseBrake:
    """Holds a pool's dispatches while a job dispatched here lacks its lease."""

    __slots__ = ("has", "lacking", "pool")

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.has: set[str] = set()
        """Ids of the live jobs of this pool that have their lease."""
        self.lacking: set[str] = set()
        """Ids of the jobs dispatched here that have no lease yet (at most one, but for a
        job dispatched while nothing else was in flight)."""

    def leased(self, job_id: str) -> None:
        """``job_id`` took its lease with its reservation."""
        self.has.add(job_id)

    def slotted(self, job_id: str) -> None:
        """``job_id`` got its lease after its dispatch: release the brake."""
        self.lacking.discard(job_id)
        self.has.add(job_id)

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        return not self.lacking

    def started(self, job: Job, now: float) -> None:
        if job.shadow is None and job.id not in self.has:  # shadow: no lease taken
            self.lacking.add(job.id)

    def ended(self, job: Job, now: float) -> None:
        self.lacking.discard(job.id)

    def forget(self, job_id: str) -> None:
        """``job_id`` gave its lease back: it ended (with its settlement), or it was taken
        back from its engine and queued again (it asks for a lease again when dispatched)."""
        self.has.discard(job_id)
