"""Settlements in batches: ``finish_many.lua`` / ``settle_many.lua`` against the single-job
rules, idempotent repeats, the outbox's grouping per Redis slot, and retries after an
outage (real redis-server, a real Redis Cluster)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import hiredis
import pytest
import redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from tests.support.redis_server import RedisCluster, RedisServer
from velvetrope.clock import SystemClock
from velvetrope.core.bucket import Claim, Grant, SettleLine, TokenBucket, settle_lines
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect
from velvetrope.store.guard import GuardedStore
from velvetrope.store.redis_store import RedisStore, SettleItem

pytestmark = pytest.mark.integration

RATE = 1e-3  # tokens/s: the refill between two calls of a test is far below its tolerance
X = Claim("tenant:a:x", "tokens", "tenant", 0, 1000.0, RATE, -200.0)  # floor -200
Y = Claim("tenant:a:y", "requests", "tenant", 0, 50.0, RATE)  # floor -50
Z = Claim("tenant:a:z", "tokens", "tenant", 0, 300.0, RATE)  # missing: full
SHAPES = {c.key: c for c in (X, Y, Z)}
START = {"tenant:a:x": 400.0, "tenant:a:y": 20.0}  # Z does not exist
START_PTTL_MS = 123_456_000
SLOT = Slot("p", 10, 1000, 100_000)  # a token cap: leases record their tokens


def job(job_id: str, *lines: SettleLine) -> SettleItem:
    return job_id, "a", tuple(SHAPES[k] for k, _, _ in lines), lines


# each kind of line: a refund, an overrun to the floor, a refund to the capacity, a missing
# bucket, a bucket that only rises (it keeps its TTL); j5 holds no lease; j4 was settled
# before (last, where settling it would change X)
JOBS = [
    job("j1", ("tenant:a:x", 300, 100), ("tenant:a:y", 1, 1)),
    job("j2", ("tenant:a:x", 100, 400)),
    job("j3", ("tenant:a:x", 50, 0), ("tenant:a:z", 100, 150)),
    job("j5", ("tenant:a:x", 0, 2000)),
    job("j6", ("tenant:a:x", 1000, 0.125)),
    job("j7", ("tenant:a:y", 1, 0), ("tenant:a:x", 10, 10)),
    job("j8", ("tenant:a:z", 100, 0), ("tenant:a:x", 1 / 3, 0)),
    job("j9", ("tenant:a:x", 0, 650)),
    job("j4", ("tenant:a:x", 500, 0)),
]
HELD = [j[0] for j in JOBS if j[0] != "j4"]
LEASED = [j[0] for j in JOBS if j[0] != "j5"]


def store(url: str, ns: str, **kw: Any) -> RedisStore:
    return RedisStore(connect(url, password=None, timeout_s=2.0), namespace=ns, **kw)


def prepare(sync: redis.Redis, s: RedisStore) -> None:
    """The buckets of :data:`START`, last refilled in the future (no refill at the first
    read: the expected levels are exact), the holds of :data:`HELD`, the leases of
    :data:`LEASED` (through the lease script)."""
    sec, usec = sync.time()
    for key, level in START.items():
        k = s.bucket_key("a", key)
        sync.hset(k, mapping={"l": repr(level), "t": repr(sec + usec / 1e6 + 3600)})
        sync.pexpire(k, START_PTTL_MS)
    for j in HELD:
        sync.set(f"{s.tag('a')}:held:{j}", 1, ex=3600)


def replay(jobs: list[SettleItem]) -> tuple[dict[str, float], dict[str, int]]:
    """The Python rules, every job at one instant: each bucket's level, and the PTTL (ms)
    the single-job script leaves it with (set by the last job that lowered it or found it
    missing; none set: the one it had)."""
    buckets = {}
    for c in (X, Y, Z):
        b = TokenBucket(c.capacity, c.rate, floor=c.floor, now=0.0)
        b.level = START.get(c.key, c.capacity)
        buckets[c.key] = b
    found = set(START)
    pttl = dict.fromkeys(START, START_PTTL_MS)
    for job_id, _, _, lines in jobs:
        if job_id not in HELD:
            continue
        for key, reserved, actual in lines:
            b = buckets[key]
            before = b.level
            b.settle(reserved, actual, 0.0)
            if key not in found or b.level < before:
                pttl[key] = math.ceil(max(0.0, (b.capacity - b.level) / b.rate) * 1000) + 5000
            found.add(key)
    return {k: b.level for k, b in buckets.items()}, pttl


def levels(sync: redis.Redis, s: RedisStore) -> dict[str, float]:
    out = {}
    for key in SHAPES:
        raw = sync.hget(s.bucket_key("a", key), "l")
        if raw is not None:
            out[key] = float(raw)
    return out


def pttls(sync: redis.Redis, s: RedisStore) -> dict[str, int]:
    return {key: int(sync.pttl(s.bucket_key("a", key))) for key in SHAPES}


def lease_state(sync: redis.Redis, s: RedisStore) -> tuple[list[Any], dict[Any, Any]]:
    base = f"{s.ns}:{{pool:p}}"
    return list(sync.zrange(f"{base}:leases", 0, -1)), dict(sync.hgetall(f"{base}:lease_tokens"))


def test_a_batch_settles_as_the_jobs_would_one_by_one(fresh_redis: str) -> None:
    """One finish_many call leaves every bucket at exactly the levels of the Python rules
    replayed job by job at one instant, with the expiries the single-job script sets, and
    agrees with single finish calls (made one after the other: within their refill)."""
    want_levels, want_pttl = replay(JOBS)
    want = [(j in HELD, int(j in LEASED)) for j, _, _, _ in JOBS]

    async def main() -> None:
        batch, one = store(fresh_redis, "many"), store(fresh_redis, "one")
        try:
            with redis.Redis.from_url(fresh_redis) as sync:
                for s in (batch, one):
                    prepare(sync, s)
                    for j in LEASED:
                        assert (await s.acquire(j, SLOT)).granted
                assert await batch.finish_many("p", JOBS) == want
                got = levels(sync, batch)
                assert got == want_levels  # exactly: the same double arithmetic
                ttl = pttls(sync, batch)
                for key, ms in want_pttl.items():
                    assert ms - 2_000 < ttl[key] <= ms, key
                assert lease_state(sync, batch) == ([], {b"_total": b"0"})

                singles = [await one.finish(j, t, c, lines, "p") for j, t, c, lines in JOBS]
                assert singles == want
                assert levels(sync, one) == pytest.approx(got, abs=1e-2)
                ttl_one = pttls(sync, one)
                for key in SHAPES:
                    assert abs(ttl_one[key] - ttl[key]) < 2_000, key
                assert lease_state(sync, one) == ([], {b"_total": b"0"})
        finally:
            await batch.close()
            await one.close()

    asyncio.run(main())


def test_a_batch_sent_again_settles_nothing_twice(fresh_redis: str) -> None:
    """The same batch again changes no bucket and releases no lease; a batch mixing
    settled and new jobs settles the new ones only; settle_many (no leases) alike."""

    async def main() -> None:
        s = store(fresh_redis, "again")
        try:
            with redis.Redis.from_url(fresh_redis) as sync:
                prepare(sync, s)
                for j in LEASED:
                    assert (await s.acquire(j, SLOT)).granted
                await s.finish_many("p", JOBS)
                buckets = {k: sync.hgetall(s.bucket_key("a", k)) for k in SHAPES}
                assert await s.finish_many("p", JOBS) == [(False, 0)] * len(JOBS)
                assert await s.settle_many(JOBS) == [False] * len(JOBS)
                assert {k: sync.hgetall(s.bucket_key("a", k)) for k in SHAPES} == buckets
                assert lease_state(sync, s) == ([], {b"_total": b"0"})

                before = levels(sync, s)
                claims = [X._replace(amount=30.0)]
                for j in ("n1", "n2"):
                    _, lease = await s.reserve_leased(j, "a", claims, SLOT)
                    assert lease is not None and lease.granted
                assert lease_state(sync, s)[1] == {b"_total": b"20", b"n1": b"10", b"n2": b"10"}
                mixed = [JOBS[0], job("n1", ("tenant:a:x", 30, 5)), JOBS[1]]
                mixed.append(job("n2", ("tenant:a:x", 30, 40)))
                got = await s.finish_many("p", mixed)
                assert got == [(False, 0), (True, 1), (False, 0), (True, 1)]
                x = levels(sync, s)["tenant:a:x"]
                assert x == pytest.approx(before["tenant:a:x"] - 60 + 25 - 10, abs=1e-2)
                assert lease_state(sync, s) == ([], {b"_total": b"0"})

                sync.set(f"{s.tag('a')}:held:n3", 1)
                third = [job("n1", ("tenant:a:x", 30, 5)), job("n3", ("tenant:a:x", 0, 100))]
                assert await s.settle_many(third) == [False, True]
                assert await s.settle_many(third) == [False, False]
                assert levels(sync, s)["tenant:a:x"] == pytest.approx(x - 100, abs=1e-2)
        finally:
            await s.close()

    asyncio.run(main())


def test_a_batch_refuses_tenants_of_different_slots(fresh_redis: str) -> None:
    async def main() -> None:
        s, shared = store(fresh_redis, "tags"), store(fresh_redis, "tags", shared_tag=True)
        try:
            two = [JOBS[0], ("j0", "b", (X,), (("tenant:a:x", 1, 1),))]
            with pytest.raises(ValueError, match="do not share a slot"):
                s.send_settle_many(two)
            assert await shared.settle_many(two) == [False, False]  # one tag for all
        finally:
            await s.close()
            await shared.close()

    asyncio.run(main())


async def _record_calls(s: RedisStore) -> list[tuple[str, list[str]]]:
    """Record the store's script calls as (script name, keys), pipelined or not: on the
    connection's transport, or on the client a script calls (the store and its pipeline may
    be compiled, their methods not replaceable)."""
    names = {v.sha: a[1:] for a in dir(s) if isinstance(v := getattr(s, a, None), AsyncScript)}
    calls: list[tuple[str, list[str]]] = []
    pipe = s._pipe
    if pipe is None:
        evalsha = s.client.evalsha

        async def recording(sha: str, numkeys: int, *keys_and_args: Any) -> Any:
            call = (names[sha], [str(k) for k in keys_and_args[:numkeys]])
            try:
                r = await evalsha(sha, numkeys, *keys_and_args)
            except NoScriptError:
                raise  # the script loads and the call is made again: that one counts
            except Exception:
                calls.append(call)
                raise
            calls.append(call)
            return r

        s.client.evalsha = recording
        return calls
    proto = await pipe.wire._connect()  # the calls from here on are written to its transport
    assert proto.transport is not None
    proto.transport = _Spy(proto.transport, calls, names)
    return calls


class _Spy(asyncio.Transport):
    """A connection's transport that records the script calls written to it."""

    def __init__(
        self, inner: asyncio.Transport, calls: list[tuple[str, list[str]]], names: dict[str, str]
    ) -> None:
        super().__init__()
        self.inner, self.calls, self.names = inner, calls, names

    def write(self, data: Any) -> None:
        reader = hiredis.Reader()
        reader.feed(bytes(data))
        while (cmd := reader.gets()) is not False:  # EVALSHA sha numkeys keys... args...
            if cmd[0] == b"EVALSHA":
                keys = [k.decode() for k in cmd[3 : 3 + int(cmd[2])]]
                self.calls.append((self.names[cmd[1].decode()], keys))
        self.inner.write(data)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()

    def is_closing(self) -> bool:
        return self.inner.is_closing()


