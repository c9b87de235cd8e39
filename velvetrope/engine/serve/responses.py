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
carrying the response with its usage.

The engine remembers the last :data:`STORED` responses it created (unless ``store`` is
false): ``previous_response_id`` must name one (else 404 ``not_found``), and
``GET``/``DELETE /v1/responses/{id}`` read or forget one.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from velvetrope.engine.outputs import OutputDecision, OutputPolicy
from velvetrope.engine.serve.bodies import filler_text
from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.progress import EngineEndpoint, progress, unavailable, until_done
from velvetrope.engine.serve.realtime import EngineClosed, EngineRequest, RealtimeEngine
from velvetrope.errors import PolicyError, RequestError
from velvetrope.openai.errors import model_not_found
from velvetrope.openai.responses import count_input_tokens, parse_responses
from velvetrope.openai.tokenizer import Tokenizer
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["STORED", "ResponsesServer"]

STORED = 10_000
"""How many responses the engine remembers (the oldest are forgotten first)."""

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class ResponsesServer(EngineEndpoint):
    """The Responses handlers (see :class:`EngineEndpoint` for its parts; ``outputs`` draws
    the output lengths)."""

    def __init__(
        self,
        model: str,
        tokenizer: Tokenizer,
        max_model_len: int,
        outputs: OutputPolicy,
        engine: RealtimeEngine | None,
        load: RequestLoad,
        stopping: Callable[[], bool],
    ) -> None:
        super().__init__(model, tokenizer, max_model_len, engine, load, stopping)
        self.outputs = outputs
        self._prefix = os.urandom(6).hex()
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
        rid = f"resp_{self._prefix}{next(self._ids):08x}"
        obj = self._response(rid, req.body, req.previous_response_id)
        store = req.body.get("store") is not False
        if req.stream:
            await self._stream(obj, prompt, d, arrived, receive, send, store)
        else:
            if await self._generate(obj["id"], prompt, d, arrived, receive) is None:
                return  # the client left
            self._finish(obj, prompt, d, store)
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

    def _finish(self, obj: dict[str, Any], prompt: int, d: OutputDecision, store: bool) -> None:
        """Complete ``obj`` with its message, status and usage; remember it if ``store``."""
        obj["output"] = [_message(obj["id"], filler_text(_base(d), 0, d.tokens), "completed")]
        if d.finish_reason == "length":
            obj["status"] = "incomplete"
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            obj["status"] = "completed"
        obj["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": d.tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + d.tokens,
        }
        if store:
            self._stored[obj["id"]] = obj
            if len(self._stored) > STORED:
                self._stored.popitem(last=False)

    async def _generate(
        self, rid: str, prompt: int, d: OutputDecision, arrived: float, receive: Receive
    ) -> list[EngineRequest] | None:
        """Run the sequence to its end (instant mode: nothing to run); ``None`` if the
        client left first."""
        engine = self.engine
        if engine is None:
            return []
        r = self._submit(engine, rid, prompt, d.tokens, arrived)
        watcher = self.watch(receive, engine, [r])
        try:
            return [r] if await until_done([r]) else None
        finally:
            engine.abort(r)
            watcher.cancel()
            self.load.end(rid, prompt, [r])

    def _submit(
        self, engine: RealtimeEngine, rid: str, prompt: int, tokens: int, arrived: float
    ) -> EngineRequest:
        try:
            r = engine.submit(rid, prompt, tokens, arrived_at=arrived)
        except PolicyError as exc:
            raise RequestError(str(exc), param="input") from None
        except EngineClosed:
            raise unavailable() from None
        self.load.begin(rid, None, arrived, prompt, False)
        return r

    async def _stream(
        self,
        obj: dict[str, Any],
        prompt: int,
        d: OutputDecision,
        arrived: float,
        receive: Receive,
        send: Send,
        store: bool,
    ) -> None:
        rid = obj["id"]
        engine = self.engine
        r = None if engine is None else self._submit(engine, rid, prompt, d.tokens, arrived)
        watcher = None if engine is None or r is None else self.watch(receive, engine, [r])
        seq = itertools.count()
        at = {"item_id": "msg_" + rid[5:], "output_index": 0, "content_index": 0}
        item = _message(rid, None, "in_progress")
        head = (
            _event("response.created", next(seq), response=obj)
            + _event("response.in_progress", next(seq), response=obj)
            + _event("response.output_item.added", next(seq), output_index=0, item=item)
            + _event("response.content_part.added", next(seq), **at, part=_part(""))
        )
        base = _base(d)

        async def delta(start: int, n: int) -> None:
            text = filler_text(base, start, n)
            ev = _event("response.output_text.delta", next(seq), **at, delta=text, logprobs=[])
            await send({"type": "http.response.body", "body": ev, "more_body": True})

        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            await send({"type": "http.response.body", "body": head, "more_body": True})
            if r is None:  # instant mode: the whole text at once
                if d.tokens:
                    await delta(0, d.tokens)
            else:
                sent = 0
                try:
                    async for _, n in progress([r]):
                        await delta(sent, n)
                        sent += n
                except EngineClosed as exc:
                    err = _event("error", next(seq), code="engine_unavailable", message=str(exc))
                    await send({"type": "http.response.body", "body": err, "more_body": False})
                    return
                if not r.finished:
                    return  # the client left
            self._finish(obj, prompt, d, store)
            text = filler_text(base, 0, d.tokens)
            done = obj["output"][0]
            final = "response.completed" if obj["status"] == "completed" else "response.incomplete"
            tail = (
                _event("response.output_text.done", next(seq), **at, text=text, logprobs=[])
                + _event("response.content_part.done", next(seq), **at, part=_part(text))
                + _event("response.output_item.done", next(seq), output_index=0, item=done)
                + _event(final, next(seq), response=obj)
            )
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            if engine is not None and r is not None:
                engine.abort(r)
                self.load.end(rid, prompt, [r])
            if watcher is not None:
                watcher.cancel()


def _base(d: OutputDecision) -> int:
    return int(d.key_hash * 4294967296.0)


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
