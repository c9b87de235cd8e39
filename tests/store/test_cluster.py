"""``redis+cluster://``: the store on a real three-node Redis Cluster (buckets and leases
in different slots: reserve and lease are separate calls there)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.redis_server import RedisCluster
from velvetrope.core.bucket import Claim, Denial, Grant, settle_lines
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect
from velvetrope.store.redis_store import RedisStore

pytestmark = pytest.mark.integration


def test_the_store_on_a_cluster(redis_cluster: RedisCluster) -> None:
    async def main() -> None:
        s = RedisStore(connect(redis_cluster.url, password=None, timeout_s=2.0), namespace="cl")
        try:
            assert not s.combined  # buckets and leases live in different slots
            claims = [Claim("tenant:a:tok", "tokens", "tenant", 300, 1000.0, 1e-6)]
            assert isinstance(await s.reserve("j1", "a", claims), Grant)
            assert (await s.acquire("j1", Slot("p", 300, 1, None))).granted
            assert not (await s.acquire("j2", Slot("p", 300, 1, None))).granted
            assert await s.settle("j1", "a", claims, settle_lines(claims, 100))
            assert not await s.settle("j1", "a", claims, settle_lines(claims, 100))
            assert await s.release("p", ["j1"]) == 1
            assert (await s.acquire("j2", Slot("p", 300, 1, None))).granted
            denied = await s.reserve("j3", "a", [claims[0]._replace(amount=950.0)])
            assert isinstance(denied, Denial)  # 900 left after j1 settled at 100
            (snap,) = await s.snapshots("a", claims)
            assert snap.remaining == pytest.approx(900, abs=0.01)
            view = await s.heartbeat("replica-1", 2)
            assert view.replicas == 1
        finally:
            await s.close()

    asyncio.run(main())


def test_two_replicas_share_a_token_limit_on_a_cluster(redis_cluster: RedisCluster) -> None:
    """Two stores (two replicas' clients) race for one tenant's tokens: the cluster grants
    exactly what the bucket holds, in total; tenants spread over the nodes' slots."""

    async def main() -> None:
        a, b = (
            RedisStore(connect(redis_cluster.url, password=None, timeout_s=2.0), namespace="sh")
            for _ in range(2)
        )
        try:
            claim = Claim("tenant:t:tok", "tokens", "tenant", 30.0, 1000.0, 1e-9)

            async def ask(store: RedisStore, i: int) -> bool:
                return isinstance(await store.reserve(f"j{i}", "t", [claim]), Grant)

            got = await asyncio.gather(*(ask(a if i % 2 else b, i) for i in range(80)))
            assert sum(got) == 33  # 33 x 30 = 990 of 1000: never more, whoever asked
            (snap,) = await b.snapshots("t", [claim])
            assert snap.remaining == pytest.approx(10, abs=0.01)
            granted = [i for i, ok in enumerate(got) if ok]
            for i in granted[:10]:  # ten finish having used 10 tokens each: 200 back
                store = a if i % 2 else b
                assert await store.settle(f"j{i}", "t", [claim], settle_lines([claim], 10))
            (snap,) = await a.snapshots("t", [claim])
            assert snap.remaining == pytest.approx(210, abs=0.01)
            # hash tags put tenants in different slots, and so on different nodes
            nodes = {
                a.client.get_node_from_key(a.bucket_key(f"u{k}", "tenant:x:tok")).name
                for k in range(32)
            }
            assert len(nodes) == 3
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())
