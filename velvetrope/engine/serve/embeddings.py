"""``POST /v1/embeddings`` of ``velvetrope engine``: prompt-only work in the engine model.

Each input is one sequence that the batcher prefills and that ends with its first token
(the pooled output): it queues and shares steps with every other sequence, and costs its
prompt tokens in KV blocks while it runs, as an embedding request does in vLLM.  Nothing is
generated; the answer is written once every input's prefill is done.

The body is validated by :func:`~velvetrope.openai.embeddings.parse_embeddings` (the
gateway's checks), then: ``model`` must be the served name (404 ``model_not_found``); an
input longer than ``max_model_len`` is a 400 ``context_length_exceeded`` (``param``
``input``); ``dimensions`` above :data:`MAX_DIMENSIONS` a 400.

The answer is OpenAI's: ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``, the usage counted
with the engine's tokenizer (summed over the inputs).  Vectors are deterministic
(:func:`embedding_vector`: the same input, the same unit vector), of
:data:`DEFAULT_DIMENSIONS` or ``dimensions`` floats, as a list or, with
``encoding_format: "base64"`` (the OpenAI SDK's default), little-endian float32 in base64.
A client that hangs up aborts the request's sequences at once.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

import orjson

from velvetrope.engine.serve.engine_request import EngineClosed, EngineRequest
from velvetrope.engine.serve.progress import EngineEndpoint, unavailable, until_done
from velvetrope.engine.serve.realtime import RealtimeEngine
from velvetrope.errors import PolicyError, RequestError
from velvetrope.openai.embeddings import count_input_tokens, parse_embeddings
from velvetrope.openai.errors import above_maximum, model_not_found
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["DEFAULT_DIMENSIONS", "MAX_DIMENSIONS", "EmbeddingServer", "embedding_vector"]

DEFAULT_DIMENSIONS = 64
"""The length of a vector when the request names no ``dimensions``."""

MAX_DIMENSIONS = 4096
"""The longest vector the engine writes."""


def embedding_vector(key: bytes, dimensions: int) -> list[float]:
    """A unit vector of ``dimensions`` floats determined by ``key`` (an input's bytes):
    float32-exact, so its base64 form decodes to the same numbers."""
    raw = hashlib.shake_256(key).digest(4 * dimensions)
    ints = struct.unpack(f"<{dimensions}I", raw)
    v = [i / 2147483648.0 - 1.0 for i in ints]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    fmt = f"<{dimensions}f"
    return list(struct.unpack(fmt, struct.pack(fmt, *(x / norm for x in v))))


def _key(p: str | list[int]) -> bytes:
    return p.encode("utf-8", "surrogatepass") if isinstance(p, str) else orjson.dumps(p)


class EmbeddingServer(EngineEndpoint):
    """The handler of ``/v1/embeddings`` (see :class:`EngineEndpoint` for its parts)."""

    async def handle(self, raw: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """Answer one request (``arrived``: when it reached the server); raises
        :class:`~velvetrope.errors.RequestError` for the app to answer."""
        req = parse_embeddings(raw)
        if req.model != self.model:
            raise model_not_found(req.model)
        dims = req.dimensions or DEFAULT_DIMENSIONS
        if dims > MAX_DIMENSIONS:
            raise above_maximum("dimensions", dims, MAX_DIMENSIONS)
        counts = self.fitting(count_input_tokens(req, self.tokenizer.count), "input", "input")
        if self.stopping():
            raise unavailable()
        rid = f"embd-{next(self._ids)}"
        total = sum(counts)
        if not await self.prefill(rid, counts, req.body, arrived, receive):
            return  # the client left: nothing to answer
        data = []
        for i, p in enumerate(req.inputs):
            v = embedding_vector(_key(p), dims)
            emb: list[float] | str = v
            if req.encoding_format == "base64":
                emb = base64.b64encode(struct.pack(f"<{dims}f", *v)).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        body = {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }
        await respond(send, 200, orjson.dumps(body))

    def fitting(self, counts: list[int], what: str, param: str | None) -> list[int]:
        """``counts`` (each prefill's tokens), once each fits ``max_model_len``: else a 400
        ``context_length_exceeded`` naming the ``what`` (``input``, ``pair``) that does not."""
        mml = self.max_model_len
        for i, n in enumerate(counts):
            if n > mml:
                raise RequestError(
                    f"This model's maximum context length is {mml} tokens. However, {what} "
                    f"{i} resulted in {n} tokens. Please reduce its length.",
                    code="context_length_exceeded",
                    param=param,
                )
        return counts

    async def prefill(
        self, rid: str, counts: list[int], body: dict[str, Any], arrived: float, receive: Receive
    ) -> bool:
        """Run one prefill-only sequence per entry of ``counts`` (its prompt tokens) to its
        first token (instant mode: nothing to run); ``False`` if the client left first.
        ``body``'s ``request_id`` names it in the journal, its ``priority`` (vLLM's) orders
        it in a priority-scheduled engine."""
        total = sum(counts)
        request_id = body.get("request_id")
        named = request_id if isinstance(request_id, str) else None  # vLLM's, for the journal
        self.load.begin(rid, named, arrived, total, False)
        rs: list[EngineRequest] = []
        try:
            if self.engine is not None:
                priority = body.get("priority")
                prio = priority if type(priority) is int else 0
                rs = self._submit(self.engine, rid, counts, prio, arrived)
                return await self._prefilled(self.engine, rs, receive)
            return True
        finally:
            if self.engine is None:
                self.load.end_instant(rid, total, 0)
            else:
                for r in rs:
                    self.engine.abort(r)  # no-op unless leaving early
                self.load.end(rid, total, rs)

    def _submit(
        self, engine: RealtimeEngine, rid: str, counts: list[int], priority: int, arrived: float
    ) -> list[EngineRequest]:
        """One prefill-only sequence per input (its first token ends it), all or none."""
        rs: list[EngineRequest] = []
        try:
            for i, n in enumerate(counts):
                rs.append(engine.submit(f"{rid}.{i}", n, 1, priority=priority, arrived_at=arrived))
        except PolicyError as exc:
            for r in rs:
                engine.abort(r)
            raise RequestError(str(exc), param="input") from None
        except EngineClosed:
            raise unavailable() from None
        return rs

    async def _prefilled(
        self, engine: RealtimeEngine, rs: list[EngineRequest], receive: Receive
    ) -> bool:
        """Wait for every sequence's prefill; ``False`` if the client left first."""
        watcher = self.watch(receive, engine, rs)
        try:
            return await until_done(rs)
        finally:
            watcher.cancel()
