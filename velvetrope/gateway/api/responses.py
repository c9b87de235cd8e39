"""The Responses API through the gateway (``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``).

A Responses request is admitted like a chat: its input (``input``, ``instructions``,
``tools``: :func:`~velvetrope.openai.responses.parse_responses`) is the prompt, its
``max_output_tokens`` (else ``gateway.default_max_tokens``, then sent as
``max_output_tokens``) the output reserved.  The answer is relayed unchanged: a stream's
typed events (``response.created``, ``response.output_text.delta``, ...) pass through as
they come, and :class:`ResponsesRelay` reads them on the way: each text delta is at least
one generated token (the first one the first-token signal), and the ``usage`` of the final
``response.completed`` (or ``response.incomplete`` / ``response.failed``) event,
``input_tokens`` and ``output_tokens``, is what the tenant is settled.  A whole answer is
settled from its body's ``usage`` (:func:`responses_usage`).

Engines keep a response's state in their own memory, so a request that names
``previous_response_id``, and a ``GET`` or ``DELETE`` of a response, must reach the engine
that created it.  :class:`~velvetrope.gateway.upstream.response_homes.ResponseHomes` remembers, per
response id, that engine and the tenant it was created for (bounded; shared over Redis when
state is Redis).  Another tenant's id is unknown to a tenant.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import orjson

from velvetrope.core import Usage
from velvetrope.gateway.api.parse import Kind, ParsedRequest
from velvetrope.gateway.api.typed_events import TypedEvents
from velvetrope.gateway.upstream.relay import UsageTally
from velvetrope.gateway.upstream.response_homes import ResponseHomes
from velvetrope.gateway.upstream.upstreams import UpstreamPools
from velvetrope.openai.errors import error_body
from velvetrope.openai.responses import count_input_tokens, parse_responses
from velvetrope.openai.sse import cached_of

__all__ = [
    "ResponsesRelay",
    "parse_responses_request",
    "pinned_exclude",
    "responses_usage",
    "stored_response",
]


def parse_responses_request(
    raw: bytes,
    count_text: Callable[[str], int],
    *,
    max_tokens_limit: int,
    known_keys_only: bool = False,
) -> ParsedRequest:
    """Validate ``raw`` as a Responses request (a 400 naming its ``param`` if not) and count
    its input.  A client's ``priority`` is removed (priority comes from the tenant's
    config).  The parsed request's ``kind`` is only a label: nothing past parsing reads it."""
    req = parse_responses(raw, known_keys_only=known_keys_only, max_tokens_limit=max_tokens_limit)
    body = req.body
    rewritten = "priority" in body
    if rewritten:
        del body["priority"]
    return ParsedRequest(
        kind=cast(Kind, "responses"),
        model=req.model,
        stream=req.stream,
        client_wants_usage=True,
        max_tokens=req.max_output_tokens,
        prompt_tokens=count_input_tokens(req, count_text),
        raw=raw,
        body=body,
        rewritten=rewritten,
    )


def _usage_of(response: object) -> Usage | None:
    """A response object's ``usage`` as the gateway settles it, if it has both counts;
    the cached input tokens from ``usage.input_tokens_details.cached_tokens``."""
    try:
        u = response["usage"]  # type: ignore[index]
        i, o = u["input_tokens"], u["output_tokens"]
    except (TypeError, KeyError, IndexError):
        return None
    if type(i) is int and type(o) is int and i >= 0 and o >= 0:
        return Usage(i, o, cached_of(u.get("input_tokens_details"), i))
    return None


def responses_usage(body: bytes | None) -> tuple[Usage | None, str | None]:
    """A whole answer's usage and response ``id`` (each ``None`` when absent)."""
    try:
        obj = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None, None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return _usage_of(obj), rid if isinstance(rid, str) else None


class ResponsesRelay(TypedEvents):
    """Reads a Responses stream's events on their way to the client (see
    :class:`~velvetrope.gateway.api.typed_events.TypedEvents`): the usage of the final event,
    and ``response_id``, the id that ``response.created`` announced."""

    __slots__ = ("response_id",)

    delta = re.compile(rb'"type"\s*:\s*"response\.output_text\.delta"')
    state = re.compile(rb'"type"\s*:\s*"response\.(created|completed|incomplete|failed)"')

    def __init__(self) -> None:
        self.response_id: str | None = None

    def on_event(self, kind: bytes, obj: dict[str, Any], tally: UsageTally) -> None:
        response = obj.get("response")
        if kind == b"created":
            rid = response.get("id") if isinstance(response, dict) else None
            self.response_id = rid if isinstance(rid, str) else None
        else:
            tally.usage = _usage_of(response) or tally.usage


def pinned_exclude(upstreams: UpstreamPools, pool: str, url: str | None) -> tuple[str, ...]:
    """The upstreams of ``pool`` to pass over so that the pick lands on ``url``: every
    other one, when ``url`` is a live upstream of the pool; else none (then the pool picks
    as usual, and the engine answers for an id it does not know)."""
    if url is None or not any(u.url == url for u in upstreams.live(pool)):
        return ()
    return tuple(u.url for u in upstreams.pools.get(pool, ()) if u.url != url)


async def stored_response(
    session: aiohttp.ClientSession | None,
    homes: ResponseHomes,
    upstreams: UpstreamPools,
    tenant: str,
    method: str,
    response_id: str,
    timeout: aiohttp.ClientTimeout,
) -> tuple[int, bytes]:
    """``GET`` or ``DELETE /v1/responses/{response_id}`` on the engine that created it:
    its status and body, 404 ``not_found`` when the gateway knows no such response of
    ``tenant``, 502 when the engine cannot be reached."""
    url = await homes.find(response_id, tenant)
    up: Any = next((u for ups in upstreams.pools.values() for u in ups if u.url == url), None)
    if up is None or session is None:
        msg = f"No response with id '{response_id}' found."
        return 404, error_body(404, msg, "not_found", "response_id")
    a = up.access
    try:
        async with session.request(
            method,
            f"{up.url}/v1/responses/{response_id}",
            timeout=timeout,
            headers=a.headers,
            ssl=a.aiohttp_ssl,
        ) as r:
            body = await r.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return 502, error_body(502, f"upstream {up.url} failed: {e}", "upstream_error")
    if method == "DELETE" and r.status == 200:
        homes.forget(response_id)
    return r.status, body
