"""``velvetrope engine``: an OpenAI-compatible server in front of the simulated engine.

A raw ASGI app (:class:`EngineApp`), served by :mod:`.server` (uvicorn, uvloop,
httptools).  Behind it a :class:`~velvetrope.engine.serve.realtime.RealtimeEngine` steps a
:class:`~velvetrope.engine.batcher.Batcher` in real time at ``speed`` K (K times faster
than real time); with ``speed = inf`` (``--instant``) there is no model time at all and
every answer is written at once (the fast upstream of the gateway throughput benchmark).

Endpoints
---------
``POST /v1/completions``, ``POST /v1/chat/completions``
    OpenAI's request and response bodies, streaming (server-sent events ``data: {...}``,
    one chunk per generated token, ending with ``data: [DONE]``) or not.  Honoured fields:
    ``model`` (must be the served name, else 404 ``model_not_found``), ``prompt`` (a string,
    a list of token ids, or a one-element list of either) or ``messages``, ``max_tokens``
    (completions default 16, like OpenAI; chat also takes ``max_completion_tokens``;
    without one a chat may use the rest of the context), ``stream``,
    ``stream_options.include_usage`` (then every chunk carries ``"usage": null`` and a
    last chunk with empty ``choices`` carries the usage, as OpenAI does), ``n`` (1 to 16
    choices, as vLLM runs them: ``n`` sequences in the batcher, each with its own output
    draw; chunks carry their choice's ``index``; usage counts the prompt once and the
    completion tokens of every choice), vLLM's ``ignore_eos`` (generate exactly
    ``max_tokens``) and ``priority`` (used when the engine runs with
    ``scheduling="priority"``; lower is served first; run FCFS, the engine answers a
    nonzero one on any endpoint with vLLM's 400 "Got priority N but Priority scheduling
    is not enabled.").  Sampling
    fields (temperature, stop, logprobs, ...) are accepted and ignored.
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

Generated text
--------------
Prompt tokens are counted with the configured
:class:`~velvetrope.openai.tokenizer.Tokenizer` (at least 1, like the BOS token a real
engine adds).  The output length is decided up front by the
:class:`~velvetrope.engine.outputs.OutputPolicy` (deterministic per prompt and choice).
The text is deterministic filler (:mod:`.bodies`).

Prefix caching
--------------
With a profile that enables automatic prefix caching (``--set enable_prefix_caching=true``),
each prompt is hashed into the engine's blocks (``block_size`` tokens of the tokenizer's
characters a block, :func:`~velvetrope.openai.prefix.prefix_hashes`; chained, so a block
is shared exactly when every byte before it is), and the batcher reuses the blocks an
earlier request computed: requests that share a system prompt hit, and the hits appear in
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` and in chat and
completions usage as ``prompt_tokens_details.cached_tokens`` (as vLLM's).

Extension: the model's own predictions
--------------------------------------
The non-streaming body, and the final usage chunk of a stream (only sent with
``stream_options.include_usage``), carry an extra top-level field::

    "velvetrope": {"model_queue_s": 0.0, "model_ttft_s": 0.041, "model_e2e_s": 3.2}

the queue time (arrival to first scheduled), time to first token and end-to-end latency
that the engine model predicted for this request (with ``n > 1``: the first choice
scheduled, the first token of any choice, the last choice to finish), in **wall
seconds** (model seconds divided by ``speed``), measured from the moment the request
reached the server (its parsing and tokenization count as queueing, as in a real engine).
A benchmark compares them with what it measured.  All zeros in instant mode.

Injected faults
---------------
With ``faults`` on (``velvetrope engine --faults``; off by default), a completion request
whose body carries ``"velvetrope_fault": STATUS`` (an integer from 400 to 599) is answered
with that status in OpenAI's error shape after it was parsed and before any work, as a
request that makes a real engine fail would be (e.g. ``500`` ``internal_error``).  Tests and
the chaos harness use it to try the gateway's handling of an engine's errors.

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

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from velvetrope.clock import Clock, SystemClock
from velvetrope.engine.batcher import Batcher
from velvetrope.engine.outputs import OutputDecision, OutputPolicy
from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.serve.bodies import Completion, StreamWriter, full_body
from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.messages import MessagesServer
from velvetrope.engine.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from velvetrope.engine.serve.metrics import EngineMetrics
from velvetrope.engine.serve.pairs import PairsServer
from velvetrope.engine.serve.progress import progress, until_done, watch_disconnect
from velvetrope.engine.serve.realtime import EngineClosed, EngineRequest, RealtimeEngine
from velvetrope.engine.serve.responses import ResponsesServer
from velvetrope.engine.serve.tokenize import TokenizeServer
from velvetrope.errors import ClientDisconnected, ConfigError, PolicyError, RequestError
from velvetrope.openai.errors import error_json, invalid_value, model_not_found
from velvetrope.openai.prefix import CHARS_PER_TOKEN, prefix_hashes
from velvetrope.openai.request import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    CompletionRequest,
    Kind,
    count_prompt_tokens,
    parse,
)
from velvetrope.openai.sse import SSE_HEADERS, error_event
from velvetrope.openai.tokenizer import ApproxTokenizer, Tokenizer, get_tokenizer
from velvetrope.serving.asgi import (
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    serve_lifespan,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "EngineApp", "EngineConfig"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Request bodies above this many bytes get 413 (an 8,192-token prompt is ~35 kB)."""


