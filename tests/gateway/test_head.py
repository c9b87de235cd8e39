"""A response head checked in two scans is uvicorn's own head: the same bytes, the same
state of the cycle, the same errors, for every kind of head; and the gateway's protocol
uses it (the gateway's answers carry their headers intact through a real server).

Each case sends one ``http.response.start`` through uvicorn's ``RequestResponseCycle`` and
through :class:`OneScanCycle`, each on a transport of its own that records the bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from velvetrope.serving.head import ENABLED, OneScanCycle, one_scan


class _Transport:
    """Records what is written."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False


class _Flow:
    write_paused = False


DEFAULTS = [(b"server", b"uvicorn"), (b"date", b"Tue, 01 Dec 2026 05:00:00 GMT")]


def _cycle(
    cls: type[RequestResponseCycle], method: str = "POST", keep_alive: bool = True
) -> RequestResponseCycle:
    log = logging.getLogger("test-head")
    return cls(
        scope={"type": "http", "method": method, "path": "/"},  # type: ignore[typeddict-item]
        transport=_Transport(),  # type: ignore[arg-type]
        flow=_Flow(),  # type: ignore[arg-type]
        logger=log,
        access_logger=log,
        access_log=False,
        default_headers=list(DEFAULTS),
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )


def _send(cycle: RequestResponseCycle, message: dict[str, Any]) -> tuple[Any, ...]:
    """What sending ``message`` did: the bytes, the cycle's state, the error if any."""

    async def go() -> str | None:
        try:
            await cycle.send(message)  # type: ignore[arg-type]
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None

    error = asyncio.run(go())
    transport = cycle.transport
    assert isinstance(transport, _Transport)
    return (
        transport.data,
        error,
        cycle.response_started,
        cycle.keep_alive,
        cycle.chunked_encoding,
        cycle.expected_content_length,
    )


RATELIMIT = [
    (b"x-ratelimit-limit-tokens", b"100000"),
    (b"x-ratelimit-remaining-tokens", b"99872"),
    (b"x-ratelimit-reset-tokens", b"76ms"),
    (b"x-ratelimit-limit-requests", b"600"),
    (b"x-ratelimit-remaining-requests", b"599"),
    (b"x-ratelimit-reset-requests", b"100ms"),
]

HEADS: dict[str, tuple[int, list[Any]]] = {
    "gateway answer": (
        200,
        [
            (b"content-type", b"application/json"),
            (b"content-length", b"312"),
            (b"x-velvetrope-queue-ms", b"0.0"),
            (b"x-velvetrope-pool", b"default"),
            *RATELIMIT,
        ],
    ),
    "stream": (200, [(b"content-type", b"text/event-stream"), *RATELIMIT]),
    "no headers": (200, []),
    "chunked": (200, [(b"Transfer-Encoding", b"Chunked")]),
    "length then chunked": (200, [(b"content-length", b"3"), (b"transfer-encoding", b"chunked")]),
    "chunked then length": (200, [(b"transfer-encoding", b"chunked"), (b"content-length", b"3")]),
    "other encoding": (200, [(b"transfer-encoding", b"gzip")]),
    "connection close": (200, [(b"Connection", b"keep-alive, Close ")]),
    "connection keep-alive": (200, [(b"connection", b"keep-alive")]),
    "tab in a value": (200, [(b"x-a", b"one\ttwo")]),
    "empty value": (200, [(b"x-a", b"")]),
    "204": (204, [(b"x-a", b"b")]),
    "304": (304, []),
    "500": (500, [(b"content-length", b"21")]),
    "upper-case name": (200, [(b"X-Mixed-Case", b"v")]),
    "space in a name": (200, [(b"x bad", b"v")]),
    "colon in a name": (200, [(b"x:bad", b"v")]),
    "nul in a name": (200, [(b"x\x00bad", b"v")]),
    "newline in a value": (200, [(b"x-a", b"v\r\nx-injected: 1")]),
    "nul in a value": (200, [(b"x-a", b"v\x00")]),
    "del in a value": (200, [(b"x-a", b"v\x7f")]),
    "bad name after good ones": (200, [*RATELIMIT, (b"x(bad)", b"v")]),
    "bad value before a bad name": (200, [(b"x-a", b"\n"), (b"x bad", b"v")]),
    "str name": (200, [("x-a", b"v")]),
    "str value": (200, [(b"x-a", "v")]),
    "three-tuple": (200, [(b"x-a", b"v", b"w")]),
    "bad content-length": (200, [(b"content-length", b"many")]),
    "unknown status": (999, []),
}


@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("case", sorted(HEADS))
def test_same_as_uvicorn(case: str, method: str, keep_alive: bool) -> None:
    status, headers = HEADS[case]
    message = {"type": "http.response.start", "status": status, "headers": headers}
    theirs = _send(_cycle(RequestResponseCycle, method, keep_alive), message)
    ours = _send(_cycle(OneScanCycle, method, keep_alive), message)
    assert ours == theirs


def test_headers_from_an_iterator() -> None:
    """Headers given as an iterator are read once, also when a check fails."""

    def good() -> Iterator[tuple[bytes, bytes]]:
        yield from HEADS["gateway answer"][1]

    def bad() -> Iterator[tuple[bytes, bytes]]:
        yield from HEADS["bad name after good ones"][1]

    for make in (good, bad):
        ours, theirs = (
            _send(_cycle(cls), {"type": "http.response.start", "status": 200, "headers": make()})
            for cls in (OneScanCycle, RequestResponseCycle)
        )
        assert ours == theirs


def test_everything_else_is_uvicorns() -> None:
    """A body, a second start, and a start while writing is paused go through uvicorn's
    ``send``; a head and its body make the same bytes."""
    messages = [
        {"type": "http.response.start", "status": 200, "headers": RATELIMIT},
        {"type": "http.response.body", "body": b"abc", "more_body": True},
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]
    out = []
    for cls in (RequestResponseCycle, OneScanCycle):
        cycle = _cycle(cls)

        async def run(c: RequestResponseCycle = cycle) -> None:
            for m in messages:
                await c.send(m)  # type: ignore[arg-type]

        asyncio.run(run())
        assert isinstance(cycle.transport, _Transport)
        out.append((cycle.transport.data, cycle.response_complete))
    assert out[0] == out[1]
    assert out[1][0].endswith(b"3\r\nabc\r\n0\r\n\r\n")
    again = _cycle(OneScanCycle)
    _send(again, messages[0])
    second = _send(again, messages[0])
    assert second[1] is not None and "http.response.start" in second[1]


def test_one_scan_swaps_only_a_plain_cycle() -> None:
    cycle = _cycle(RequestResponseCycle)
    one_scan(cycle)
    assert isinstance(cycle, OneScanCycle) is ENABLED
    one_scan(None)  # no cycle (an upgrade): nothing to do

    class Other(RequestResponseCycle):
        pass

    other = _cycle(Other)
    one_scan(other)
    assert type(other) is Other
