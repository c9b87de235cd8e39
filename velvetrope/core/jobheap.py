"""A priority queue of queued jobs with lazy removal by identity.

Jobs are ordered by ``(key, seq)``; jobs are pushed in increasing ``seq`` order (the
controller numbers jobs as they arrive), so among equal keys the earlier push goes first.
The queue is a list of sorted *runs*, each a list of keys beside a list of the jobs, every
run's keys no greater than the next run's, and a read position in the first run:

* a push whose key is not below the largest key queued (FCFS, EDF with increasing
  deadlines) appends to the last run: O(1);
* any other push bisects the runs' last keys, then its run's keys, and inserts there:
  O(log n) comparisons of plain doubles, plus a move of at most ``2 * RUN`` slots;
* the head is the job at the read position: peek and pop are O(1).  A run read to its end
  is dropped by moving a head index past it; the dropped runs' slots are cut off the lists
  only once they are at least half of them, so dropping a run costs O(1) amortised (cutting
  the first of thousands of runs each time moved every run's slot).

A binary heap of ``(key, seq, job)`` tuples pops by sifting through log n tuples scattered
in memory; at 10^5 queued jobs those cache misses were most of the admission cycle's queue
cost.  Here a push compares a few keys per level and a pop reads one slot.  The searches are
compiled loops over ``list[float]`` (:func:`_bisect_right`): the stdlib's ``bisect`` over an
``array('d')`` boxed a new float for every comparison, a third of a push's cost.

Removal marks nothing: a job that left the QUEUED state is skipped when it surfaces, and the
structure is rebuilt when dead entries outnumber live ones, so removal is O(1) plus an
amortised O(1) share of the rebuilds.
"""

from __future__ import annotations

from typing import Final

from velvetrope.core.job import Job
from velvetrope.core.lifecycle import JobState

__all__ = ["RUN", "JobHeap"]

_QUEUED: Final = JobState.QUEUED
_REBUILD_MIN_DEAD: Final = 64
_CUT_MIN_RUNS: Final = 16  # dropped runs cut off the lists only from this many on

RUN: Final = 32
"""Slots per run after a split or a rebuild; a run is split when it doubles."""
_SPLIT: Final = 2 * RUN


class JobHeap:
    """Jobs ordered by ``(key, seq)``; only jobs still QUEUED count as live.

    The runs still held are ``_head`` to the end of the run lists (all three lists have one
    slot per run); none is held exactly when the lists are empty (then ``_head`` is 0)."""

    __slots__ = ("_dead", "_head", "_jobs", "_keys", "_maxes", "_pos", "_unordered", "live")

    def __init__(self) -> None:
        self._keys: list[list[float]] = []  # per run, sorted
        self._jobs: list[list[Job]] = []  # per run, beside its keys
        self._maxes: list[float] = []  # the last key of each run
        self._head = 0  # the first run held (the runs before it were read to their end)
        self._pos = 0  # read position in the first run held
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
        runs = len(maxes)
        if runs == 0 or key >= maxes[runs - 1]:
            if runs and len(self._jobs[runs - 1]) < _SPLIT:
                self._keys[runs - 1].append(key)
                self._jobs[runs - 1].append(job)
                maxes[runs - 1] = key
            else:
                self._keys.append([key])
                self._jobs.append([job])
                maxes.append(key)
            return
        self._unordered = True
        head = self._head
        i = _bisect_right(maxes, key, head, runs)  # < runs: key is below the largest one
        keys = self._keys[i]
        jobs = self._jobs[i]
        lo = self._pos if i == head else 0
        at = _bisect_right(keys, key, lo, len(keys))
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
            maxes.insert(i, keys[len(keys) - 1])

    def peek(self) -> Job | None:
        """The live job with the smallest key, or ``None``."""
        all_jobs = self._jobs
        while all_jobs:
            jobs = all_jobs[self._head]
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
        jobs = self._jobs[self._head]
        pos = self._pos
        job = jobs[pos]
        self.live -= 1
        if pos + 1 == len(jobs):
            self._drop_first()
        else:
            self._pos = pos + 1
        return job

    def _drop_first(self) -> None:
        """Drop the first run held; cut the dropped runs off the lists when they are all of
        them, or at least :data:`_CUT_MIN_RUNS` and half of them."""
        head = self._head + 1
        self._pos = 0
        runs = len(self._maxes)
        if head == runs:
            self._keys.clear()
            self._jobs.clear()
            self._maxes.clear()
            head = 0
        elif head >= _CUT_MIN_RUNS and 2 * head >= runs:
            del self._keys[:head]
            del self._jobs[:head]
            del self._maxes[:head]
            head = 0
        self._head = head

    def discard(self, job: Job) -> None:
        """Account that ``job`` (already moved out of QUEUED) is no longer live here."""
        self.live -= 1
        self._dead += 1
        if self._dead > _REBUILD_MIN_DEAD and self._dead > self.live:
            keys: list[float] = []
            jobs: list[Job] = []
            head = self._head
            start = self._pos  # entries before it in the first run held were popped
            for ks, js in zip(self._keys[head:], self._jobs[head:], strict=True):
                for k, j in zip(ks[start:], js[start:], strict=True):
                    if j.state is _QUEUED:
                        keys.append(k)
                        jobs.append(j)
                start = 0
            cuts = range(0, len(jobs), RUN)
            self._keys = [keys[c : c + RUN] for c in cuts]
            self._jobs = [jobs[c : c + RUN] for c in cuts]
            self._maxes = [ks[-1] for ks in self._keys]
            self._head = 0
            self._pos = 0
            self._dead = 0

    def __len__(self) -> int:
        return self.live


def _bisect_right(a: list[float], x: float, lo: int, hi: int) -> int:
    """:func:`bisect.bisect_right` over ``a[lo:hi]`` (sorted): the first index whose key is
    above ``x``.  Compiled, it compares unboxed doubles."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo
