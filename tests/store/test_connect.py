"""Redis URLs and the linear-time command packer."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.connection import Connection

from velvetrope.errors import ConfigError
from velvetrope.store.connect import FastPackConnection, connect, parse_nodes


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "ab" * 20, 3, "ns:{t:a}:b:tenant:a:tok", b"raw", 0.25, 1e12, -3, "x y"),
        ("SCRIPT LOAD", "return 1"),
        (b"CLIENT SETNAME", b"n"),
        ("GET", "é" * 3000),
        ("SET", "k", "v" * 10_000),
    ],
)
def test_fast_packing_is_byte_for_byte_redis_pys(args: tuple[object, ...]) -> None:
    ref = b"".join(Connection().pack_command(*args))  # type: ignore[arg-type]
    assert b"".join(FastPackConnection().pack_command(*args)) == ref


def test_fast_packing_keeps_the_encoders_checks() -> None:
    from redis.exceptions import DataError

    with pytest.raises(DataError):
        FastPackConnection().pack_command("SET", "k", True)


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
        assert client.connection_pool.connection_class is FastPackConnection
        await client.aclose()

    asyncio.run(pooled())
