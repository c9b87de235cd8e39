"""The bucket rules in Python and in Lua agree on every vector of :mod:`tests.store.vectors`."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis

from velvetrope.core.bucket import BucketKind, Claim, Denial, Grant, MemoryBuckets, TokenBucket
from velvetrope.store.redis_store import RedisStore

from .vectors import TOLERANCE_S, VECTORS, Vector

pytestmark = pytest.mark.integration

TENANT = "acme"


def claim(v: Vector, key: str, amount: float) -> Claim:
    b = v.buckets[key]
    kind: BucketKind = "tokens" if b.kind == "tokens" else "requests"
    return Claim(key, kind, "tenant", amount, b.capacity, b.rate, b.floor)


def claims_of(v: Vector) -> list[Claim]:
    if v.op == "reserve":
        return [claim(v, k, a) for k, a in v.amounts.items()]
    return [claim(v, k, r) for k, r, _ in v.lines]


def run_memory(v: Vector) -> tuple[object, dict[str, float]]:
    m = MemoryBuckets()
    for key, b in v.buckets.items():
        if b.level is not None:
            tb = TokenBucket(b.capacity, b.rate, floor=b.floor, now=-b.age_s)
            tb.level = b.level
            m._buckets[key] = tb
    if v.op == "reserve":
        out: object = m.reserve(claims_of(v), 0.0)
    else:
        if v.already_settled:
            m.settle([], 0.0, job_id="job")
        out = m.settle(v.lines, 0.0, job_id="job")
    return out, {k: lvl for k, (lvl, _) in m.levels(0.0).items()}


async def run_redis(v: Vector, url: str) -> tuple[object, dict[str, float]]:
    store = RedisStore(redis.asyncio.Redis.from_url(url), namespace="vec")
    sync = redis.Redis.from_url(url)
    try:
        sync.flushdb()
        sec, usec = sync.time()
        now = sec + usec / 1e6
        for key, b in v.buckets.items():
            if b.level is not None:
                sync.hset(
                    store.bucket_key(TENANT, key),
                    mapping={"l": repr(b.level), "t": repr(now - b.age_s)},
                )
        claims = claims_of(v)
        if v.op == "reserve":
            out: object = await store.reserve("job", TENANT, claims)
        else:
            if not v.already_settled:
                sync.set(f"vec:{{t:{TENANT}}}:held:job", 1)
            out = await store.settle("job", TENANT, claims, v.lines)
        existing = [claim(v, k, 0) for k in v.buckets if sync.exists(store.bucket_key(TENANT, k))]
        snaps = await store.snapshots(TENANT, existing)
        return out, {s.key: s.remaining for s in snaps}
    finally:
        sync.close()
        await store.close()


def check(v: Vector, out: object, levels: dict[str, float], tol_s: float) -> None:
    if v.op == "reserve":
        if v.granted:
            assert isinstance(out, Grant), out
        else:
            assert isinstance(out, Denial), out
            assert out.key == v.worst
            assert v.wait_s is not None
            if math.isinf(v.wait_s):
                assert math.isinf(out.retry_after_s)
            else:
                assert out.retry_after_s == pytest.approx(v.wait_s, abs=tol_s)
    else:
        assert out is v.applied
    for key, want in v.levels.items():
        rate = v.buckets[key].rate
        assert levels[key] == pytest.approx(want, abs=rate * tol_s + 1e-9), key
    assert set(v.levels) <= set(levels)


@pytest.mark.parametrize("v", VECTORS, ids=[v.name for v in VECTORS])
def test_python_rules(v: Vector) -> None:
    out, levels = run_memory(v)
    check(v, out, levels, 0.0)


@pytest.mark.parametrize("v", VECTORS, ids=[v.name for v in VECTORS])
def test_lua_scripts(v: Vector, redis_url: str) -> None:
    out, levels = asyncio.run(run_redis(v, redis_url))
    check(v, out, levels, TOLERANCE_S)


def test_a_written_level_reads_back_as_the_same_double(fresh_redis: str) -> None:
    """A bucket's fields hold the exact doubles the script computed (a level with a long
    fraction: its refill during the test is below its precision)."""

    async def main() -> None:
        store = RedisStore(redis.asyncio.Redis.from_url(fresh_redis), namespace="vec")
        try:
            c = Claim("x", "tokens", "tenant", 1 / 3, 1e9, 1e-9)
            assert isinstance(await store.reserve("exact", TENANT, [c]), Grant)
            with redis.Redis.from_url(fresh_redis) as sync:
                level, last = sync.hmget(store.bucket_key(TENANT, "x"), "l", "t")
                sec, usec = sync.time()
            assert level is not None and last is not None
            assert float(level) == 1e9 - 1 / 3
            assert 0 <= sec + usec / 1e6 - float(last) < 5
        finally:
            await store.close()

    asyncio.run(main())
