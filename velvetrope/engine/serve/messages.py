"""``/v1/messages`` and ``/v1/messages/count_tokens`` of ``velvetrope engine``: Anthropic's
Messages API in the engine model, as vLLM and llama.cpp serve it beside OpenAI's.

``POST /v1/messages`` validates the body with
:func:`~velvetrope.openai.anthropic.parse_messages` (the gateway's checks) and runs it as one
sequence in the batcher like a chat: its input (system, messages, tools, counted with the
engine's tokenizer) is the prompt, the output length is drawn by the
:class:`~velvetrope.engine.outputs.OutputPolicy` up to ``max_tokens``, the text is the
deterministic filler of :mod:`.bodies`.  The answer is a message (``id`` ``msg_...``, one
``text`` block, ``stop_reason`` ``end_turn`` or ``max_tokens``, ``usage`` with
``input_tokens`` and ``output_tokens``); streamed, Anthropic's events: ``message_start``
(its usage: the input and 1 output token), ``content_block_start``, one
``content_block_delta`` per batch of tokens the engine delivers, ``content_block_stop``,
``message_delta`` (the stop reason and the output tokens) and ``message_stop``.  With prefix
caching on, the prompt's blocks (system, then messages) are looked up in the engine's prefix
cache as a chat's, and the usage (the whole answer's, the stream's ``message_delta``) splits
the prompt as Anthropic does: ``input_tokens`` not read from the cache,
``cache_read_input_tokens`` read from it.

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` at once.  Errors are in
OpenAI's shape, as on the engine's other routes.
"""

from __future__ import annotations

from typing import Any

import orjson

from velvetrope.engine.outputs import OutputDecision
from velvetrope.engine.serve.bodies import filler_seed, filler_text
from velvetrope.engine.serve.progress import GeneratingEndpoint, unavailable
from velvetrope.errors import RequestError
from velvetrope.openai.anthropic import count_input_tokens, parse_messages
from velvetrope.openai.errors import model_not_found
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["MessagesServer"]


def _event(kind: str, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class MessagesServer(GeneratingEndpoint):
    """The Messages handlers (see :class:`GeneratingEndpoint` for their parts)."""

    async def count_tokens(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``."""
        req = parse_messages(raw, count_only=True)
        if req.model != self.model:
            raise model_not_found(req.model)
        n = count_input_tokens(req, self.tokenizer.count)
        await respond(send, 200, orjson.dumps({"input_tokens": n}))

    async def handle(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/messages``; raises :class:`~velvetrope.errors.RequestError` for the
        app to answer."""
        req = parse_messages(raw)
        if req.model != self.model:
            raise model_not_found(req.model)
        prompt = count_input_tokens(req, self.tokenizer.count)
        cap = req.max_tokens or 1
        if prompt + cap > self.max_model_len:
            raise RequestError(
                f"prompt is too long: {prompt} tokens + {cap} max_tokens > "
                f"{self.max_model_len} maximum",
                code="context_length_exceeded",
                param="messages",
            )
        key = orjson.dumps([req.body.get("system"), req.body.get("messages")])
        d = self.outputs.decide(key, cap)
        if self.stopping():
            raise unavailable()
        mid = f"msg_{self.prefix}{next(self._ids):08x}"
        system = req.body.get("system")
        head = [{"role": "system", "content": system}] if system else []
        blocks = self.blocks({"messages": [*head, *req.body.get("messages", [])]}, prompt)
        if req.stream:
            start = self._message(mid, None, None)
            start["usage"] = {"input_tokens": prompt, "output_tokens": 1}
            events = _MessageEvents(start, d, prompt if self.prefix_caching else None)
            await self.stream(mid, prompt, d.tokens, arrived, receive, send, events, blocks)
            return
        cached = await self.generate(mid, prompt, d.tokens, arrived, receive, blocks)
        if cached is not None:
            body = self._message(mid, filler_text(filler_seed(d), 0, d.tokens), d)
            usage = {"input_tokens": prompt, "output_tokens": d.tokens}
            body["usage"] = _usage(prompt, cached, d.tokens) if self.prefix_caching else usage
            await respond(send, 200, orjson.dumps(body))

    def _message(self, mid: str, text: str | None, d: OutputDecision | None) -> dict[str, Any]:
        stop = None if d is None else ("max_tokens" if d.finish_reason == "length" else "end_turn")
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": stop,
            "stop_sequence": None,
        }


class _MessageEvents:
    """Anthropic's events of one streamed message (an
    :class:`~velvetrope.engine.serve.progress.EventWriter`)."""

    def __init__(self, start: dict[str, Any], d: OutputDecision, prompt: int | None) -> None:
        self.start, self.d, self.base, self.prompt = start, d, filler_seed(d), prompt

    def head(self) -> bytes:
        block = {"type": "text", "text": ""}
        return _event("message_start", message=self.start) + _event(
            "content_block_start", index=0, content_block=block
        )

    def delta(self, start: int, n: int) -> bytes:
        text = filler_text(self.base, start, n)
        return _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    def tail(self, cached: int) -> bytes:
        stop = "max_tokens" if self.d.finish_reason == "length" else "end_turn"
        return (
            _event("content_block_stop", index=0)
            + _event(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage=_usage(self.prompt, cached, self.d.tokens),
            )
            + _event("message_stop")
        )

    def error(self, message: str) -> bytes:
        return _event("error", error={"type": "overloaded_error", "message": message})


def _usage(prompt: int | None, cached: int, output: int) -> dict[str, int]:
    """A Messages ``usage``: with prefix caching (``prompt`` given), Anthropic's split of the
    prompt, ``input_tokens`` the part not read from the cache and ``cache_read_input_tokens``
    the part read; without, the output only (the caller adds the input where it goes)."""
    if prompt is None:
        return {"output_tokens": output}
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }
