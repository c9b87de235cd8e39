"""A live job's ends, for the admission controller: its first token, completion,
failure, cancellation, expiry and preemption, and the settlement each one owes.

:class:`JobEnds` is the base of :class:`~velvetrope.core.controller.AdmissionController`:
the controller admits and dispatches (arrival, routing, the queue), this class ends what it
admitted.  The invariant is the controller's: every job reaches exactly one terminal state,
and at that moment, exactly once, its slot and token budget are released and its bucket
reservation is settled against the tokens actually used; each terminal
:class:`~velvetrope.core.job.Outcome` is handed to every observer and returned.  A job taken
back from its engine before its first token (:mod:`velvetrope.core.preemption`) is the one
dispatched job that may be queued again instead of ending.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Final, NamedTuple

from velvetrope.clock import Clock
from velvetrope.core.bucket import settle_lines
from velvetrope.core.estimate import OutputEstimator
from velvetrope.core.job import Job, Outcome
from velvetrope.core.lifecycle import JobState, Reason, Settlement, Usage
from velvetrope.core.pool import Pool
from velvetrope.core.predictor import LengthPredictor
from velvetrope.core.tuples import new_tuple
from velvetrope.errors import LifecycleError, UnknownJobError

__all__ = ["JobEnds", "Preempted"]

_QUEUED: Final = JobState.QUEUED
_DISPATCHED: Final = JobState.DISPATCHED
_COMPLETED: Final = JobState.COMPLETED
_DONE: Final = Reason.COMPLETED
_NONE: Final = Settlement(())  # what a job with no claims owes


class Preempted(NamedTuple):
    """A job taken back from its engine before its first token (cancel it there): queued
    again (``outcome`` ``None``), or ended 503 ``preempted``, to retry after
    ``retry_after_s``."""

    job: Job
    outcome: Outcome | None
    retry_after_s: float | None


class JobEnds:
    """The ends of live jobs; the state it shares with the controller is set by the
    controller's constructor and configuration."""

    clock: Clock
    estimator: OutputEstimator
    observers: list[Callable[[Outcome], None]]
    queued: int
    in_flight: int
    _jobs: dict[str, Job]
    _pools: dict[str, Pool]
    _deadlines: list[tuple[float, int, Job]]
    _tenant_queued: dict[str, int]
    _unreported: list[Outcome]
    _preempted: list[Preempted]
    _asks: list[tuple[float, int, Job]]
    _tier_index: dict[str, int]
    _tier_max_wait: list[float | None]

    def sent(self, job_id: str) -> None:
        """The dispatched job ``job_id`` was handed to an engine: until its first token it
        may be taken back to make room for a higher tier (:mod:`velvetrope.core.preemption`;
        a driver that never reports this never sees a preemption)."""
        job = self._jobs.get(job_id)
        if job is not None and job.state is _DISPATCHED and job.shadow is None:
            pre = self._pools[job.pool].preemption
            if pre is not None:
                pre.sent(job)

    def take_preempted(self) -> list[Preempted]:
        """The jobs taken back from their engines since the last call: the driver cancels
        each at its engine; one with an ``outcome`` ended (503 ``preempted``, its claims
        refunded), one without is queued again (it is in :meth:`dispatchable` later)."""
        out = self._preempted
        self._preempted = []
        return out

    def first_token(self, job_id: str) -> None:
        """Record the first token of a dispatched job."""
        job = self._live(job_id)
        if job.state is not _DISPATCHED:
            raise LifecycleError(f"job {job_id!r} is {job.state.value}, not dispatched")
        if job.first_token_at is None:
            job.first_token_at = now = self.clock.now()
            self._pools[job.pool].first_token(job, now)

    def complete(self, job_id: str, usage: Usage) -> Outcome:
        """A dispatched job finished: settle with ``usage`` and release its capacity."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no live job {job_id!r}")
        if job.state is not _DISPATCHED:
            raise LifecycleError(f"job {job_id!r} is {job.state.value}, not dispatched")
        est = self.estimator
        if job.predicted_output == 0:
            pass  # prompt-only work (embeddings, rerank): no output length to learn from
        elif isinstance(est, LengthPredictor):  # narrowed: a direct compiled call
            est.observe(job, usage.completion_tokens)
        else:
            est.observe(job, usage.completion_tokens)
        return self._end_dispatched(job, _COMPLETED, _DONE, usage)

    def fail(
        self, job_id: str, reason: Reason = Reason.UPSTREAM_ERROR, usage: Usage | None = None
    ) -> Outcome:
        """A dispatched job failed upstream.  Without ``usage`` nothing is charged."""
        job = self._live(job_id)
        if job.state is not _DISPATCHED:
            raise LifecycleError(f"job {job_id!r} is {job.state.value}, not dispatched")
        return self._end_dispatched(job, JobState.FAILED, reason, usage or Usage(0, 0))

    def cancel(self, job_id: str, usage: Usage | None = None) -> Outcome:
        """The client went away.  A queued job is refunded in full; a dispatched one is
        charged ``usage`` (default: its prompt tokens only)."""
        job = self._live(job_id)
        now = self.clock.now()
        if job.state is _QUEUED:
            return self._end_queued(job, JobState.CANCELLED, Reason.CANCELLED, now)
        return self._end_dispatched(
            job, JobState.CANCELLED, Reason.CANCELLED, usage or Usage(job.prompt_tokens, 0)
        )

    def tick(self) -> list[Outcome]:
        """Expire queued jobs whose deadline passed; return them (and any expired earlier
        by :meth:`dispatchable` and not yet returned)."""
        out = self._unreported
        self._unreported = []
        out.extend(self._expire(self.clock.now()))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time something is due among queued jobs, for a driver's timer: a
        deadline, or the moment a job may ask for room (:mod:`velvetrope.core.preemption`;
        the driver's timer then calls :meth:`tick` and ``dispatchable``)."""
        d = self._deadlines
        while d and d[0][2].state is not _QUEUED:
            heapq.heappop(d)
        a = self._asks
        while a and a[0][2].state is not _QUEUED:
            heapq.heappop(a)
        if not a:
            return d[0][0] if d else None
        return a[0][0] if not d or a[0][0] < d[0][0] else d[0][0]

    def _live(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no live job {job_id!r}")
        return job

    def _settlement(self, job: Job, actual_tokens: int) -> Settlement:
        claims = job.claims
        if not claims:
            return _NONE
        return new_tuple(Settlement, (settle_lines(claims, actual_tokens),))

    def _emit(
        self, job: Job, state: JobState, reason: Reason, settlement: Settlement, now: float
    ) -> Outcome:
        job.reason = reason
        job.finished_at = now
        out = new_tuple(Outcome, (job, state, reason, settlement, now))
        for obs in self.observers:
            obs(out)
        return out

    def _end_queued(self, job: Job, state: JobState, reason: Reason, now: float) -> Outcome:
        job.move(state)
        pool = self._pools[job.pool]
        pool.sched.discard(job)
        self.queued -= 1
        self._tenant_queued[job.tenant] -= 1
        del self._jobs[job.id]
        return self._emit(job, state, reason, self._settlement(job, 0), now)

    def _end_dispatched(self, job: Job, state: JobState, reason: Reason, usage: Usage) -> Outcome:
        now = self.clock.now()
        job.state = state  # DISPATCHED -> terminal: callers checked DISPATCHED
        job.usage = usage
        output = usage[1]
        total = usage[0] + output
        pool = self._pools[job.pool]
        self.in_flight -= 1
        pool.release(job, now, total, output, state is _COMPLETED)
        pool.sched.on_complete(job, output)
        del self._jobs[job.id]
        claims = job.claims  # (self._settlement, inline on this path)
        if claims and job.shadow == "rejected":
            total = 0  # enforcement would have refunded what it reserved
        settled = new_tuple(Settlement, (settle_lines(claims, total),)) if claims else _NONE
        return self._emit(job, state, reason, settled, now)

    def _take_back(self, job: Job, pool: Pool, now: float) -> None:
        """Queue ``job``, just taken back from its engine before its first token, at the
        head of its band; or end it ``preempted`` when it can no longer start before its
        deadline (:meth:`Pool.starts_by`)."""
        self.in_flight -= 1
        pool.release(job, now, 0, 0, False)
        deadline = self._deadline(job, self._tier_index[job.tier])
        retry = pool.starts_by(job, deadline, now)
        if retry is not None:
            job.state = JobState.REJECTED
            del self._jobs[job.id]
            o = self._emit(job, JobState.REJECTED, Reason.PREEMPTED, self._settlement(job, 0), now)
            self._preempted.append(Preempted(job, o, retry))
            return
        job.state = _QUEUED
        pool.sched.requeue(job)
        self.queued += 1
        self._tenant_queued[job.tenant] = self._tenant_queued.get(job.tenant, 0) + 1
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, job.seq, job))
        self._preempted.append(Preempted(job, None, None))

    def _deadline(self, job: Job, tier: int) -> float | None:
        """When ``job`` (of tier number ``tier``) expires if still queued: its own deadline
        or its tier's wait bound from its arrival, whichever comes first."""
        deadline = job.deadline
        max_wait = self._tier_max_wait[tier]
        if max_wait is not None:
            limit = job.arrival + max_wait
            deadline = limit if deadline is None or limit < deadline else deadline
        return deadline

    def _expire(self, now: float) -> list[Outcome]:
        out: list[Outcome] = []
        d = self._deadlines
        while d and d[0][0] <= now:
            job = heapq.heappop(d)[2]
            if job.state is _QUEUED:
                out.append(self._end_queued(job, JobState.EXPIRED, Reason.EXPIRED, now))
        return out
