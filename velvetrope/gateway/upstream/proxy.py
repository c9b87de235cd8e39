"""Forwarding one admitted request to an upstream, streaming or not.

Non-streaming responses pass through byte for byte; the usage is read from the body (and
raised to what its choices show, :func:`~velvetrope.gateway.upstream.relay.body_tokens`, when the
engine reports fewer).
Streaming responses are forwarded event by event as they arrive (no buffering of the
whole response).  The client's response starts with the first token: events before it (a
role-only delta) are held until then, so a request taken back from its engine before its
first token (:mod:`velvetrope.core.preemption`) can still be answered with an error
status, never with a 200 and an empty body.  The upstream is always asked for
``include_usage``; when the client did not ask for it, the extra usage-only chunk is read
and dropped.  A
:class:`~velvetrope.gateway.upstream.relay.UsageTally` counts the completion tokens seen so
far so that a client disconnect mid-stream settles what was really generated.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from velvetrope.core import Usage
from velvetrope.errors import UpstreamError
from velvetrope.gateway.upstream.httpclient import HttpClient
from velvetrope.gateway.upstream.relay import UsageTally, body_tokens, relay_events
from velvetrope.gateway.upstream.upstream_access import UpstreamAccess
from velvetrope.openai.sse import split_complete, usage_of

__all__ = ["UpstreamAnswer", "forward"]

_GENERATED = re.compile(
    rb'"(?:reasoning_content|reasoning)"\s*:\s*"[^"]'  # a reasoning model's thinking
    rb'|"tool_calls"\s*:\s*\[\s*\{'  # a tool call's first delta
    rb'|"type"\s*:\s*"response\.[a-z_.]+\.delta"'  # any of the Responses API's deltas
)
"""Generated output that is not the answer's text: the first token all the same (the
response starts, and the job is no longer preemptible)."""

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
    :func:`~velvetrope.gateway.upstream.relay.relay_events`; another API's typed events: its own).
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
            headers = [(b"content-type", ctype), *extra_headers]
            if relay is None:
                await start(200, headers)
                async for piece in resp.chunks():
                    if resp.at_end:
                        await end(piece)  # the last bytes and the end: one write
                        break
                    await send(piece)
                return UpstreamAnswer(200, None, None, ctype)
            buf = held = b""
            started = False
            async for piece in resp.chunks():
                done, buf = split_complete(buf + piece)
                if not done:
                    continue
                out = events(done, relay, client_wants_usage, on_first_token)
                last = not buf and resp.at_end
                if not started:  # the response starts with the first token (or the end)
                    if not relay.first_token and _GENERATED.search(done) is not None:
                        relay.first_token = True  # reasoning or a tool call, not text yet
                        on_first_token()
                    if not relay.first_token and not last:
                        held += out
                        continue
                    if not relay.first_token:
                        on_first_token()  # an answer with no token: its end is its start
                    started = True
                    await start(200, headers)
                    out, held = held + out, b""
                if last:
                    await end(out)  # the last bytes and the end of the response: one write
                    return UpstreamAnswer(200, relay.usage_so_far(), None, ctype)
                if out:
                    await send(out)
            if not started:
                on_first_token()
                await start(200, headers)
            if held or buf.strip():
                await send(held + buf)
            return UpstreamAnswer(200, relay.usage_so_far(), None, ctype)
    except (UpstreamError, asyncio.CancelledError):
        raise
    except OSError as e:
        raise UpstreamError(f"upstream {url} failed: {type(e).__name__}: {e}") from e
