"""``redis+sentinel://``: the store finds the master a real Sentinel names, and its
pipelined connection (``store/wire.py``) talks to that master."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import RedisServer, redis_binary
from velvetrope.core.bucket import Claim, Grant, settle_lines
from velvetrope.serving.launch import free_port
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect
from velvetrope.store.redis_store import RedisStore

pytestmark = pytest.mark.integration


def _sentinel_conf(port: int, master_port: int, directory: Path, extra: str = "") -> Path:
    conf = directory / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n{extra}"
    )
    return conf


def _until(check: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@contextlib.contextmanager
def _sentinel(master_port: int, directory: Path, extra: str = "") -> Iterator[int]:
    """A Sentinel watching the master on ``master_port`` as ``mymaster``; its port."""
    port = free_port()
    proc = subprocess.Popen(
        [redis_binary(), str(_sentinel_conf(port, master_port, directory, extra)), "--sentinel"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with redis.Redis(port=port, socket_timeout=0.5) as s:
            _until(
                lambda: bool(s.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")),
                "the Sentinel did not come up",
            )
        yield port
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def sentinel(own_redis: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A Sentinel watching ``own_redis`` as ``mymaster``; yields its port."""
    with _sentinel(own_redis.port, tmp_path) as port:
        yield port


def test_the_store_works_on_the_master_a_sentinel_names(
    own_redis: RedisServer, sentinel: int
) -> None:
    async def main() -> None:
        url = f"redis+sentinel://127.0.0.1:{sentinel}/mymaster"
        s = RedisStore(connect(url, password=None, timeout_s=1.0), namespace="sen")
        try:
            claims = [Claim("tenant:a:tok", "tokens", "tenant", 300, 1000.0, 1e-6)]
            res, lease = await s.reserve_leased("j1", "a", claims, Slot("p", 300, 1, None))
            assert isinstance(res, Grant) and lease is not None and lease.granted
            assert await s.finish("j1", "a", claims, settle_lines(claims, 100), "p") == (True, 1)
            (snap,) = await s.snapshots("a", claims)
            assert snap.remaining == pytest.approx(900, abs=0.01)
        finally:
            await s.close()

    asyncio.run(main())
    with redis.Redis(port=own_redis.port) as master:  # the writes landed on the master
        assert any(k.startswith(b"sen:") for k in master.scan_iter("sen:*"))


def test_the_store_follows_a_failover_to_the_promoted_replica(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The master dies; the Sentinel promotes its replica; the store's next connection goes
    to the new master (calls in between fail with redis-py's errors, which the guard turns
    into the failure policy), and buckets and leases work there."""
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(own_redis.port)])
    replica.start()
    try:
        with redis.Redis(port=replica.port) as r:
            _until(lambda: r.info("replication")["master_link_status"] == "up", "no sync")
        fast = (
            "sentinel down-after-milliseconds mymaster 300\n"
            "sentinel failover-timeout mymaster 2000\n"
        )
        with _sentinel(own_redis.port, tmp_path, fast) as port, redis.Redis(port=port) as sen:
            _until(
                lambda: len(sen.execute_command("SENTINEL", "replicas", "mymaster")) == 1,
                "the Sentinel did not see the replica",
            )
            url = f"redis+sentinel://127.0.0.1:{port}/mymaster"
            claims = [Claim("tenant:a:tok", "tokens", "tenant", 300, 1000.0, 1e-6)]

            async def before() -> RedisStore:
                s = RedisStore(connect(url, password=None, timeout_s=1.0), namespace="fo")
                res, lease = await s.reserve_leased("j1", "a", claims, Slot("p", 300, 4, None))
                assert isinstance(res, Grant) and lease is not None and lease.granted
                return s

            async def after(s: RedisStore) -> None:
                deadline = time.monotonic() + 20
                while True:  # until the pipelined connection reaches the new master
                    try:
                        res, lease = await s.reserve_leased(
                            "j2", "a", claims, Slot("p", 300, 4, None)
                        )
                        break
                    except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                        assert time.monotonic() < deadline, "the store never reconnected"
                        await asyncio.sleep(0.1)
                assert isinstance(res, Grant) and lease is not None and lease.granted
                assert await s.finish("j2", "a", claims, settle_lines(claims, 10), "p") == (
                    True,
                    1,
                )
                await s.close()

            loop = asyncio.new_event_loop()
            try:
                store = loop.run_until_complete(before())
                own_redis.stop()  # the master dies
                _until(
                    lambda: (
                        int(
                            sen.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")[
                                1
                            ]
                        )
                        == replica.port
                    ),
                    "the Sentinel did not promote the replica",
                )
                loop.run_until_complete(after(store))
            finally:
                loop.close()
        with redis.Redis(port=replica.port) as new_master:
            assert new_master.info("replication")["role"] == "master"
            # scripts replicate as their effects: EVALSHA ran here only once it was master
            assert new_master.info("commandstats")["cmdstat_evalsha"]["calls"] >= 2
    finally:
        replica.stop()
