"""The client's side of one completion response: a status line once, then bytes.

:class:`ClientStream` is how the gateway answers once a request was admitted (or is
waiting): it starts the response at most once, relays an upstream's stream chunk by chunk,
and answers an error in OpenAI's shape (Anthropic's on its Messages API) either as a plain
response (nothing sent yet) or, once a stream has begun, as an SSE error event with the same
code, then the end.  An error
answer that retrying cannot help carries ``x-should-retry: false``
(:func:`~velvetrope.openai.errors.retry_headers`), so OpenAI's SDKs do not send it again.

While a streaming request waits in the queue with progress on (per tenant
``queue_progress``, or the request header ``x-velvetrope-progress: 1``),
:meth:`ClientStream.comment` commits the response to 200 with SSE headers and sends SSE
comment lines (``: ...``, which clients ignore) saying where the request stands, so users
see progress and proxies do not time out a silent connection.
"""

from __future__ import annotations

from collections.abc import Sequence

from velvetrope.openai import anthropic
from velvetrope.openai.errors import error_body, retry_headers
from velvetrope.openai.sse import SSE_HEADERS, error_event
from velvetrope.serving.asgi import Send, respond

__all__ = ["PROGRESS_HEADER", "ClientStream"]

PROGRESS_HEADER = b"x-velvetrope-progress"
"""Request header asking for queue-progress comments (value ``1``); also sent back."""


class ClientStream:
    """One response to one client: started at most once."""

    __slots__ = ("anthropic", "comments", "ended", "send", "started")

    def __init__(self, send: Send, anthropic: bool = False) -> None:
        self.send = send
        self.anthropic = anthropic
        """Errors in Anthropic's shape and statuses (the Messages API)."""
        self.started = False
        self.ended = False
        self.comments = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line (ignored if progress comments already started a 200)."""
        if self.started:
            return
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        """End the response, with ``data`` as its last bytes (once; later calls do nothing)."""
        if self.ended:
            return
        self.ended = True
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def comment(self, text: str) -> None:
        """An SSE comment line; the first one commits the response to a 200 stream."""
        if not self.started:
            await self.start(200, [*SSE_HEADERS, (PROGRESS_HEADER, b"1")])
        self.comments += 1
        await self.chunk(b": " + text.encode() + b"\n\n")

    async def error(
        self,
        status: int,
        message: str,
        code: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Answer an error: a response with ``status``, or, once a stream began, an SSE
        error event carrying the same body, then the end of the stream."""
        if self.anthropic:
            status = anthropic.error_status(status)
            if self.started:
                await self.chunk(anthropic.error_event(status, message))
                await self.end()
            else:
                body = anthropic.error_body(status, message)
                await respond(self.send, status, body, [*headers, *retry_headers(status, code)])
            return
        if self.started:
            await self.chunk(error_event(status, message, code))
            await self.end()
        else:
            await respond(
                self.send,
                status,
                error_body(status, message, code),
                [*headers, *retry_headers(status, code)],
            )

    async def passthrough(self, status: int, body: bytes, content_type: bytes) -> None:
        """An upstream's error answer as it came, or as an error event once streaming
        (the upstream's message kept when it is in OpenAI's shape)."""
        if not self.started:
            headers = [(b"content-type", content_type), *retry_headers(status)]
            await respond(self.send, status, body, headers)
            return
        await self.chunk(b"data: " + body.replace(b"\n\n", b"\n") + b"\n\n")
        await self.end()
