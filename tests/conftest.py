"""Suite-wide fixtures: a real Redis (see :mod:`tests.support.redis_server`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer, shared_redis_url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis for the whole session: ``VELVETROPE_TEST_REDIS_URL`` or one we start."""
    url = shared_redis_url()
    if url is not None:
        yield url
        return
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def fresh_redis(redis_url: str) -> str:
    """``redis_url`` after FLUSHDB."""
    with redis.Redis.from_url(redis_url) as c:
        c.flushdb()
    return redis_url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, which the test may stop and restart (outages)."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
