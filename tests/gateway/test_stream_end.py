"""The end of a relayed stream: when the upstream's response is complete by the time its
last bytes are relayed, they go to the client with the end of the response in one message
(one write instead of two); when the end comes later, it follows on its own.  Either way
the client gets the same bytes and the upstream connection goes back to the pool.

The upstream is a raw loopback HTTP/1.1 server that writes the response exactly as the test
says (all at once, or the terminating chunk later), so what the relay sees is deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.raw_http import read_request
from velvetrope.gateway.upstream.httpclient import HttpClient
from velvetrope.gateway.upstream.proxy import UpstreamAnswer, forward
from velvetrope.gateway.upstream.relay import UsageTally
from velvetrope.gateway.upstream.upstream_access import UpstreamAccess
from velvetrope.openai.sse import DONE

pytestmark = pytest.mark.integration

EVENTS = (
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n' + DONE
)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _forward(
    http: HttpClient,
    port: int,
    relay: UsageTally,
    start: Any,
    send: Any,
    end: Any,
    on_first_token: Callable[[], None],
) -> UpstreamAnswer:
    """One streamed chat completion from the raw upstream on ``port``, relayed."""
    return await forward(
        http,
        f"http://127.0.0.1:{port}/v1/chat/completions",
        b"{}",
        UpstreamAccess(),
        stream=True,
        client_wants_usage=True,
        relay=relay,
        start=start,
        send=send,
        end=end,
        on_first_token=on_first_token,
        extra_headers=[],
    )


async def _relay(split_end: bool) -> tuple[list[tuple[str, bytes]], int, int]:
    """Serve one streamed answer (the terminating chunk written with the body, or once
    the relay passed the body on); relay it twice through one client.  Returns the
    client-side messages of the first relay, the connections the server accepted and the
    tokens counted."""
    accepted = 0
    closed = asyncio.Event()
    relayed = asyncio.Event()  # the relay sent the body on without the end

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            while True:
                await read_request(reader)
                if split_end:
                    writer.write(HEAD + _chunk(EVENTS))
                    await writer.drain()
                    await relayed.wait()
                    relayed.clear()
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(HEAD + _chunk(EVENTS) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()
            closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = HttpClient(2.0, 2.0)
    runs: list[list[tuple[str, bytes]]] = []
    sent: list[tuple[str, bytes]] = []

    async def start(status: int, headers: Any) -> None:
        sent.append(("start", b"%d" % status))

    async def send(data: bytes) -> None:
        sent.append(("more", data))
        relayed.set()

    async def end(data: bytes) -> None:
        sent.append(("end", data))

    relay = UsageTally(0)
    try:
        for _ in range(2):
            sent.clear()
            relay = UsageTally(0)
            answer = await _forward(http, port, relay, start, send, end, lambda: None)
            assert answer.status == 200
            runs.append(list(sent))
    finally:
        http.close()
        await asyncio.wait_for(closed.wait(), 5.0)  # the server saw the pooled connection close
        server.close()
        await server.wait_closed()
    assert runs[0] == runs[1]
    return runs[0], accepted, relay.completion_tokens


def test_a_complete_answer_ends_the_response_with_its_last_bytes() -> None:
    sent, accepted, tokens = asyncio.run(_relay(split_end=False))
    assert sent == [("start", b"200"), ("end", EVENTS)]
    assert accepted == 1  # the connection was reused for the second answer
    assert tokens == 2


def test_an_end_that_comes_later_follows_the_bytes_on_its_own() -> None:
    sent, accepted, tokens = asyncio.run(_relay(split_end=True))
    assert sent == [("start", b"200"), ("more", EVENTS)]  # the caller ends the response
    assert accepted == 1
    assert tokens == 2


THINKING = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"Hm"}}]}\n\n'
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


@pytest.mark.parametrize("first", [THINKING, ROLE])
def test_the_response_starts_with_the_first_generated_token_even_if_it_is_not_text(
    first: bytes,
) -> None:
    """The client's response starts with the engine's first generated token, reasoning
    included; an event before it (a role-only delta) is held until then.  The upstream
    writes ``first`` and waits (3 s at most) for the client's response to start before it
    writes the answer's text: a reasoning model's thinking reaches the client as it comes,
    a role-only chunk does not start the response."""
    log: list[str] = []
    started = asyncio.Event()

    async def go() -> list[str]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(HEAD + _chunk(first))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(started.wait(), 3.0)
            log.append("upstream: the text")
            rest = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n' + DONE
            writer.write(_chunk(rest) + b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = HttpClient(10.0, 10.0)

        async def start(status: int, headers: Any) -> None:
            log.append("client: start")
            started.set()

        async def send(data: bytes) -> None:
            log.append("client: bytes")

        firsts: list[str] = []
        try:
            await _forward(
                http, port, UsageTally(0), start, send, send, lambda: firsts.append("first token")
            )
        finally:
            http.close()
            server.close()
            await server.wait_closed()
        assert firsts == ["first token"]
        return log

    log = asyncio.run(go())
    if first is THINKING:
        assert log[:2] == ["client: start", "client: bytes"], log  # before the text
        assert log.index("upstream: the text") > 1, log
    else:
        assert log[0] == "upstream: the text" and log[1] == "client: start", log
