"""The bucket-store contract, run against ``memory://`` and ``redis://`` from one fixture."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from velvetrope.clock import SystemClock
from velvetrope.core.bucket import Claim, Denial, Grant, settle_lines
from velvetrope.store import MemoryStore, RedisStore
from velvetrope.store.base import BucketStore
from velvetrope.store.connect import connect

pytestmark = pytest.mark.integration

Run = Callable[[Callable[[BucketStore], Awaitable[Any]]], Any]


def tok(amount: float, capacity: float = 1000, rate: float = 1e-6, key: str = "t") -> Claim:
    return Claim(f"tenant:a:{key}", "tokens", "tenant", amount, capacity, rate)


def req(capacity: float = 3, rate: float = 1e-6) -> Claim:
    return Claim("tenant:a:req", "requests", "tenant", 1.0, capacity, rate)


@pytest.fixture(params=["memory", "redis"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run an async body against a fresh store of the parametrised kind."""

    def go(body: Callable[[BucketStore], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            store: Any
            if request.param == "memory":
                store = MemoryStore(SystemClock())
            else:
                url = request.getfixturevalue("fresh_redis")
                client = connect(url, password=None, timeout_s=5.0, max_connections=16)
                store = RedisStore(client, namespace="conf")
            try:
                return await body(store)
            finally:
                await store.close()

        return asyncio.run(main())

    return go


def test_grant_takes_every_claim_and_reports_levels(run: Run) -> None:
    async def body(s: BucketStore) -> None:
        g = await s.reserve("j1", "a", [tok(300), req()])
        assert isinstance(g, Grant)
        assert [c.key for c in g.claims] == ["tenant:a:t", "tenant:a:req"]
        snaps = {x.key: x for x in g.snapshots}
        assert snaps["tenant:a:t"].remaining == pytest.approx(700, abs=1e-3)
        assert snaps["tenant:a:req"].remaining == pytest.approx(2, abs=1e-3)
        assert (snaps["tenant:a:t"].kind, snaps["tenant:a:t"].owner) == ("tokens", "tenant")

    run(body)


def test_denial_takes_nothing_and_names_the_bucket(run: Run) -> None:
    async def body(s: BucketStore) -> None:
        for i in range(3):
            assert isinstance(await s.reserve(f"j{i}", "a", [tok(10), req()]), Grant)
        d = await s.reserve("j9", "a", [tok(10), req()])
        assert isinstance(d, Denial)
        assert d.key == "tenant:a:req"
        snaps = await s.snapshots("a", [tok(0), req()])
        assert {x.key: round(x.remaining, 3) for x in snaps} == {
            "tenant:a:t": 970,
            "tenant:a:req": 0,
        }
        big = await s.reserve("j10", "a", [tok(1001)])
        assert isinstance(big, Denial) and math.isinf(big.retry_after_s)

    run(body)


def test_settlement_applies_once_per_job(run: Run) -> None:
    async def body(s: BucketStore) -> None:
        claims = [tok(300)]
        assert isinstance(await s.reserve("j1", "a", claims), Grant)
        lines = settle_lines(claims, 120)
        assert await s.settle("j1", "a", claims, lines)
        assert not await s.settle("j1", "a", claims, lines)
        (snap,) = await s.snapshots("a", claims)
        assert snap.remaining == pytest.approx(880, abs=1e-3)

    run(body)


def test_concurrent_settlement_is_exact(run: Run) -> None:
    """Many clients reserving and settling at once (some settlements sent twice): the final
    level equals an independent replay, capacity minus every token actually used."""
    rng = random.Random(7)
    jobs = [(f"j{i}", rng.randint(50, 400), rng.randint(0, 500)) for i in range(300)]

    async def body(s: BucketStore) -> None:
        async def one(job_id: str, amount: int, used: int) -> None:
            claims = [tok(amount, capacity=1e9)]
            g = await s.reserve(job_id, "a", claims)
            assert isinstance(g, Grant)
            await asyncio.sleep(0)
            lines = settle_lines(claims, used)
            await asyncio.gather(*(s.settle(job_id, "a", claims, lines) for _ in range(2)))

        await asyncio.gather(*(one(*j) for j in jobs))
        (snap,) = await s.snapshots("a", [tok(0, capacity=1e9)])
        assert snap.remaining == pytest.approx(1e9 - sum(u for _, _, u in jobs), abs=0.5)

    run(body)


def test_levels_and_times_to_full_come_back_exact(run: Run) -> None:
    """A level with a long fraction (its refill during the test is below its precision)
    reads back as the same double the Python rules compute, in a grant and in a snapshot."""
    c = Claim("tenant:a:x", "tokens", "tenant", 1 / 3, 1e9, 1e-9)
    level = 1e9 - 1 / 3

    async def body(s: BucketStore) -> None:
        g = await s.reserve("j1", "a", [c])
        assert isinstance(g, Grant)
        for snap in (*g.snapshots, *(await s.snapshots("a", [c]))):
            assert (snap.remaining, snap.reset_s) == (level, (1e9 - level) / 1e-9)
        d = await s.reserve("j2", "a", [c._replace(amount=1e9)])
        assert isinstance(d, Denial)
        assert d.snapshots[0].remaining == level

    run(body)
