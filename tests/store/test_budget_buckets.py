"""A budget's bucket (rate 0) reloaded with another size keeps what was used, in Python and
in Lua alike: its level moves by the change of capacity instead of being clipped or kept."""

from __future__ import annotations

import asyncio

import pytest
import redis

from velvetrope.core.bucket import Claim, Denial, Grant, MemoryBuckets
from velvetrope.store.redis_store import RedisStore

pytestmark = pytest.mark.integration

TENANT = "acme"


def budget(amount: float, capacity: float) -> Claim:
    return Claim("quota:acme:day:2026-12-06:tok", "tokens", "quota", amount, capacity, 0.0)


# (claim, granted, the level after it), in order, one bucket
STEPS: tuple[tuple[Claim, bool, float], ...] = (
    (budget(600, 1000), True, 400.0),  # 600 used of 1000
    (budget(0, 2000), True, 1400.0),  # raised: the 600 used stay used
    (budget(1500, 2000), False, 1400.0),  # 1,400 left: refused
    (budget(1, 500), False, -100.0),  # lowered below the use: in debt, not clipped to 500
    (budget(100, 1000), True, 300.0),  # raised again: 700 used
)


def test_python_rules() -> None:
    m = MemoryBuckets()
    for c, granted, level in STEPS:
        res = m.reserve([c], 0.0, with_snapshots=True)
        assert isinstance(res, Grant if granted else Denial), c
        assert res.snapshots[0].remaining == level


def test_lua_scripts(fresh_redis: str) -> None:
    async def main() -> None:
        store = RedisStore(redis.asyncio.Redis.from_url(fresh_redis), namespace="bud")
        try:
            for i, (c, granted, level) in enumerate(STEPS):
                res = await store.reserve(f"job{i}", TENANT, [c])
                assert isinstance(res, Grant if granted else Denial), c
                assert res.snapshots[0].remaining == level
            # a settlement under a new size moves the level the same way, then settles
            await store.settle("job4", TENANT, [budget(100, 900)], [(budget(0, 0).key, 100, 40)])
            snap = await store.snapshots(TENANT, [budget(0, 900)])
            assert snap[0].remaining == 300.0 - 100 + 60
        finally:
            await store.close()

    asyncio.run(main())
