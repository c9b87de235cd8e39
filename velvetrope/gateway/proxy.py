"""Forwarding one admitted request to an upstream, streaming or not.

Non-streaming responses pass through byte for byte; the usage is read from the body.
Streaming responses are forwarded event by event as they arrive (no buffering of the
whole response).  The upstream is always asked for ``include_usage``; when the client did
not ask for it, the extra usage-only chunk is read and dropped.  :class:`Relay` counts the
completion tokens seen so far so that a client disconnect mid-stream settles what was
really generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from velvetrope.core import Usage
from velvetrope.errors import UpstreamError
from velvetrope.gateway.httpclient import HttpClient
from velvetrope.openai.sse import (
    content_keys,
    usage_at,
    usage_of,
)

__all__ = ["Relay", "UpstreamAnswer", "forward", "relay_events"]

Send = Callable[[bytes], Awaitable[None]]
Start = Callable[[int, list[tuple[bytes, bytes]]], Awaitable[None]]


@dataclass(slots=True)
class UpstreamAnswer:
    """What came back: the status and, for non-streaming answers, the body."""

    status: int
    usage: Usage | None
    body: bytes | None = None
    content_type: bytes = b"application/json"


@dataclass(slots=True)
class Relay:
    """Progress of one proxied request."""

    prompt_tokens: int
    completion_tokens: int = 0
    first_token: bool = False
    usage: Usage | None = None

    def usage_so_far(self) -> Usage:
        """The real usage if the upstream sent it, else what was seen streaming."""
        if self.usage is not None:
            return self.usage
        return Usage(self.prompt_tokens, self.completion_tokens)


async def forward(
    client: HttpClient,
    url: str,
    body: bytes,
    *,
    stream: bool,
    client_wants_usage: bool,
    relay: Relay | None,
    start: Start,
    send: Send,
    end: Send,
    on_first_token: Callable[[], None],
    extra_headers: list[tuple[bytes, bytes]],
) -> UpstreamAnswer:
    """POST ``body`` to ``url``; stream the answer to the client through ``start``/``send``;
    when the upstream's answer is complete as its last bytes are relayed, they go through
    ``end``, which also ends the client's response (one write, not two).

    For a non-streaming request nothing is sent to the client: the caller sends
    ``UpstreamAnswer.body``.  Without a ``relay`` this is a plain proxy: the answer is
    neither read for its usage nor split into events, its bytes go on as they arrive.

    Raises what :class:`HttpClient` raises: ``UpstreamTimeout`` when the upstream stalls,
    ``UpstreamUnreachable`` when nothing reached it (another upstream may be tried),
    ``UpstreamError`` when it broke off.
    """
    try:
        resp = await client.post(url, body)
        async with resp:
            ctype = resp.header(b"content-type", b"application/json") or b"application/json"
            if not stream or resp.status != 200:
                data = await resp.read()
                if relay is None or resp.status != 200:
                    return UpstreamAnswer(resp.status, None, data, ctype)
                try:
                    usage = usage_of(orjson.loads(data))
                except orjson.JSONDecodeError:
                    usage = None
                if usage is not None:
                    relay.usage = usage
                    relay.completion_tokens = usage.completion_tokens
                return UpstreamAnswer(resp.status, usage, data, ctype)
            await start(200, [(b"content-type", ctype), *extra_headers])
            if relay is None:
                async for piece in resp.chunks():
                    if resp.at_end:
                        await end(piece)  # the last bytes and the end: one write
                        break
                    await send(piece)
                return UpstreamAnswer(200, None, None, ctype)
            buf = b""
            async for piece in resp.chunks():
                buf += piece
                cut = buf.rfind(b"\n\n")
                if cut < 0:
                    continue
                out = relay_events(buf[: cut + 2], relay, client_wants_usage, on_first_token)
                buf = buf[cut + 2 :]
                if not buf and resp.at_end:
                    await end(out)  # the last bytes and the end of the response: one write
                    return UpstreamAnswer(200, relay.usage, None, ctype)
                if out:
                    await send(out)
            if buf.strip():
                await send(buf)
            return UpstreamAnswer(200, relay.usage, None, ctype)
    except (UpstreamError, asyncio.CancelledError):
        raise
    except OSError as e:
        raise UpstreamError(f"upstream {url} failed: {type(e).__name__}: {e}") from e


def relay_events(
    data: bytes, relay: Relay, client_wants_usage: bool, on_first_token: Callable[[], None]
) -> bytes:
    """Account complete events (``data`` ends with a blank line); what reaches the client.

    Only the event with the last ``usage`` object is parsed (a later usage supersedes an
    earlier one).  Once the engine's usage is known, nothing more is counted: its count
    supersedes any taken from the text, and its completion tokens, if any, are the
    first-token signal.  Elsewhere the generated text is counted from the bytes
    (:func:`~velvetrope.openai.sse.content_keys`), which counts what parsing every chunk
    would, for a small fraction of its cost."""
    at = usage_at(data)
    if at >= 0:
        start = data.rfind(b"\n\n", 0, at) + 2  # 1 when none: the event starts the data
        if start == 1:
            start = 0
        end = data.find(b"\n\n", at) + 2
        if data.startswith(b"data:", start):
            try:
                obj = orjson.loads(data[start + 5 : end])  # JSON may have spaces around
            except orjson.JSONDecodeError:
                obj = None
            usage = usage_of(obj)  # None unless obj is an object with token counts
            if usage is not None:
                relay.usage = usage
                relay.completion_tokens = 0  # the engine's count replaces the one from the text
                _credit(usage.completion_tokens, relay, on_first_token)
                if client_wants_usage or obj.get("choices"):
                    return data
                return data[:start] + data[end:]  # the client did not ask for it
    _credit(content_keys(data), relay, on_first_token)
    return data


def _credit(n: int, relay: Relay, on_first_token: Callable[[], None]) -> None:
    """``n`` more generated tokens (the first of them: the first-token signal)."""
    if n:
        relay.completion_tokens += n
        if not relay.first_token:
            relay.first_token = True
            on_first_token()
