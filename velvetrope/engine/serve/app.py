"""``velvetrope engine``: an OpenAI-compatible server in front of the simulated engine.

A raw ASGI app (:class:`EngineApp`, made from an
:class:`~velvetrope.engine.serve.engine_config.EngineConfig`), served by :mod:`.server`
(uvicorn, uvloop, httptools).  Behind it a
:class:`~velvetrope.engine.serve.realtime.RealtimeEngine` steps a
:class:`~velvetrope.engine.batcher.Batcher` in real time at ``speed`` K (K times faster
than real time); with ``speed = inf`` (``--instant``) there is no model time at all and
every answer is written at once (the fast upstream of the gateway throughput benchmark).

Endpoints
---------
``POST /v1/completions``, ``POST /v1/chat/completions``
    OpenAI's request and response bodies, streaming or not (see :mod:`.completions`: the
    fields honoured, the generated text, prefix caching, the model's own predictions and
    injected faults).  Run FCFS, the engine answers a nonzero ``priority`` on any endpoint
    with vLLM's 400 "Got priority N but Priority scheduling is not enabled.".
``POST /v1/embeddings``
    Prompt-only work: one prefill per input, usage ``prompt_tokens`` (see
    :mod:`.embeddings`).
``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``
    OpenAI's Responses API, streaming or not (see :mod:`.responses`).
``POST /v1/rerank``, ``POST /rerank``, ``POST /v1/score``
    A reranker's work, prompt-only: one prefill per (query, document) pair (see
    :mod:`.pairs`).
``POST /v1/messages``, ``POST /v1/messages/count_tokens``
    Anthropic's Messages API, streaming or not (see :mod:`.messages`).
``POST /tokenize``, ``POST /detokenize``
    vLLM's shapes, the count by the engine's tokenizer (see :mod:`.tokenize`).
``GET /v1/models``
    The one served model, with its ``max_model_len``.
``GET /health``
    200 with an empty body while the engine runs (vLLM's behaviour); 503 once it stops.
    Absent (404) with ``health_route=False``: an engine with no such route.
``GET /metrics``
    Prometheus text with vLLM's metric names (:mod:`velvetrope.engine.serve.metrics`), or
    another engine's (``metrics_dialect``); absent (404) with ``metrics_dialect="none"``.
    With vLLM's, also the requests held now and at most
    (:mod:`velvetrope.engine.serve.journal`, which with ``EngineConfig.journal`` also writes
    each request's start and end to a file).

API key
-------
With ``api_key`` set (``velvetrope engine --api-key``, as vLLM's ``--api-key``), every
``/v1/`` route answers 401 ``invalid_api_key`` unless the request carries
``Authorization: Bearer KEY``; ``/health`` and ``/metrics`` stay open.

Errors
------
OpenAI's shape ``{"error": {"message", "type", "code", "param"}}``, built by
:mod:`velvetrope.openai` (the gateway's messages for the same mistakes): 400 for malformed
JSON, a body that is not an object, wrong types, missing fields and unsupported values
(a batched prompt); 400
``context_length_exceeded`` when prompt (+ ``max_tokens``) exceeds ``max_model_len``; 404
unknown model or path; 405 wrong method; 413 body larger than ``max_body_bytes``; 503 while
the engine is stopping.  A stream cut by the engine stopping ends with
``data: {"error": ...}``.

Disconnects
-----------
A client that goes away (before its first token or mid-stream, streaming or not) aborts
its sequences at once: their KV blocks are free before the next engine step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import orjson

from velvetrope.clock import Clock, SystemClock
from velvetrope.engine.batcher import Batcher
from velvetrope.engine.serve.completions import CompletionsServer, InstantStats
from velvetrope.engine.serve.engine_config import EngineConfig
from velvetrope.engine.serve.engine_request import EngineRequest
from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.messages import MessagesServer
from velvetrope.engine.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from velvetrope.engine.serve.metrics import EngineMetrics
from velvetrope.engine.serve.pairs import PairsServer
from velvetrope.engine.serve.progress import unavailable
from velvetrope.engine.serve.realtime import RealtimeEngine
from velvetrope.engine.serve.responses import ResponsesServer
from velvetrope.engine.serve.tokenize import TokenizeServer
from velvetrope.errors import ClientDisconnected, RequestError
from velvetrope.openai.errors import error_json, invalid_value
from velvetrope.serving.asgi import (
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    serve_lifespan,
)

__all__ = ["EngineApp"]

log = logging.getLogger(__name__)


class EngineApp:
    """The ASGI application (see the module docstring).

    :meth:`startup` must run in the serving loop before requests arrive (the ASGI lifespan
    protocol does it; so does :func:`~velvetrope.engine.serve.server.serve_engine`);
    :meth:`shutdown` stops the engine, ending every stream.  Both are idempotent.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._profile = config.profile
        self._model = config.model_name
        tok = config.tokenizer
        self._clock: Clock = SystemClock()
        self.load = RequestLoad(self._clock, config.journal)
        instant_stats: InstantStats | None = None
        self._engine: RealtimeEngine | None = None
        if config.instant:
            instant_stats = InstantStats()
            self.metrics = EngineMetrics(
                config.model_name, instant_stats, config.metrics_dialect, self.load
            )
        else:
            priority = config.scheduling == "priority"
            self._engine = RealtimeEngine(
                Batcher(config.profile, priority=priority),
                speed=config.speed,
                clock=self._clock,
                priority=priority,
                on_finish=self._observe,
            )
            self.metrics = EngineMetrics(
                config.model_name, self._engine, config.metrics_dialect, self.load
            )
        self._created = int(time.time())
        self._started = False
        self._stopping = False
        p = config.profile
        completions = CompletionsServer(
            config, self._engine, instant_stats, self.load, self.metrics, self._is_stopping
        )
        parts = (self._model, tok, p.max_model_len, config.outputs, self._engine, self.load)
        self._responses = ResponsesServer(*parts, self._is_stopping)
        self._messages = MessagesServer(*parts, self._is_stopping)
        pairs = PairsServer(
            self._model, tok, p.max_model_len, self._engine, self.load, self._is_stopping
        )
        tok_server = TokenizeServer(self._model, tok, p.max_model_len)
        self._routes: dict[str, tuple[str, Callable[..., Awaitable[None]]]] = {
            "/v1/completions": ("POST", completions.completions),
            "/v1/chat/completions": ("POST", completions.chat),
            "/v1/models": ("GET", self._models),
            "/v1/embeddings": ("POST", pairs.handle),
            "/v1/rerank": ("POST", pairs.rerank),
            "/rerank": ("POST", pairs.rerank),
            "/v1/score": ("POST", pairs.score),
            "/v1/responses": ("POST", self._responses.handle),
            "/v1/messages": ("POST", self._messages.handle),
            "/v1/messages/count_tokens": ("POST", self._messages.count_tokens),
            "/tokenize": ("POST", tok_server.tokenize),
            "/detokenize": ("POST", tok_server.detokenize),
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
        }
        if config.metrics_dialect == "none":
            del self._routes["/metrics"]
        if not config.health_route:
            del self._routes["/health"]
        self._auth = None if config.api_key is None else b"Bearer " + config.api_key.encode()

    def _is_stopping(self) -> bool:
        return self._stopping

    @property
    def engine(self) -> RealtimeEngine | None:
        """The real-time driver (``None`` in instant mode)."""
        return self._engine

    # -- lifecycle --------------------------------------------------------------------------

    async def startup(self) -> None:
        """Start the engine driver in the running loop."""
        if self._started:
            return
        self._started = True
        if self._engine is not None:
            await self._engine.start()

    async def shutdown(self) -> None:
        """Stop the engine: every live request is closed (streams end with an error)."""
        self._stopping = True
        if self._engine is not None:
            await self._engine.stop("the engine is shutting down")
        self.load.close()

    def _observe(self, r: EngineRequest) -> None:
        a = r.arrival_wall
        s = r.scheduled_wall if r.scheduled_wall is not None else a
        f = r.first_token_wall if r.first_token_wall is not None else a
        e = r.finished_wall if r.finished_wall is not None else a
        self.metrics.observe_request(s - a, f - a, e - a)

    # -- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send, self.startup, self.shutdown)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = self._clock.now()
        route = self._routes.get(scope["path"]) or self._responses.route(
            scope["path"], scope["method"]
        )
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            if route is None:
                raise RequestError(f"Unknown path {scope['path']!r}.", status=404, code="not_found")
            method, handler = route
            if self._auth is not None and scope["path"].startswith("/v1/"):
                self._authorize(scope)
            if scope["method"] != method:
                raise RequestError(
                    f"Method {scope['method']} is not allowed on {scope['path']}; use {method}.",
                    status=405,
                    code="method_not_allowed",
                )
            if method == "POST":
                body = await read_body(scope, receive, self.config.max_body_bytes)
                if self.config.scheduling == "fcfs" and b'"priority"' in body:
                    _refuse_priority(body)
                await handler(body, arrived, receive, tracked_send)
            else:
                await handler(tracked_send)
        except ClientDisconnected:
            return
        except RequestError as exc:
            if not started:
                await _send_error(send, exc)
        except Exception:  # never a stack trace to the client: log it, answer 500
            log.exception("engine request failed")
            if not started:
                await _send_error(
                    send,
                    RequestError(
                        "The engine failed to handle the request.",
                        status=500,
                        code="internal_error",
                    ),
                )

    # -- GET endpoints ----------------------------------------------------------------------

    def _authorize(self, scope: Scope) -> None:
        """Raise 401 unless the request carries the engine's API key."""
        for name, value in scope["headers"]:
            if name == b"authorization" and value == self._auth:
                return
        raise RequestError("Incorrect or missing API key.", status=401, code="invalid_api_key")

    async def _health(self, send: Send) -> None:
        if self._stopping or (self._engine is not None and not self._engine.running):
            raise unavailable()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def _models(self, send: Send) -> None:
        body = {
            "object": "list",
            "data": [
                {
                    "id": self._model,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "velvetrope",
                    "root": self._model,
                    "parent": None,
                    "max_model_len": self._profile.max_model_len,
                }
            ],
        }
        await respond(send, 200, orjson.dumps(body))

    async def _metrics(self, send: Send) -> None:
        headers = [(b"content-type", METRICS_CONTENT_TYPE.encode())]
        await respond(send, 200, self.metrics.render(), headers)


def _refuse_priority(body: bytes) -> None:
    """As vLLM run FCFS: a nonzero ``priority`` is a 400 (0, null or a body that is not
    JSON pass on to the endpoint, which says what else is wrong)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    p = obj.get("priority") if isinstance(obj, dict) else None
    if isinstance(p, int) and not isinstance(p, bool) and p != 0:
        raise invalid_value("priority", f"Got priority {p} but Priority scheduling is not enabled.")


async def _send_error(send: Send, exc: RequestError) -> None:
    extra = [(b"connection", b"close")] if exc.status == 413 else []
    await respond(send, exc.status, error_json(exc), extra)
