"""Anthropic's Messages API through the gateway (``POST /v1/messages``,
``/v1/messages/count_tokens``).

A Messages request is admitted like a chat: its input (``system``, ``messages``, ``tools``:
:func:`~velvetrope.openai.anthropic.parse_messages`) is the prompt and its ``max_tokens``,
which Anthropic's API requires, the output reserved (so there is no cap to add).  A stream's
events (``message_start``, ``content_block_delta``, ``message_delta``, ``message_stop``)
pass through unchanged; :class:`MessagesRelay` reads them on the way: each text delta is at
least one generated token (the first one the first-token signal), ``message_start``'s usage
gives the input tokens and ``message_delta``'s the output (its input too when the engine
says so there), which is what the tenant is settled.  A whole answer is settled from its
body's ``usage`` (:func:`messages_usage`).  Errors on these paths, the gateway's own
included, are in Anthropic's shape (:mod:`velvetrope.openai.anthropic`), an overloaded 503
answered as 529.  ``count_tokens`` is authenticated and forwarded to an engine of the
model's pool, not queued (it generates nothing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import orjson

from velvetrope.core import Usage
from velvetrope.gateway.api.parse import Kind, ParsedRequest
from velvetrope.gateway.api.typed_events import TypedEvents
from velvetrope.gateway.upstream.relay import UsageTally
from velvetrope.openai.anthropic import count_input_tokens, parse_messages

__all__ = ["MessagesRelay", "messages_usage", "parse_messages_request"]


def parse_messages_request(
    raw: bytes,
    count_text: Callable[[str], int],
    *,
    max_tokens_limit: int,
    known_keys_only: bool = False,
    count_only: bool = False,
) -> ParsedRequest:
    """Validate ``raw`` as a Messages request (``count_only``: a ``count_tokens`` one) and
    count its input.  The parsed request's ``kind`` is only a label."""
    req = parse_messages(
        raw,
        known_keys_only=known_keys_only,
        max_tokens_limit=max_tokens_limit,
        count_only=count_only,
    )
    return ParsedRequest(
        kind=cast(Kind, "messages"),
        model=req.model,
        stream=req.stream,
        client_wants_usage=True,
        max_tokens=req.max_tokens,
        prompt_tokens=count_input_tokens(req, count_text),
        raw=raw,
        body=req.body,
        rewritten=False,
    )


def _counts(u: object) -> tuple[int | None, int | None, int]:
    """A Messages ``usage`` object's prompt tokens, output tokens and cached prompt tokens.

    Anthropic's ``input_tokens`` leaves out the tokens read from the cache
    (``cache_read_input_tokens``) and those written to it (``cache_creation_input_tokens``):
    the prompt is their sum, of which the cache reads are cached (a cache write is charged
    as uncached input).  Absent or not integers: ``None`` (input, output), 0 (cache)."""
    if not isinstance(u, dict):
        return None, None, 0
    i, o = u.get("input_tokens"), u.get("output_tokens")
    read = _count(u.get("cache_read_input_tokens"))
    made = _count(u.get("cache_creation_input_tokens"))
    prompt = i + read + made if type(i) is int and i >= 0 else None
    return prompt, (o if type(o) is int else None), read


def _count(n: object) -> int:
    return n if type(n) is int and n > 0 else 0


def messages_usage(body: bytes | None) -> Usage | None:
    """A whole answer's ``usage`` (``input_tokens`` with the cache's, ``output_tokens``,
    ``cache_read_input_tokens`` as the cached prompt tokens: :func:`_counts`), if it has
    both counts."""
    try:
        obj = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None
    i, o, c = _counts(obj.get("usage") if isinstance(obj, dict) else None)
    return Usage(i, o, c) if i is not None and o is not None else None


class MessagesRelay(TypedEvents):
    """Reads a Messages stream's events on their way to the client (see
    :class:`~velvetrope.gateway.api.typed_events.TypedEvents`): ``message_start``'s input
    tokens, then ``message_delta``'s usage."""

    __slots__ = ("cached_tokens", "input_tokens")

    delta = re.compile(rb'"type"\s*:\s*"content_block_delta"')
    state = re.compile(rb'"type"\s*:\s*"message_(start|delta)"')

    def __init__(self) -> None:
        self.input_tokens: int | None = None
        self.cached_tokens = 0

    def on_event(self, kind: bytes, obj: dict[str, Any], tally: UsageTally) -> None:
        if kind == b"start":
            msg = obj.get("message")
            i, _, c = _counts(msg.get("usage") if isinstance(msg, dict) else None)
            self.input_tokens, self.cached_tokens = i, c
            return
        i, o, c = _counts(obj.get("usage"))
        if i is None:  # message_delta's usage may carry only the output: message_start's
            i, c = self.input_tokens, self.cached_tokens
        if i is not None and o is not None:
            tally.usage = Usage(i, o, min(c, i))
