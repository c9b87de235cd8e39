"""The failure policy: circuit breaker, fail_open at 1/N, fail_closed, recovery, outbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.support.redis_server import RedisServer
from velvetrope.clock import ManualClock, SystemClock
from velvetrope.core.bucket import Claim, Denial, Grant, settle_lines
from velvetrope.core.lifecycle import Usage
from velvetrope.core.quota import LEDGER_CAP, QuotaBook, is_ledger_key
from velvetrope.core.quota_config import QuotaSettings
from velvetrope.errors import StoreUnavailable
from velvetrope.serving.launch import free_port
from velvetrope.store.base import Slot
from velvetrope.store.breaker import CircuitBreaker
from velvetrope.store.connect import connect
from velvetrope.store.guard import GuardedStore
from velvetrope.store.redis_store import RedisStore


def test_breaker_opens_after_failures_and_probes_once() -> None:
    clock = ManualClock()
    b = CircuitBreaker(clock, failures=3, reset_s=0.5)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.state == "closed"
    b.failure()
    assert (str(b.state), b.allow(), b.opened) == ("open", False, 1)
    clock.advance(0.5)
    assert b.allow()  # the probe
    assert not b.allow()  # only one at a time
    b.failure()  # the probe failed: open again, for another reset_s
    assert str(b.state) == "open" and b.opened == 1
    clock.advance(0.5)
    assert b.allow()
    b.success()
    assert str(b.state) == "closed" and b.allow()


def claim(amount: float, capacity: float = 1000.0) -> Claim:
    return Claim("tenant:a:tok", "tokens", "tenant", amount, capacity, 1e-6)


async def past_on_redis(url: str, ms: float, timeout_s: float = 10.0) -> None:
    """Wait, polling with a deadline, until Redis's clock (``TIME``, the scripts' only
    clock) is past ``ms`` (epoch milliseconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    with redis.Redis.from_url(url) as r:
        while True:
            sec, usec = r.time()
            if sec * 1000 + usec / 1000 > ms:
                return
            assert loop.time() < end, "Redis's clock did not pass the mark in time"
            await asyncio.sleep(0.005)


def lease_expiry(url: str, pool: str, *jobs: str) -> float:
    """The latest expiry (epoch ms) of ``jobs``' leases in ``pool``."""
    with redis.Redis.from_url(url) as r:
        scores = [r.zscore(f"velvetrope:{{pool:{pool}}}:leases", j) for j in jobs]
    assert all(x is not None for x in scores)
    return max(float(x) for x in scores if x is not None)


def guarded(url: str, on_error: Any = "fail_open", **kw: Any) -> tuple[GuardedStore, list[str]]:
    calls: list[str] = []
    client = connect(url, password=None, timeout_s=0.25)
    state = GuardedStore(
        RedisStore(client, namespace="guard", lease_ttl_s=30.0),
        SystemClock(),
        on_store_error=on_error,
        call_timeout_s=0.05,
        breaker_reset_s=0.2,
        observe_call=lambda op, s: calls.append(op),
        **kw,
    )
    return state, calls


def test_dead_redis_fails_open_at_this_replicas_share_without_a_timeout_per_request() -> None:
    async def main() -> None:
        # never seen: the configured replica count gives this replica's share (half)
        state, calls = guarded(f"redis://127.0.0.1:{free_port()}/0", expected_replicas=2)
        try:
            for i in range(3):  # three failures open the breaker
                assert isinstance(await state.reserve(f"j{i}", "a", [claim(10)]), Grant)
            assert state.breaker.state == "open"
            # while the breaker is open the store answers without I/O, as memory does
            assert isinstance(state.reserve_now("n0", "a", [claim(1)]), Grant)
            before = len(calls)
            t0 = time.perf_counter()
            for i in range(50):
                await state.reserve(f"k{i}", "a", [claim(1)])
            assert len(calls) == before  # not one more call to the dead store
            assert time.perf_counter() - t0 < 5.0  # sanity bound only, not a benchmark
            # local bucket of 1000/2 = 500: 30 + 1 + 50 used, 400 more fits, then no more
            assert isinstance(await state.reserve("x", "a", [claim(400)]), Grant)
            denied = await state.reserve("y", "a", [claim(400)])
            assert isinstance(denied, Denial)
            too_big = await state.reserve("z", "a", [claim(600)])  # > 500: never locally
            assert isinstance(too_big, Denial) and too_big.never
            assert state.guard.fallbacks["reserve_local"] >= 50
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


@pytest.mark.integration
def test_settled_in_the_fallback_the_ledger_is_written_when_redis_is_back(
    own_redis: RedisServer,
) -> None:
    """fail_open with Redis away: a job reserved locally settles locally, and its ledger
    counts wait in the outbox (``status()["ledger_deferred"]``, the gateway's
    ``velvetrope_ledger_deferred_total``) until Redis answers; then the ledger in Redis has
    them, once, also when the same write is sent again (a reply lost)."""

    async def main() -> None:
        state, _ = guarded(own_redis.url, expected_replicas=1)
        state.breaker.reset_s = 0.2
        book = QuotaBook(QuotaSettings(ledger=True))
        try:
            own_redis.pause()
            claims = [claim(10), *book.claims("a", "m", 7, 3, 0.0)]
            for i in range(3):  # failures open the breaker: the reservation is local
                await state.reserve(f"x{i}", "a", [claim(1)])
            assert isinstance(await state.reserve("j", "a", claims), Grant)
            lines = book.settle("m", claims, settle_lines(claims, 12), Usage(7, 5))
            state.finish("j", "a", claims, lines, "default")
            assert state.status()["ledger_deferred"] == {"requests": 1, "tokens": 12}
            own_redis.resume()
            state.start()
            await _until(lambda: state.up and len(state.outbox) == 0)
            led = [(c, ln) for c, ln in zip(claims, lines, strict=True) if ln[2]]
            led = [(c, (ln[0], 0.0, ln[2])) for c, ln in led if is_ledger_key(ln[0])]
            again = ("j", "a", tuple(c for c, _ in led), tuple(ln for _, ln in led))
            assert await state.redis.send_ledger_many([again]) == [0]  # written once already
            with redis.Redis.from_url(own_redis.url) as r:
                used = {
                    k.decode().rsplit("|", 1)[1]: LEDGER_CAP - float(r.hget(k, "l") or 0)
                    for k in r.scan_iter(match="guard:*:b:ledger|*")
                }
            assert used == {"requests": 1, "input": 7, "output": 5}, used
        finally:
            own_redis.resume()
            await state.stop(flush_s=0)

    asyncio.run(main())


def test_dead_redis_fails_closed() -> None:
    async def main() -> None:
        state, _ = guarded(f"redis://127.0.0.1:{free_port()}/0", "fail_closed")
        state.breaker.reset_s = 60.0  # no probe during the test: the breaker stays open
        try:
            for i in range(5):
                with pytest.raises(StoreUnavailable):
                    await state.reserve(f"j{i}", "a", [claim(10)])
            with pytest.raises(StoreUnavailable):
                await state.acquire("j", Slot("default", 10, 4, None))
            with pytest.raises(StoreUnavailable):  # refused without I/O once the breaker opened
                state.reserve_now("k", "a", [claim(10)])
            assert state.guard.fallbacks["reserve_refused"] == 6
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


@pytest.mark.integration
def test_fail_open_slots_count_the_leases_still_running_from_redis(own_redis: RedisServer) -> None:
    """Redis goes away while this replica runs jobs on Redis leases: its fallback share of
    the pool's slots counts those jobs, so the fleet-wide limit holds across the outage."""

    async def main() -> None:
        state, _ = guarded(own_redis.url)
        state.breaker.reset_s = 60.0  # no probe during the test: the breaker stays open
        try:
            slot = Slot("p", 10, 4, None)
            assert await state.acquire("r1", slot) and await state.acquire("r2", slot)
            own_redis.stop()
            for i in range(3):  # three failures open the breaker
                await state.reserve(f"x{i}", "a", [claim(1)])
            assert state.breaker.state == "open"
            # one replica: its share is the pool's 4 slots, two of them held by r1 and r2
            taken = [await state.acquire(f"l{i}", slot) for i in range(4)]
            assert taken == [True, True, False, False]
            state.finish("r1", "a", (), (), "p")  # a Redis-leased job ends: its slot frees
            assert await state.acquire("l9", slot)
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


async def _until(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.integration
def test_hung_redis_then_back_settlements_land_exactly_once(own_redis: RedisServer) -> None:
    """Redis hangs (SIGSTOP) with settlements pending: they wait in the outbox and land
    exactly once after it resumes; the breaker closes again by itself."""

    async def main() -> None:
        state, _ = guarded(own_redis.url)
        state.start()
        try:
            claims = [claim(300)]
            assert isinstance(await state.reserve("j1", "a", claims), Grant)
            own_redis.pause()
            lines = settle_lines(claims, 100)
            state.settlements.settle("j1", "a", claims, lines)
            state.settlements.settle("j1", "a", claims, lines)  # a retry: same job
            await _until(lambda: state.breaker.state != "closed")
            assert len(state.outbox) >= 1
            own_redis.resume()
            await _until(lambda: state.up and len(state.outbox) == 0)
            (snap,) = await state.redis.snapshots("a", claims)
            assert snap.remaining == pytest.approx(900, abs=0.01)
        finally:
            own_redis.resume()
            await state.stop()

    asyncio.run(main())


@pytest.mark.integration
def test_leases_are_fleet_wide_and_expire(fresh_redis: str) -> None:
    async def main() -> None:
        a = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), lease_ttl_s=0.3)
        b = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), lease_ttl_s=0.3)
        try:
            assert (await a.acquire("j1", Slot("p", 100, 2, 250))).granted
            assert (await b.acquire("j2", Slot("p", 100, 2, 250))).granted
            ans = await b.acquire("j3", Slot("p", 10, 2, 250))
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (False, 2, 200)
            assert await a.release("p", ["j1", "j1"]) == 1
            ans = await b.acquire("j4", Slot("p", 160, 3, 250))  # 100 + 160 > 250 tokens
            assert not ans.granted
            ans = await b.acquire("j4", Slot("p", 150, 3, 250))
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 2, 250)
            assert await b.renew("p", {"j2": 100}) == 0  # held: extended
            # j4 (not renewed since) and j2 expire
            await past_on_redis(fresh_redis, lease_expiry(fresh_redis, "p", "j2", "j4"))
            ans = await a.acquire("j5", Slot("p", 100, 1, 250))  # their tokens were dropped
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 1, 100)
            assert await b.renew("p", {"j2": 100}) == 1  # expired, its job running: re-created
            ans = await a.acquire("j6", Slot("p", 10, 3, 250))  # j2 counts again, tokens too
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 3, 210)
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


