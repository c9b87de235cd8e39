"""One write for a response's head and the start of its body.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, and the body with the next message: two ``send()`` system calls,
two TCP segments, and on the client's side two wake-ups for one response, although the app
almost always sends the body (or, streaming, its first events) in the same turn of the event
loop.  :class:`HeadHoldingTransport` sits between uvicorn's protocol and the socket's
transport and holds a response head until the next write on the connection, which then
carries both (one ``writev``), or until the end of the current turn of the event loop
(``call_soon``), whichever comes first.  A head is never held across an ``await`` that
waits on anything else: a stream whose first event is not there yet still gets its
headers at once.

:class:`HeadHoldingHttpToolsProtocol` is uvicorn's httptools protocol on such a transport;
pass it as ``uvicorn.Config(http=...)``.  It also answers bytes that its HTTP parser refuses
(a bad request line, a bad header, a bad chunk: no request exists yet, the app never sees
them) with a 400 in OpenAI's error shape (``invalid_http_request``) instead of uvicorn's
plain text, and closes the connection as uvicorn does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from velvetrope.openai.errors import error_body, retry_headers
from velvetrope.serving.head import one_scan

__all__ = ["HeadHoldingHttpToolsProtocol", "HeadHoldingTransport"]

_HEAD = b"HTTP/1."
"""How uvicorn's writes of a response head (and of ``100 Continue``) begin."""


class HeadHoldingTransport:
    """A transport that holds a response head until the next write or the end of the loop
    turn (see the module).

    Contract: bytes reach the wrapped transport in the order they were written; a held
    head is written before anything else and before :meth:`close` (and dropped by
    :meth:`abort`, like everything the transport still buffers).  Everything else is the
    wrapped transport's (attributes are forwarded).
    """

    __slots__ = ("_flush_handle", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._take()
        if held is not None:
            self._transport.writelines((held, data))  # one writev on uvloop, no copy
        elif isinstance(data, bytes) and data.startswith(_HEAD):
            self._held = data
            self._flush_handle = self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        self.flush()
        self._transport.writelines(lines)

    def flush(self) -> None:
        """Write a held head now (nothing when none is held or the connection is closing)."""
        held = self._take()
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._take()
        self._transport.abort()

    def _take(self) -> bytes | None:
        """The held head, if any, no longer held (its scheduled flush cancelled)."""
        held = self._held
        if held is not None:
            self._held = None
            assert self._flush_handle is not None  # scheduled with every held head
            self._flush_handle.cancel()
            self._flush_handle = None
        return held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadHoldingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a :class:`HeadHoldingTransport`, its
    response heads checked in two scans (:mod:`velvetrope.serving.head`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = HeadHoldingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        one_scan(self.cycle)

    def send_400_response(self, msg: str) -> None:
        """Answer bytes the parser refused: 400 ``invalid_http_request`` in OpenAI's error
        shape (``msg`` is uvicorn's sentence), then close the connection."""
        body = error_body(400, f"{msg} The bytes sent are not HTTP/1.1.", "invalid_http_request")
        lines = [b"HTTP/1.1 400 Bad Request\r\n"]
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *retry_headers(400),
            (b"connection", b"close"),
        ]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in headers]
        self.transport.write(b"".join([*lines, b"\r\n", body]))
        self.transport.close()
