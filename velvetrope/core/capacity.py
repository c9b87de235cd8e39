"""Pool capacity: how much may be in flight at once, per engine × live engines.

A pool allows a dispatch while it is under ``max_in_flight`` jobs and, if set, under
``max_tokens_in_flight`` (prompt + reserved output: a proxy for KV cache), and while every
extra :class:`SaturationSignal` agrees (backend metrics, an adaptive limit, leases).
A pool with nothing in flight allows one job whatever the token budget and the signals say,
so a job larger than the budget is never stuck forever and a pool whose signals are blind
still trickles; a pool with no live engine (``max_in_flight`` 0) allows nothing.

Limits given per engine (``max_in_flight_per_engine``, ``max_tokens_in_flight_per_engine``)
follow the fleet: :meth:`PoolCapacity.set_engines` makes them that × the live engines, so
an engine that joins raises the pool's capacity with no config change, and one that leaves
lowers it.

A :class:`DispatchTracker` is told of every job the pool starts and of its end, exactly
once each, whatever the outcome (completed, failed, cancelled): the saturation rule counts
work on its way to the engines with it, so nothing it counts can leak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from velvetrope.core.job import Job

__all__ = ["DispatchTracker", "PoolCapacity", "SaturationSignal"]


class SaturationSignal(Protocol):
    """An extra brake on dispatch, consulted after the slot and token checks pass."""

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """May ``job`` start now, with this much already in flight?  Must not count the
        job as started: :class:`DispatchTracker` hears of the jobs that do."""
        ...


class DispatchTracker(Protocol):
    """Told of each dispatched job when it starts and when it ends (once each)."""

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from this pool (state DISPATCHED)."""
        ...

    def ended(self, job: Job, now: float) -> None:
        """``job``, dispatched earlier, reached its terminal state (any outcome)."""
        ...


class PoolCapacity:
    """Slots and tokens in flight for one pool."""

    __slots__ = (
        "engines",
        "in_flight",
        "listeners",
        "max_in_flight",
        "max_tokens",
        "name",
        "per_engine_slots",
        "per_engine_tokens",
        "probes",
        "signals",
        "tokens",
        "trackers",
    )

    def __init__(
        self,
        name: str,
        max_in_flight: int,
        max_tokens: int | None = None,
        *,
        per_engine_slots: int | None = None,
        per_engine_tokens: int | None = None,
    ) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_tokens = max_tokens
        self.per_engine_slots = per_engine_slots
        self.per_engine_tokens = per_engine_tokens
        self.in_flight = 0
        self.tokens = 0
        self.signals: list[SaturationSignal] = []
        self.trackers: list[DispatchTracker] = []
        self.listeners: list[Callable[[int], None]] = []
        """Told the number of live engines whenever it changes (an adaptive limit)."""
        self.engines = 1
        self.probes = 0
        self.set_engines(1)

    def reshape(
        self,
        max_in_flight: int,
        max_tokens: int | None,
        per_engine_slots: int | None,
        per_engine_tokens: int | None,
    ) -> None:
        """Take new limits (a reload), as :meth:`__init__` takes them: those per engine
        apply to the live engines at once.  Work in flight is kept; a lowered limit holds
        new dispatches until enough of it ends."""
        self.max_in_flight = max_in_flight
        self.max_tokens = max_tokens
        self.per_engine_slots = per_engine_slots
        self.per_engine_tokens = per_engine_tokens
        self.set_engines(self.engines, self.probes)

    def set_engines(self, n: int, probes: int = 0) -> None:
        """The pool now has ``n`` live engines, and ``probes`` more that may take one probe
        request each (a half-open circuit breaker): limits given per engine become that ×
        ``n``, plus one slot (and one engine's token budget) per probe; fixed limits are
        left alone.  The caller dispatches what now fits."""
        old = self.engines
        self.engines = max(0, n)
        probes = self.probes = max(0, probes)
        if self.engines != old:
            for tell in self.listeners:
                tell(self.engines)
        if self.per_engine_slots is not None:
            self.max_in_flight = self.per_engine_slots * self.engines + probes
        if self.per_engine_tokens is not None:
            self.max_tokens = self.per_engine_tokens * (self.engines + probes)

    def fits(self, job: Job, now: float) -> bool:
        """Whether ``job`` may be dispatched now."""
        n = self.in_flight
        if n >= self.max_in_flight:
            return False
        if n == 0:
            return True
        mt = self.max_tokens
        if mt is not None and self.tokens + job.cost > mt:
            return False
        for s in self.signals:  # noqa: SIM110 (all() over a generator costs more, hot path)
            if not s.allows_dispatch(job, n, self.tokens, now):
                return False
        return True

    def acquire(self, job: Job) -> None:
        self.in_flight += 1
        self.tokens += job.cost

    def release(self, job: Job) -> None:
        self.in_flight -= 1
        self.tokens -= job.cost