@pytest.mark.integration
def test_leases_with_and_without_a_token_cap_share_a_pool(fresh_redis: str) -> None:
    """Only leases taken under a token cap count tokens (a replica whose pool has no cap,
    or not yet, counts slots alone): mixed in one pool, released or expired in any order,
    the recorded sum never goes negative and comes back to zero."""

    async def main() -> None:
        a = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), lease_ttl_s=0.3)
        b = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), lease_ttl_s=0.3)
        tokens = "velvetrope:{pool:p}:lease_tokens"
        try:
            ans = await a.acquire("u1", Slot("p", 500, 4, None))
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 1, -1)
            with redis.Redis.from_url(fresh_redis) as c:
                assert not c.exists(tokens)  # nothing recorded without a cap
            ans = await b.acquire("c1", Slot("p", 100, 4, 250))  # u1's 500 not counted
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 2, 100)
            assert not (await b.acquire("c2", Slot("p", 200, 4, 250))).granted  # 300 > 250
            ans = await b.acquire("c1", Slot("p", 100, 4, 250))  # held: renewed, counted once
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 2, 100)
            ans = await a.acquire("u1", Slot("p", 500, 2, None))  # held, pool full: renewed
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 2, -1)
            res, lease = await a.reserve_leased("c2", "a", [claim(10)], Slot("p", 150, 4, 250))
            assert isinstance(res, Grant) and lease is not None
            assert (lease.granted, lease.in_flight, lease.tokens_in_flight) == (True, 3, 250)
            assert await a.release("p", ["u1", "u1"]) == 1  # no record: the sum is untouched
            ans = await b.acquire("c3", Slot("p", 1, 4, 250))
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (False, 2, 250)
            assert await b.release("p", ["c1"]) == 1
            assert await a.finish("c2", "a", [claim(10)], settle_lines([claim(10)], 5), "p") == (
                True,
                1,
            )
            ans = await b.acquire("c3", Slot("p", 250, 4, 250))  # back to zero, not below
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 1, 250)
            assert (await a.acquire("u2", Slot("p", 50, 4, None))).granted
            # c3 and u2 expire without renewal
            await past_on_redis(fresh_redis, lease_expiry(fresh_redis, "p", "c3", "u2"))
            ans = await b.acquire("c4", Slot("p", 10, 4, 250))
            assert (ans.granted, ans.in_flight, ans.tokens_in_flight) == (True, 1, 10)
            assert await b.release("p", ["c4"]) == 1
            with redis.Redis.from_url(fresh_redis) as c:
                assert c.hgetall(tokens) == {b"_total": b"0"}
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


@pytest.mark.integration
def test_acquiring_a_lease_already_held_renews_it_once(fresh_redis: str) -> None:
    """With room in the pool or without, a second acquire of a held lease renews it: it
    is granted, its expiry moves, and neither the slot nor its tokens count twice."""

    async def main() -> None:
        s = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), lease_ttl_s=30.0)
        leases = "velvetrope:{pool:p}:leases"
        try:
            with redis.Redis.from_url(fresh_redis) as r:
                assert tuple(await s.acquire("j1", Slot("p", 100, 2, 1000))) == (True, 1, 100)
                first = r.zscore(leases, "j1")
                assert first is not None
                await past_on_redis(fresh_redis, first - 30_000)  # a later ms than j1's
                assert tuple(await s.acquire("j1", Slot("p", 100, 2, 1000))) == (True, 1, 100)
                second = r.zscore(leases, "j1")
                assert first is not None and second is not None and second > first
                assert tuple(await s.acquire("j2", Slot("p", 100, 2, 1000))) == (True, 2, 200)
                await past_on_redis(fresh_redis, second - 30_000)
                assert tuple(await s.acquire("j1", Slot("p", 100, 2, 1000))) == (True, 2, 200)
                third = r.zscore(leases, "j1")
                assert third is not None and third > second
                assert tuple(await s.acquire("j3", Slot("p", 100, 2, 1000))) == (False, 2, 200)
                assert await s.release("p", ["j1", "j2"]) == 2
                assert tuple(await s.acquire("j3", Slot("p", 100, 2, 1000))) == (True, 1, 100)
        finally:
            await s.close()

    asyncio.run(main())


@pytest.mark.integration
def test_reserve_leased_and_finish_take_and_give_back_in_one_call(fresh_redis: str) -> None:
    async def main() -> None:
        s = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), namespace="af")
        try:
            assert s.combined
            claims = [claim(300)]
            res, lease = await s.reserve_leased("j1", "a", claims, Slot("p", 300, 1, None))
            assert isinstance(res, Grant) and lease is not None and lease.granted
            res2, lease2 = await s.reserve_leased("j2", "a", claims, Slot("p", 300, 1, None))
            assert isinstance(res2, Grant) and lease2 is not None and not lease2.granted
            denied, none = await s.reserve_leased("j3", "a", [claim(500)], Slot("p", 500, 9, None))
            assert isinstance(denied, Denial) and none is None  # 400 left: no lease asked
            assert await s.finish("j1", "a", claims, settle_lines(claims, 100), "p") == (True, 1)
            assert await s.finish("j1", "a", claims, settle_lines(claims, 100), "p") == (False, 0)
            (snap,) = await s.snapshots("a", claims)
            assert snap.remaining == pytest.approx(600, abs=0.01)  # 1000 - 300 (j2) - 100
            assert (await s.acquire("j4", Slot("p", 1, 1, None))).granted  # j1's slot is free
        finally:
            await s.close()

    asyncio.run(main())


