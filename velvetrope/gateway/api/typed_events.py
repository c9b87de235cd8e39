"""Reading a stream of typed events on its way to the client (the Responses API's and
Anthropic's Messages API's ``event: TYPE`` / ``data: {"type": TYPE, ...}``), the ``events``
hook of :func:`~velvetrope.gateway.upstream.proxy.forward` for the APIs that are not OpenAI's
chunks.

A :class:`TypedEvents` counts each text-delta event as at least one generated token (the
first one is the first-token signal), so a client that hangs up mid-stream is charged what
it was sent, and hands each event whose type matters (those its ``state`` pattern matches)
to :meth:`TypedEvents.on_event`, parsed, to read the usage from.  The bytes pass on
unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from velvetrope.gateway.upstream.relay import UsageTally
from velvetrope.openai.sse import event_data

__all__ = ["TypedEvents"]


class TypedEvents:
    """Base of a typed-event reader: ``delta`` matches a text-delta event, ``state`` the
    events :meth:`on_event` reads (its first group names which)."""

    __slots__ = ()

    delta: re.Pattern[bytes]
    state: re.Pattern[bytes]

    def __call__(
        self, data: bytes, tally: UsageTally, wants_usage: bool, on_first: Callable[[], None]
    ) -> bytes:
        """Account complete events ``data`` into ``tally``; return them unchanged."""
        n = len(self.delta.findall(data))
        if n:
            tally.completion_tokens += n
            if not tally.first_token:
                tally.first_token = True
                on_first()
        if self.state.search(data) is None:
            return data
        for event in data.split(b"\n\n"):
            m = self.state.search(event)
            payload = event_data(event + b"\n") if m is not None else None
            if m is None or payload is None:
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                self.on_event(m.group(1), obj, tally)
        return data

    def on_event(self, kind: bytes, obj: dict[str, Any], tally: UsageTally) -> None:
        """Read one event of ``kind`` (the ``state`` pattern's group), parsed."""
        raise NotImplementedError
