"""Pool capacity: how much may be in flight at once.

A pool admits a dispatch while it is under ``max_in_flight`` jobs and, if set, under
``max_tokens_in_flight`` (prompt + reserved output: a proxy for KV cache), and while every
extra :class:`SaturationSignal` agrees (backend metrics, an adaptive limit).  A pool with
nothing in flight always admits one job, so a job larger than the token budget is never
stuck forever.
"""

from __future__ import annotations

from typing import Protocol

from velvetrope.core.request import Job

__all__ = ["PoolCapacity", "SaturationSignal"]


class SaturationSignal(Protocol):
    """An extra brake on dispatch, consulted after the slot and token checks pass."""

    def admits(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """May ``job`` start now, with this much already in flight?"""
        ...


class PoolCapacity:
    """Slots and tokens in flight for one pool."""

    __slots__ = ("in_flight", "max_in_flight", "max_tokens", "name", "signals", "tokens")

    def __init__(self, name: str, max_in_flight: int, max_tokens: int | None = None) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_tokens = max_tokens
        self.in_flight = 0
        self.tokens = 0
        self.signals: list[SaturationSignal] = []

    def fits(self, job: Job, now: float) -> bool:
        """Whether ``job`` may be dispatched now."""
        n = self.in_flight
        if n == 0:
            return True
        if n >= self.max_in_flight:
            return False
        mt = self.max_tokens
        if mt is not None and self.tokens + job.cost > mt:
            return False
        return all(s.admits(job, n, self.tokens, now) for s in self.signals)

    def acquire(self, job: Job) -> None:
        self.in_flight += 1
        self.tokens += job.cost

    def release(self, job: Job) -> None:
        self.in_flight -= 1
        self.tokens -= job.cost