@pytest.mark.integration
def test_every_key_the_scripts_write_expires(fresh_redis: str) -> None:
    """Buckets, holds, leases and heartbeats all carry a TTL: a namespace left behind by a
    deployment that went away empties itself."""

    async def main() -> None:
        s = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), namespace="ttl")
        try:
            claims = [claim(300), Claim("tenant:a:req", "requests", "tenant", 1, 10, 0.1)]
            await s.reserve_leased("j1", "a", claims, Slot("p", 300, 4, None))
            await s.reserve("j2", "a", claims)
            await s.acquire("j2", Slot("p", 300, 4, None))
            await s.heartbeat("replica-1", 3)
            await s.finish("j1", "a", claims, settle_lines(claims, 100), "p")
            await s.settle("j2", "a", claims, settle_lines(claims, 50))
            await s.reserve("j3", "a", claims)  # a hold left waiting for its settlement
        finally:
            await s.close()

    asyncio.run(main())
    with redis.Redis.from_url(fresh_redis) as c:
        keys = sorted(k.decode() for k in c.scan_iter("ttl:*"))
        assert any(":b:" in k for k in keys) and any(":held:" in k for k in keys)
        assert any(":leases" in k for k in keys) and any("replicas" in k for k in keys)
        assert {k: c.pttl(k) for k in keys if c.pttl(k) <= 0} == {}


@pytest.mark.integration
def test_a_settlement_lowering_a_bucket_extends_its_expiry_one_raising_it_keeps_it(
    fresh_redis: str,
) -> None:
    """A bucket's key lives at least until the bucket would be full again, plus a slack
    (5 s): a reservation or an overrun sets that; a refund leaves the later expiry it had;
    a bucket that had expired is written with one again."""
    c = Claim("tenant:a:tok", "tokens", "tenant", 300, 1000.0, 10.0)  # 10 tokens/s
    key = "ttl:{t:a}:b:tenant:a:tok"

    async def main() -> None:
        s = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), namespace="ttl")
        try:
            with redis.Redis.from_url(fresh_redis) as r:
                assert isinstance(await s.reserve("j1", "a", [c]), Grant)  # 700: full in 30 s
                assert 34_000 < r.pttl(key) <= 35_000
                assert await s.settle("j1", "a", [c], settle_lines([c], 100))  # 900, kept
                assert 34_000 < r.pttl(key) <= 35_000
                assert isinstance(await s.reserve("j2", "a", [c]), Grant)  # ~600: 45 s
                assert 44_000 < r.pttl(key) <= 45_000
                assert await s.settle("j2", "a", [c], settle_lines([c], 500))  # ~400: 65 s
                assert 64_000 < r.pttl(key) <= 65_000
                assert isinstance(await s.reserve("j3", "a", [c]), Grant)
                r.delete(key)  # expired meanwhile: full again
                assert await s.settle("j3", "a", [c], settle_lines([c], 0))
                assert 0 < r.pttl(key) <= 5_000
                (snap,) = await s.snapshots("a", [c])
                assert snap.remaining == 1000.0
        finally:
            await s.close()

    asyncio.run(main())


@pytest.mark.integration
def test_a_reservation_sent_again_takes_nothing_twice(fresh_redis: str) -> None:
    """A client that retries a call whose reply it lost (redis-py's cluster client does,
    on a timeout) sends the same job's reservation again: it is granted, charged once, and
    settled once; a denied one leaves no hold behind."""

    async def main() -> None:
        s = RedisStore(connect(fresh_redis, password=None, timeout_s=1.0))
        c = Claim("tenant:a:tok", "tokens", "tenant", 600.0, 1000.0, 1e-9)
        try:
            for _ in range(3):  # j1 three times: 600 taken once
                assert isinstance(await s.reserve("j1", "a", [c]), Grant)
            res, lease = await s.reserve_leased("j1", "a", [c], Slot("p", 600, 4, None))  # one call
            assert isinstance(res, Grant) and lease is not None and lease.granted
            (snap,) = await s.snapshots("a", [c])
            assert snap.remaining == pytest.approx(400, abs=0.01)
            assert isinstance(await s.reserve("j2", "a", [c]), Denial)  # 600 > 400 left
            assert isinstance(await s.reserve("j2", "a", [c]), Denial)  # no hold was left
            assert await s.settle("j1", "a", [c], settle_lines([c], 100))  # 500 back
            assert not await s.settle("j1", "a", [c], settle_lines([c], 100))
            (snap,) = await s.snapshots("a", [c])
            assert snap.remaining == pytest.approx(900, abs=0.01)
        finally:
            await s.close()

    asyncio.run(main())


