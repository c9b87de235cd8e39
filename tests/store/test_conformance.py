"""The store contract (:class:`~velvetrope.store.base.Store`), run against ``memory://``
and ``redis://`` alike: each store is opened from its URL by ``open_store`` and used
exactly as the gateway's ticket uses it (a reservation without I/O when the store can
answer so, else one awaited; one finish per job)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from velvetrope.clock import SystemClock
from velvetrope.config import parse_config
from velvetrope.core.bucket import Claim, Denial, Grant, settle_lines
from velvetrope.store.base import Store
from velvetrope.store.open import open_store

pytestmark = pytest.mark.integration

Run = Callable[[Callable[[Store], Awaitable[Any]]], Any]


def tok(amount: float, capacity: float = 1000, rate: float = 1e-6, key: str = "t") -> Claim:
    return Claim(f"tenant:a:{key}", "tokens", "tenant", amount, capacity, rate)


def req(capacity: float = 3, rate: float = 1e-6) -> Claim:
    return Claim("tenant:a:req", "requests", "tenant", 1.0, capacity, rate)


async def reserve(s: Store, job_id: str, claims: Sequence[Claim]) -> Grant | Denial:
    """What the ticket does: without I/O when the store can, else awaited."""
    res = s.reserve_now(job_id, "a", claims)
    return res if res is not None else await s.reserve(job_id, "a", claims)


async def remaining(s: Store, claim: Claim) -> float:
    """The bucket's level now, read by a reservation of one token (given back)."""
    probe = claim._replace(amount=1.0)
    g = await reserve(s, f"probe-{random.random()}", [probe])
    assert isinstance(g, Grant)
    (snap,) = g.snapshots
    return snap.remaining + 1.0


@pytest.fixture(params=["memory", "redis"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run an async body against a fresh store of the parametrised kind."""

    def go(body: Callable[[Store], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            url = (
                "memory://" if request.param == "memory" else request.getfixturevalue("fresh_redis")
            )
            cfg = parse_config(
                {"state": {"url": url, "namespace": "conf", "call_timeout_ms": 2000}}
            )
            store = open_store(cfg, SystemClock())
            assert store.shared is (request.param == "redis")
            store.start()
            try:
                return await body(store)
            finally:
                await store.stop()

        return asyncio.run(main())

    return go


def test_grant_takes_every_claim_and_reports_levels(run: Run) -> None:
    async def body(s: Store) -> None:
        g = await reserve(s, "j1", [tok(300), req()])
        assert isinstance(g, Grant)
        assert [c.key for c in g.claims] == ["tenant:a:t", "tenant:a:req"]
        snaps = {x.key: x for x in g.snapshots}
        assert snaps["tenant:a:t"].remaining == pytest.approx(700, abs=1e-3)
        assert snaps["tenant:a:req"].remaining == pytest.approx(2, abs=1e-3)
        assert (snaps["tenant:a:t"].kind, snaps["tenant:a:t"].owner) == ("tokens", "tenant")

    run(body)


def test_denial_takes_nothing_and_names_the_bucket(run: Run) -> None:
    async def body(s: Store) -> None:
        for i in range(3):
            assert isinstance(await reserve(s, f"j{i}", [tok(10), req()]), Grant)
        d = await reserve(s, "j9", [tok(10), req()])
        assert isinstance(d, Denial)
        assert d.key == "tenant:a:req"
        assert {x.key: round(x.remaining, 3) for x in d.snapshots} == {
            "tenant:a:t": 970,
            "tenant:a:req": 0,
        }
        big = await reserve(s, "j10", [tok(1001)])
        assert isinstance(big, Denial) and math.isinf(big.retry_after_s)

    run(body)


def test_a_finish_settles_what_was_used(run: Run) -> None:
    async def body(s: Store) -> None:
        claims = [tok(300)]
        assert isinstance(await reserve(s, "j1", claims), Grant)
        s.finish("j1", "a", claims, settle_lines(claims, 120), "default")
        assert await s.flush(5.0)
        assert await remaining(s, tok(0)) == pytest.approx(880, abs=1e-3)

    run(body)


def test_a_rejected_job_refunded_with_nothing_used_gets_everything_back(run: Run) -> None:
    async def body(s: Store) -> None:
        claims = [tok(300), req()]
        assert isinstance(await reserve(s, "j1", claims), Grant)
        s.finish("j1", "a", claims, settle_lines(claims, 0), "default")
        assert await s.flush(5.0)
        assert await remaining(s, tok(0)) == pytest.approx(1000, abs=1e-3)
        assert await remaining(s, req()) == pytest.approx(3, abs=1e-3)

    run(body)


def test_concurrent_settlement_is_exact(run: Run) -> None:
    """Many clients reserving and finishing at once: the final level equals an independent
    replay, capacity minus every token actually used."""
    rng = random.Random(7)
    jobs = [(f"j{i}", rng.randint(50, 400), rng.randint(0, 500)) for i in range(300)]

    async def body(s: Store) -> None:
        async def one(job_id: str, amount: int, used: int) -> None:
            claims = [tok(amount, capacity=1e9)]
            g = await reserve(s, job_id, claims)
            assert isinstance(g, Grant)
            await asyncio.sleep(0)
            s.finish(job_id, "a", claims, settle_lines(claims, used), "default")

        await asyncio.gather(*(one(*j) for j in jobs))
        assert await s.flush(5.0)
        left = await remaining(s, tok(0, capacity=1e9))
        assert left == pytest.approx(1e9 - sum(u for _, _, u in jobs), abs=0.5)

    run(body)


def test_levels_and_times_to_full_come_back_exact(run: Run) -> None:
    """A level with a long fraction (its refill during the test is below its precision)
    reads back as the same double the Python rules compute, in a grant and in a snapshot."""
    c = Claim("tenant:a:x", "tokens", "tenant", 1 / 3, 1e9, 1e-9)
    level = 1e9 - 1 / 3

    async def body(s: Store) -> None:
        g = await reserve(s, "j1", [c])
        assert isinstance(g, Grant)
        (snap,) = g.snapshots
        assert (snap.remaining, snap.reset_s) == (level, (1e9 - level) / 1e-9)
        d = await reserve(s, "j2", [c._replace(amount=1e9)])
        assert isinstance(d, Denial)
        assert d.snapshots[0].remaining == level

    run(body)
