"""Parse and validate an OpenAI request body before admission.

Every defect is a :class:`~velvetrope.errors.RequestError` with the HTTP status, OpenAI's
``code`` and the offending ``param``: malformed JSON (400), a body that is not an object
(400), an unknown top-level key (400, ``unknown_parameter``), a missing or mistyped field
(400), ``max_tokens`` below 1 or above the configured limit (400).

The upstream sees the body unchanged except where the gateway must change it: a streaming
request always asks for ``stream_options.include_usage`` (the gateway strips the extra
chunk if the client did not ask for it), and a client's own ``priority`` field is removed
(priority comes only from the tenant's config).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from velvetrope.errors import RequestError

__all__ = ["CHAT_KEYS", "COMPLETION_KEYS", "Kind", "ParsedRequest", "parse_request"]

Kind = Literal["chat", "completions"]

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
COMPLETION_KEYS = frozenset(_COMMON | {"prompt", "suffix", "echo"})


@dataclass(slots=True)
class ParsedRequest:
    """A validated request.  ``body`` is what goes upstream (see :attr:`upstream_body`);
    ``n`` is how many completions it asks for (each up to ``max_tokens``)."""

    kind: Kind
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    raw: bytes
    body: dict[str, Any]
    rewritten: bool
    n: int = 1

    def upstream_body(self) -> bytes:
        """The bytes to send upstream: the client's own, unless the gateway changed them."""
        return orjson.dumps(self.body) if self.rewritten else self.raw


def _bad(message: str, param: str | None, code: str = "invalid_request_error") -> RequestError:
    return RequestError(message, status=400, code=code, param=param)


def _int_field(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer, got {type(v).__name__}", key, "invalid_type")
    return v


def _text_of_content(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise _bad(f"'{param}[{i}]' must be an object", f"{param}[{i}]", "invalid_type")
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "\n".join(parts)
    raise _bad(f"'{param}' must be a string or a list of parts", param, "invalid_type")


def parse_request(
    raw: bytes,
    kind: Kind,
    *,
    max_tokens_limit: int,
    count_text: Callable[[str], int],
    count_chat: Callable[[Sequence[dict[str, Any]]], int] | None = None,
) -> ParsedRequest:
    """Validate ``raw`` as a ``kind`` request and count its prompt tokens."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_json")
    allowed = CHAT_KEYS if kind == "chat" else COMPLETION_KEYS
    for key in body:
        if key not in allowed:
            raise _bad(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model", "invalid_type")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    wants_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    max_tokens = _int_field(body, "max_tokens")
    mct = _int_field(body, "max_completion_tokens") if kind == "chat" else None
    param = "max_tokens"
    if mct is not None:
        max_tokens, param = (
            mct if max_tokens is None else min(max_tokens, mct),
            "max_completion_tokens",
        )
    if max_tokens is not None and not 1 <= max_tokens <= max_tokens_limit:
        raise _bad(
            f"'{param}' must be between 1 and {max_tokens_limit}, got {max_tokens}",
            param,
            "invalid_value",
        )
    n = _int_field(body, "n")
    if n is not None and not 1 <= n <= 16:
        raise _bad(f"'n' must be between 1 and 16, got {n}", "n", "invalid_value")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad(
                "'messages' is required and must be a non-empty list", "messages", "invalid_type"
            )
        texts: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _bad(f"'messages[{i}]' must be an object", f"messages[{i}]", "invalid_type")
            if not isinstance(m.get("role"), str):
                raise _bad(
                    f"'messages[{i}].role' must be a string", f"messages[{i}].role", "invalid_type"
                )
            texts.append(
                {
                    "role": m["role"],
                    "content": _text_of_content(m.get("content"), f"messages[{i}].content"),
                }
            )
        if count_chat is not None:
            prompt_tokens = count_chat(texts)
        else:
            prompt_tokens = sum(count_text(t["content"]) + 4 for t in texts) + 3
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_tokens = count_text(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompt_tokens = sum(count_text(p) for p in prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        ):
            prompt_tokens = len(prompt)
        else:
            raise _bad(
                "'prompt' is required: a string, a list of strings or a list of token ids",
                "prompt",
                "invalid_type",
            )
    rewritten = False
    if "priority" in body:
        del body["priority"]
        rewritten = True
    if stream and not wants_usage:
        new_opts = dict(opts) if isinstance(opts, dict) else {}
        new_opts["include_usage"] = True
        body["stream_options"] = new_opts
        rewritten = True
    return ParsedRequest(
        kind=kind,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        max_tokens=max_tokens,
        prompt_tokens=max(1, prompt_tokens),
        raw=raw,
        body=body,
        rewritten=rewritten,
        n=n or 1,
    )
