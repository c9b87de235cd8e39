"""Fairness between tenants inside one band.  Each policy is a queue of jobs over tenants.

Registered policies (:data:`FAIRNESS`):

``none``
    one queue for the band, ordered by the ordering key alone.
``round_robin``
    one queue per tenant; backlogged tenants take turns, one dispatch each.
``vtc``
    Virtual Token Counters (Sheng et al., "Fairness in Serving Large Language Models",
    OSDI 2024).  Each tenant has a counter of the service it received,
    ``(w_in · prompt + w_out · output) / weight``; the backlogged tenant with the smallest
    counter goes next.  Output is charged at dispatch from the prediction and corrected at
    completion with the real count.  A tenant that becomes backlogged is lifted to the
    smallest counter among the backlogged (or to the last served counter when none are),
    so idle time banks no credit.  Selection scans the backlogged tenants: O(T).

Inside a tenant's queue, jobs are ordered by the ordering key (see :mod:`.ordering`).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

from velvetrope.core.job import Job
from velvetrope.core.jobheap import JobHeap
from velvetrope.core.policy import QueuePolicy
from velvetrope.errors import PolicyError

__all__ = ["FAIRNESS", "BandQueue", "NoFairness", "RoundRobin", "VirtualTokenCounter", "make_band"]

WeightFn = Callable[[str], float]


class BandQueue:
    """The queue of one band.  ``pop`` removes the job the last ``peek`` returned.

    A compiled base class, not a Protocol: the scheduler calls each policy's methods
    directly through it (a Protocol-typed call goes through Python's generic call)."""

    def push(self, job: Job, key: float) -> None:
        """Queue ``job`` (QUEUED, ``seq`` above every seq pushed before) under ``key``."""
        raise NotImplementedError

    def peek(self) -> Job | None:
        """The job this band would dispatch next, or ``None`` if it holds none."""
        raise NotImplementedError

    def pop(self) -> Job:
        """Dequeue the job the last :meth:`peek` returned."""
        raise NotImplementedError

    def discard(self, job: Job) -> None:
        """Account that queued ``job`` (already moved out of QUEUED) left the band."""
        raise NotImplementedError

    def on_start_direct(self, job: Job) -> None:
        """A job of this band started without queueing (fairness may count it)."""

    def on_complete(self, job: Job, output_tokens: int) -> None:
        """A job of this band, dispatched earlier, completed with ``output_tokens``."""

    def reweigh(self) -> None:
        """The policy's tenant weights may have changed (a reload): read them again."""

    def __len__(self) -> int:
        raise NotImplementedError


class NoFairness(BandQueue):
    """One heap for the whole band."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap = JobHeap()

    def push(self, job: Job, key: float) -> None:
        self._heap.push(key, job)

    def peek(self) -> Job | None:
        return self._heap.peek()

    def pop(self) -> Job:
        return self._heap.pop()

    def discard(self, job: Job) -> None:
        self._heap.discard(job)

    def __len__(self) -> int:
        return self._heap.live


class RoundRobin(BandQueue):
    """Backlogged tenants take turns; each turn dispatches the head of that tenant's heap."""

    __slots__ = ("_heaps", "_live", "_turns")

    def __init__(self) -> None:
        self._heaps: dict[str, JobHeap] = {}
        self._turns: deque[str] = deque()
        self._live = 0

    def push(self, job: Job, key: float) -> None:
        h = self._heaps.get(job.tenant)
        if h is None:
            h = self._heaps[job.tenant] = JobHeap()
        if h.live == 0:
            self._turns.append(job.tenant)
        h.push(key, job)
        self._live += 1

    def peek(self) -> Job | None:
        turns = self._turns
        while turns:
            job = self._heaps[turns[0]].peek()
            if job is not None:
                return job
            turns.popleft()
        return None

    def pop(self) -> Job:
        tenant = self._turns.popleft()
        h = self._heaps[tenant]
        job = h.pop()
        self._live -= 1
        if h.live > 0:
            self._turns.append(tenant)
        return job

    def discard(self, job: Job) -> None:
        h = self._heaps[job.tenant]
        h.discard(job)
        self._live -= 1
        if h.live == 0:
            with contextlib.suppress(ValueError):
                self._turns.remove(job.tenant)

    def __len__(self) -> int:
        return self._live


class _Tenant:
    """One tenant of a VTC band: its heap, its virtual counter and its weight (read once,
    and again when the policy is reloaded: :meth:`VirtualTokenCounter.reweigh`)."""

    __slots__ = ("counter", "heap", "name", "weight")

    def __init__(self, name: str, weight: float) -> None:
        self.name = name
        self.heap = JobHeap()
        self.counter = 0.0
        self.weight = weight


class VirtualTokenCounter(BandQueue):
    """VTC fair queueing (see the module docstring).

    Each tenant's heap, counter and weight sit in one :class:`_Tenant` record, so a
    selection, a dispatch or a completion reads them with no dict lookup per tenant."""

    __slots__ = (
        "_backlogged",
        "_chosen",
        "_last",
        "_live",
        "_tenants",
        "_w_in",
        "_w_out",
        "_weight",
    )

    def __init__(self, policy: QueuePolicy, weight: WeightFn) -> None:
        self._w_in = policy.vtc_input_weight
        self._w_out = policy.vtc_output_weight
        self._weight = weight
        self._tenants: dict[str, _Tenant] = {}
        self._backlogged: dict[str, _Tenant] = {}  # in the order they became backlogged
        self._chosen: _Tenant | None = None
        self._last = 0.0
        self._live = 0

    @property
    def counters(self) -> dict[str, float]:
        """Each tenant's counter (of the tenants seen so far), as a new dict."""
        return {t: q.counter for t, q in self._tenants.items()}

    def reweigh(self) -> None:
        """Read every known tenant's weight again; counters and queues are kept."""
        for q in self._tenants.values():
            q.weight = self._weight(q.name)

    def _tenant(self, t: str) -> _Tenant:
        q = self._tenants.get(t)
        if q is None:
            q = self._tenants[t] = _Tenant(t, self._weight(t))
        return q

    def push(self, job: Job, key: float) -> None:
        t = job.tenant
        backlogged = self._backlogged
        q = backlogged.get(t)
        if q is None:
            q = self._tenant(t)
            c = q.counter
            floor = min(u.counter for u in backlogged.values()) if backlogged else self._last
            q.counter = c if c > floor else floor
            backlogged[t] = q
        q.heap.push(key, job)
        self._live += 1

    def peek(self) -> Job | None:
        backlogged = self._backlogged
        while backlogged:
            best: _Tenant | None = None  # the first smallest counter (a loop beats min(key=))
            for q in backlogged.values():
                if best is None or q.counter < best.counter:
                    best = q
            assert best is not None
            job = best.heap.peek()
            if job is not None:
                self._chosen = best
                return job
            del backlogged[best.name]
        return None

    def pop(self) -> Job:
        q = self._chosen
        assert q is not None, "pop() without a successful peek()"
        job = q.heap.pop()
        self._live -= 1
        c = self._last = q.counter
        q.counter = c + self._charge(q, job)
        if q.heap.live == 0:
            del self._backlogged[q.name]
        self._chosen = None
        return job

    def _charge(self, q: _Tenant, job: Job) -> float:
        """What dispatching ``job`` adds to its tenant ``q``'s counter: its prompt and
        predicted output, weighted, over the tenant's weight."""
        out = job.predicted_output
        if out is None:
            out = job.max_tokens
        return (self._w_in * job.prompt_tokens + self._w_out * out) / q.weight

    def discard(self, job: Job) -> None:
        q = self._tenants[job.tenant]
        q.heap.discard(job)
        self._live -= 1
        if q.heap.live == 0:
            self._backlogged.pop(q.name, None)

    def on_start_direct(self, job: Job) -> None:
        """A job of this band started without queueing: it is service all the same (its
        tenant is lifted to the last served counter, then charged as :meth:`pop` does)."""
        q = self._tenant(job.tenant)
        c = q.counter
        c = self._last = c if c > self._last else self._last
        q.counter = c + self._charge(q, job)

    def on_complete(self, job: Job, output_tokens: int) -> None:
        predicted = job.predicted_output
        if predicted is None:
            predicted = job.max_tokens
        q = self._tenant(job.tenant)
        q.counter = q.counter + self._w_out * (output_tokens - predicted) / q.weight

    def __len__(self) -> int:
        return self._live


FAIRNESS: dict[str, Callable[[QueuePolicy, WeightFn], BandQueue]] = {
    "none": lambda policy, weight: NoFairness(),
    "round_robin": lambda policy, weight: RoundRobin(),
    "vtc": VirtualTokenCounter,
}


def make_band(policy: QueuePolicy, weight: WeightFn) -> BandQueue:
    """A band queue for ``policy.fairness``; :class:`PolicyError` if unknown."""
    try:
        factory = FAIRNESS[policy.fairness]
    except KeyError:
        raise PolicyError(
            f"unknown fairness {policy.fairness!r}; known: {', '.join(sorted(FAIRNESS))}"
        ) from None
    return factory(policy, weight)
