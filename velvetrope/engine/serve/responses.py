"""``/v1/responses`` of ``velvetrope engine``: OpenAI's Responses API in the engine model.

``POST /v1/responses`` validates the body with
:func:`~velvetrope.openai.responses.parse_responses` (the gateway's checks), then runs it as
one sequence in the batcher like a chat: its input (instructions, input items, tools,
counted with the engine's tokenizer; with ``previous_response_id``, that response's input
and output too, as an engine feeds the conversation again) is the prompt, and the output
length is drawn by the :class:`~velvetrope.engine.outputs.OutputPolicy` up to
``max_output_tokens`` (else the rest of the context; ``ignore_eos`` as on the other
endpoints).  The text is the deterministic filler of :mod:`.bodies`.

The answer is a response object (``id`` ``resp_...``, ``output`` one assistant message with
one ``output_text`` part, ``usage`` with ``input_tokens``, ``output_tokens`` and
``total_tokens``); a generation cut by ``max_output_tokens`` is ``status: "incomplete"`` with
``incomplete_details.reason``, as in OpenAI's API.  Streamed, it is OpenAI's typed events
(``event: TYPE`` and ``data: {...}``): ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per batch of tokens the engine delivers,
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` (or ``response.incomplete``)
carrying the response with its usage.  With prefix caching on, the prompt's blocks
(instructions, then input) are looked up in the engine's prefix cache as a chat's, and
``usage.input_tokens_details.cached_tokens`` says how many were found (a follow-up by
``previous_response_id`` is not looked up: 0).

The engine remembers the last :data:`STORED` responses it created (unless ``store`` is
false): ``previous_response_id`` must name one (else 404 ``not_found``), and
``GET``/``DELETE /v1/responses/{id}`` read or forget one.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from velvetrope.engine.outputs import OutputDecision
from velvetrope.engine.serve.bodies import filler_seed, filler_text
from velvetrope.engine.serve.progress import GeneratingEndpoint, unavailable
from velvetrope.errors import RequestError
from velvetrope.openai.errors import model_not_found
from velvetrope.openai.responses import count_input_tokens, parse_responses
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["STORED", "ResponsesServer"]

STORED = 10_000
"""How many responses the engine remembers (the oldest are forgotten first)."""

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class ResponsesServer(GeneratingEndpoint):
    """The Responses handlers (see :class:`GeneratingEndpoint` for their parts)."""

    def __init__(self, *parts: Any) -> None:
        super().__init__(*parts)
        self._stored: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def route(self, path: str, method: str) -> tuple[str, Callable[..., Awaitable[None]]] | None:
        """The handler of ``/v1/responses/{id}`` (``None`` for another path): ``(method,
        handler)`` for ``GET`` and ``DELETE``, else ``("GET", ...)`` (a 405)."""
        if not path.startswith("/v1/responses/") or len(path) <= 14:
            return None
        rid = path[14:]

        async def stored(send: Send) -> None:
            await self._stored_response(rid, method, send)

        return (method if method in ("GET", "DELETE") else "GET"), stored

    async def _stored_response(self, rid: str, method: str, send: Send) -> None:
        got = self._stored.get(rid)
        if got is None:
            raise RequestError(f"No response with id '{rid}' found.", status=404, code="not_found")
        if method == "DELETE":
            del self._stored[rid]
            body: dict[str, Any] = {"id": rid, "object": "response.deleted", "deleted": True}
        else:
            body = got
        await respond(send, 200, orjson.dumps(body))

    async def handle(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/responses``; raises :class:`~velvetrope.errors.RequestError` for the
        app to answer."""
        req = parse_responses(raw)
        if req.model != self.model:
            raise model_not_found(req.model)
        prompt = count_input_tokens(req, self.tokenizer.count)
        previous = None
        if req.previous_response_id is not None:
            previous = self._stored.get(req.previous_response_id)
            if previous is None:
                raise RequestError(
                    f"Previous response with id '{req.previous_response_id}' not found.",
                    status=404,
                    code="not_found",
                    param="previous_response_id",
                )
            prompt += previous["usage"]["total_tokens"]
        room = self.max_model_len - prompt
        cap = req.max_output_tokens or room
        if room < 1 or cap > room:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, the input resulted in {prompt} tokens and {cap} output tokens "
                f"were asked for. Please reduce the length of the input or the output.",
                code="context_length_exceeded",
                param="input",
            )
        key = orjson.dumps([req.body.get("input"), req.body.get("instructions")])
        d = self.outputs.decide(key, cap, ignore_eos=req.body.get("ignore_eos") is True)
        if self.stopping():
            raise unavailable()
        rid = f"resp_{self.prefix}{next(self._ids):08x}"
        obj = self._response(rid, req.body, req.previous_response_id)
        store = req.body.get("store") is not False
        # a follow-up's prompt starts with the stored conversation: not laid out here
        blocks = () if previous is not None else self.blocks(_layout(req.body), prompt)
        if req.stream:
            events = self._events(obj, prompt, d, store)
            await self.stream(rid, prompt, d.tokens, arrived, receive, send, events, blocks)
        else:
            cached = await self.generate(obj["id"], prompt, d.tokens, arrived, receive, blocks)
            if cached is None:
                return  # the client left
            self.finish(obj, prompt, d, store, cached)
            await respond(send, 200, orjson.dumps(obj))

    def _response(self, rid: str, body: dict[str, Any], previous: str | None) -> dict[str, Any]:
        """The response object before any output (``status: in_progress``)."""
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": previous,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "metadata": {},
            "usage": None,
        }

    def finish(
        self, obj: dict[str, Any], prompt: int, d: OutputDecision, store: bool, cached: int = 0
    ) -> None:
        """Complete ``obj`` with its message, status and usage (``cached``: the prompt tokens
        found in the prefix cache); remember it if ``store``."""
        obj["output"] = [_message(obj["id"], filler_text(filler_seed(d), 0, d.tokens), "completed")]
        if d.finish_reason == "length":
            obj["status"] = "incomplete"
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            obj["status"] = "completed"
        obj["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": d.tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + d.tokens,
        }
        if store:
            self._stored[obj["id"]] = obj
            if len(self._stored) > STORED:
                self._stored.popitem(last=False)

    def _events(
        self, obj: dict[str, Any], prompt: int, d: OutputDecision, store: bool
    ) -> _ResponseEvents:
        return _ResponseEvents(self, obj, prompt, d, store)