def _leases_in_redis(url: str, pool: str) -> set[str]:
    with redis.Redis.from_url(url) as r:
        return {m.decode() for m in r.zrange(f"guard:{{pool:{pool}}}:leases", 0, -1)}


@pytest.mark.integration
@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
def test_leases_survive_a_redis_that_restarts_empty(own_redis: RedisServer, on_error: str) -> None:
    """Two replicas hold a pool's 4 leases; Redis is killed and restarted without its
    data.  Each re-asserts the leases of its running jobs at its first contact, so the pool
    stays full: no replica takes a fifth slot, before or after both re-asserted, and what
    Redis counts is exactly the jobs running.  (Before, the restarted Redis granted 4 more.)"""

    async def main() -> None:
        # started (the outbox runs); the background heartbeat beats once, then sleeps
        a, _ = guarded(own_redis.url, on_error, heartbeat_s=600.0)
        b, _ = guarded(own_redis.url, on_error, heartbeat_s=600.0)
        slot = Slot("p", 10, 4, None)
        a.start()
        b.start()
        try:
            await _until(lambda: a._beaten and b._beaten)
            assert await a.beat_once() and await b.beat_once()
            assert (a.replicas, b.replicas) == (2, 2)
            assert await a.acquire("a1", slot) and await a.acquire("a2", slot)
            assert await b.acquire("b1", slot) and await b.acquire("b2", slot)
            assert not await a.acquire("a3", slot)  # the fleet's 4 are taken
            own_redis.stop()
            own_redis.start()  # empty
            # a notices first (a failed call), then reaches Redis again before b does
            assert not await a.beat_once()
            a.breaker.reset_s = 0.0
            assert await a.beat_once()
            assert _leases_in_redis(own_redis.url, "p") == {"a1", "a2"}
            assert not await a.acquire("a3", slot)  # b's jobs still run: a holds its share
            # b's connection comes back without a failed call: Redis forgot b, b notices
            assert await b.beat_once()
            assert _leases_in_redis(own_redis.url, "p") == {"a1", "a2", "b1", "b2"}
            for store in (a, b):
                store.leases.careful_until = 0.0  # the re-assertion window over: Redis counts
            assert not await a.acquire("a3", slot) and not await b.acquire("b3", slot)
            a.finish("a1", "t", (), (), "p")
            await a.outbox.flush(5.0)
            assert await b.acquire("b3", slot)  # a slot a gave back, taken by b
            assert _leases_in_redis(own_redis.url, "p") == {"a2", "b1", "b2", "b3"}
        finally:
            await a.stop(flush_s=0)
            await b.stop(flush_s=0)

    asyncio.run(main())


@pytest.mark.integration
def test_fallback_leases_move_into_redis_when_it_returns(own_redis: RedisServer) -> None:
    """fail_open: jobs started on fallback slots during an outage are counted in Redis once
    it returns, and given back there when they end."""

    async def main() -> None:
        state, _ = guarded(own_redis.url, "fail_open", heartbeat_s=600.0)
        slot = Slot("p", 10, 3, None)
        state.start()
        try:
            await _until(lambda: state._beaten)
            own_redis.stop()
            assert not await state.beat_once()
            for _ in range(3):
                assert not await state.beat_once()
            assert state.breaker.state == "open"
            assert await state.acquire("l1", slot) and await state.acquire("l2", slot)
            own_redis.start()
            state.breaker.reset_s = 0.0
            assert await state.beat_once()
            assert _leases_in_redis(own_redis.url, "p") == {"l1", "l2"}
            assert state.status()["local_leases"] == {"p": 0}
            state.leases.careful_until = 0.0
            assert await state.acquire("r1", slot)
            assert not await state.acquire("r2", slot)  # 3 in flight, fleet-wide
            state.finish("l1", "t", (), (), "p")
            await state.outbox.flush(5.0)
            assert _leases_in_redis(own_redis.url, "p") == {"l2", "r1"}
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


