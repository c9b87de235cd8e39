"""The job queue against a binary heap of ``(key, seq)``: same head after any mix of
pushes (in order, out of order, tied), discards and pops, through run splits and
rebuilds."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import make_job
from velvetrope.core import Job, JobState
from velvetrope.core.jobheap import RUN, JobHeap

_op = st.one_of(
    st.tuples(st.just("push"), st.integers(0, 40)),  # a key among few: ties
    st.tuples(st.just("push"), st.integers(0, 10**6)),
    st.tuples(st.just("tail"), st.integers(0, 3)),  # at or above the largest key so far
    st.tuples(st.just("discard"), st.integers(0, 10**6)),
    st.tuples(st.just("pop"), st.just(0)),
)


def check(ops: list[tuple[str, int]]) -> JobHeap:
    q = JobHeap()
    ref: list[tuple[float, int, Job]] = []
    live: list[Job] = []
    top = 0.0
    seq = 0
    for kind, x in ops:
        if kind in ("push", "tail"):
            key = float(x) if kind == "push" else top + x
            top = max(top, key)
            seq += 1
            job = make_job()
            job.seq, job.state = seq, JobState.QUEUED
            q.push(key, job)
            heapq.heappush(ref, (key, seq, job))
            live.append(job)
        elif kind == "discard" and live:
            job = live.pop(x % len(live))
            job.state = JobState.CANCELLED
            q.discard(job)
        else:
            while ref and ref[0][2].state is not JobState.QUEUED:
                heapq.heappop(ref)
            head = q.peek()
            assert head is (ref[0][2] if ref else None)
            if head is not None:
                assert q.pop() is head
                heapq.heappop(ref)
                head.state = JobState.DISPATCHED
                live.remove(head)
        assert len(q) == len(live)
    expected = [e[2] for e in sorted(e for e in ref if e[2].state is JobState.QUEUED)]
    order = []
    while (head := q.peek()) is not None:
        order.append(q.pop())
        head.state = JobState.DISPATCHED
    assert order == expected
    return q


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_op, max_size=600))
def test_the_queue_orders_like_a_heap(ops: list[tuple[str, int]]) -> None:
    check(ops)


def test_long_runs_split_and_dead_entries_are_rebuilt_away() -> None:
    """Seeded: enough out-of-order pushes to split runs many times, and enough discards to
    trigger rebuilds, on both sides of a pop position inside the first run."""
    import random

    rng = random.Random(4)
    ops: list[tuple[str, int]] = []
    for _ in range(40 * RUN):
        r = rng.random()
        if r < 0.55:
            ops.append(("push", rng.randrange(10**6)))
        elif r < 0.7:
            ops.append(("tail", rng.randrange(3)))
        elif r < 0.85:
            ops.append(("discard", rng.randrange(10**6)))
        else:
            ops.append(("pop", 0))
    q = check(ops)
    assert q.is_heap


def test_runs_read_to_their_end_are_cut_off_in_bulk() -> None:
    """Seeded, deep: thousands of runs, most read to their end by pops while out-of-order
    keys keep landing in the first runs held, so the dropped runs are cut off the lists many
    times (and the queue emptied and refilled) and the order still matches the heap's."""
    import random

    rng = random.Random(7)
    ops: list[tuple[str, int]] = [("tail", rng.randrange(3)) for _ in range(60 * RUN)]
    for _ in range(4):
        for _ in range(80 * RUN):
            r = rng.random()
            if r < 0.3:
                ops.append(("push", rng.randrange(10**6)))
            elif r < 0.35:
                ops.append(("discard", rng.randrange(10**6)))
            else:
                ops.append(("pop", 0))
        ops += [("tail", rng.randrange(3)) for _ in range(20 * RUN)]
    q = check(ops)
    assert q.is_heap
