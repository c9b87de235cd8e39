"""Token buckets with reserve-then-settle semantics, and the in-memory bucket store.

A bucket holds up to ``capacity`` units and refills at ``rate`` units per second.  A job
reserves its expected cost up front (all of its claims, or none), and settles when it ends:
the unused part is refunded, an overrun is charged.  An overrun may push the level below
zero, down to ``floor`` (never further); a tenant in debt waits for the refill before its
next request is granted.

The arithmetic exists once in Python, in :class:`TokenBucket` and
:meth:`MemoryBuckets.reserve`; the Redis store runs the same rules in Lua, and one table of
test vectors runs against both.  Inputs and outputs are plain data (:class:`Claim`,
:class:`Grant`, :class:`Denial`, :class:`BucketSnapshot`) so that a store elsewhere can
answer for the core.

A claim names its bucket by ``key`` and says what it counts by ``kind`` (``"tokens"`` or
``"requests"``) and who it belongs to by ``owner`` (``"tenant"``, ``"tier"``, ``"model"``;
``"quota"`` and ``"ledger"`` for the budgets of :mod:`velvetrope.core.quota`); nothing is
ever parsed out of a key.

A bucket with ``rate`` 0 never refills: a budget over a calendar window (its key names the
window, so the next window is a new, full bucket) or a ledger counter.  Waiting cannot
grant it (the wait is ``inf``), and it is never full again once used (``time_to_full`` is
``inf``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final, Literal, NamedTuple

from velvetrope.core.tuples import new_tuple
from velvetrope.errors import PolicyError

__all__ = [
    "REQUESTS",
    "TOKENS",
    "BucketKind",
    "BucketOwner",
    "BucketSnapshot",
    "Claim",
    "Denial",
    "Grant",
    "MemoryBuckets",
    "SettleLine",
    "TokenBucket",
    "settle_lines",
    "time_to_full",
]

BucketKind = Literal["tokens", "requests"]
BucketOwner = Literal["tenant", "tier", "model", "quota", "ledger"]
TOKENS: Final[BucketKind] = "tokens"
REQUESTS: Final[BucketKind] = "requests"


SettleLine = tuple[str, float, float]
"""``(key, reserved, actual)``: refund ``reserved - actual`` (or charge the overrun)."""


class TokenBucket:
    """One bucket.  All methods take ``now`` (seconds) and refill lazily up to it."""

    __slots__ = ("capacity", "floor", "last", "level", "rate")

    def __init__(
        self, capacity: float, rate: float, *, floor: float | None = None, now: float = 0.0
    ):
        if not capacity > 0 or not math.isfinite(capacity):
            raise PolicyError(f"bucket capacity must be a positive finite number, got {capacity}")
        if not rate >= 0 or not math.isfinite(rate):
            raise PolicyError(f"bucket refill rate must be a finite number >= 0, got {rate}")
        floor = -capacity if floor is None else floor
        if floor > 0:
            raise PolicyError(f"bucket floor must be <= 0, got {floor}")
        self.capacity = float(capacity)
        self.rate = float(rate)
        self.floor = float(floor)
        self.level = float(capacity)
        self.last = now

    def refill(self, now: float) -> float:
        """Bring the level up to ``now`` and return it.  Time never runs backwards: an
        earlier ``now`` leaves the bucket as it is."""
        dt = now - self.last
        if dt > 0:
            self.last = now
            level = self.level + dt * self.rate
            self.level = level if level < self.capacity else self.capacity
        return self.level

    def reshape(self, capacity: float, rate: float, floor: float | None, now: float) -> None:
        """Take a new capacity, rate and floor (a reloaded policy): the level is refilled to
        ``now`` at the old rate first; a raised capacity refills from the current level, a
        lowered one clips it (as the Redis store does, which is given both with each call).
        A budget (rate 0 before and after) keeps what was used instead: its level moves by
        the change of capacity."""
        self.refill(now)
        if rate == 0.0 and self.rate == 0.0:
            self.level += capacity - self.capacity
            self.capacity = float(capacity)
            self.floor = -self.capacity if floor is None else float(floor)
            return
        self.capacity = float(capacity)
        self.rate = float(rate)
        self.floor = -self.capacity if floor is None else float(floor)
        if self.level > self.capacity:
            self.level = self.capacity

    def wait_for(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` could be reserved (0 if it can be now or is 0; inf if never)."""
        if cost > self.capacity:
            return math.inf
        level = self.refill(now)
        if level >= cost or cost <= 0.0:  # a claim of nothing: granted, even in debt
            return 0.0
        return (cost - level) / self.rate if self.rate > 0.0 else math.inf

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
        """Seconds until the bucket is full again (``inf`` for a used bucket of rate 0)."""
        return time_to_full(self.capacity, self.refill(now), self.rate)


def time_to_full(capacity: float, level: float, rate: float) -> float:
    """Seconds for a bucket at ``level`` to refill to ``capacity`` at ``rate`` (>= 0)."""
    if level >= capacity:
        return 0.0
    return (capacity - level) / rate if rate > 0.0 else math.inf


class Claim(NamedTuple):
    """Reserve ``amount`` from bucket ``key``; create it full with (capacity, rate, floor)
    if it does not exist.  ``floor`` ``None`` means ``-capacity``."""

    key: str
    kind: BucketKind
    owner: BucketOwner
    amount: float
    capacity: float
    rate: float
    floor: float | None = None


class BucketSnapshot(NamedTuple):
    """A bucket's state, for ``x-ratelimit-*`` headers and status pages."""

    key: str
    kind: BucketKind
    owner: BucketOwner
    limit: float
    remaining: float
    reset_s: float


