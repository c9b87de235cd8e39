"""Validating an OpenAI completions or chat-completions request body, once for both servers.

:func:`parse` turns the raw bytes into a :class:`CompletionRequest` or raises a 400
:class:`~velvetrope.errors.RequestError` built by :mod:`velvetrope.openai.errors`, so the
gateway and ``velvetrope engine`` answer the same mistake with the same ``code``, ``param``
and message.  Checks, in this order:

* the body is JSON (``invalid_json``), an object (``invalid_type``) and nested no deeper
  than :data:`MAX_JSON_DEPTH` levels (``invalid_value``, ``param`` the top-level field that
  holds the deepest value);
* with ``known_keys_only`` (the gateway's strict mode, ``gateway.unknown_parameters:
  refuse``), every top-level key is one OpenAI or vLLM accepts for the endpoint
  (:data:`CHAT_KEYS`, :data:`COMPLETION_KEYS`; ``unknown_parameter``).  Without it (the
  default of both servers) any other key is left alone: it is the engine's to use or refuse
  (the OpenAI SDK's newer ``create()`` fields, engine extras sent through ``extra_body``);
* ``model`` is present and a non-empty string;
* ``stream`` and ``ignore_eos`` are booleans, ``priority`` an integer (each may be null);
* ``stream_options`` is an object, sent only with ``stream: true``, and its
  ``include_usage`` and (vLLM's) ``continuous_usage_stats`` booleans;
* ``max_tokens`` and (chat) ``max_completion_tokens`` are integers of at least 1 and, when
  ``max_tokens_limit`` is given, at most that; for a chat ``max_completion_tokens`` wins
  over ``max_tokens`` (as in OpenAI's API and vLLM);
* ``n`` is an integer from 1 to :data:`MAX_N`; ``best_of`` an integer of at least 1;
* ``logprobs`` is a boolean (chat) or an integer of at least 0 (completions), and
  (chat) ``top_logprobs`` an integer of at least 0;
* chat: ``messages`` is a non-empty array of objects, each with a known ``role`` and a
  ``content`` that is a string or an array of typed parts (only an assistant message may
  omit it), every part an object with a string ``type``; completions: ``prompt`` is a
  string, an array of token ids, or an array of either (a batch);
* the types of every other field OpenAI or vLLM documents, down to a tool's function's
  ``name`` or a text part's ``text`` (:mod:`velvetrope.openai.fields`).

What each server does beyond that is its own: the engine rejects batched prompts and
models it does not serve, the gateway rewrites the body for its upstream
(:mod:`velvetrope.gateway.api.parse`).  :func:`count_prompt_tokens` counts a request's prompt
the same way for both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from velvetrope.openai.errors import (
    above_maximum,
    below_minimum,
    invalid_json,
    invalid_type,
    invalid_value,
    missing,
    nested_too_deep,
    not_an_object,
    unknown_parameter,
)
from velvetrope.openai.fields import (
    CHAT_CHECKS,
    COMPLETION_CHECKS,
    check_fields,
    check_message,
    check_part,
)
from velvetrope.openai.tokenizer import count_chat_with

__all__ = [
    "CHAT_KEYS",
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "COMPLETION_KEYS",
    "MAX_JSON_DEPTH",
    "MAX_N",
    "ROLES",
    "CompletionRequest",
    "Kind",
    "Prompt",
    "count_prompt_tokens",
    "known_keys",
    "load_body",
    "message_list",
    "model_of",
    "parse",
    "template_fingerprint",
    "validate",
]

Kind = Literal["chat", "completions"]
"""Which endpoint: ``/v1/chat/completions`` or ``/v1/completions``."""

Prompt = str | list[int]
"""One completions prompt: text or token ids."""

MAX_JSON_DEPTH = 128
"""The deepest nesting of a request body either server accepts, the body itself being level
1.  Both servers write parts of a body again as JSON (the gateway a rewritten body, the
engine a chat's messages), and orjson writes no more than 254 levels; the parser itself
stops at 1024."""

MAX_N = 16
"""The largest ``n`` (completions per request) either server accepts."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a completions request that sets none (OpenAI's and vLLM's default)."""

ROLES = frozenset({"system", "user", "assistant", "tool", "function", "developer"})
"""The chat roles OpenAI's API knows."""

_COMMON = {
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "seed",
    "logprobs",
    "metadata",
    "service_tier",
    "store",
    # vLLM's extra sampling parameters
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "best_of",
    "use_beam_search",
    "length_penalty",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "priority",
    "request_id",
}
CHAT_KEYS = frozenset(
    _COMMON
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "functions",
        "function_call",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
    }
)
"""Top-level keys a chat request may carry (OpenAI's and vLLM's)."""
COMPLETION_KEYS = frozenset(_COMMON | {"prompt", "suffix", "echo"})
"""Top-level keys a completions request may carry (OpenAI's and vLLM's)."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A request body that passed :func:`validate`.

    ``body`` is the decoded object itself (not a copy).  ``max_tokens`` is the effective
    cap (``None``: the request set none); ``priority`` is vLLM's field (``None``: unset).
    ``messages`` is the chat's messages (empty for completions), ``prompts`` the
    completions prompts (one unless batched; empty for chat).
    """

    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    priority: int | None
    ignore_eos: bool
    messages: tuple[Mapping[str, Any], ...] = ()
    prompts: tuple[Prompt, ...] = ()


