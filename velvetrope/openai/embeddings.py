"""Validating an OpenAI embeddings request body (``POST /v1/embeddings``), once for both
servers.

:func:`parse_embeddings` turns the raw bytes into an :class:`EmbeddingRequest` or raises a
400 :class:`~velvetrope.errors.RequestError` built by :mod:`velvetrope.openai.errors` (the
gateway and ``velvetrope engine`` answer a mistake alike).  Checks, in this order:

* the body is a JSON object nested no deeper than
  :data:`~velvetrope.openai.request.MAX_JSON_DEPTH` (:func:`~velvetrope.openai.request.load_body`);
* with ``known_keys_only`` (the gateway's strict mode), every top-level key is one OpenAI
  or vLLM accepts (:data:`EMBEDDING_KEYS`; ``unknown_parameter``);
* ``model`` is a non-empty string;
* ``input`` is a non-empty string, a non-empty array of non-empty strings, an array of
  token ids (non-negative integers), or an array of such arrays, at most
  :data:`MAX_INPUTS` inputs (OpenAI's limit);
* ``encoding_format`` is ``"float"`` or ``"base64"``; ``dimensions`` an integer of at
  least 1; ``user`` a string.

:func:`count_input_tokens` counts the input as both servers do: text with the tokenizer,
token ids by their number, summed over the inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from velvetrope.openai.errors import below_minimum, invalid_type, invalid_value, missing
from velvetrope.openai.request import Prompt, known_keys, load_body, model_of

__all__ = [
    "EMBEDDING_KEYS",
    "ENCODINGS",
    "MAX_INPUTS",
    "EmbeddingRequest",
    "count_input_tokens",
    "parse_embeddings",
]

MAX_INPUTS = 2048
"""The most inputs one request may embed (OpenAI's limit)."""

ENCODINGS = ("float", "base64")
"""The ``encoding_format`` values: a list of floats, or little-endian float32 in base64
(what the OpenAI Python SDK asks for by default, and decodes)."""

EMBEDDING_KEYS = frozenset(
    {
        "model",
        "input",
        "encoding_format",
        "dimensions",
        "user",
        # vLLM's extras
        "truncate_prompt_tokens",
        "add_special_tokens",
        "additional_data",
        "priority",
        "request_id",
        "normalize",
        "embed_dtype",
    }
)
"""Top-level keys an embeddings request may carry (OpenAI's and vLLM's)."""

_INPUT_TYPES = (
    "a string, an array of strings, an array of token ids, or an array of token-id arrays"
)


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """A request body that passed :func:`parse_embeddings`: ``body`` is the decoded object
    itself, ``inputs`` one entry per vector asked for (text or token ids)."""

    body: dict[str, Any]
    model: str
    inputs: tuple[Prompt, ...]
    encoding_format: str
    dimensions: int | None


def _is_tokens(v: object) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(type(t) is int and t >= 0 for t in v)


def _inputs(value: object) -> tuple[Prompt, ...]:
    if value is None:
        raise missing("input")
    if isinstance(value, str):
        if not value:
            raise invalid_value("input", "'input' must not be empty.")
        return (value,)
    if not isinstance(value, list):
        raise invalid_type("input", _INPUT_TYPES, value)
    if not value:
        raise invalid_value("input", "'input' must not be empty.")
    if _is_tokens(value):
        return (value,)
    if all(type(t) is int for t in value):
        raise invalid_value("input", "'input' token ids must be non-negative integers.")
    if len(value) > MAX_INPUTS:
        raise invalid_value(
            "input", f"'input' has {len(value)} entries; at most {MAX_INPUTS} are allowed."
        )
    for i, v in enumerate(value):
        if isinstance(v, str):
            if not v:
                raise invalid_value(f"input[{i}]", f"'input[{i}]' must not be empty.")
        elif not _is_tokens(v):
            raise invalid_type(f"input[{i}]", "a non-empty string or array of token ids", v)
    return tuple(value)


def parse_embeddings(raw: bytes, *, known_keys_only: bool = False) -> EmbeddingRequest:
    """Validate ``raw`` as an embeddings request (see the module docstring for every
    check); a 400 :class:`~velvetrope.errors.RequestError` naming its ``param`` if not."""
    body = load_body(raw)
    if known_keys_only:
        known_keys(body, EMBEDDING_KEYS)
    model = model_of(body)
    inputs = _inputs(body.get("input"))
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    elif fmt not in ENCODINGS:
        raise invalid_value(
            "encoding_format", f"'encoding_format' must be 'float' or 'base64', not {fmt!r}."
        )
    dims = body.get("dimensions")
    if dims is not None:
        if type(dims) is not int:
            raise invalid_type("dimensions", "an integer", dims)
        if dims < 1:
            raise below_minimum("dimensions", dims, 1)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid_type("user", "a string", user)
    return EmbeddingRequest(body, model, inputs, str(fmt), dims)


def count_input_tokens(req: EmbeddingRequest, count_text: Callable[[str], int]) -> list[int]:
    """The tokens of each input of ``req`` (at least 1 each: the BOS token an engine
    adds): text by ``count_text``, token ids by their number."""
    return [max(1, count_text(p) if isinstance(p, str) else len(p)) for p in req.inputs]
