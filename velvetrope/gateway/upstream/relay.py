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

__all__ = ["UsageTally", "body_tokens", "relay_events"]


class UsageTally:
    """Progress of one proxied request: its ``prompt_tokens``, the ``completion_tokens``
    seen so far (streamed chunks with text, or what a whole body shows: see
    :func:`body_tokens`), whether the ``first_token`` was seen, and the engine's ``usage``
    once it sent one.  ``choice_limit`` is the ``max_tokens`` of one completion when the
    upstream was told it (0: unknown)."""

    __slots__ = ("choice_limit", "completion_tokens", "first_token", "prompt_tokens", "usage")

    def __init__(self, prompt_tokens: int, choice_limit: int = 0) -> None:
        self.prompt_tokens = prompt_tokens
        self.choice_limit = choice_limit
        self.completion_tokens = 0
        self.first_token = False
        self.usage: Usage | None = None

    def usage_so_far(self) -> Usage:
        """What to settle: the engine's usage if it sent one, with its completion tokens
        raised to what the gateway saw when the engine reported fewer (an engine that
        counts one of ``n`` choices, or reports less than it streamed); else the prompt and
        what was seen.  The cached prompt tokens are the engine's (0 without its usage)."""
        u = self.usage
        if u is not None:
            if u[1] < self.completion_tokens:
                return Usage(u[0], self.completion_tokens, u[2])
            return u
        return Usage(self.prompt_tokens, self.completion_tokens)


def body_tokens(obj: object, choice_limit: int) -> int:
    """The fewest completion tokens a whole (non-streaming) answer ``obj`` can hold: each
    choice that ended for ``length`` generated ``choice_limit`` tokens (when known), each
    other choice with text at least one.  No tokenizer is assumed, so this never exceeds
    what the engine generated; it catches an engine that reports one choice of several."""
    if not isinstance(obj, dict):
        return 0
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return 0
    total = 0
    for c in choices:
        if not isinstance(c, dict):
            continue
        if c.get("finish_reason") == "length" and choice_limit > 0:
            total += choice_limit
            continue
        msg = c.get("message")
        text = msg.get("content") if isinstance(msg, dict) else c.get("text")
        if isinstance(text, str) and text:
            total += 1
    return total


def relay_events(
    data: bytes, relay: UsageTally, client_wants_usage: bool, on_first_token: Callable[[], None]
) -> bytes:
    """Account complete events (``data`` ends with a blank line, lines end with ``\\n``: what
    :func:`~velvetrope.openai.sse.split_complete` gives); what reaches the client.

    Only the event with the last ``usage`` object is parsed (a later usage supersedes an
    earlier one); its completion tokens, if any, are the first-token signal.  The generated
    text is counted from the bytes throughout
    (:func:`~velvetrope.openai.sse.content_keys`: what parsing every chunk would count, for a
    small fraction of its cost), so that :meth:`UsageTally.usage_so_far` can settle the
    larger of the engine's count and what passed through."""
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
                _credit(content_keys(data), relay, on_first_token)  # the text, still counted
                if usage[1] and not relay.first_token:  # its tokens: the first-token signal
                    relay.first_token = True
                    on_first_token()
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
