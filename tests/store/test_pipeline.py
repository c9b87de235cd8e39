"""The auto-pipeline on its pipelined connection, against a real Redis: batching, replies
in order, errors per call, NOSCRIPT, a lost connection, AUTH, SELECT and Unix sockets."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.support.redis_server import RedisServer
from velvetrope.store.connect import connect
from velvetrope.store.pipeline import AutoPipeline

pytestmark = pytest.mark.integration

ECHO = "return {KEYS[1], ARGV[1]}"
SET = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])"
BOOM = "return redis.error_reply('boom ' .. ARGV[1])"


def run(url: str, body: Callable[[AutoPipeline, Any], Awaitable[None]]) -> None:
    async def main() -> None:
        client = connect(url, password=None, timeout_s=1.0)
        pipe = AutoPipeline(client)
        try:
            await body(pipe, client)
        finally:
            await pipe.close()
            await client.aclose()
            await client.connection_pool.disconnect()

    asyncio.run(main())


def test_calls_of_one_tick_share_one_write_and_get_their_own_replies(fresh_redis: str) -> None:
    async def body(pipe: AutoPipeline, client: Any) -> None:
        trips: list[float] = []
        pipe.observe = trips.append
        echo = client.register_script(ECHO)
        await client.script_load(ECHO)
        futs = [pipe.run(echo, [f"k{i}"], [i]) for i in range(200)]
        got = await asyncio.gather(*futs)
        assert got == [[f"k{i}".encode(), str(i).encode()] for i in range(200)]
        assert len(trips) == 1  # one write, one round trip observed
        # another tick, another write, on the same connection
        assert await pipe.run(echo, ["x"], [0.25]) == [b"x", b"0.25"]
        assert len(trips) == 2

    run(fresh_redis, body)


def test_a_failing_script_fails_only_its_caller(fresh_redis: str) -> None:
    async def body(pipe: AutoPipeline, client: Any) -> None:
        echo, boom = client.register_script(ECHO), client.register_script(BOOM)
        await client.script_load(ECHO)
        await client.script_load(BOOM)
        futs = [pipe.run(boom if i % 3 == 1 else echo, ["k"], [i]) for i in range(9)]
        res = await asyncio.gather(*futs, return_exceptions=True)
        for i, r in enumerate(res):
            if i % 3 == 1:
                assert isinstance(r, ResponseError) and f"boom {i}" in str(r)
            else:
                assert r == [b"k", str(i).encode()]

    run(fresh_redis, body)


def test_a_script_the_server_lost_is_loaded_and_run(fresh_redis: str) -> None:
    async def body(pipe: AutoPipeline, client: Any) -> None:
        setter = client.register_script(SET)
        # never loaded: NOSCRIPT, then loaded and re-sent, each call exactly once
        got = await asyncio.gather(*(pipe.run(setter, [f"s{i}"], [i]) for i in range(5)))
        assert got == [str(i).encode() for i in range(5)]
        with redis.Redis.from_url(fresh_redis) as c:
            c.script_flush()
        assert await pipe.run(setter, ["again"], ["v"]) == b"v"

    run(fresh_redis, body)


def test_a_lost_connection_fails_what_waits_and_the_next_call_reconnects(
    own_redis: RedisServer,
) -> None:
    async def body(pipe: AutoPipeline, client: Any) -> None:
        echo = client.register_script(ECHO)
        await client.script_load(ECHO)
        assert await pipe.run(echo, ["a"], [1]) == [b"a", b"1"]
        own_redis.pause()  # the call below is written and never answered...
        fut = pipe.run(echo, ["b"], [2])
        deadline = asyncio.get_running_loop().time() + 5
        while not pipe.wire.pending():  # until it is written
            assert asyncio.get_running_loop().time() < deadline, "the call was never written"
            await asyncio.sleep(0.001)
        assert not fut.done()
        assert own_redis.proc is not None
        own_redis.proc.kill()  # ...until the server dies, still stopped: the caller hears it
        own_redis.proc.wait(10)
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(fut, 5)
        with pytest.raises(RedisConnectionError):  # nothing listens: refused at once
            await asyncio.wait_for(pipe.run(echo, ["c"], [3]), 5)
        own_redis.start()  # a new server: the script is loaded again on the way
        assert await pipe.run(echo, ["d"], [4]) == [b"d", b"4"]

    run(own_redis.url, body)


def test_password_and_database_from_the_url() -> None:
    server = RedisServer(password="s3cret")
    server.start()
    try:
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        run(url, lambda pipe, client: _set_and_check(pipe, client, server.port))

        async def wrong(pipe: AutoPipeline, client: Any) -> None:
            with pytest.raises(RedisConnectionError, match="AUTH"):
                await pipe.run(client.register_script(SET), ["k"], ["v"])

        run(f"redis://:nope@127.0.0.1:{server.port}/0", wrong)
    finally:
        server.stop()


async def _set_and_check(pipe: AutoPipeline, client: Any, port: int) -> None:
    await client.script_load(SET)
    assert await pipe.run(client.register_script(SET), ["k"], ["in-db-3"]) == b"in-db-3"
    with redis.Redis(port=port, password="s3cret", db=3) as c:
        assert c.get("k") == b"in-db-3"
    with redis.Redis(port=port, password="s3cret", db=0) as c:
        assert c.get("k") is None


def test_unix_socket(tmp_path: Any) -> None:
    sock = str(tmp_path / "redis.sock")
    server = RedisServer(args=["--unixsocket", sock, "--unixsocketperm", "700"])
    server.start()
    try:

        async def body(pipe: AutoPipeline, client: Any) -> None:
            await client.script_load(SET)
            assert await pipe.run(client.register_script(SET), ["u"], ["x"]) == b"x"

        run(f"unix://{sock}", body)
        assert os.path.exists(sock)
    finally:
        server.stop()


def test_pack_writes_resp_and_refuses_what_it_cannot_send() -> None:
    from velvetrope.store.wire import pack

    args = ("EVALSHA", "f" * 40, 2, "k:{t}:é", b"\x00raw", 1e12, 1 / 3, -0.0, 10**20, "30.0")
    want = b"*%d\r\n" % len(args)
    for a in args:  # RESP bulk strings; numbers as repr writes them (as redis-py does)
        raw = a if isinstance(a, bytes) else a.encode() if isinstance(a, str) else repr(a).encode()
        want += b"$%d\r\n%b\r\n" % (len(raw), raw)
    assert pack(*args) == want
    for bad in (True, None, [1], {"a": 1}):
        with pytest.raises(TypeError, match=f"cannot send {type(bad).__name__}"):
            pack("SET", "k", bad)