def _state(s: RedisStore, **kw: Any) -> GuardedStore:
    return GuardedStore(s, SystemClock(), call_timeout_s=0.05, breaker_reset_s=0.1, **kw)


def _claims(tenant: str) -> list[Claim]:
    return [
        Claim(f"tenant:{tenant}:tok", "tokens", "tenant", 100.0, 1000.0, RATE),
        Claim(f"tenant:{tenant}:req", "requests", "tenant", 1.0, 50.0, RATE),
    ]


async def _until(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _admit_all(state: GuardedStore, jobs: list[tuple[str, str, str]]) -> None:
    """Admit every (job, tenant, pool): 100 tokens and a slot each."""
    for j, t, pool in jobs:
        await state.reserve(j, t, _claims(t), Slot(pool, 100, 100, None))
        assert state.has_lease(j, pool)


def _finish_all(state: GuardedStore, jobs: list[tuple[str, str, str]]) -> None:
    """Finish every (job, tenant, pool) in this tick, each having used 30 tokens."""
    for j, t, pool in jobs:
        state.finish(j, t, _claims(t), settle_lines(_claims(t), 30), pool)


def _check_settled_once(sync: redis.Redis, s: RedisStore, jobs: list[tuple[str, str, str]]) -> None:
    for tenant in {t for _, t, _ in jobs}:
        n = sum(t == tenant for _, t, _ in jobs)
        tok = float(sync.hget(s.bucket_key(tenant, f"tenant:{tenant}:tok"), "l") or 0)
        req = float(sync.hget(s.bucket_key(tenant, f"tenant:{tenant}:req"), "l") or 0)
        assert tok == pytest.approx(1000 - 30 * n, abs=1e-2)
        assert req == pytest.approx(50 - n, abs=1e-2)
    assert not list(sync.scan_iter(f"{s.ns}:*:held:*"))
    for pool in {p for _, _, p in jobs}:
        assert sync.zcard(f"{s.ns}:{{pool:{pool}}}:leases") == 0


async def _one_round(
    state: GuardedStore, jobs: list[tuple[str, str, str]]
) -> list[tuple[str, list[str]]]:
    """Start ``state``, admit ``jobs``, finish them in one tick, wait for the outbox;
    returns the script calls made from the first admission on."""
    state.start()
    sent = await _record_calls(state.redis)
    await _admit_all(state, jobs)
    _finish_all(state, jobs)
    assert await state.outbox.flush(10.0)
    return sent


JOBS_2x2 = [(f"g{i}", "ab"[i % 2], "pq"[i // 2 % 2]) for i in range(8)]


@pytest.mark.parametrize(("shared_tag", "calls"), [(False, 4), (True, 2)])
def test_finishes_of_one_round_go_as_one_call_per_tag_and_pool(
    fresh_redis: str, shared_tag: bool, calls: int
) -> None:
    """Two tenants, two pools, two jobs of each pair, finished in one tick: one
    finish_many call per (tenant tag, pool), every job settled and released once."""

    async def main() -> None:
        s = store(fresh_redis, "grp", shared_tag=shared_tag)
        state = _state(s)
        try:
            sent = await _one_round(state, JOBS_2x2)
            finishes = [keys for name, keys in sent if name == "finish_many"]
            assert len(finishes) == calls
            assert {"finish", "settle", "settle_many"}.isdisjoint(n for n, _ in sent)
            holds = sorted(k for keys in finishes for k in keys if ":held:" in k)
            assert holds == sorted(f"{s.tag(t)}:held:{j}" for j, t, _ in JOBS_2x2)
            with redis.Redis.from_url(fresh_redis) as sync:
                _check_settled_once(sync, s, JOBS_2x2)
        finally:
            await state.stop()

    asyncio.run(main())


def test_a_failed_batch_is_sent_again_and_lands_once(own_redis: RedisServer) -> None:
    """Redis hangs (SIGSTOP) while a batch is on its way: the round times out, the batch
    waits in the outbox and is sent again; after Redis resumes, the first write and the
    repeat have both run, and every job is settled and released exactly once."""

    async def main() -> None:
        s = store(own_redis.url, "retry")
        state = _state(s)
        state.start()
        try:
            jobs = [(f"r{i}", "ab"[i % 2], "p") for i in range(10)]
            await _admit_all(state, jobs)
            own_redis.pause()
            _finish_all(state, jobs)
            await _until(lambda: state.outbox.retried > 0)
            own_redis.resume()
            await _until(lambda: state.up and len(state.outbox) == 0, 20.0)
            assert await state.outbox.flush(5.0)
            with redis.Redis.from_url(own_redis.url) as sync:
                _check_settled_once(sync, s, jobs)
            assert state.outbox.sent == len(jobs)
        finally:
            own_redis.resume()
            await state.stop()

    asyncio.run(main())


def test_on_a_cluster_settlements_go_per_tag_and_releases_per_pool(
    redis_cluster: RedisCluster,
) -> None:
    """On a Redis Cluster (buckets and pools in different slots) a round's settlements of
    one tenant go as one settle_many call, its releases of one pool as one release."""

    async def main() -> None:
        s = store(redis_cluster.url, "clb")
        assert not s.combined
        state = GuardedStore(s, SystemClock(), call_timeout_s=0.5)
        try:
            sent = await _one_round(state, JOBS_2x2)
            done = sorted(name for name, _ in sent if name in ("settle_many", "release"))
            assert done == ["release", "release", "settle_many", "settle_many"]
            assert all(name not in ("settle", "finish") for name, _ in sent)
            one = _claims("a")[:1]
            assert await s.settle_many([("g0", "a", one, settle_lines(one, 1))]) == [False]
            for t in "ab":
                (tok, _) = await s.snapshots(t, _claims(t))
                assert tok.remaining == pytest.approx(1000 - 30 * 4, abs=1e-2)
        finally:
            await state.stop()

    asyncio.run(main())


def test_a_job_redis_refuses_is_dropped_alone_and_the_others_settle_once(
    fresh_redis: str,
) -> None:
    """One tenant's bucket key holds another type (WRONGTYPE: the batch's script fails on
    reading it, before it changed anything): the round's one call is refused, its jobs are
    sent again one by one, the other tenant's settle and release exactly once, the refused
    ones are dropped and counted, and the breaker never opens (Redis answered)."""

    async def main() -> None:
        s = store(fresh_redis, "poison", shared_tag=True)  # every tenant in one call
        state = _state(s)
        state.start()
        try:
            jobs = [(f"x{i}", "ab"[i % 2], "p") for i in range(4)]
            sent = await _record_calls(s)
            await _admit_all(state, jobs)
            with redis.Redis.from_url(fresh_redis) as sync:
                bad = s.bucket_key("b", "tenant:b:tok")
                sync.delete(bad)
                sync.set(bad, "not a bucket")
                _finish_all(state, jobs)
                await _until(lambda: len(state.outbox) == 0 and state.outbox.rejected == 2)
                assert await state.outbox.flush(5.0)
                finishes = [keys for name, keys in sent if name == "finish_many"]
                assert len(finishes) == 1 + 4  # the batch, then each job alone
                tok = float(sync.hget(s.bucket_key("a", "tenant:a:tok"), "l") or 0)
                req = float(sync.hget(s.bucket_key("a", "tenant:a:req"), "l") or 0)
                assert tok == pytest.approx(1000 - 30 * 2)
                assert req == pytest.approx(50 - 2)
                assert sorted(sync.zrange(f"{s.ns}:{{pool:p}}:leases", 0, -1)) == [b"x1", b"x3"]
                assert sorted(sync.scan_iter(f"{s.ns}:*:held:*")) == sorted(
                    f"{s.tag('b')}:held:{j}".encode() for j, t, _ in jobs if t == "b"
                )
            assert (state.outbox.sent, state.outbox.rejected, state.outbox.retried) == (2, 2, 0)
            assert state.up and state.breaker.state == "closed"
            assert state.status()["outbox_rejected"] == 2
        finally:
            await state.stop()

    asyncio.run(main())


def test_reservations_redis_refuses_fall_back_without_opening_the_breaker(
    fresh_redis: str,
) -> None:
    """Redis refuses every reservation of one tenant (its bucket key holds another type):
    each falls back by the policy (here locally, at this replica's share), the breaker
    stays closed, and the other tenant keeps reserving in Redis."""

    async def main() -> None:
        s = store(fresh_redis, "refuse")
        state = _state(s, breaker_failures=3)
        state.start()
        try:
            with redis.Redis.from_url(fresh_redis) as sync:
                sync.set(s.bucket_key("b", "tenant:b:tok"), "not a bucket")
                for i in range(10):
                    res = await state.reserve(f"b{i}", "b", _claims("b"))
                    assert isinstance(res, Grant)  # from the local share
                    assert state.breaker.state == "closed"
                await state.reserve("a0", "a", _claims("a"))
                assert sync.exists(s.bucket_key("a", "tenant:a:tok"))
            assert state.status()["refused_calls"] == 10
            assert state.guard.fallbacks["reserve_local"] == 10
            # each fallback queued an undo of a reservation that may have happened: refused too
            await _until(lambda: state.outbox.rejected == 10 and len(state.outbox) == 0)
        finally:
            await state.stop()

    asyncio.run(main())
