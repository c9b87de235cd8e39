"""One table of bucket test vectors: (state, operation, claims, time) → (result, new state).

Run against the Python rules (:class:`~velvetrope.core.bucket.MemoryBuckets`) and against
the Lua scripts in a real Redis (:mod:`tests.store.test_vectors`), so the two cannot drift.
Time is relative: a bucket's ``age_s`` is how long ago it was last refilled, ``now`` is 0.
Redis scripts read the clock from ``TIME``, so the Redis run checks within the refill of
the few milliseconds the round trip takes (``TOLERANCE_S`` of refill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["TOLERANCE_S", "VECTORS", "BucketState", "Vector"]

TOLERANCE_S = 0.25


@dataclass(frozen=True)
class BucketState:
    """A bucket before the operation; ``level`` ``None``: it does not exist yet."""

    capacity: float
    rate: float
    floor: float | None = None
    level: float | None = None
    age_s: float = 0.0
    kind: str = "tokens"


@dataclass(frozen=True)
class Vector:
    name: str
    buckets: dict[str, BucketState]
    op: str  # "reserve" | "settle"
    amounts: dict[str, float] = field(default_factory=dict)  # reserve: key -> amount
    lines: tuple[tuple[str, float, float], ...] = ()  # settle: (key, reserved, actual)
    already_settled: bool = False  # settle: this job id was settled before
    granted: bool | None = None  # reserve: expected answer
    wait_s: float | None = None  # reserve denial: expected retry-after
    worst: str | None = None  # reserve denial: the bucket imposing it
    applied: bool | None = None  # settle: expected answer
    levels: dict[str, float] = field(default_factory=dict)  # expected levels after, at now


B = BucketState
VECTORS: tuple[Vector, ...] = (
    Vector(
        "new bucket starts full and grants",
        {"t": B(1000, 10)},
        "reserve",
        amounts={"t": 300},
        granted=True,
        levels={"t": 700},
    ),
    Vector(
        "refill since last use counts",
        {"t": B(1000, 10, level=100, age_s=20)},
        "reserve",
        amounts={"t": 250},
        granted=True,
        levels={"t": 50},
    ),
    Vector(
        "refill stops at capacity",
        {"t": B(1000, 10, level=900, age_s=60)},
        "reserve",
        amounts={"t": 1000},
        granted=True,
        levels={"t": 0},
    ),
    Vector(
        "short bucket denies with the refill wait",
        {"t": B(1000, 10, level=100, age_s=0)},
        "reserve",
        amounts={"t": 300},
        granted=False,
        wait_s=20.0,
        worst="t",
        levels={"t": 100},
    ),
    Vector(
        "more than the capacity is never granted",
        {"t": B(1000, 10)},
        "reserve",
        amounts={"t": 1001},
        granted=False,
        wait_s=math.inf,
        worst="t",
        levels={},
    ),
    Vector(
        "all or nothing: one short bucket takes nothing from the others",
        {"t": B(1000, 10, level=1000), "r": B(5, 0.5, level=0.5, kind="requests")},
        "reserve",
        amounts={"t": 200, "r": 1},
        granted=False,
        wait_s=1.0,
        worst="r",
        levels={"t": 1000, "r": 0.5},
    ),
    Vector(
        "the longest wait names the bucket",
        {"a": B(100, 10, level=70), "b": B(100, 1, level=5)},
        "reserve",
        amounts={"a": 80, "b": 10},
        granted=False,
        wait_s=5.0,
        worst="b",
        levels={"a": 70, "b": 5},
    ),
    Vector(
        "a bucket in debt waits until it has the amount",
        {"t": B(1000, 10, level=-200, age_s=10)},
        "reserve",
        amounts={"t": 50},
        granted=False,
        wait_s=15.0,
        worst="t",
        levels={"t": -100},
    ),
    Vector(
        "both granted together",
        {"t": B(1000, 10, level=500), "r": B(10, 1, level=3, kind="requests")},
        "reserve",
        amounts={"t": 500, "r": 1},
        granted=True,
        levels={"t": 0, "r": 2},
    ),
    Vector(
        "settle refunds the unused part",
        {"t": B(1000, 10, level=200)},
        "settle",
        lines=(("t", 500, 120),),
        applied=True,
        levels={"t": 580},
    ),
    Vector(
        "settle charges an overrun into debt",
        {"t": B(1000, 10, level=100)},
        "settle",
        lines=(("t", 100, 400),),
        applied=True,
        levels={"t": -200},
    ),
    Vector(
        "debt stops at the floor",
        {"t": B(1000, 10, floor=-300, level=0)},
        "settle",
        lines=(("t", 100, 900),),
        applied=True,
        levels={"t": -300},
    ),
    Vector(
        "a refund never overfills",
        {"t": B(1000, 10, level=950, age_s=3)},
        "settle",
        lines=(("t", 500, 0),),
        applied=True,
        levels={"t": 1000},
    ),
    Vector(
        "settle refills first",
        {"t": B(1000, 10, level=0, age_s=10)},
        "settle",
        lines=(("t", 100, 50),),
        applied=True,
        levels={"t": 150},
    ),
    Vector(
        "a second settlement of one job changes nothing",
        {"t": B(1000, 10, level=200)},
        "settle",
        lines=(("t", 500, 120),),
        already_settled=True,
        applied=False,
        levels={"t": 200},
    ),
    Vector(
        "several lines at once",
        {"t": B(1000, 10, level=0), "r": B(10, 1, level=4, kind="requests")},
        "settle",
        lines=(("t", 300, 100), ("r", 1, 0)),
        applied=True,
        levels={"t": 200, "r": 5},
    ),
    Vector(
        "settling exactly what was reserved keeps the refilled level",
        {"t": B(1000, 10, level=200, age_s=5)},
        "settle",
        lines=(("t", 300, 300),),
        applied=True,
        levels={"t": 250},
    ),
    Vector(
        "one line refunds while another charges an overrun",
        {"t": B(1000, 10, level=0), "u": B(1000, 10, level=500)},
        "settle",
        lines=(("t", 300, 100), ("u", 100, 400)),
        applied=True,
        levels={"t": 200, "u": 200},
    ),
    Vector(
        "a budget (rate 0) never refills: a short one waits forever",
        {"q": B(1000, 0, level=100, age_s=3600)},
        "reserve",
        amounts={"q": 101},
        granted=False,
        wait_s=math.inf,
        worst="q",
        levels={"q": 100},
    ),
    Vector(
        "a budget grants what it holds and keeps the rest, however long after",
        {"q": B(1000, 0, level=100, age_s=86400)},
        "reserve",
        amounts={"q": 100},
        granted=True,
        levels={"q": 0},
    ),
    Vector(
        "a claim of nothing is granted, even in debt (a budget in shadow mode)",
        {"q": B(1000, 0, level=-30)},
        "reserve",
        amounts={"q": 0},
        granted=True,
        levels={"q": -30},
    ),
    Vector(
        "a ledger counter (rate 0, floor 0) counts down by what is settled",
        {"c": B(2.0**53, 0, floor=0.0, level=2.0**53 - 7)},
        "settle",
        lines=(("c", 0, 35),),
        applied=True,
        levels={"c": 2.0**53 - 42},
    ),
)
