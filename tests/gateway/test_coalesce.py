"""A response's head and the start of its body leave in one write; a head is never held
across an await (a stream whose first event is late still gets its headers at once); bytes
keep their order; close writes a held head, abort drops it.

A real uvicorn server on loopback runs :class:`HeadHoldingHttpToolsProtocol`; the test's
subclass of it counts the writes that reach the socket's real transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import uvicorn

from velvetrope.serving.coalesce import HeadHoldingHttpToolsProtocol, HeadHoldingTransport


def _sync(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """The test ``fn`` run in an event loop of its own."""

    @functools.wraps(fn)
    def test(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    return test


class _Counting:
    """The socket's transport, counting the calls that write to it."""

    def __init__(self, transport: asyncio.Transport, log: list[bytes]) -> None:
        self._t = transport
        self.log = log

    def write(self, data: bytes) -> None:
        self.log.append(bytes(data))
        self._t.write(data)

    def writelines(self, lines: Any) -> None:
        lines = [bytes(x) for x in lines]
        self.log.append(b"".join(lines))
        self._t.writelines(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


WRITES: list[bytes] = []


class _CountedProtocol(HeadHoldingHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Counting(transport, WRITES))  # type: ignore[arg-type]


RELEASE: asyncio.Event | None = None


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await receive()
    if scope["path"] == "/late":  # a stream whose first event waits on something else
        await send({"type": "http.response.start", "status": 200, "headers": []})
        assert RELEASE is not None
        await RELEASE.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = b'{"ok":true}'
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"x-extra", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[str]:
    """The app on loopback; the socket listens before the server runs (connections wait in
    its backlog), so nothing has to wait for the server to start."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=_CountedProtocol, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.mark.integration
@_sync
async def test_head_and_body_leave_in_one_write_on_a_kept_alive_connection() -> None:
    WRITES.clear()
    async with _server() as url, httpx.AsyncClient(base_url=url) as client:
        for _ in range(3):
            r = await client.post("/plain", content=b"{}")
            assert r.status_code == 200
            assert r.json() == {"ok": True}
            assert r.headers["x-extra"] == "1"
    assert len(WRITES) == 3
    for w in WRITES:
        assert w.startswith(b"HTTP/1.1 200 OK\r\n")
        assert w.endswith(b'\r\n\r\n{"ok":true}')


@pytest.mark.integration
@_sync
async def test_a_late_stream_gets_its_head_at_once_then_its_events() -> None:
    global RELEASE
    RELEASE = asyncio.Event()
    WRITES.clear()
    async with _server() as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /late HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head
        RELEASE.set()
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        assert b"data: 1\n\n" in rest
        writer.close()
        await writer.wait_closed()
    assert WRITES[0] == head  # the head went alone, before the app sent anything more
    assert b"".join(WRITES[1:]) == rest


class _Recorder:
    """A transport's writing side, recording what reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, lines: Any) -> None:
        self.calls.append(("writelines", b"".join(bytes(x) for x in lines)))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", b""))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", b""))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def _wrap() -> tuple[HeadHoldingTransport, _Recorder]:
    rec = _Recorder()
    return HeadHoldingTransport(rec, asyncio.get_running_loop()), rec  # type: ignore[arg-type]


@_sync
async def test_a_head_alone_is_written_at_the_end_of_the_loop_turn() -> None:
    t, rec = _wrap()
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert rec.calls == []
    await asyncio.sleep(0)
    assert rec.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n")]
    t.write(b"body")
    assert rec.calls[-1] == ("write", b"body")


@_sync
async def test_order_is_kept_and_close_writes_a_held_head_while_abort_drops_it() -> None:
    t, rec = _wrap()
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.writelines([b"a", b"b"])
    assert rec.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n"), ("writelines", b"ab")]
    t.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    t.close()
    assert rec.calls[-2:] == [("write", b"HTTP/1.1 204 No Content\r\n\r\n"), ("close", b"")]
    await asyncio.sleep(0)  # the cancelled flush writes nothing more
    assert len(rec.calls) == 4

    t2, rec2 = _wrap()
    t2.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t2.abort()
    await asyncio.sleep(0)
    assert rec2.calls == [("abort", b"")]
    assert t2.get_extra_info("peername") == ("127.0.0.1", 1)  # forwarded


@_sync
async def test_a_head_held_when_the_connection_closes_under_it_is_dropped() -> None:
    t, rec = _wrap()
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    rec.closing = True  # the peer went away within the loop turn
    await asyncio.sleep(0)
    assert rec.calls == []


@pytest.mark.parametrize("data", [b"data: x\n\n", bytearray(b"HTTP/1.1 200"), b""])
@_sync
async def test_anything_but_a_head_passes_through_at_once(data: bytes) -> None:
    t, rec = _wrap()
    t.write(data)
    assert rec.calls == [("write", bytes(data))]
