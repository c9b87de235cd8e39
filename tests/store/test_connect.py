"""Redis URLs and the RESP packer of the pipelined connection."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.connection import Connection

from velvetrope.errors import ConfigError
from velvetrope.store.connect import connect, parse_nodes
from velvetrope.store.wire import pack


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "ab" * 20, 3, "ns:{t:a}:b:tenant:a:tok", b"raw", 0.25, 1e12, -3, "x y"),
        (b"EVALSHA", "ab" * 20, 1, "k", 1, 1.0, 0.1 + 0.2, 2**70, -0.0),
        ("AUTH", "user", "pässword"),
        ("GET", "é" * 3000),
        ("SET", "k", "v" * 10_000),
    ],
)
def test_packing_is_byte_for_byte_redis_pys(args: tuple[object, ...]) -> None:
    ref = b"".join(Connection().pack_command(*args))  # type: ignore[arg-type]
    assert pack(*args) == ref
    assert pack(*args) == ref  # again, from the cache of strings


def test_packing_refuses_what_redis_pys_encoder_refuses() -> None:
    for bad in (True, None, object()):
        with pytest.raises(TypeError):
            pack("SET", "k", bad)


def test_urls() -> None:
    assert parse_nodes("a:1,b:2", 6379) == [("a", 1), ("b", 2)]
    assert parse_nodes("user:pw@a,b:7000", 6379) == [("a", 6379), ("b", 7000)]
    with pytest.raises(ConfigError):
        parse_nodes("a:x", 6379)
    with pytest.raises(ConfigError):
        connect("mysql://h", password=None, timeout_s=1.0)
    with pytest.raises(ConfigError, match="service"):
        connect("redis+sentinel://h:26379", password=None, timeout_s=1.0)

    async def pooled() -> None:
        client = connect("redis://127.0.0.1:1/0", password=None, timeout_s=1.0)
        assert client.connection_pool.connection_kwargs["socket_connect_timeout"] == 1.0
        await client.aclose()

    asyncio.run(pooled())
