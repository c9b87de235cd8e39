"""Fleet-wide slots through the ticket, two gateways' admission on one real Redis (in
process, no HTTP): at most one job per pool leaves a replica's queue without its slot, the
policy's order holds inside a replica, and a refused request charges nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis

from tests.core.helpers import make_job
from velvetrope.clock import SystemClock
from velvetrope.config import parse_config
from velvetrope.core import AdmissionController, Usage
from velvetrope.gateway.driver.admission import Admission, Refusal, Ticket
from velvetrope.store.open import open_store

pytestmark = pytest.mark.integration


def replica(url: str, namespace: str, slots: int, calls: list[str] | None = None) -> Admission:
    """One gateway's admission: tiers hi > lo, a pool of ``slots`` fleet-wide, a tenant
    with a token limit, state in Redis."""
    cfg: dict[str, Any] = {
        "state": {"url": url, "namespace": namespace, "call_timeout_ms": 2000},
        "policy": {
            "tiers": [{"name": "hi"}, {"name": "lo"}],
            # a bucket that barely refills: a refund missing shows in its level
            "tenants": [
                {
                    "name": "t",
                    "tier": "lo",
                    "limits": {"tokens_per_minute": 6, "token_burst": 60000},
                }
            ],
            "pools": [{"name": "default", "max_in_flight": slots}],
        },
    }
    config = parse_config(cfg)
    clock = SystemClock()
    ctl = AdmissionController(config.policy, clock)
    observe = None if calls is None else (lambda op, s: calls.append(op))
    return Admission(ctl, open_store(config, clock, observe_call=observe))


async def until(cond: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_one_job_per_pool_waits_for_a_slot_and_priority_holds(fresh_redis: str) -> None:
    async def main() -> None:
        ns = f"fs{uuid.uuid4().hex[:8]}"
        b_calls: list[str] = []
        a, b = replica(fresh_redis, ns, 2), replica(fresh_redis, ns, 2, b_calls)
        a.store.start()
        b.store.start()
        loop = asyncio.get_running_loop()
        try:
            held = [await a.enter(make_job(tier="lo"), loop.create_future()) for _ in range(2)]
            assert all(isinstance(t, Ticket) for t in held)  # the fleet's two slots
            lows = [make_job(tier="lo") for _ in range(4)]
            waits = [asyncio.ensure_future(b.enter(j, loop.create_future())) for j in lows]
            await until(lambda: b.ctl.queued + b.ctl.in_flight == 4)
            # b's first job polls for a slot meanwhile: let it try three times
            await until(lambda: b_calls.count("acquire") >= 3)
            # one job left b's queue without a slot; the other three wait in it, in order
            assert (b.ctl.in_flight, b.ctl.queued) == (1, 3)
            first = lows[0]
            hi = make_job(tier="hi")
            hi_wait = asyncio.ensure_future(b.enter(hi, loop.create_future()))
            await until(lambda: b.ctl.queued == 4)
            for t in held:  # a gives back both slots
                assert isinstance(t, Ticket)
                t.complete(Usage(100, 100))
            got = [await waits[0], await hi_wait]
            assert [t.job for t in got if isinstance(t, Ticket)] == [first, hi]
            lacking = b.machine.brakes["default"].lacking
            assert len(lacking) <= 1  # the next one may be waiting for its slot already
            assert b.ctl.in_flight - len(lacking) == 2
            for t in got:
                assert isinstance(t, Ticket)
                t.complete(Usage(100, 100))
            for w in waits[1:]:  # the rest, in their order, each ending when it runs
                t = await w
                assert isinstance(t, Ticket)
                t.complete(Usage(100, 100))
            assert (b.ctl.in_flight, b.ctl.queued) == (0, 0)
        finally:
            await a.store.stop()
            await b.store.stop()

    asyncio.run(main())


def test_a_draining_replica_on_redis_charges_nothing(fresh_redis: str) -> None:
    """A request refused with ``draining`` takes no token, no request and leaves no hold."""

    async def main() -> None:
        ns = f"dr{uuid.uuid4().hex[:8]}"
        adm = replica(fresh_redis, ns, 4)
        adm.store.start()
        loop = asyncio.get_running_loop()
        try:
            adm.start_draining()
            for _ in range(5):
                out = await adm.enter(make_job(tier="lo"), loop.create_future())
                assert isinstance(out, Refusal) and out.code == "draining"
            assert await adm.store.flush(5.0)
        finally:
            await adm.store.stop()
        with redis.Redis.from_url(fresh_redis) as r:
            assert [k for k in r.scan_iter(f"{ns}:*") if b":fleet}" not in k] == []

    asyncio.run(main())


def test_a_job_rejected_after_redis_granted_it_gives_back_its_tokens_and_slot(
    fresh_redis: str,
) -> None:
    """Draining starts while a request's reservation (with its slot) is on its way: the
    core rejects it, and the reservation and the lease come back."""

    async def main() -> None:
        ns = f"rj{uuid.uuid4().hex[:8]}"
        adm = replica(fresh_redis, ns, 4)
        adm.store.start()
        loop = asyncio.get_running_loop()
        try:
            job = make_job(tier="lo")
            entering = asyncio.ensure_future(adm.enter(job, loop.create_future()))
            await asyncio.sleep(0)  # the reservation is sent ...
            adm.start_draining()  # ... and the gateway starts draining before it returns
            out = await entering
            assert isinstance(out, Refusal) and out.code == "draining"
            assert await adm.store.flush(5.0)
            assert not adm.store.has_lease(job.id, "default")
            with redis.Redis.from_url(fresh_redis) as r:
                (bucket,) = list(r.scan_iter(f"{ns}:*:b:*"))
                assert float(r.hget(bucket, "l") or 0) == pytest.approx(60000, abs=5)
                assert list(r.scan_iter(f"{ns}:*held*")) == []
                assert r.zcard(f"{ns}:{{pool:default}}:leases") == 0
        finally:
            await adm.store.stop()

    asyncio.run(main())
