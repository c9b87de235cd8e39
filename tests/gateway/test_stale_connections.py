"""A pooled connection the engine closed is never what fails a request.

llama.cpp's server closes its connection after every streamed response while advertising
keep-alive; the close can cross the gateway's next request on that connection, which then
ends with no answer.  The upstream here makes that race certain: every connection answers
its first request (keep-alive, as llama.cpp says) and closes on the next one without a
byte of answer.  Every pooled connection is then stale, so a request that retried on
another pooled connection would fail; the client must go to a new one.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.raw_http import read_request
from velvetrope.gateway.upstream.httpclient import HttpClient

pytestmark = pytest.mark.integration

BODY = b'{"ok":true}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


async def _stale_pool(concurrent: int, sequential: int) -> tuple[list[bytes], int, int]:
    """Fill the pool with ``concurrent`` connections, then send ``sequential`` requests one
    by one.  Returns the bodies of the sequential answers, the connections the server
    accepted and the client's count of requests sent again."""
    accepted = 0
    gate = asyncio.Event()  # holds the first answers until every connection is open

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            await read_request(reader)
            if accepted >= concurrent:
                gate.set()
            await gate.wait()
            writer.write(ANSWER)
            await writer.drain()
            await read_request(reader)  # the next request: closed on, unanswered
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/completions"
    http = HttpClient(2.0, 5.0)

    async def one() -> bytes:
        async with await http.post(url, b"{}") as resp:
            assert resp.status == 200
            return await resp.read()

    try:
        assert await asyncio.gather(*(one() for _ in range(concurrent))) == [BODY] * concurrent
        bodies = [await one() for _ in range(sequential)]
    finally:
        http.close()
        server.close()
        await server.wait_closed()
    return bodies, accepted, http.stale_retries


def test_a_request_on_a_stale_pooled_connection_goes_again_on_a_new_one() -> None:
    bodies, accepted, retried = asyncio.run(_stale_pool(concurrent=3, sequential=4))
    assert bodies == [BODY] * 4
    # each sequential request found a stale connection first (three from the pool, then the
    # one the previous request's retry left there) and was sent once more, on a new one
    assert retried == 4
    assert accepted == 3 + 4
