"""The types of the request fields that neither server acts on, checked where they stand.

:func:`~velvetrope.openai.request.validate` checks the fields the servers read (``model``,
``messages``/``prompt``, ``max_tokens``, ``n``, ``stream``...).  This module checks the
types of the other fields OpenAI's API and vLLM document, so that a request that no
OpenAI-compatible engine could accept gets the same precise 400 from either server
(``invalid_type``, ``invalid_value`` or ``missing_required_parameter``, ``param`` the path of
the offending value, e.g. ``tools[0].function.name`` or ``stop[1]``) instead of reaching the
engine or code that assumed the type:

* :func:`check_fields`: the top-level fields (:data:`CHAT_CHECKS` for a chat,
  :data:`COMPLETION_CHECKS` for completions);
* :func:`check_message`: a chat message's ``name``, ``tool_calls`` and ``tool_call_id``;
* :func:`check_part`: a content part's ``type``, a ``text`` part's ``text`` and an
  ``image_url`` part's ``image_url``.

A field set to ``null`` counts as absent, as in OpenAI's API.  Only types and the structure
around them are checked, and values only where no engine accepts the value (token ids in
``logit_bias`` keys, ``min_tokens`` below 0): ranges an engine may read its own way
(``temperature`` above 2, ``top_k`` of 0) are the engine's to refuse.  Keys no server knows
are not looked at here (strict mode refuses them, :mod:`velvetrope.openai.request`).
Sans-IO; every check costs a dict lookup per field present.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from velvetrope.openai.errors import below_minimum, invalid_type, invalid_value, missing

__all__ = ["CHAT_CHECKS", "COMPLETION_CHECKS", "check_fields", "check_message", "check_part"]

Check = Callable[[object, str], None]
"""A check of one value (never ``None``) at ``param``; raises a 400
:class:`~velvetrope.errors.RequestError` naming the offending path."""


def _string(v: object, p: str) -> None:
    if not isinstance(v, str):
        raise invalid_type(p, "a string", v)


def _boolean(v: object, p: str) -> None:
    if not isinstance(v, bool):
        raise invalid_type(p, "a boolean", v)


def _integer(v: object, p: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid_type(p, "an integer", v)


def _count(v: object, p: str) -> None:
    _integer(v, p)
    assert isinstance(v, int)
    if v < 0:
        raise below_minimum(p, v, 0)


def _number(v: object, p: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise invalid_type(p, "a number", v)


def _object(v: object, p: str) -> None:
    if not isinstance(v, dict):
        raise invalid_type(p, "an object", v)


def _array_of(item: Check, what: str) -> Check:
    """A check of an array whose every item passes ``item`` (``what``: "an array of ...")."""

    def check(v: object, p: str) -> None:
        if not isinstance(v, list):
            raise invalid_type(p, what, v)
        for i, x in enumerate(v):
            item(x, f"{p}[{i}]")

    return check


def _string_or_strings(v: object, p: str) -> None:
    if not isinstance(v, str):
        _array_of(_string, "a string or an array of strings")(v, p)


def _string_or_object(v: object, p: str) -> None:
    if not isinstance(v, str | dict):
        raise invalid_type(p, "a string or an object", v)


def _required(d: Mapping[str, Any], key: str, p: str, check: Check) -> Any:
    """``d[key]``, present and not null, checked with ``check`` (``p`` is ``d``'s path)."""
    v = d.get(key)
    if v is None:
        raise missing(f"{p}.{key}")
    check(v, f"{p}.{key}")
    return v


def _optional(d: Mapping[str, Any], key: str, p: str, check: Check) -> None:
    v = d.get(key)
    if v is not None:
        check(v, f"{p}.{key}")


def _named(v: object, p: str) -> None:
    """An object with a string ``name`` (a function call, a ``tool_choice``'s function)."""
    _object(v, p)
    assert isinstance(v, dict)
    _required(v, "name", p, _string)


def _function(v: object, p: str) -> None:
    """A function definition: its ``name``, ``description``, ``parameters``, ``strict``."""
    _named(v, p)
    assert isinstance(v, dict)
    _optional(v, "description", p, _string)
    _optional(v, "parameters", p, _object)
    _optional(v, "strict", p, _boolean)


def _tool(v: object, p: str) -> None:
    """A tool: a ``type``, and for a ``function`` tool its definition."""
    _object(v, p)
    assert isinstance(v, dict)
    if _required(v, "type", p, _string) == "function":
        _required(v, "function", p, _function)


def _tool_choice(v: object, p: str) -> None:
    """``none``/``auto``/``required``, or an object naming a ``type`` (and a function)."""
    if isinstance(v, str):
        return
    if not isinstance(v, dict):
        raise invalid_type(p, "a string or an object", v)
    _required(v, "type", p, _string)
    _optional(v, "function", p, _named)


def _function_call(v: object, p: str) -> None:
    if not isinstance(v, str):
        _named(v, p)


def _logit_bias(v: object, p: str) -> None:
    """An object from token ids (decimal strings) to numbers."""
    _object(v, p)
    assert isinstance(v, dict)
    for key, bias in v.items():
        if not (key.isascii() and key.isdigit()):
            raise invalid_value(
                p, f"Invalid value for '{p}': {key!r} is not a token id (a decimal integer)."
            )
        _number(bias, f"{p}.{key}")


def _response_format(v: object, p: str) -> None:
    _object(v, p)
    assert isinstance(v, dict)
    _required(v, "type", p, _string)


_COMMON: dict[str, Check] = {
    "temperature": _number,
    "top_p": _number,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "stop": _string_or_strings,
    "logit_bias": _logit_bias,
    "user": _string,
    "seed": _integer,
    "metadata": _object,
    "service_tier": _string,
    "store": _boolean,
    "response_format": _response_format,
    # vLLM's extra sampling parameters
    "top_k": _integer,
    "min_p": _number,
    "repetition_penalty": _number,
    "length_penalty": _number,
    "min_tokens": _count,
    "skip_special_tokens": _boolean,
    "spaces_between_special_tokens": _boolean,
    "stop_token_ids": _array_of(_integer, "an array of integers"),
    "include_stop_str_in_output": _boolean,
    "use_beam_search": _boolean,
    "guided_json": _string_or_object,
    "guided_regex": _string,
    "guided_choice": _array_of(_string, "an array of strings"),
    "guided_grammar": _string,
    "request_id": _string,
}
CHAT_CHECKS: Mapping[str, Check] = {
    **_COMMON,
    "tools": _array_of(_tool, "an array of tools"),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _boolean,
    "functions": _array_of(_function, "an array of functions"),
    "function_call": _function_call,
    "modalities": _array_of(_string, "an array of strings"),
    "audio": _object,
    "prediction": _object,
    "reasoning_effort": _string,
    "chat_template": _string,
    "chat_template_kwargs": _object,
    "add_generation_prompt": _boolean,
    "continue_final_message": _boolean,
}
"""The checks of a chat request's top-level fields, by name."""
COMPLETION_CHECKS: Mapping[str, Check] = {**_COMMON, "suffix": _string, "echo": _boolean}
"""The checks of a completions request's top-level fields, by name."""


def check_fields(body: Mapping[str, Any], checks: Mapping[str, Check]) -> None:
    """Check every field of ``body`` that ``checks`` names and that is not null."""
    for key, value in body.items():
        check = checks.get(key)
        if check is not None and value is not None:
            check(value, key)


def _tool_call(v: object, p: str) -> None:
    """A call an assistant made: an ``id``, a ``type``, a ``function`` with its
    ``name`` and ``arguments`` (a string of JSON)."""
    _object(v, p)
    assert isinstance(v, dict)
    _optional(v, "id", p, _string)
    _optional(v, "type", p, _string)
    fn = _required(v, "function", p, _named)
    _optional(fn, "arguments", f"{p}.function", _string)


_MESSAGE: dict[str, Check] = {
    "name": _string,
    "tool_calls": _array_of(_tool_call, "an array of tool calls"),
    "tool_call_id": _string,
}


def check_message(message: Mapping[str, Any], p: str) -> None:
    """Check a message's ``name``, ``tool_calls`` and ``tool_call_id`` (``p``: its path)."""
    for key, check in _MESSAGE.items():
        _optional(message, key, p, check)


def _image_url(v: object, p: str) -> None:
    """An image part's ``image_url``: an object with its ``url`` (or the URL alone)."""
    if isinstance(v, str):
        return
    if not isinstance(v, dict):
        raise invalid_type(p, "an object with a 'url'", v)
    _required(v, "url", p, _string)


def check_part(part: object, p: str) -> None:
    """Check a content part at ``p``: an object with a string ``type``; a ``text`` part
    has a string ``text``, an ``image_url`` part its ``image_url``.  Parts of other types
    (audio, files, an engine's own) are the engine's to read."""
    if not isinstance(part, dict):
        raise invalid_type(p, "an object with a 'type'", part)
    kind = _required(part, "type", p, _string)
    if kind == "text":
        _required(part, "text", p, _string)
    elif kind == "image_url":
        _required(part, "image_url", p, _image_url)
