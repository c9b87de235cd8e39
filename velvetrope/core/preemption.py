"""Making room before the first token: which dispatched job, if any, to take back from its
engine so a higher tier's queued job starts within its TTFT objective.

A job is *preemptible* from the moment its driver reports it sent to an engine
(:meth:`Preemption.sent`) until its first token, its end, or its preemption: work that has
streamed a token is never taken back, and neither is a job still on its way to an engine
(nothing to cancel yet).  Each job is taken back at most once.

The rule, asked by the controller for the head of a pool's queue when it cannot be
dispatched (:meth:`Preemption.needed`, then :meth:`Preemption.victim`):

* only a job whose tier has a TTFT objective ``ttft`` asks;
* it asks when it would start too late: its predicted wait for a slot, one over the rate
  at which the pool's jobs end (measured over ``window_s``), exceeds ``share`` of the TTFT
  it has left, or, before any end was measured, once it has waited ``share × ttft``;
* the victim is a preemptible job of a lower band (a larger band number): the lowest band
  first, and in it the one dispatched last (the one an engine most likely has not begun).

What happens to the victim is the controller's (:meth:`AdmissionController.dispatchable
<velvetrope.core.controller.AdmissionController.dispatchable>`): its capacity is released,
and it goes back to the head of its band, or, when it can no longer start before its own
deadline, ends ``preempted`` (503 with ``Retry-After``); its driver cancels it at the
engine (:meth:`AdmissionController.take_preempted
<velvetrope.core.controller.AdmissionController.take_preempted>`).
"""

from __future__ import annotations

from collections.abc import Mapping

from velvetrope.core.event_rate import EventRate
from velvetrope.core.job import Job

__all__ = ["Preemption"]


class Preemption:
    """The preemption rule of one pool; see the module docstring.  ``count`` is the jobs
    taken back so far."""

    __slots__ = ("_ends", "_sent", "count", "share", "ttft", "window_s")

    def __init__(
        self, ttft_by_tier: Mapping[str, float | None], *, share: float, window_s: float
    ) -> None:
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}
        self.share = share
        self.window_s = window_s
        self.count = 0
        self._sent: dict[str, Job] = {}  # preemptible jobs, in the order they were sent
        self._ends = EventRate(window_s)

    def retarget(self, ttft_by_tier: Mapping[str, float | None]) -> None:
        """Take the tiers' TTFT objectives of a reloaded policy (what was measured stays)."""
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}

    # -- events ------------------------------------------------------------------------

    def sent(self, job: Job) -> None:
        """``job`` (dispatched, never preempted, no first token) was handed to an engine:
        it is preemptible until its first token or its end."""
        if job.preemptions == 0 and job.first_token_at is None:
            self._sent[job.id] = job

    def first_token(self, job: Job) -> None:
        """``job`` produced its first token: it is no longer preemptible."""
        self._sent.pop(job.id, None)

    def ended(self, job: Job, now: float) -> None:
        """``job`` left its engine (any end, or its preemption): one end measured."""
        self._sent.pop(job.id, None)
        self._ends.add(now)

    # -- the rule ----------------------------------------------------------------------

    def end_rate(self, now: float) -> float:
        """Jobs ended per second over the last ``window_s`` (0 before any)."""
        return self._ends.rate(now)

    def ask_at(self, job: Job) -> float | None:
        """When ``job``, queued, has waited ``share`` of its TTFT (``None``: its tier has no
        TTFT objective): the driver wakes then to ask for room even if nothing else
        happens."""
        ttft = self.ttft.get(job.tier)
        return None if ttft is None else job.arrival + self.share * ttft

    def needed(self, head: Job, now: float) -> bool:
        """Whether ``head``, first in its pool's queue and unable to start, would start too
        late for its TTFT objective unless a slot is made for it."""
        if not self._sent:
            return False
        ttft = self.ttft.get(head.tier)
        if ttft is None:
            return False
        left = head.arrival + ttft - now
        rate = self.end_rate(now)
        if rate <= 0.0:
            return now - head.arrival >= self.share * ttft
        return 1.0 / rate > self.share * left

    def victim(self, band: int) -> Job | None:
        """The preemptible job to take back for a job of ``band``: of the lowest band below
        it, the one sent last; ``None`` when every preemptible job is of ``band`` or
        above."""
        best: Job | None = None
        for job in reversed(self._sent.values()):
            if job.band > band and (best is None or job.band > best.band):
                best = job
        return best

    def make_room(self, head: Job, now: float) -> Job | None:
        """The job to take back for ``head``, which cannot be dispatched now
        (:meth:`needed`, :meth:`victim`), counted as taken; ``None`` when it does not need
        room or no job may be taken back for it.  Taking a job back frees its slot and its
        place in an engine at once (the engine's own queue shrinks when it is cancelled):
        ``head`` starts now if the slot was what held it, else as soon as the engines show
        the room."""
        if not self.needed(head, now):
            return None
        victim = self.victim(head.band)
        if victim is None:
            return None
        self._sent.pop(victim.id, None)
        victim.preemptions += 1
        self.count += 1
        return victim
