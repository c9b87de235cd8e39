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
    response heads checked in two scans (:mod:`velvetrope.serving.head`).

    With :attr:`request_timeout_s` set (:meth:`with_request_timeout`), a request must
    arrive whole, head and body, within that many seconds of its first byte (and a new
    connection must send one within as long): else it is answered 408 ``request_timeout``
    in OpenAI's error shape and the connection is closed; an application still reading the
    body hears a disconnect.  One timer per request, armed when it begins."""

    request_timeout_s: float | None = None
    _late: asyncio.TimerHandle | None = None
    _head_done = False

    @classmethod
    def with_request_timeout(cls, timeout_s: float) -> type[HeadHoldingHttpToolsProtocol]:
        """This protocol with :attr:`request_timeout_s` set to ``timeout_s``."""
        return type(cls.__name__, (cls,), {"request_timeout_s": timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = HeadHoldingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done = False
        self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._head_done = True
        one_scan(self.cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def _arm(self) -> None:
        timeout_s = self.request_timeout_s
        if timeout_s is not None:
            self._disarm()
            self._late = self.loop.call_later(timeout_s, self._request_late)

    def _disarm(self) -> None:
        late = self._late
        if late is not None:
            late.cancel()
            self._late = None

    def _request_late(self) -> None:
        """The request did not arrive in time: 408 unless a response began, then close."""
        self._late = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self._head_done else None
        if cycle is not None:
            if cycle.response_started:  # answered early (e.g. a 401): nothing more to say
                self.transport.close()
                return
            cycle.disconnected = True  # the application hears a disconnect, sends nothing
            cycle.message_event.set()
        timeout_s = self.request_timeout_s
        msg = f"The request did not arrive within {timeout_s:g} seconds."
        self._send_error(b"408 Request Timeout", 408, msg, "request_timeout")

    def send_400_response(self, msg: str) -> None:
        """Answer bytes the parser refused: 400 ``invalid_http_request`` in OpenAI's error
        shape (``msg`` is uvicorn's sentence), then close the connection."""
        self._disarm()
        msg = f"{msg} The bytes sent are not HTTP/1.1."
        self._send_error(b"400 Bad Request", 400, msg, "invalid_http_request")

    def _send_error(self, status_line: bytes, status: int, msg: str, code: str) -> None:
        """Write an error response in OpenAI's shape outside any request cycle, then close."""
        body = error_body(status, msg, code)
        lines = [b"HTTP/1.1 " + status_line + b"\r\n"]
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *retry_headers(status, code),
            (b"connection", b"close"),
        ]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in headers]
        self.transport.write(b"".join([*lines, b"\r\n", body]))
        self.transport.close()