@pytest.mark.integration
def test_a_fallback_lease_whose_job_ends_during_its_reassertion_is_released_once(
    own_redis: RedisServer,
) -> None:
    """fail_open: a job on a fallback lease ends while the re-assertion's call is out (that
    call takes its lease again in Redis): the lease is given back there by one release,
    and Redis counts exactly the jobs still running.  (Two releases were queued before.)"""

    async def main() -> None:
        ended: list[str] = []

        def observe(op: str, s: float) -> None:
            if op == "renew" and not ended:  # the re-assertion's reply is in, not yet read
                ended.append("l1")
                state.finish("l1", "t", (), (), "p")

        client = connect(own_redis.url, password=None, timeout_s=0.25)
        state = GuardedStore(
            RedisStore(client, namespace="guard", lease_ttl_s=30.0),
            SystemClock(),
            on_store_error="fail_open",
            call_timeout_s=0.5,
            breaker_reset_s=0.2,
            heartbeat_s=600.0,
            observe_call=observe,
        )
        slot = Slot("p", 10, 3, None)
        try:
            assert await state.beat_once()  # Redis answered: this replica knows its share
            own_redis.stop()
            for _ in range(3):
                assert not await state.beat_once()
            assert state.breaker.state == "open"
            assert await state.acquire("l1", slot) and await state.acquire("l2", slot)
            assert state.status()["local_leases"] == {"p": 2}
            own_redis.start()  # empty
            state.breaker.reset_s = 0.0
            assert await state.beat_once()  # re-asserts l1 and l2; l1 ends meanwhile
            assert ended == ["l1"]
            assert len(state.outbox) == 1  # one release, for l1
            state.start()
            assert await state.flush(5.0)
            assert state.outbox.sent == 1
            assert _leases_in_redis(own_redis.url, "p") == {"l2"}
            assert state.status()["leases"] == {"p": 1}
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


def test_fail_open_before_redis_ever_answered_refuses_without_expected_replicas() -> None:
    """A replica that never reached Redis cannot know how many share its limits: without
    ``expected_replicas`` it refuses (as fail_closed would) rather than enforce the whole
    limit alone, and says what to configure."""

    async def main() -> None:
        state, _ = guarded(f"redis://127.0.0.1:{free_port()}/0")
        try:
            for i in range(4):
                with pytest.raises(StoreUnavailable, match="expected_replicas"):
                    await state.reserve(f"j{i}", "a", [claim(10)])
            with pytest.raises(StoreUnavailable, match="expected_replicas"):
                await state.acquire("j", Slot("default", 10, 4, None))
            assert state.guard.fallbacks["reserve_refused"] == 4
            assert state.guard.fallbacks["lease_refused"] == 1
            assert state.status()["answered"] is False
        finally:
            await state.stop(flush_s=0)

    asyncio.run(main())


@pytest.mark.integration
@pytest.mark.parametrize("with_slot", [True, False])
def test_a_caller_that_leaves_mid_reservation_leaves_nothing_taken(
    fresh_redis: str, with_slot: bool
) -> None:
    """The client hangs up while its reservation (and, with a slot, its lease, in the same
    script) is on its way: the call still runs in Redis, so the store undoes it after the
    call; the request machine's own settlement of the abandoned job changes nothing more.
    No hold, no lease, and the bucket is full again."""

    async def main() -> None:
        s = GuardedStore(
            RedisStore(connect(fresh_redis, password=None, timeout_s=1.0), namespace="cx"),
            SystemClock(),
        )
        s.start()
        claims = (claim(300),)
        slot = Slot("p", 300, 4, None) if with_slot else None
        try:
            assert isinstance(await s.reserve("w0", "a", claims, slot), Grant)  # connected
            s.finish("w0", "a", claims, settle_lines(claims, 0), "p")
            task = asyncio.create_task(s.reserve("j1", "a", claims, slot))
            await asyncio.sleep(0)  # the call is queued for Redis
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            s.finish("j1", "a", claims, settle_lines(claims, 0), "p")  # the machine's Settle
            assert await s.flush(5.0)
            (snap,) = await s.redis.snapshots("a", claims)
            assert snap.remaining == pytest.approx(1000.0, abs=0.01)
        finally:
            await s.stop()

    asyncio.run(main())
    with redis.Redis.from_url(fresh_redis) as c:
        keys = list(c.scan_iter("cx:*"))
        assert [k for k in keys if b":held:" in k] == []
        assert sum(int(c.zcard(k)) for k in keys if k.endswith(b":leases")) == 0
