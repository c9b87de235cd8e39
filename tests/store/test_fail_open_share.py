"""``fail_open`` and a pool's fleet-wide ``max_in_flight`` when the replicas did not hold
equal parts of it as Redis went away (found by ``make chaos``, issue 32).

Each replica's fallback share is the pool's slots divided by the live replicas, less the
jobs it still runs on Redis leases.  A replica that held more than its share when Redis
went away keeps running those jobs; the other one takes its whole share on top: the fleet
runs more than ``max_in_flight`` until the first one's jobs end.  ``make chaos`` measured
it at the engines: ``engines held at most 20 requests at once (limit 12)``, first over
just after Redis was SIGKILLed, with one gateway holding 9 leases and the other 3.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.store.test_guard import claim, guarded
from tests.support.redis_server import RedisServer
from velvetrope.store.base import Slot


@pytest.mark.integration
def test_the_fleet_limit_holds_when_a_replica_held_more_than_its_share(
    own_redis: RedisServer,
) -> None:
    async def main() -> None:
        a, _ = guarded(own_redis.url)
        b, _ = guarded(own_redis.url)
        for s in (a, b):
            s.replicas = 2  # as the heartbeats said before the outage: a share of 2 each
            s.breaker.reset_s = 60.0  # no probe during the test: the breaker stays open
        try:
            slot = Slot("p", 10, 4, None)  # 4 slots for the fleet
            for job in ("a1", "a2", "a3"):  # a runs 3 (the fleet allows it: 3 <= 4)
                assert await a.acquire(job, slot)
            assert await b.acquire("b1", slot)  # b runs 1: the fleet's 4 are taken
            assert not await b.acquire("b-full", slot)
            own_redis.stop()
            for i in range(3):  # three failures open b's breaker
                await b.reserve(f"x{i}", "t", [claim(1)])
            assert b.breaker.state == "open"
            # a's 3 jobs still run: b may not start another while they do (3 + 1 = 4)
            assert not await b.acquire("b2", slot), "the fleet would run 5 jobs on 4 slots"
        finally:
            await a.stop(flush_s=0)
            await b.stop(flush_s=0)

    asyncio.run(main())
