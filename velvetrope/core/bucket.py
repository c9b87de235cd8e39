"""Token buckets with reserve-then-settle semantics.

A bucket holds up to ``capacity`` units and refills at ``rate`` units per second.
:meth:`TokenBucket.reserve` takes a job's expected cost up front, or says how long until it
could; :meth:`TokenBucket.settle` later refunds the unused part or charges the overrun.  An
overrun may push the level below zero, down to ``floor`` (never further); a tenant in debt
waits for the refill before its next request is granted.

:class:`BucketLedger` keeps named buckets and reserves several at once, all or nothing.
This is the step a shared store (Redis) performs instead, with the same math, which is why
its inputs and outputs are plain data (:class:`Claim`, :class:`Grant`, :class:`Denial`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from velvetrope.errors import PolicyError

__all__ = ["BucketLedger", "BucketSnapshot", "Claim", "Denial", "Grant", "TokenBucket", "take"]


class TokenBucket:
    """One bucket.  All methods take ``now`` (seconds) and refill lazily up to it."""

    __slots__ = ("capacity", "floor", "last", "level", "rate")

    def __init__(
        self, capacity: float, rate: float, *, floor: float | None = None, now: float = 0.0
    ):
        if not capacity > 0 or not math.isfinite(capacity):
            raise PolicyError(f"bucket capacity must be a positive finite number, got {capacity}")
        if not rate > 0 or not math.isfinite(rate):
            raise PolicyError(f"bucket refill rate must be a positive finite number, got {rate}")
        floor = -capacity if floor is None else floor
        if floor > 0:
            raise PolicyError(f"bucket floor must be <= 0, got {floor}")
        self.capacity = float(capacity)
        self.rate = float(rate)
        self.floor = float(floor)
        self.level = float(capacity)
        self.last = now

    def refill(self, now: float) -> float:
        """Bring the level up to ``now`` and return it."""
        dt = now - self.last
        if dt > 0:
            self.last = now
            level = self.level + dt * self.rate
            self.level = level if level < self.capacity else self.capacity
        return self.level

    def wait_for(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` could be reserved (0 if it can be now; inf if never)."""
        if cost > self.capacity:
            return math.inf
        level = self.level
        dt = now - self.last
        if dt > 0:
            self.last = now
            level += dt * self.rate
            if level > self.capacity:
                level = self.capacity
            self.level = level
        return 0.0 if level >= cost else (cost - level) / self.rate

    def reserve(self, cost: float, now: float) -> float:
        """Take ``cost`` if the level allows: return 0.0.  Otherwise take nothing and return
        the seconds until it would be granted (``inf`` when ``cost`` exceeds the capacity)."""
        wait = self.wait_for(cost, now)
        if wait == 0.0:
            self.level -= cost
        return wait

    def settle(self, reserved: float, actual: float, now: float) -> None:
        """Refund ``reserved - actual`` (or charge the overrun), clamped to [floor, capacity]."""
        level = self.refill(now) + reserved - actual
        self.level = self.floor if level < self.floor else min(level, self.capacity)

    def time_to_full(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.refill(now)) / self.rate)


class Claim(NamedTuple):
    """Reserve ``amount`` from bucket ``key``; create it with (capacity, rate, floor) if new."""

    key: str
    amount: float
    capacity: float
    rate: float
    floor: float | None = None


class BucketSnapshot(NamedTuple):
    """A bucket's state, for ``x-ratelimit-*`` headers and status pages."""

    key: str
    limit: float
    remaining: float
    reset_s: float


class Grant(NamedTuple):
    """Every claim was reserved: ``lines`` are ``(key, amount)`` to settle later."""

    lines: tuple[tuple[str, float], ...]
    snapshots: tuple[BucketSnapshot, ...] = ()


class Denial(NamedTuple):
    """Nothing was reserved.  ``retry_after_s`` is ``inf`` when a claim exceeds a capacity."""

    retry_after_s: float
    key: str
    snapshots: tuple[BucketSnapshot, ...] = ()

    @property
    def never(self) -> bool:
        return math.isinf(self.retry_after_s)


def take(
    plan: Sequence[tuple[str, TokenBucket, bool]], cost: float, now: float
) -> tuple[float, str]:
    """Reserve ``cost`` from each token bucket and 1 from each request bucket of ``plan``
    (``(key, bucket, is_tokens)``), all or nothing.  Returns ``(0.0, "")`` when granted,
    else ``(wait, key)``: the longest wait in seconds (``inf`` when an amount exceeds a
    capacity) and the bucket that imposes it; nothing is taken then."""
    worst = 0.0
    worst_key = ""
    for key, b, tok in plan:
        w = b.wait_for(cost if tok else 1.0, now)
        if w > worst:
            worst, worst_key = w, key
    if worst > 0.0:
        return worst, worst_key
    for _, b, tok in plan:
        b.level -= cost if tok else 1.0
    return 0.0, ""


class BucketLedger:
    """Named in-memory buckets.  Reservations over several buckets are all-or-nothing."""

    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def bucket(self, claim: Claim, now: float) -> TokenBucket:
        """The bucket for ``claim.key``, created full on first use."""
        b = self._buckets.get(claim.key)
        if b is None:
            b = TokenBucket(claim.capacity, claim.rate, floor=claim.floor, now=now)
            self._buckets[claim.key] = b
        return b

    def get(self, key: str) -> TokenBucket | None:
        return self._buckets.get(key)

    def reserve(self, claims: Sequence[Claim], now: float) -> Grant | Denial:
        """Reserve every claim, or none.  A denial names the bucket with the longest wait."""
        buckets = [self.bucket(c, now) for c in claims]
        worst = 0.0
        worst_key = ""
        for c, b in zip(claims, buckets, strict=True):
            w = b.wait_for(c.amount, now)
            if w > worst:
                worst, worst_key = w, c.key
        if worst > 0.0:
            return Denial(worst, worst_key, self.snapshots((c.key for c in claims), now))
        for c, b in zip(claims, buckets, strict=True):
            b.level -= c.amount
        return Grant(tuple([(c.key, c.amount) for c in claims]))

    def settle(self, lines: Iterable[tuple[str, float, float]], now: float) -> None:
        """Apply ``(key, reserved, actual)`` lines; unknown keys are ignored (never created)."""
        for key, reserved, actual in lines:
            b = self._buckets.get(key)
            if b is not None:
                b.settle(reserved, actual, now)

    def snapshots(self, keys: Iterable[str], now: float) -> tuple[BucketSnapshot, ...]:
        out = []
        for k in keys:
            b = self._buckets.get(k)
            if b is not None:
                out.append(BucketSnapshot(k, b.capacity, b.refill(now), b.time_to_full(now)))
        return tuple(out)

    def levels(self, now: float) -> dict[str, float]:
        """Every bucket's level at ``now``."""
        return {k: b.refill(now) for k, b in self._buckets.items()}

    def __len__(self) -> int:
        return len(self._buckets)