def load_body(raw: bytes) -> dict[str, Any]:
    """``raw`` decoded as a JSON object nested at most :data:`MAX_JSON_DEPTH` levels (400
    ``invalid_json``, ``invalid_type`` or ``invalid_value`` if not)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # past the parser's own limit (1024)
            raise nested_too_deep(None, MAX_JSON_DEPTH) from None
        raise invalid_json(str(exc)) from None
    if not isinstance(body, dict):
        raise not_an_object(body)
    # a body with no more brackets than the limit cannot nest deeper: one pass in C
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        for key, value in body.items():
            if _deeper_than(value, MAX_JSON_DEPTH - 1):
                raise nested_too_deep(key, MAX_JSON_DEPTH)
    return body


def _deeper_than(value: object, levels: int) -> bool:
    """Whether ``value`` nests more than ``levels`` levels (a scalar is none, an empty
    array one).  Iterative: no recursion, whatever the depth."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > levels:
            return True
        for child in v.values() if isinstance(v, dict) else v:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def known_keys(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse (400 ``unknown_parameter``) the first top-level key of ``body`` not in
    ``allowed`` (the gateway's strict mode)."""
    for key in body:
        if key not in allowed:
            raise unknown_parameter(key)


def model_of(body: Mapping[str, Any]) -> str:
    """``body``'s ``model``: present (400 ``missing_required_parameter``), a string
    (``invalid_type``) and not empty (``invalid_value``)."""
    model = body.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    if not model:
        raise invalid_value("model", "'model' must not be empty.")
    return model


def _opt_bool(d: Mapping[str, Any], key: str, param: str | None = None) -> bool:
    v = d.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise invalid_type(param or key, "a boolean", v)
    return v


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid_type(key, "an integer", v)
    return v


def _bounded(d: Mapping[str, Any], key: str, maximum: int | None) -> int | None:
    v = _opt_int(d, key)
    if v is None:
        return None
    if v < 1:
        raise below_minimum(key, v, 1)
    if maximum is not None and v > maximum:
        raise above_maximum(key, v, maximum)
    return v


def _at_least_zero(d: Mapping[str, Any], key: str) -> None:
    v = _opt_int(d, key)
    if v is not None and v < 0:
        raise below_minimum(key, v, 0)


def message_list(value: object) -> list[dict[str, Any]]:
    """``messages``: present, an array, not empty, of objects (400 naming the first
    defect); the checks of each message are the API's own."""
    if value is None:
        raise missing("messages")
    if not isinstance(value, list):
        raise invalid_type("messages", "an array", value)
    if not value:
        raise invalid_value("messages", "'messages' must contain at least one message.")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise invalid_type(f"messages[{i}]", "an object", m)
    return value


def _messages(value: object) -> tuple[Mapping[str, Any], ...]:
    messages = message_list(value)
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        role = m.get("role")
        if role is None:
            raise missing(f"{p}.role")
        if not isinstance(role, str):
            raise invalid_type(f"{p}.role", "a string", role)
        if role not in ROLES:
            raise invalid_value(
                f"{p}.role", f"Invalid value for '{p}.role': {role!r} is not a known role."
            )
        content = m.get("content")
        if content is None and role != "assistant":
            raise missing(f"{p}.content")
        if content is not None and not isinstance(content, str | list):
            raise invalid_type(f"{p}.content", "a string or an array of parts", content)
        if isinstance(content, list):
            for j, part in enumerate(content):
                check_part(part, f"{p}.content[{j}]")
        if len(m) > 2 or content is None:  # more than a role and a content: tool calls...
            check_message(m, p)
    return tuple(messages)


def _is_token_list(v: object) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
    )


def _prompts(value: object) -> tuple[Prompt, ...]:
    if value is None:
        raise missing("prompt")
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and not value:
        raise invalid_value("prompt", "'prompt' must not be empty.")
    if _is_token_list(value):
        assert isinstance(value, list)
        return (value,)
    if isinstance(value, list) and all(isinstance(p, str) or _is_token_list(p) for p in value):
        return tuple(value)
    raise invalid_type(
        "prompt", "a string, an array of non-negative token ids, or an array of either", value
    )


def validate(
    body: dict[str, Any],
    kind: Kind,
    *,
    known_keys_only: bool = False,
    max_tokens_limit: int | None = None,
) -> CompletionRequest:
    """Check ``body`` as a ``kind`` request (see the module docstring for every check).

    ``known_keys_only`` rejects top-level keys outside :data:`CHAT_KEYS` /
    :data:`COMPLETION_KEYS` (else they pass unread); ``max_tokens_limit`` caps
    ``max_tokens``.  Raises a 400
    :class:`~velvetrope.errors.RequestError` naming the offending ``param``.
    """
    if known_keys_only:
        known_keys(body, CHAT_KEYS if kind == "chat" else COMPLETION_KEYS)
    model = model_of(body)
    stream = _opt_bool(body, "stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid_type("stream_options", "an object", options)
        if not stream:
            raise invalid_value(
                "stream_options", "'stream_options' is only allowed when 'stream' is true."
            )
        include_usage = _opt_bool(options, "include_usage", "stream_options.include_usage")
        _opt_bool(options, "continuous_usage_stats", "stream_options.continuous_usage_stats")
    max_tokens = _bounded(body, "max_tokens", max_tokens_limit)
    if kind == "chat":
        mct = _bounded(body, "max_completion_tokens", max_tokens_limit)
        if mct is not None:
            max_tokens = mct
    n = _bounded(body, "n", MAX_N)
    if "best_of" in body or "logprobs" in body or "top_logprobs" in body:  # seldom sent
        _bounded(body, "best_of", None)
        if kind == "chat":
            _opt_bool(body, "logprobs")
            _at_least_zero(body, "top_logprobs")
        else:
            _at_least_zero(body, "logprobs")
    priority = _opt_int(body, "priority")
    ignore_eos = _opt_bool(body, "ignore_eos")
    common: dict[str, Any] = {
        "kind": kind,
        "body": body,
        "model": model,
        "stream": stream,
        "include_usage": include_usage,
        "max_tokens": max_tokens,
        "n": 1 if n is None else n,
        "priority": priority,
        "ignore_eos": ignore_eos,
    }
    if kind == "chat":
        messages = _messages(body.get("messages"))
        check_fields(body, CHAT_CHECKS)
        return CompletionRequest(**common, messages=messages)
    prompts = _prompts(body.get("prompt"))
    check_fields(body, COMPLETION_CHECKS)
    return CompletionRequest(**common, prompts=prompts)


def parse(
    raw: bytes,
    kind: Kind,
    *,
    known_keys_only: bool = False,
    max_tokens_limit: int | None = None,
) -> CompletionRequest:
    """:func:`load_body` then :func:`validate`."""
    return validate(
        load_body(raw), kind, known_keys_only=known_keys_only, max_tokens_limit=max_tokens_limit
    )


def count_prompt_tokens(
    req: CompletionRequest,
    count_text: Callable[[str], int],
    count_chat: Callable[[Sequence[Mapping[str, Any]]], int] | None = None,
) -> int:
    """Prompt tokens of ``req``, at least 1 (the BOS token a real engine adds).

    A chat is counted by ``count_chat`` if given, else by OpenAI's convention over
    ``count_text`` (:func:`~velvetrope.openai.tokenizer.count_chat_with`); completions
    prompts by ``count_text`` (text) or their length (token ids), summed over a batch.
    """
    if req.kind == "chat":
        n = count_chat(req.messages) if count_chat else count_chat_with(count_text, req.messages)
    else:
        n = sum(count_text(p) if isinstance(p, str) else len(p) for p in req.prompts)
    return max(1, n)


TEMPLATE_PREFIX_CHARS = 512
"""How much of a prompt's text identifies its template."""


def _text_of(content: object) -> str:
    """A message's text: the string, or the text of its ``text`` parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def template_fingerprint(req: CompletionRequest, prefix_chars: int = TEMPLATE_PREFIX_CHARS) -> str:
    """A short fingerprint of ``req``'s prompt template, for length prediction.

    Chat: the first system (or developer) message, whole, if there is one, else the first
    ``prefix_chars`` characters of the first message; completions: the first
    ``prefix_chars`` characters (or token ids) of the first prompt.  Requests of one
    application share this and differ after it.  The model name is not part of it (the
    predictor keys on the model separately).
    """
    head: str
    if req.messages:
        system = next((m for m in req.messages if m.get("role") in ("system", "developer")), None)
        if system is not None:
            head = "s:" + _text_of(system.get("content"))
        else:
            first = req.messages[0]
            head = f"{first.get('role')}:" + _text_of(first.get("content"))[:prefix_chars]
    elif req.prompts:
        p = req.prompts[0]
        head = "p:" + (p[:prefix_chars] if isinstance(p, str) else str(p[:prefix_chars]))
    else:
        head = ""
    return hashlib.blake2b(head.encode("utf-8", "replace"), digest_size=8).hexdigest()
