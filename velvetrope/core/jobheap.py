"""A priority queue of queued jobs with lazy removal by identity.

Jobs are ordered by ``(key, seq)``.  While keys arrive in non-decreasing order (FCFS, EDF
with increasing deadlines) the queue is a deque: O(1) push and pop.  The first key that
arrives out of order turns it into a binary heap for good (a sorted list already is one):
O(log n) push and pop.

Removal marks nothing: a job that left the QUEUED state is skipped when it surfaces, and the
structure is rebuilt when dead entries outnumber live ones, so removal is O(1) plus an
amortised O(1) share of the rebuilds.
"""

from __future__ import annotations

import heapq
from collections import deque

from velvetrope.core.request import Job, JobState

__all__ = ["JobHeap"]

_QUEUED = JobState.QUEUED
_REBUILD_MIN_DEAD = 64

_Entry = tuple[float, int, Job]


class JobHeap:
    """Jobs ordered by ``(key, seq)``; only jobs still QUEUED count as live."""

    __slots__ = ("_dead", "_dq", "_h", "_last", "live")

    def __init__(self) -> None:
        self._dq: deque[_Entry] = deque()
        self._h: list[_Entry] | None = None
        self._last = float("-inf")
        self.live = 0
        self._dead = 0

    @property
    def is_heap(self) -> bool:
        """True once an out-of-order key turned the deque into a heap."""
        return self._h is not None

    def push(self, key: float, job: Job) -> None:
        h = self._h
        if h is None:
            if key >= self._last:
                self._dq.append((key, job.seq, job))
                self._last = key
                self.live += 1
                return
            h = self._h = list(self._dq)  # sorted, hence a valid heap
            self._dq.clear()
        heapq.heappush(h, (key, job.seq, job))
        self.live += 1

    def peek(self) -> Job | None:
        """The live job with the smallest key, or ``None``."""
        h = self._h
        if h is None:
            dq = self._dq
            while dq:
                job = dq[0][2]
                if job.state is _QUEUED:
                    return job
                dq.popleft()
                self._dead -= 1
            return None
        while h:
            job = h[0][2]
            if job.state is _QUEUED:
                return job
            heapq.heappop(h)
            self._dead -= 1
        return None

    def pop(self) -> Job:
        """Remove and return the live head.  Call only after :meth:`peek` returned a job."""
        h = self._h
        job = self._dq.popleft()[2] if h is None else heapq.heappop(h)[2]
        self.live -= 1
        return job

    def discard(self, job: Job) -> None:
        """Account that ``job`` (already moved out of QUEUED) is no longer live here."""
        self.live -= 1
        self._dead += 1
        if self._dead > _REBUILD_MIN_DEAD and self._dead > self.live:
            if self._h is None:
                self._dq = deque(e for e in self._dq if e[2].state is _QUEUED)
            else:
                self._h = [e for e in self._h if e[2].state is _QUEUED]
                heapq.heapify(self._h)
            self._dead = 0

    def __len__(self) -> int:
        return self.live
