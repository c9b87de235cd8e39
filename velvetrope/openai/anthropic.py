"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as
engines serve it beside OpenAI's: validating a request, counting its input, and errors in
Anthropic's shape.

:func:`parse_messages` turns the raw bytes into a :class:`MessagesRequest` or raises a 400
:class:`~velvetrope.errors.RequestError` naming its ``param``.  Checks, in this order: the
body is a JSON object (:func:`~velvetrope.openai.request.load_body`), only
:data:`MESSAGES_KEYS` in strict mode; ``model`` a non-empty string; ``max_tokens`` present
(Anthropic requires it; not for ``count_tokens``), an integer of at least 1 and at most
``max_tokens_limit``; ``messages`` a non-empty array of objects whose ``role`` is ``user``
or ``assistant`` and whose ``content`` is a string or an array of typed blocks; ``system``
a string or an array of blocks; ``tools`` an array; ``stream`` a boolean.

:attr:`MessagesRequest.texts` is what the model reads: the system prompt, each message's
text (a string, or its blocks' ``text``, a ``tool_use``'s ``input`` as JSON, a
``tool_result``'s content), and the tools as JSON.

Errors answer ``{"type": "error", "error": {"type", "message"}}`` (:func:`error_body`),
with Anthropic's statuses: 529 ``overloaded_error`` where OpenAI's shape says 503.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from velvetrope.openai.errors import (
    above_maximum,
    below_minimum,
    error_type_for,
    invalid_type,
    invalid_value,
    missing,
)
from velvetrope.openai.request import known_keys, load_body, message_list, model_of

__all__ = [
    "MESSAGES_KEYS",
    "MessagesRequest",
    "count_input_tokens",
    "error_body",
    "error_event",
    "error_status",
    "error_type",
    "parse_messages",
]

MESSAGES_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "thinking",
        "service_tier",
        "container",
        "mcp_servers",
    }
)
"""Top-level keys a Messages request may carry."""

_OWN_TYPES = {408: "timeout_error", 413: "request_too_large", 529: "overloaded_error"}
"""Where Anthropic's error ``type`` is not OpenAI's for the status
(:func:`~velvetrope.openai.errors.error_type_for`); any other 5xx is ``api_error``."""


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an (Anthropic) ``status``."""
    own = _OWN_TYPES.get(status)
    if own is not None:
        return own
    return error_type_for(status) if status < 500 else "api_error"


def error_status(status: int) -> int:
    """Anthropic's status for the gateway's ``status``: 529 for an overloaded 503."""
    return 529 if status == 503 else status


def error_body(status: int, message: str) -> bytes:
    """The error answer in Anthropic's shape for an (Anthropic) ``status``."""
    kind = error_type(status)
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def error_event(status: int, message: str) -> bytes:
    """The same error as a stream's ``error`` event."""
    return b"event: error\ndata: " + error_body(status, message) + b"\n\n"


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A body that passed :func:`parse_messages` (``body`` is the decoded object itself)."""

    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    texts: tuple[str, ...]


def _block_texts(blocks: list[Any], param: str, out: list[str]) -> None:
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise invalid_type(f"{param}[{j}]", "an object with a string 'type'", b)
        text = b.get("text")
        if isinstance(text, str):
            out.append(text)
        if "input" in b:
            out.append(orjson.dumps(b["input"]).decode())
        inner = b.get("content")
        if isinstance(inner, str):
            out.append(inner)
        elif isinstance(inner, list):
            _block_texts(inner, f"{param}[{j}].content", out)


def _messages(value: object, out: list[str]) -> None:
    for i, m in enumerate(message_list(value)):
        p = f"messages[{i}]"
        if m.get("role") not in ("user", "assistant"):
            raise invalid_value(f"{p}.role", f"'{p}.role' must be 'user' or 'assistant'.")
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            _block_texts(content, f"{p}.content", out)
        else:
            raise invalid_type(f"{p}.content", "a string or an array of blocks", content)


def parse_messages(
    raw: bytes,
    *,
    known_keys_only: bool = False,
    max_tokens_limit: int | None = None,
    count_only: bool = False,
) -> MessagesRequest:
    """Validate ``raw`` as a Messages request (see the module docstring);
    ``count_only``: a ``count_tokens`` request (no ``max_tokens``)."""
    body = load_body(raw)
    if known_keys_only:
        known_keys(body, MESSAGES_KEYS)
    model = model_of(body)
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not count_only:
        raise missing("max_tokens")
    if max_tokens is not None:
        if type(max_tokens) is not int:
            raise invalid_type("max_tokens", "an integer", max_tokens)
        if max_tokens < 1:
            raise below_minimum("max_tokens", max_tokens, 1)
        if max_tokens_limit is not None and max_tokens > max_tokens_limit:
            raise above_maximum("max_tokens", max_tokens, max_tokens_limit)
    texts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        texts.append(system)
    elif isinstance(system, list):
        _block_texts(system, "system", texts)
    elif system is not None:
        raise invalid_type("system", "a string or an array of blocks", system)
    _messages(body.get("messages"), texts)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid_type("tools", "an array", tools)
        texts.append(orjson.dumps(tools).decode())
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid_type("stream", "a boolean", stream)
    return MessagesRequest(body, model, bool(stream), max_tokens, tuple(texts))


def count_input_tokens(req: MessagesRequest, count_text: Callable[[str], int]) -> int:
    """The input tokens of ``req`` (at least 1): its texts counted by ``count_text``."""
    return max(1, sum(count_text(t) for t in req.texts))
