"""``redis+cluster://``: the store on a real three-node Redis Cluster (buckets and leases
in different slots: reserve and lease are separate calls there)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer, redis_binary
from velvetrope.core.bucket import Claim, Denial, Grant, settle_lines
from velvetrope.store import RedisStore
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect

pytestmark = pytest.mark.integration


def cluster_port() -> int:
    """A free port whose cluster-bus twin (port + 10000) is free too."""
    while True:
        port = random.randrange(20_000, 40_000)
        try:
            for p in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def redis_cli() -> str:
    """``redis-cli`` beside the ``redis-server`` the suite uses."""
    return os.path.join(os.path.dirname(redis_binary()), "redis-cli")


@pytest.fixture
def cluster() -> Iterator[list[RedisServer]]:
    """Three masters, every slot assigned, no replicas."""
    nodes = [
        RedisServer(
            port=cluster_port(),
            args=["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"],
        )
        for _ in range(3)
    ]
    try:
        for n in nodes:
            n.start()
        hosts = [f"127.0.0.1:{n.port}" for n in nodes]
        subprocess.run(
            [redis_cli(), "--cluster", "create", *hosts, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        for n in nodes:
            with redis.Redis(port=n.port) as c:
                while c.cluster("info").get("cluster_state") != "ok":
                    assert time.monotonic() < deadline, "the cluster did not come up"
                    time.sleep(0.05)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_the_store_on_a_cluster(cluster: list[RedisServer]) -> None:
    async def main() -> None:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster[:2])
        s = RedisStore(connect(url, password=None, timeout_s=2.0), namespace="cl")
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
