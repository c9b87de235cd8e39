"""Server-sent events as OpenAI streams them, written and read in one place.

Writing (both servers): an event is ``data: <payload>\\n\\n`` (:func:`event`,
:func:`json_event`); a stream ends with :data:`DONE`; a stream cut by an error ends with
an error object in OpenAI's shape (:func:`error_event`) instead.

Reading (the gateway's proxy and relay, and the clients: load generator, calibration):
:func:`split_complete` cuts a byte buffer after its complete events (:func:`split_events`
also cuts them apart), :func:`data_of` gives the payload of a ``data:`` line or event
(``None`` for comments and other fields, which clients ignore), and :func:`usage_of` /
:func:`content_choices` read what a chunk or a response body says about tokens.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from velvetrope.core import Usage
from velvetrope.core.tuples import new_tuple
from velvetrope.openai.errors import error_body

__all__ = [
    "DONE",
    "DONE_DATA",
    "SSE_HEADERS",
    "cached_of",
    "content_choices",
    "content_keys",
    "data_of",
    "error_event",
    "event",
    "event_data",
    "json_event",
    "split_complete",
    "split_events",
    "usage_at",
    "usage_of",
]

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
"""Response headers of a stream."""

DONE_DATA = b"[DONE]"
"""The payload of the last event of a complete stream."""

DONE = b"data: [DONE]\n\n"
"""The last event of a complete stream."""


def event(data: bytes) -> bytes:
    """One event carrying ``data`` (which must not contain a blank line)."""
    return b"data: " + data + b"\n\n"


def json_event(obj: Any) -> bytes:
    """One event carrying ``obj`` as compact JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def error_event(status: int, message: str, code: str | None = None) -> bytes:
    """The event that ends a stream with an error (the body a ``status`` answer would carry)."""
    return event(error_body(status, message, code))


def split_complete(buf: bytes) -> tuple[bytes, bytes]:
    """``buf`` cut after its last blank line: the complete events at its start, as one
    piece (``b""`` when there is none), and the rest (the start of an event).

    ``buf`` is what an upstream sent after the end of the last complete event (the rest of
    the previous call, then new bytes).  Lines may end with ``\\n``, ``\\r\\n`` or ``\\r``, as
    the SSE spec allows: the complete piece is given with ``\\n`` line ends (the same events,
    which every SSE client reads alike), so the usual stream, already framed with ``\\n``,
    costs one more byte scan and nothing else.  A ``\\r`` that ends ``buf`` may be the first
    half of a ``\\r\\n``: it stays at the end of the rest, unless it ends an event, which is
    then complete at once (and the rest is that ``\\r``, which the next call drops with a
    ``\\n`` that follows it: blank lines before an event mean nothing)."""
    if b"\r" in buf:
        return _split_cr(buf)
    cut = buf.rfind(b"\n\n")
    if cut < 0:
        return b"", buf
    end = cut + 2
    if end == len(buf):  # the usual piece: whole events (compiled, a slice would copy it)
        return buf, b""
    return buf[:end], buf[end:]


def _split_cr(buf: bytes) -> tuple[bytes, bytes]:
    """:func:`split_complete` of a ``buf`` with ``\\r`` in it (``\\r\\n`` or ``\\r`` line ends)."""
    if buf[:1] in _BLANK:  # the rest began with a line end: a blank line, or a CR's LF
        buf = buf.lstrip(b"\r\n")
    held = buf.endswith(b"\r")
    if held:
        buf = buf[:-1]
    text = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if held and text.endswith(b"\n"):  # the held CR is a blank line: the events are complete
        return text + b"\n", b"\r"
    done, rest = split_complete(text)
    return done, rest + b"\r" if held else rest


_BLANK = (b"\r", b"\n")


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """:func:`split_complete`, its complete events one by one: each ends with its blank line
    (the last also with any newlines that follow that), and they join to the first piece."""
    done, rest = split_complete(buf)
    if not done:
        return [], rest
    parts = done.split(b"\n\n")
    events = [part + b"\n\n" for part in parts[:-1]]
    events[-1] += parts[-1]  # b"", or the newline after an odd run of them
    return events, rest


def data_of(line: bytes) -> bytes | None:
    """The stripped payload of a ``data:`` line (or an event that starts with one);
    ``None`` for anything else."""
    if not line.startswith(b"data:"):
        return None
    return line[5:].strip()


