"""Suite-wide fixtures and rules.

Fixtures: a real Redis, and a real three-node Redis Cluster (see
:mod:`tests.support.redis_server`).

Rule: a test that starts a real server is marked ``integration``.  Every server the tests
start goes through :func:`velvetrope.serving.launch.start` (``velvetrope engine``,
``velvetrope serve``, the demo's processes) or
:meth:`tests.support.redis_server.RedisServer.start`; both are wrapped here so that
starting one from a test without the marker fails that test with a message saying so
(also when a module- or session-scoped fixture starts it on the test's behalf).
``pytest -m "not integration"`` then runs no server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.support.redis_server import RedisCluster, RedisServer, shared_redis_url
from velvetrope.serving import launch

_current: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[:] = [item]


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _current.clear()


def _only_in_integration_tests(what: str, start: Callable[..., Any]) -> Callable[..., Any]:
    def checked(*args: Any, **kwargs: Any) -> Any:
        for item in _current:
            if item.get_closest_marker("integration") is None:
                pytest.fail(
                    f"{item.nodeid} starts a server ({what}): mark it @pytest.mark.integration",
                    pytrace=False,
                )
        return start(*args, **kwargs)

    return checked


launch.start = _only_in_integration_tests("velvetrope", launch.start)
RedisServer.start = _only_in_integration_tests("redis-server", RedisServer.start)  # type: ignore[method-assign]


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


@pytest.fixture
def redis_cluster() -> Iterator[RedisCluster]:
    """A three-node Redis Cluster of this test's own."""
    cluster = RedisCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
