"""Validating an OpenAI Responses API request body (``POST /v1/responses``), once for both
servers.

:func:`parse_responses` turns the raw bytes into a :class:`ResponsesRequest` or raises a
400 :class:`~velvetrope.errors.RequestError` naming its ``param``.  Checks, in this order:

* the body is a JSON object (:func:`~velvetrope.openai.request.load_body`), with only
  :data:`RESPONSES_KEYS` in strict mode (``unknown_parameter``);
* ``model`` is a non-empty string;
* ``input`` is a string or an array of objects (items: messages whose ``content`` is a
  string or an array of parts, function calls, function call outputs, ...);
* ``instructions`` and ``previous_response_id`` are strings, ``tools`` an array,
  ``stream`` a boolean;
* ``max_output_tokens`` an integer of at least 1 and, when ``max_tokens_limit`` is given,
  at most that.

:attr:`ResponsesRequest.texts` is the text the model reads: the instructions, every string
of the input items (a message's text or its parts' ``text``, a call's ``arguments``, an
output's ``output``) and the tools' JSON; :func:`count_input_tokens` counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from velvetrope.openai.errors import above_maximum, below_minimum, invalid_type, missing
from velvetrope.openai.request import known_keys, load_body, model_of

__all__ = ["RESPONSES_KEYS", "ResponsesRequest", "count_input_tokens", "parse_responses"]

RESPONSES_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "max_tool_calls",
        "previous_response_id",
        "conversation",
        "stream",
        "stream_options",
        "store",
        "background",
        "include",
        "metadata",
        "reasoning",
        "text",
        "temperature",
        "top_p",
        "top_logprobs",
        "truncation",
        "user",
        "service_tier",
        "prompt",
        "prompt_cache_key",
        "safety_identifier",
        # vLLM's extras
        "request_id",
        "priority",
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
    }
)
"""Top-level keys a Responses request may carry (OpenAI's and vLLM's)."""

_TEXT_FIELDS = ("content", "text", "arguments", "output")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A body that passed :func:`parse_responses` (``body`` is the decoded object itself)."""

    body: dict[str, Any]
    model: str
    stream: bool
    max_output_tokens: int | None
    previous_response_id: str | None
    texts: tuple[str, ...]


def _strings(value: object, out: list[str]) -> None:
    """Every string an input item holds in its text fields (one level of parts down)."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict):
                for f in _TEXT_FIELDS:
                    v = part.get(f)
                    if isinstance(v, str):
                        out.append(v)


def _input_texts(value: object) -> list[str]:
    if value is None:
        raise missing("input")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise invalid_type("input", "a string or an array of input items", value)
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid_type(f"input[{i}]", "an object", item)
        for f in _TEXT_FIELDS:
            _strings(item.get(f), out)
    return out


def parse_responses(
    raw: bytes, *, known_keys_only: bool = False, max_tokens_limit: int | None = None
) -> ResponsesRequest:
    """Validate ``raw`` as a Responses request (see the module docstring for every check)."""
    body = load_body(raw)
    if known_keys_only:
        known_keys(body, RESPONSES_KEYS)
    model = model_of(body)
    texts = _input_texts(body.get("input"))
    for key, kind, name in (
        ("instructions", str, "a string"),
        ("previous_response_id", str, "a string"),
        ("tools", list, "an array"),
        ("stream", bool, "a boolean"),
    ):
        v = body.get(key)
        if v is not None and not isinstance(v, kind):
            raise invalid_type(key, name, v)
    instructions = body.get("instructions")
    if instructions:
        texts.insert(0, instructions)
    tools = body.get("tools")
    if tools:
        texts.append(orjson.dumps(tools).decode())
    mot = body.get("max_output_tokens")
    if mot is not None:
        if type(mot) is not int:
            raise invalid_type("max_output_tokens", "an integer", mot)
        if mot < 1:
            raise below_minimum("max_output_tokens", mot, 1)
        if max_tokens_limit is not None and mot > max_tokens_limit:
            raise above_maximum("max_output_tokens", mot, max_tokens_limit)
    return ResponsesRequest(
        body,
        model,
        bool(body.get("stream")),
        mot,
        body.get("previous_response_id"),
        tuple(texts),
    )


def count_input_tokens(req: ResponsesRequest, count_text: Callable[[str], int]) -> int:
    """The input tokens of ``req`` (at least 1): its :attr:`~ResponsesRequest.texts`
    counted by ``count_text``."""
    return max(1, sum(count_text(t) for t in req.texts))