def event_data(ev: bytes) -> bytes | None:
    """The data of one event as the SSE spec reads it (``ev`` with ``\\n`` line ends, as
    :func:`split_events` gives them): the values of its ``data`` lines joined with ``\\n``
    (one space after the colon dropped); ``None`` when it has none (a comment, or only other
    fields).  Lines of other fields and comments (``:``...) are skipped."""
    parts: list[bytes] = []
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":  # a field with no colon: its value is empty
            parts.append(b"")
    if not parts:
        return None
    return b"\n".join(parts)


def usage_of(obj: object) -> Usage | None:
    """The ``usage`` a response body or a chunk reports, if it has token counts; with the
    prompt tokens found cached (``usage.prompt_tokens_details.cached_tokens``, what vLLM
    reports with prefix caching and ``--enable-prompt-tokens-details``, and OpenAI always)
    when given (:func:`cached_of`)."""
    try:
        u = obj["usage"]  # type: ignore[index]
        p, c = u["prompt_tokens"], u["completion_tokens"]
    except (TypeError, KeyError, IndexError):  # not an object, or not one with both counts
        return None
    if isinstance(obj, dict) and isinstance(p, int) and isinstance(c, int):
        return new_tuple(Usage, (p, c, cached_of(u.get("prompt_tokens_details"), p)))
    return None


def cached_of(details: object, prompt: int) -> int:
    """The ``cached_tokens`` of a usage's details object (OpenAI's
    ``prompt_tokens_details``, the Responses API's ``input_tokens_details``), at most
    ``prompt``; 0 when absent, null or not a non-negative integer."""
    if not isinstance(details, dict):
        return 0
    n = details.get("cached_tokens")
    if type(n) is not int or n <= 0:
        return 0
    return n if n < prompt else max(prompt, 0)


_TEXT_KEYS = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
_TEXT_FORMS = tuple(
    (b'"%s"' % k, b'"%s":"' % k, b'"%s":null' % k, b'"%s":""' % k) for k in (b"content", b"text")
)
"""Compact JSON (what engines send): a name's occurrences, then those with a string value,
a null value and an empty string; four substring counts cost far less than a regex."""


def content_keys(data: bytes) -> int:
    """How many ``content`` or ``text`` members with a non-empty string value the JSON in
    ``data`` has, at any depth, without parsing it.

    For the chunks of a stream this is :func:`content_choices` summed over the events in
    ``data``, whatever the whitespace: in valid JSON a quoted word followed by ``:`` is a
    member name (a quote inside a string is escaped), and chunks carry text only in
    ``delta.content`` (chat) or ``text`` (completions); ``logprobs.content`` is an array
    and ``reasoning_content`` another name, so neither counts."""
    total = 0
    for name, string, null, empty in _TEXT_FORMS:
        n = data.count(name)
        if not n:
            continue
        strings = data.count(string)
        if n != strings and n != strings + data.count(null):  # spaced, or another value
            return len(_TEXT_KEYS.findall(data))
        total += strings - data.count(empty)
    return total


def usage_at(data: bytes) -> int:
    """Where the last ``usage`` member in ``data`` is, if its value is an object; else -1
    (``"usage": null``, which some servers put in every chunk, is no usage).

    Searched from the end, where a stream's usage chunk is: the scan stops there."""
    i = data.rfind(b'"usage"')
    if i >= 0 and data[i + 7 : i + 9] == b":{":  # compact JSON, what engines send
        return i
    while i >= 0:
        j = _skip_space(data, i + 7)
        if data[j : j + 1] == b":":  # a member name (a string value is never followed by ':')
            j = _skip_space(data, j + 1)
            return i if data[j : j + 1] == b"{" else -1
        i = data.rfind(b'"usage"', 0, i)
    return -1


def _skip_space(data: bytes, j: int) -> int:
    while data[j : j + 1] in _JSON_SPACE:
        j += 1
    return j


_JSON_SPACE = (b" ", b"\t", b"\r", b"\n")


def content_choices(obj: dict[str, Any]) -> int:
    """Choices of a streamed chunk that carry generated text (``delta.content`` for chat,
    ``text`` for completions): one token each, when the server streams token by token."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return 0
    n = 0
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else ch.get("text")
        if text:
            n += 1
    return n
