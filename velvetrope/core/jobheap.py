"""A priority queue of queued jobs with lazy removal by identity.

Jobs are ordered by ``(key, seq)``; jobs are pushed in increasing ``seq`` order (the
controller numbers jobs as they arrive), so among equal keys the earlier push goes first.
The queue is a list of sorted *runs*, each a flat array of keys (``array('d')``) beside a
list of the jobs, every run's keys no greater than the next run's, and a read position in
the first run:

* a push whose key is not below the largest key queued (FCFS, EDF with increasing
  deadlines) appends to the last run: O(1);
* any other push bisects the runs' last keys, then its run's keys, and inserts there:
  O(log n) comparisons of plain doubles, plus a move of at most ``2 * RUN`` slots;
* the head is the job at the read position: peek and pop are O(1) (a run is dropped when
  read to its end).

A binary heap of ``(key, seq, job)`` tuples pops by sifting through log n tuples scattered
in memory; at 10^5 queued jobs those cache misses were most of the admission cycle's queue
cost.  Here the keys a push compares sit side by side and a pop reads one slot.

Removal marks nothing: a job that left the QUEUED state is skipped when it surfaces, and the
structure is rebuilt when dead entries outnumber live ones, so removal is O(1) plus an
amortised O(1) share of the rebuilds.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from velvetrope.core.request import Job, JobState

__all__ = ["RUN", "JobHeap"]

_QUEUED = JobState.QUEUED
_REBUILD_MIN_DEAD = 64

RUN = 32
"""Slots per run after a split or a rebuild; a run is split when it doubles."""
_SPLIT = 2 * RUN


class JobHeap:
    """Jobs ordered by ``(key, seq)``; only jobs still QUEUED count as live."""

    __slots__ = ("_dead", "_jobs", "_keys", "_maxes", "_pos", "_unordered", "live")

    def __init__(self) -> None:
        self._keys: list[array[float]] = []  # per run, sorted
        self._jobs: list[list[Job]] = []  # per run, beside its keys
        self._maxes: array[float] = array("d")  # the last key of each run
        self._pos = 0  # read position in the first run
        self._unordered = False
        self.live = 0
        self._dead = 0

    @property
    def is_heap(self) -> bool:
        """True once a key arrived below a queued one (until then pushes only appended)."""
        return self._unordered

    def push(self, key: float, job: Job) -> None:
        """Queue ``job`` under ``key`` (``job.seq`` above every seq pushed before)."""
        maxes = self._maxes
        self.live += 1
        if not maxes or key >= maxes[-1]:
            if maxes and len(self._jobs[-1]) < _SPLIT:
                self._keys[-1].append(key)
                self._jobs[-1].append(job)
                maxes[-1] = key
            else:
                self._keys.append(array("d", (key,)))
                self._jobs.append([job])
                maxes.append(key)
            return
        self._unordered = True
        i = bisect_right(maxes, key)  # < len(maxes): key is below the largest one
        keys = self._keys[i]
        jobs = self._jobs[i]
        lo = self._pos if i == 0 else 0
        at = bisect_right(keys, key, lo)
        keys.insert(at, key)
        jobs.insert(at, job)
        if len(jobs) - lo > _SPLIT:
            if lo:
                del keys[:lo]
                del jobs[:lo]
                self._pos = 0
            self._keys.insert(i + 1, keys[RUN:])
            self._jobs.insert(i + 1, jobs[RUN:])
            del keys[RUN:]
            del jobs[RUN:]
            maxes.insert(i, keys[-1])

    def peek(self) -> Job | None:
        """The live job with the smallest key, or ``None``."""
        all_jobs = self._jobs
        while all_jobs:
            jobs = all_jobs[0]
            pos = self._pos
            n = len(jobs)
            while pos < n:
                job = jobs[pos]
                if job.state is _QUEUED:
                    self._pos = pos
                    return job
                pos += 1
                self._dead -= 1
            self._drop_first()
        return None

    def pop(self) -> Job:
        """Remove and return the live head.  Call only after :meth:`peek` returned a job."""
        jobs = self._jobs[0]
        pos = self._pos
        job = jobs[pos]
        self.live -= 1
        if pos + 1 == len(jobs):
            self._drop_first()
        else:
            self._pos = pos + 1
        return job

    def _drop_first(self) -> None:
        del self._keys[0]
        del self._jobs[0]
        del self._maxes[0]
        self._pos = 0

    def discard(self, job: Job) -> None:
        """Account that ``job`` (already moved out of QUEUED) is no longer live here."""
        self.live -= 1
        self._dead += 1
        if self._dead > _REBUILD_MIN_DEAD and self._dead > self.live:
            keys: list[float] = []
            jobs: list[Job] = []
            start = self._pos  # entries before it in the first run were popped
            for ks, js in zip(self._keys, self._jobs, strict=True):
                for k, j in zip(ks[start:], js[start:], strict=True):
                    if j.state is _QUEUED:
                        keys.append(k)
                        jobs.append(j)
                start = 0
            cuts = range(0, len(jobs), RUN)
            self._keys = [array("d", keys[c : c + RUN]) for c in cuts]
            self._jobs = [jobs[c : c + RUN] for c in cuts]
            self._maxes = array("d", [ks[-1] for ks in self._keys])
            self._pos = 0
            self._dead = 0

    def __len__(self) -> int:
        return self.live