class Grant(NamedTuple):
    """Every claim was reserved; settle them when the job ends."""

    claims: tuple[Claim, ...]
    snapshots: tuple[BucketSnapshot, ...] = ()


class Denial(NamedTuple):
    """Nothing was reserved.  ``retry_after_s`` is ``inf`` when a claim exceeds a capacity;
    ``key`` is the bucket that imposes the longest wait."""

    retry_after_s: float
    key: str
    snapshots: tuple[BucketSnapshot, ...] = ()

    @property
    def never(self) -> bool:
        return math.isinf(self.retry_after_s)


def settle_lines(claims: Sequence[Claim], actual_tokens: int) -> tuple[SettleLine, ...]:
    """What ``claims`` owe once the job used ``actual_tokens`` (prompt + output).

    A token bucket is charged the tokens used; a request bucket keeps its 1 when any work
    was done and is refunded in full when none was (a job shed before it started).
    """
    actual = float(actual_tokens)
    if len(claims) == 1:  # the common case: no list to build
        return (_settle_line(claims[0], actual),)
    out: list[SettleLine] = []  # a loop, not a comprehension: cheaper for one or two claims
    for c in claims:
        out.append(_settle_line(c, actual))
    return tuple(out)


def _settle_line(c: Claim, actual: float) -> SettleLine:
    """The settle line of claim ``c`` for a job that used ``actual`` tokens."""
    return (c.key, c.amount, actual if c.kind == TOKENS else (c.amount if actual else 0.0))


class MemoryBuckets:
    """Named in-memory buckets: the Python implementation of the bucket store's rules.

    :meth:`reserve` takes every claim or none; :meth:`settle` applies settle lines, at most
    once per job id for the last ``remember`` settled jobs.  Unknown keys in settle lines are
    ignored (a bucket is never created by a settlement).
    """

    __slots__ = ("_buckets", "_remember", "_settled")

    def __init__(self, remember: int = 65_536) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._settled: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def bucket(self, claim: Claim, now: float) -> TokenBucket:
        """The bucket for ``claim.key``, created full on first use."""
        b = self._buckets.get(claim.key)
        if b is None:
            b = TokenBucket(claim.capacity, claim.rate, floor=claim.floor, now=now)
            self._buckets[claim.key] = b
        return b

    def get(self, key: str) -> TokenBucket | None:
        return self._buckets.get(key)

    def reserve(
        self, claims: Sequence[Claim], now: float, with_snapshots: bool = False
    ) -> Grant | Denial:
        """Reserve every claim, or none.  A denial names the bucket with the longest wait
        (the first such claim on ties) and carries snapshots of every claimed bucket; a
        grant carries them (after the reservation) when ``with_snapshots``."""
        held = tuple(claims)
        denial = self.take(held, now)
        if denial is not None:
            return denial
        if not with_snapshots:
            return new_tuple(Grant, (held, ()))
        buckets = self._buckets
        snaps = []
        for c in held:  # each bucket was refilled to now by wait_for
            b = buckets[c.key]
            reset = time_to_full(b.capacity, b.level, b.rate)
            snaps.append(
                new_tuple(BucketSnapshot, (c.key, c.kind, c.owner, b.capacity, b.level, reset))
            )
        return new_tuple(Grant, (held, tuple(snaps)))

    def take(self, claims: tuple[Claim, ...], now: float) -> Denial | None:
        """:meth:`reserve` without the :class:`Grant` (the controller's hot path): ``None``
        when every claim was reserved, else the same :class:`Denial`, nothing reserved."""
        buckets = self._buckets
        worst = 0.0
        worst_key = ""
        for c in claims:
            b = buckets.get(c.key)
            if b is None:
                b = self.bucket(c, now)
            elif b.capacity != c.capacity or b.rate != c.rate:
                b.reshape(c.capacity, c.rate, c.floor, now)  # the policy was reloaded
            w = b.wait_for(c.amount, now)
            if w > worst:
                worst, worst_key = w, c.key
        if worst > 0.0:
            return Denial(worst, worst_key, self.snapshots(claims, now))
        for c in claims:
            buckets[c.key].level -= c.amount
        return None

    def settle(self, lines: Iterable[SettleLine], now: float, job_id: str | None = None) -> bool:
        """Apply ``lines``; with ``job_id``, only the first time that id is settled.
        Returns whether the lines were applied."""
        if job_id is not None:
            if job_id in self._settled:
                return False
            self._settled[job_id] = None
            if len(self._settled) > self._remember:
                self._settled.popitem(last=False)
        for key, reserved, actual in lines:
            b = self._buckets.get(key)
            if b is not None:
                b.settle(reserved, actual, now)
        return True

    def snapshots(self, claims: Iterable[Claim], now: float) -> tuple[BucketSnapshot, ...]:
        """Snapshots of the claimed buckets that exist."""
        out = []
        for c in claims:
            b = self._buckets.get(c.key)
            if b is not None:
                level = b.refill(now)
                reset = b.time_to_full(now)
                out.append(
                    new_tuple(BucketSnapshot, (c.key, c.kind, c.owner, b.capacity, level, reset))
                )
        return tuple(out)

    def levels(self, now: float) -> dict[str, tuple[float, float]]:
        """Every bucket's ``(level, capacity)`` at ``now``."""
        return {k: (b.refill(now), b.capacity) for k, b in self._buckets.items()}

    def __len__(self) -> int:
        return len(self._buckets)
