"""``redis+sentinel://``: the store finds the master a real Sentinel names, and its
pipelined connection (``store/wire.py``) talks to that master."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import RedisServer, redis_binary
from velvetrope.core.bucket import Claim, Grant, settle_lines
from velvetrope.serving.launch import free_port
from velvetrope.store import RedisStore
from velvetrope.store.base import Slot
from velvetrope.store.connect import connect

pytestmark = pytest.mark.integration


@pytest.fixture
def sentinel(own_redis: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A Sentinel watching ``own_redis`` as ``mymaster``; yields its port."""
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {own_redis.port} 1\n"
    )
    proc = subprocess.Popen(
        [redis_binary(), str(conf), "--sentinel"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        with redis.Redis(port=port, socket_timeout=0.5) as s:
            while True:
                try:
                    if s.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster"):
                        break
                except redis.RedisError:
                    pass
                assert time.monotonic() < deadline, "the Sentinel did not come up"
                time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait(10)


def test_the_store_works_on_the_master_a_sentinel_names(
    own_redis: RedisServer, sentinel: int
) -> None:
    async def main() -> None:
        url = f"redis+sentinel://127.0.0.1:{sentinel}/mymaster"
        s = RedisStore(connect(url, password=None, timeout_s=1.0), namespace="sen")
        try:
            claims = [Claim("tenant:a:tok", "tokens", "tenant", 300, 1000.0, 1e-6)]
            res, lease = await s.admit("j1", "a", claims, Slot("p", 300, 1, None))
            assert isinstance(res, Grant) and lease is not None and lease.granted
            assert await s.finish("j1", "a", claims, settle_lines(claims, 100), "p") == (True, 1)
            (snap,) = await s.snapshots("a", claims)
            assert snap.remaining == pytest.approx(900, abs=0.01)
        finally:
            await s.close()

    asyncio.run(main())
    with redis.Redis(port=own_redis.port) as master:  # the writes landed on the master
        assert any(k.startswith(b"sen:") for k in master.scan_iter("sen:*"))