# -- configuration --------------------------------------------------------------------------


def _default_tokenizer() -> Tokenizer:
    return get_tokenizer("cl100k_base")


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine server needs.

    ``speed`` is K (model seconds per wall second); ``math.inf`` means instant mode.
    ``scheduling`` is vLLM's ``--scheduling-policy`` (``fcfs`` or ``priority``).
    """

    profile: EngineProfile
    speed: float = 1.0
    model_name: str = "velvetrope-sim"
    tokenizer: Tokenizer = field(default_factory=_default_tokenizer)
    outputs: OutputPolicy = field(default_factory=OutputPolicy)
    scheduling: Literal["fcfs", "priority"] = "fcfs"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    faults: bool = False
    """Answer a body's ``velvetrope_fault`` status (see the module's docstring)."""
    metrics_dialect: str = "vllm"
    """Whose metric names ``/metrics`` speaks (:data:`~velvetrope.engine.serve.metrics.
    DIALECTS`); ``none``: no ``/metrics`` route (404)."""
    journal: str | None = None
    """A file to append each request's start and end to
    (:mod:`velvetrope.engine.serve.journal`)."""
    api_key: str | None = None
    """Required as ``Authorization: Bearer KEY`` on ``/v1/`` routes (see the module's
    docstring)."""
    health_route: bool = True
    """Serve ``GET /health`` (``False``: 404, an engine without one)."""

    def __post_init__(self) -> None:
        if not (self.speed > 0 and not math.isnan(self.speed)):
            raise ConfigError(f"engine speed must be positive (or inf), got {self.speed!r}")
        if self.scheduling not in ("fcfs", "priority"):
            raise ConfigError(
                f"engine scheduling must be 'fcfs' or 'priority', got {self.scheduling!r}"
            )
        if not self.model_name:
            raise ConfigError("engine model name must not be empty")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")

    @property
    def instant(self) -> bool:
        """Zero model time: every answer is written at once."""
        return self.speed == math.inf


# -- the app ------------------------------------------------------------------------------------


class _InstantStats:
    """Gauges and counters of instant mode (no batcher)."""

    __slots__ = ("generation_tokens_total", "in_flight", "prompt_tokens_total")

    def __init__(self) -> None:
        self.in_flight = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @property
    def num_running(self) -> int:
        return self.in_flight

    @property
    def num_waiting(self) -> int:
        return 0

    @property
    def kv_usage(self) -> float:
        return 0.0

    @property
    def num_preemptions(self) -> int:
        return 0


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
        self._model_json = orjson.dumps(config.model_name)
        self._tok = config.tokenizer
        tok = config.tokenizer
        self._cpt = tok.chars_per_token if isinstance(tok, ApproxTokenizer) else CHARS_PER_TOKEN
        self._outputs = config.outputs
        self._speed = config.speed
        self._clock: Clock = SystemClock()
        self.load = RequestLoad(self._clock, config.journal)
        self._instant_stats: _InstantStats | None = None
        self._engine: RealtimeEngine | None = None
        if config.instant:
            self._instant_stats = _InstantStats()
            self.metrics = EngineMetrics(
                config.model_name, self._instant_stats, config.metrics_dialect, self.load
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
        self._watchers: set[asyncio.Task[None]] = set()
        p = config.profile
        parts = (self._model, tok, p.max_model_len, self._outputs, self._engine, self.load)
        self._responses = ResponsesServer(*parts, self._is_stopping)
        self._messages = MessagesServer(*parts, self._is_stopping)
        pairs = PairsServer(
            self._model, tok, p.max_model_len, self._engine, self.load, self._is_stopping
        )
        tok_server = TokenizeServer(self._model, tok, p.max_model_len)
        self._routes: dict[str, tuple[str, Callable[..., Awaitable[None]]]] = {
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat),
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

    def _unavailable(self) -> RequestError:
        return RequestError("The engine is shutting down.", status=503, code="engine_unavailable")

    def _authorize(self, scope: Scope) -> None:
        """Raise 401 unless the request carries the engine's API key."""
        for name, value in scope["headers"]:
            if name == b"authorization" and value == self._auth:
                return
        raise RequestError("Incorrect or missing API key.", status=401, code="invalid_api_key")

    async def _health(self, send: Send) -> None:
        if self._stopping or (self._engine is not None and not self._engine.running):
            raise self._unavailable()
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
        await _send_json(send, 200, body)

    async def _metrics(self, send: Send) -> None:
        headers = [(b"content-type", METRICS_CONTENT_TYPE.encode())]
        await respond(send, 200, self.metrics.render(), headers)

    # -- POST endpoints ---------------------------------------------------------------------

    async def _chat(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        await self._complete("chat", body, arrived, receive, send)

    async def _completions(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        await self._complete("completions", body, arrived, receive, send)

    async def _complete(
        self, kind: Kind, body: bytes, arrived: float, receive: Receive, send: Send
    ) -> None:
        req = parse(body, kind)
        if self.config.faults:
            _inject_fault(body)
        if req.model != self._model:
            raise model_not_found(req.model)
        key: bytes
        if kind == "chat":
            key = orjson.dumps(req.messages)
        else:
            if len(req.prompts) > 1:
                raise invalid_value(
                    "prompt", "Batched prompts are not supported: send one prompt per request."
                )
            (prompt,) = req.prompts
            key = (
                prompt.encode("utf-8", "surrogatepass")
                if isinstance(prompt, str)
                else orjson.dumps(prompt)
            )
        prompt_tokens = count_prompt_tokens(req, self._tok.count, self._tok.count_chat)
        choices = self._decide(req, prompt_tokens, key)
        c = Completion.new(
            kind == "chat",
            prompt_tokens,
            choices,
            req.stream,
            req.include_usage,
            req.priority or 0,
            arrived,
        )
        request_id = req.body.get("request_id")  # vLLM's: the caller's id, for the journal
        c.request_id = request_id if isinstance(request_id, str) else None
        if self._profile.enable_prefix_caching:  # the prompt's blocks, for its prefix cache
            bs = self._profile.block_size
            c.block_ids = prefix_hashes(req.body, bs, prompt_tokens // bs, self._cpt)
            c.block_tokens = bs
        await self._run(c, receive, send)

    def _decide(
        self, req: CompletionRequest, prompt_tokens: int, key: bytes
    ) -> tuple[OutputDecision, ...]:
        """One output decision per choice (choice 0 keyed by the prompt alone, so ``n=1``
        answers as it always did; choice ``i`` by the prompt and ``i``)."""
        what = "messages" if req.kind == "chat" else "prompt"
        max_tokens = req.max_tokens
        if max_tokens is None and req.kind == "completions":
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        mml = self._profile.max_model_len
        room = mml - prompt_tokens
        if max_tokens is None:
            if room < 1:
                raise RequestError(
                    f"This model's maximum context length is {mml} tokens. However, your "
                    f"{what} resulted in {prompt_tokens} tokens, which leaves no room for a "
                    f"completion. Please reduce the length of the {what}.",
                    code="context_length_exceeded",
                    param=what,
                )
            cap = room
        else:
            if max_tokens > room:
                raise RequestError(
                    f"This model's maximum context length is {mml} tokens. However, you "
                    f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                    f"{what}, {max_tokens} in the completion). Please reduce the length of "
                    f"the {what} or completion.",
                    code="context_length_exceeded",
                    param=what,
                )
            cap = max_tokens
        return tuple(
            self._outputs.decide(
                key if i == 0 else key + b"\x00" + str(i).encode(), cap, ignore_eos=req.ignore_eos
            )
            for i in range(req.n)
        )

    # -- generation -------------------------------------------------------------------------

    async def _run(self, c: Completion, receive: Receive, send: Send) -> None:
        if self._stopping:
            raise self._unavailable()
        if self._engine is None:
            await self._run_instant(c, send)
        else:
            await self._run_realtime(self._engine, c, receive, send)

    async def _run_instant(self, c: Completion, send: Send) -> None:
        stats = self._instant_stats
        assert stats is not None
        stats.in_flight += len(c.choices)
        self.load.begin(c.rid, c.request_id, c.arrived, c.prompt_tokens, c.stream)
        try:
            stats.prompt_tokens_total += c.prompt_tokens * len(c.choices)
            stats.generation_tokens_total += c.completion_tokens
            for _ in c.choices:
                self.metrics.observe_request(0.0, 0.0, 0.0)
            ext = {"model_queue_s": 0.0, "model_ttft_s": 0.0, "model_e2e_s": 0.0}
            if c.stream:
                w = StreamWriter(c, self._model_json)
                body = b"".join(
                    w.tokens(i, 0, d.tokens, True) for i, d in enumerate(c.choices)
                ) + w.end(ext)
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                await send({"type": "http.response.body", "body": body, "more_body": False})
            else:
                await _send_json(send, 200, full_body(c, self._model, ext))
        finally:
            stats.in_flight -= len(c.choices)
            self.load.end_instant(c.rid, c.prompt_tokens * len(c.choices), c.completion_tokens)

    def _ext(self, rs: Sequence[EngineRequest]) -> dict[str, float]:
        """The model's predictions in wall seconds: the first choice scheduled, the first
        token of any choice, the last choice finished."""
        k = self._speed
        return {
            "model_queue_s": min(r.model_queue_s or 0.0 for r in rs) / k,
            "model_ttft_s": min(r.model_ttft_s or 0.0 for r in rs) / k,
            "model_e2e_s": max(r.model_e2e_s or 0.0 for r in rs) / k,
        }

    def _submit(self, engine: RealtimeEngine, c: Completion) -> list[EngineRequest]:
        """One sequence per choice, all or none."""
        rs: list[EngineRequest] = []
        try:
            for i, d in enumerate(c.choices):
                sid = c.rid if i == 0 else f"{c.rid}.{i}"
                rs.append(
                    engine.submit(
                        sid,
                        c.prompt_tokens,
                        d.tokens,
                        priority=c.priority,
                        arrived_at=c.arrived,
                        block_ids=c.block_ids,
                        block_tokens=c.block_tokens,
                    )
                )
        except PolicyError as exc:  # pre-checked: a duplicate id or a profile limit
            for r in rs:
                engine.abort(r)
            raise RequestError(str(exc), param="prompt") from None
        except EngineClosed:
            raise self._unavailable() from None
        return rs

    async def _run_realtime(
        self, engine: RealtimeEngine, c: Completion, receive: Receive, send: Send
    ) -> None:
        rs = self._submit(engine, c)
        self.load.begin(c.rid, c.request_id, c.arrived, c.prompt_tokens, c.stream)
        watcher = asyncio.create_task(watch_disconnect(receive, engine, rs))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        try:
            if c.stream:
                await self._stream(c, rs, send)
            else:
                if await until_done(rs):
                    self._cached(c, rs)
                    await _send_json(send, 200, full_body(c, self._model, self._ext(rs)))
        finally:
            for r in rs:
                engine.abort(r)  # no-op unless the handler is leaving early
            watcher.cancel()
            self.load.end(c.rid, c.prompt_tokens, rs)

    def _cached(self, c: Completion, rs: Sequence[EngineRequest]) -> None:
        """With prefix caching on, set ``c``'s cached prompt tokens (its first choice's, the
        prompt being counted once) for its usage."""
        if self._profile.enable_prefix_caching:
            c.cached_tokens = rs[0].cached_tokens

    async def _stream(self, c: Completion, rs: Sequence[EngineRequest], send: Send) -> None:
        w = StreamWriter(c, self._model_json)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        sent = [0] * len(rs)
        left = len(rs)
        try:
            async with contextlib.aclosing(progress(rs)) as tokens:
                async for i, n in tokens:
                    r = rs[i]
                    last = r.finished and r.pending_tokens == 0
                    body = w.tokens(i, sent[i], n, last)
                    sent[i] += n
                    left -= last
                    if left == 0:
                        self._cached(c, rs)
                        body += w.end(self._ext(rs))
                    await send({"type": "http.response.body", "body": body, "more_body": left > 0})
        except EngineClosed as exc:
            end = error_event(503, str(exc), "engine_unavailable")
            await send({"type": "http.response.body", "body": end, "more_body": False})


async def _send_json(
    send: Send,
    status: int,
    body: Mapping[str, Any],
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await respond(send, status, orjson.dumps(body), extra_headers)


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


def _inject_fault(body: bytes) -> None:
    """Raise the :class:`RequestError` a body's ``velvetrope_fault`` asks for, if any."""
    status = orjson.loads(body).get("velvetrope_fault")
    if status is None:
        return
    if type(status) is not int or not 400 <= status <= 599:
        raise invalid_value(
            "velvetrope_fault", "velvetrope_fault must be an HTTP status, 400 to 599."
        )
    code = "internal_error" if status == 500 else f"injected_{status}"
    raise RequestError(f"Injected fault: {status}.", status=status, code=code)
