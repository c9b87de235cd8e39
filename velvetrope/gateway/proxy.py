"""Forwarding one admitted request to an upstream, streaming or not.

Non-streaming responses pass through byte for byte; the usage is read from the body (and
raised to what its choices show, :func:`~velvetrope.gateway.relay.body_tokens`, when the
engine reports fewer).
Streaming responses are forwarded event by event as they arrive (no buffering of the
whole response).  The upstream is always asked for ``include_usage``; when the client did
not ask for it, the extra usage-only chunk is read and dropped.  A
:class:`~velvetrope.gateway.relay.UsageTally` counts the completion tokens seen so far so that a
client disconnect mid-stream settles what was really generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from velvetrope.core import Usage
from velvetrope.errors import UpstreamError
from velvetrope.gateway.httpclient import HttpClient
from velvetrope.gateway.relay import UsageTally, body_tokens, relay_events
from velvetrope.gateway.upstream_access import UpstreamAccess
from velvetrope.openai.sse import split_complete, usage_of

__all__ = ["UpstreamAnswer", "forward"]

Send = Callable[[bytes], Awaitable[None]]
Start = Callable[[int, list[tuple[bytes, bytes]]], Awaitable[None]]
Events = Callable[[bytes, UsageTally, bool, Callable[[], None]], bytes]
"""Reads complete SSE events into the tally, returns what reaches the client."""


@dataclass(slots=True)
class UpstreamAnswer:
    """What came back: the status and, for non-streaming answers, the body."""

    status: int
    usage: Usage | None
    body: bytes | None = None
    content_type: bytes = b"application/json"


async def forward(
    client: HttpClient,
    url: str,
    body: bytes,
    access: UpstreamAccess,
    *,
    stream: bool,
    client_wants_usage: bool,
    relay: UsageTally | None,
    start: Start,
    send: Send,
    end: Send,
    on_first_token: Callable[[], None],
    extra_headers: list[tuple[bytes, bytes]],
    events: Events = relay_events,
) -> UpstreamAnswer:
    """POST ``body`` to ``url`` (over ``access``'s TLS, with its API key); stream the
    answer to the client through ``start``/``send``; when the upstream's answer is complete
    as its last bytes are relayed, they go through ``end``, which also ends the client's
    response (one write, not two).

    For a non-streaming request nothing is sent to the client: the caller sends
    ``UpstreamAnswer.body``.  Without a ``relay`` this is a plain proxy: the answer is
    neither read for its usage nor split into events, its bytes go on as they arrive.

    Raises what :class:`HttpClient` raises: ``UpstreamTimeout`` when the upstream stalls,
    ``UpstreamUnreachable`` when nothing reached it (another upstream may be tried),
    ``UpstreamError`` when it broke off.

    ``events`` reads a stream's complete events (OpenAI's chunks:
    :func:`~velvetrope.gateway.relay.relay_events`; another API's typed events: its own).
    """
    try:
        resp = await client.post(url, body, tls=access.tls, auth=access.auth_line)
        async with resp:
            ctype = resp.header(b"content-type", b"application/json") or b"application/json"
            if not stream or resp.status != 200:
                data = await resp.read()
                if relay is None or resp.status != 200:
                    return UpstreamAnswer(resp.status, None, data, ctype)
                obj: object = None
                try:
                    obj = orjson.loads(data)
                    usage = usage_of(obj)
                except orjson.JSONDecodeError:
                    usage = None
                if usage is not None:
                    relay.usage = usage
                relay.completion_tokens = body_tokens(obj, relay.choice_limit)
                return UpstreamAnswer(resp.status, relay.usage_so_far(), data, ctype)
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
                done, buf = split_complete(buf + piece)
                if not done:
                    continue
                out = events(done, relay, client_wants_usage, on_first_token)
                if not buf and resp.at_end:
                    await end(out)  # the last bytes and the end of the response: one write
                    return UpstreamAnswer(200, relay.usage_so_far(), None, ctype)
                if out:
                    await send(out)
            if buf.strip():
                await send(buf)
            return UpstreamAnswer(200, relay.usage_so_far(), None, ctype)
    except (UpstreamError, asyncio.CancelledError):
        raise
    except OSError as e:
        raise UpstreamError(f"upstream {url} failed: {type(e).__name__}: {e}") from e