class _ResponseEvents:
    """The typed events of one streamed response (an
    :class:`~velvetrope.engine.serve.progress.EventWriter`)."""

    def __init__(
        self,
        server: ResponsesServer,
        obj: dict[str, Any],
        prompt: int,
        d: OutputDecision,
        store: bool,
    ) -> None:
        self.server, self.obj, self.prompt, self.d, self.store = server, obj, prompt, d, store
        self.seq = itertools.count()
        self.at = {"item_id": "msg_" + obj["id"][5:], "output_index": 0, "content_index": 0}
        self.base = filler_seed(d)

    def head(self) -> bytes:
        obj, seq = self.obj, self.seq
        item = _message(obj["id"], None, "in_progress")
        return (
            _event("response.created", next(seq), response=obj)
            + _event("response.in_progress", next(seq), response=obj)
            + _event("response.output_item.added", next(seq), output_index=0, item=item)
            + _event("response.content_part.added", next(seq), **self.at, part=_part(""))
        )

    def delta(self, start: int, n: int) -> bytes:
        text = filler_text(self.base, start, n)
        return _event(
            "response.output_text.delta", next(self.seq), **self.at, delta=text, logprobs=[]
        )

    def tail(self, cached: int) -> bytes:
        obj, seq, at = self.obj, self.seq, self.at
        self.server.finish(obj, self.prompt, self.d, self.store, cached)
        text = filler_text(self.base, 0, self.d.tokens)
        final = "response.completed" if obj["status"] == "completed" else "response.incomplete"
        return (
            _event("response.output_text.done", next(seq), **at, text=text, logprobs=[])
            + _event("response.content_part.done", next(seq), **at, part=_part(text))
            + _event("response.output_item.done", next(seq), output_index=0, item=obj["output"][0])
            + _event(final, next(seq), response=obj)
        )

    def error(self, message: str) -> bytes:
        return _event("error", next(self.seq), code="engine_unavailable", message=message)


def _layout(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses prompt laid out as a chat's messages for the prefix cache's hashes: the
    ``instructions`` as a system message, then the ``input`` (a string: one user message;
    items: their role and the text of their content parts, whatever the part's type)."""
    messages: list[dict[str, str]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        role = item.get("role", item.get("type", ""))
        messages.append({"role": str(role), "content": content if isinstance(content, str) else ""})
    return {"messages": messages}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(rid: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {
        "id": "msg_" + rid[5:],
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }
