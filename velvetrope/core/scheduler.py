"""One pool's queue: band → fairness → ordering, with bounds and work accounting.

Bands are the tiers, highest priority first, chosen by ``QueuePolicy.bands``:

``single``
    every tier shares one band (tiers ignored for ordering).
``strict``
    the highest backlogged band goes first, except that a band with ``min_share`` s > 0
    earns s credit per dispatch while it is backlogged and is served as soon as it holds a
    full credit: a backlogged band waits at most ``ceil(1/s)`` dispatches.
``weighted``
    stride scheduling over dispatched cost tokens: the backlogged band with the smallest
    virtual pass goes next, and a dispatch advances its pass by ``cost / weight``.  A band
    that becomes backlogged is lifted to the smallest pass among the backlogged.

Inside a band, a fairness policy (:mod:`.fairness`) picks the tenant and an ordering key
(:mod:`.ordering`) the job.
"""

from __future__ import annotations

from collections.abc import Callable

from velvetrope.core.fairness import BandQueue, make_band
from velvetrope.core.job import Job
from velvetrope.core.ordering import deadline_budgets, make_ordering
from velvetrope.core.policy import PolicyConfig

__all__ = ["Band", "Scheduler"]


class Band:
    """A band's queue and its counters."""

    __slots__ = (
        "count",
        "credit",
        "front",
        "index",
        "max_queued",
        "min_share",
        "name",
        "queue",
        "tokens",
        "vpass",
        "weight",
    )

    def __init__(
        self,
        index: int,
        name: str,
        queue: BandQueue,
        weight: float,
        min_share: float,
        max_queued: int | None,
    ) -> None:
        self.index = index
        self.name = name
        self.queue = queue
        self.weight = weight
        self.min_share = min_share
        self.max_queued = max_queued
        self.tokens = 0
        self.count = 0
        self.credit = 0.0
        self.vpass = 0.0
        self.front: list[Job] = []
        """Jobs taken back from an engine, served before the band's queue, oldest first."""

    def __len__(self) -> int:
        return self.count


class Scheduler:
    """The queue of one pool.  ``pop`` removes the job the last ``peek`` returned."""

    __slots__ = (
        "_chosen",
        "_mode",
        "_ordering",
        "_others",
        "_shared",
        "_strict",
        "_tier_band",
        "_vtime",
        "_weight",
        "_weighted",
        "bands",
        "queued",
        "tokens",
    )

    def __init__(self, policy: PolicyConfig, weight: Callable[[str], float]) -> None:
        q = policy.queue
        self._mode = q.bands
        self._weight = weight
        self._ordering = make_ordering(q, deadline_budgets(policy))
        if self._mode == "single":
            bound = q.max_queued
            self.bands = [Band(0, "all", make_band(q, weight), 1.0, 0.0, bound)]
            self._tier_band = [0] * len(policy.tiers)
        else:
            self.bands = [
                Band(i, t.name, make_band(q, weight), t.weight, t.min_share, t.max_queued)
                for i, t in enumerate(policy.tiers)
            ]
            self._tier_band = list(range(len(policy.tiers)))
        self._weighted = self._mode == "weighted"
        self._strict = self._mode == "strict"
        self._others = [[x for x in self.bands if x is not b] for b in self.bands]
        self._shared = [b for b in self.bands if b.min_share > 0]  # strict bands with a share
        self._chosen: Band | None = None
        self._vtime = 0.0
        self.queued = 0
        self.tokens = 0

    def retier(self, policy: PolicyConfig) -> None:
        """Take ``policy``'s tiers and bounds (a reload; the queue's structure, ``bands``,
        ``fairness`` and ``ordering``, is unchanged, :mod:`velvetrope.core.reload`).

        A band keeps its queue, counters and credit when its tier keeps its name (in any
        position); a new tier gets an empty band; a removed tier's band must hold no queued
        job (the controller rejects them first) and is dropped.  The caller renumbers
        ``job.band`` of live jobs by tier name (:meth:`band_named`).  New jobs are ordered
        with the new tiers' deadline budgets; queued ones keep their keys."""
        q = policy.queue
        self._ordering = make_ordering(q, deadline_budgets(policy))
        if self._mode == "single":
            only = self.bands[0]
            only.max_queued = q.max_queued
            only.queue.reweigh()
            self._tier_band = [0] * len(policy.tiers)
            return
        old = {b.name: b for b in self.bands}
        bands: list[Band] = []
        for i, t in enumerate(policy.tiers):
            b = old.pop(t.name, None)
            if b is None:
                b = Band(i, t.name, make_band(q, self._weight), t.weight, t.min_share, None)
            b.index, b.weight, b.min_share, b.max_queued = i, t.weight, t.min_share, t.max_queued
            b.queue.reweigh()
            bands.append(b)
        for b in old.values():
            assert b.count == 0, f"band {b.name!r} removed while it holds queued jobs"
        self.bands = bands
        self._tier_band = list(range(len(bands)))
        self._others = [[x for x in bands if x is not b] for b in bands]
        self._shared = [b for b in bands if b.min_share > 0]
        self._chosen = None

    def band_named(self, tier: str) -> int:
        """The band number of tier ``tier`` (``-1``: no such band any more, a tier removed
        by a reload; its jobs in flight end without a band to report to)."""
        for b in self.bands:
            if b.name == tier or self._mode == "single":
                return b.index
        return -1

    def band_of(self, tier_index: int) -> int:
        """The band a tier's jobs queue in."""
        return self._tier_band[tier_index]

    def band_full(self, band: int) -> bool:
        b = self.bands[band]
        return b.max_queued is not None and b.count >= b.max_queued

    def enqueue(self, job: Job, band: int, cost: int) -> None:
        """Queue ``job`` (already QUEUED, with ``seq`` set) in band number ``band``; ``band``
        and ``cost`` are the job's, passed in (the controller has read them)."""
        b = self.bands[band]
        if self._weighted and b.count == 0:
            self._wake(b)
        b.queue.push(job, self._ordering.key(job))
        b.count += 1
        b.tokens += cost
        self.queued += 1
        self.tokens += cost

    def _wake(self, b: Band) -> None:
        """An empty weighted band gets work: its pass starts no earlier than the busy bands'
        (else it would be owed every turn it sat idle), or the last one served's."""
        live = [x.vpass for x in self.bands if x.count]
        floor = min(live) if live else self._vtime
        if b.vpass < floor:
            b.vpass = floor

    def requeue(self, job: Job) -> None:
        """Queue ``job`` (already QUEUED, taken back from an engine before its first token)
        at the head of its band, behind any job taken back before it."""
        b = self.bands[job.band]
        if self._weighted and b.count == 0:
            self._wake(b)
        b.front.append(job)
        b.count += 1
        b.tokens += job.cost
        self.queued += 1
        self.tokens += job.cost

    def peek(self) -> Job | None:
        """The job policy would dispatch next, or ``None`` if the queue is empty."""
        if self.queued == 0:
            return None
        chosen: Band | None = None
        if self._weighted:
            for b in self.bands:
                if b.count and (chosen is None or b.vpass < chosen.vpass):
                    chosen = b
        else:
            for b in self._shared:
                if b.credit >= 1.0 and b.count and (chosen is None or b.credit > chosen.credit):
                    chosen = b
            if chosen is None:
                for b in self.bands:
                    if b.count:
                        chosen = b
                        break
        if chosen is None:
            return None
        self._chosen = chosen
        if chosen.front:
            return chosen.front[0]
        return chosen.queue.peek()

    def pop(self) -> Job:
        """Dequeue the job the last :meth:`peek` returned and advance the band policy."""
        b = self._chosen
        assert b is not None, "pop() without a successful peek()"
        self._chosen = None
        # a job taken back was served by its fairness policy already: not charged again
        job = b.front.pop(0) if b.front else b.queue.pop()
        cost = job.cost
        b.count -= 1
        b.tokens -= cost
        self.queued -= 1
        self.tokens -= cost
        if self._weighted:
            self._vtime = b.vpass
            b.vpass += cost / b.weight
        elif self._strict:
            for x in self._shared:
                if x is b or x.count:
                    x.credit += x.min_share
                else:
                    x.credit = 0.0
            b.credit = max(0.0, b.credit - 1.0)
        return job

    def discard(self, job: Job) -> None:
        """Account that queued ``job`` left the queue (cancelled or expired)."""
        b = self.bands[job.band]
        if job in b.front:
            b.front.remove(job)
        else:
            b.queue.discard(job)
        b.count -= 1
        b.tokens -= job.cost
        self.queued -= 1
        self.tokens -= job.cost

    def on_start_direct(self, job: Job) -> None:
        """``job`` (with ``band`` set) started without queueing: fairness still counts it."""
        self.bands[job.band].queue.on_start_direct(job)

    def on_complete(self, job: Job, output_tokens: int) -> None:
        band = job.band
        if band >= 0:  # -1: its tier was removed by a reload while it ran
            self.bands[band].queue.on_complete(job, output_tokens)

    def ahead(self, band: int) -> tuple[int, float]:
        """``(jobs, tokens)`` a new job in ``band`` would wait behind, at most.

        ``tokens`` is the work the pool drains before the new job starts, at most: with
        ``strict`` bands, the work queued in this band and the ones above it; with
        ``weighted`` bands, this band's queued work plus, for each other backlogged band,
        the smaller of what it holds and what stride scheduling serves it meanwhile (its
        weight / this band's weight × this band's work); with ``single``, everything queued.
        """
        if self._strict:
            n = t = 0
            for b in self.bands[: band + 1]:
                n += b.count
                t += b.tokens
            return n, t
        if self._weighted:
            # while this band drains its own work, each other backlogged band is served at
            # most weight/own-weight times as much, and never more than it holds
            own = self.bands[band]
            work = float(own.tokens)
            scale = work / own.weight
            for b in self._others[band]:
                if b.count:
                    share = scale * b.weight
                    tokens = float(b.tokens)  # a float: the sum stays unboxed, compiled
                    work += tokens if tokens < share else share
            return own.count, work
        return self.queued, self.tokens
