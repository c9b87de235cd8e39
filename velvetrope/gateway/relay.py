"""Accounting a streamed answer as it passes through: the tokens generated so far, the
first-token signal and the engine's own usage.

:func:`relay_events` reads each batch of complete events on its way to the client and
keeps a :class:`UsageTally` up to date, so that whatever ends the request (the engine's usage
chunk, the end of the stream, a client that hung up) settles what was really generated.
This module imports nothing outside the core and :mod:`velvetrope.openai.sse`, so
``setup.py`` compiles it with mypyc (with the SSE reader): it runs for every piece of
every stream.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from velvetrope.core.lifecycle import Usage
from velvetrope.openai.sse import content_keys, event_data, usage_at, usage_of

__all__ = ["UsageTally", "relay_events"]


class UsageTally:
    """Progress of one proxied request: its ``prompt_tokens``, the ``completion_tokens``
    seen so far, whether the ``first_token`` was seen, and the engine's ``usage`` once it
    sent one."""

    __slots__ = ("completion_tokens", "first_token", "prompt_tokens", "usage")

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.first_token = False
        self.usage: Usage | None = None

    def usage_so_far(self) -> Usage:
        """The real usage if the upstream sent it, else what was seen streaming."""
        if self.usage is not None:
            return self.usage
        return Usage(self.prompt_tokens, self.completion_tokens)


def relay_events(
    data: bytes, relay: UsageTally, client_wants_usage: bool, on_first_token: Callable[[], None]
) -> bytes:
    """Account complete events (``data`` ends with a blank line, lines end with ``\\n``: what
    :func:`~velvetrope.openai.sse.split_complete` gives); what reaches the client.

    Only the event with the last ``usage`` object is parsed (a later usage supersedes an
    earlier one).  Once the engine's usage is known, nothing more is counted: its count
    supersedes any taken from the text, and its completion tokens, if any, are the
    first-token signal.  Elsewhere the generated text is counted from the bytes
    (:func:`~velvetrope.openai.sse.content_keys`), which counts what parsing every chunk
    would, for a small fraction of its cost."""
    at = usage_at(data)
    if at >= 0:
        start = data.rfind(b"\n\n", 0, at) + 2  # 1 when none: the event starts the data
        if start == 1:
            start = 0
            while data[start : start + 1] == b"\n":  # blank lines before it
                start += 1
        end = data.find(b"\n\n", at) + 2
        line_end = data.find(b"\n", start)
        if line_end == end - 2 and data.startswith(b"data:", start):  # one data line: usual
            payload: bytes | None = data[start + 5 : line_end]  # JSON may have spaces around
        else:  # more lines: several data lines, a comment, other fields
            payload = event_data(data[start:end])
        if payload is not None:
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                obj = None
            usage = usage_of(obj)  # None unless obj is an object with token counts
            if usage is not None:
                relay.usage = usage
                relay.completion_tokens = 0  # the engine's count replaces the one from the text
                _credit(usage[1], relay, on_first_token)  # its completion tokens
                if client_wants_usage or obj.get("choices"):
                    return data
                return data[:start] + data[end:]  # the client did not ask for it
    _credit(content_keys(data), relay, on_first_token)
    return data


def _credit(n: int, relay: UsageTally, on_first_token: Callable[[], None]) -> None:
    """``n`` more generated tokens (the first of them: the first-token signal)."""
    if n:
        relay.completion_tokens += n
        if not relay.first_token:
            relay.first_token = True
            on_first_token()
