"""The small ASGI toolkit both servers share (the gateway and ``velvetrope engine``).

Raw ASGI on uvicorn keeps the request path short; this module holds what both apps need
from it: the type aliases, the lifespan protocol, a bounded body reader, header lookup and a
one-shot response.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from velvetrope.errors import ClientDisconnected, RequestError

__all__ = [
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header",
    "read_body",
    "respond",
    "serve_lifespan",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = (b"content-type", b"application/json")


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or ``None``."""
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


async def serve_lifespan(
    receive: Receive,
    send: Send,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
) -> None:
    """Answer the ASGI lifespan protocol; a failing ``startup`` is reported, not raised."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:  # the server prints it and exits
                await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _too_large(limit: int) -> RequestError:
    return RequestError(
        f"Request body too large: the limit is {limit} bytes.",
        status=413,
        code="request_too_large",
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, at most ``limit`` bytes.

    Raises :class:`RequestError` (400 for a bad ``Content-Length``, 413 past the limit,
    checked against the declared length first) or :class:`ClientDisconnected`.
    """
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError("Invalid Content-Length header.") from None
        if size > limit:
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("the client went away while sending its request")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def respond(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """A complete response: ``body`` with a content length (JSON unless a content type
    is given)."""
    hs = list(headers)
    for k, _ in hs:
        if k == b"content-type":
            break
    else:
        hs.insert(0, _JSON)
    hs.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})
