"""A binary heap of queued jobs with O(log n) push/pop and lazy removal by identity.

Removal marks nothing in the heap: a job that left the QUEUED state is skipped when it
surfaces, and the heap is rebuilt when dead entries outnumber live ones, so removal is
O(1) plus an amortised O(1) share of the rebuilds.
"""

from __future__ import annotations

import heapq

from velvetrope.core.request import Job, JobState

__all__ = ["JobHeap"]

_QUEUED = JobState.QUEUED
_REBUILD_MIN_DEAD = 64


class JobHeap:
    """Jobs ordered by ``(key, seq)``; only jobs still QUEUED count as live."""

    __slots__ = ("_dead", "_h", "live")

    def __init__(self) -> None:
        self._h: list[tuple[float, int, Job]] = []
        self.live = 0
        self._dead = 0

    def push(self, key: float, job: Job) -> None:
        heapq.heappush(self._h, (key, job.seq, job))
        self.live += 1

    def peek(self) -> Job | None:
        """The live job with the smallest key, or ``None``."""
        h = self._h
        while h:
            job = h[0][2]
            if job.state is _QUEUED:
                return job
            heapq.heappop(h)
            self._dead -= 1
        return None

    def pop(self) -> Job:
        """Remove and return the live head.  Call only after :meth:`peek` returned a job."""
        job = heapq.heappop(self._h)[2]
        self.live -= 1
        return job

    def discard(self, job: Job) -> None:
        """Account that ``job`` (already moved out of QUEUED) is no longer live here."""
        self.live -= 1
        self._dead += 1
        if self._dead > _REBUILD_MIN_DEAD and self._dead > self.live:
            self._h = [e for e in self._h if e[2].state is _QUEUED]
            heapq.heapify(self._h)
            self._dead = 0

    def __len__(self) -> int:
        return self.live
