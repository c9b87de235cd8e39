"""``velvetrope engine``: an OpenAI-compatible server in front of the simulated engine.

A raw ASGI app (:class:`EngineApp`) served by uvicorn with uvloop and httptools.  Behind it
a :class:`~velvetrope.engine.realtime.RealtimeEngine` steps a
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
    last chunk with empty ``choices`` carries the usage, as OpenAI does), ``n`` (only 1),
    vLLM's ``ignore_eos`` (generate exactly ``max_tokens``) and ``priority`` (used when
    the engine runs with ``scheduling="priority"``; lower is served first).  Sampling
    fields (temperature, stop, logprobs, ...) are accepted and ignored.
``GET /v1/models``
    The one served model, with its ``max_model_len``.
``GET /health``
    200 with an empty body while the engine runs (vLLM's behaviour); 503 once it stops.
``GET /metrics``
    Prometheus text with vLLM's metric names (:mod:`velvetrope.engine.metrics`).

Generated text
--------------
Prompt tokens are counted with the configured :class:`~velvetrope.tokenizer.Tokenizer`
(at least 1, like the BOS token a real engine adds).  The output length is decided up
front by the :class:`~velvetrope.engine.outputs.OutputPolicy` (deterministic per prompt).
The text is deterministic filler: one common English word, with a leading space, per
generated token (:data:`FILLER_WORDS`, each exactly one ``cl100k_base`` token, so counting
the returned text with that encoding gives ``completion_tokens`` back).

Extension: the model's own predictions
--------------------------------------
The non-streaming body, and the final usage chunk of a stream (only sent with
``stream_options.include_usage``), carry an extra top-level field::

    "velvetrope": {"model_queue_s": 0.0, "model_ttft_s": 0.041, "model_e2e_s": 3.2}

the queue time (arrival to first scheduled), time to first token and end-to-end latency
that the engine model predicted for this request, in **wall seconds** (model seconds
divided by ``speed``), measured from the moment the request reached the server (its
parsing and tokenization count as queueing, as in a real engine).  A benchmark compares
them with what it measured.  All zeros in instant mode.

Errors
------
OpenAI's shape ``{"error": {"message", "type", "code", "param"}}``: 400 for malformed JSON,
a body that is not an object, wrong types, missing fields and unsupported values; 400
``context_length_exceeded`` when prompt (+ ``max_tokens``) exceeds ``max_model_len``; 404
unknown model or path; 405 wrong method; 413 body larger than ``max_body_bytes``; 503 while
the engine is stopping.  A stream cut by the engine stopping ends with
``data: {"error": ...}``.

Disconnects
-----------
A client that goes away (before its first token or mid-stream, streaming or not) aborts
its sequence at once: its KV blocks are free before the next engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import uvicorn

from velvetrope.asgi import Message, Receive, Scope, Send, read_body, respond, serve_lifespan
from velvetrope.clock import Clock, SystemClock
from velvetrope.engine.batcher import Batcher
from velvetrope.engine.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from velvetrope.engine.metrics import EngineMetrics
from velvetrope.engine.outputs import OutputDecision, OutputPolicy
from velvetrope.engine.profile import EngineProfile, load_profile
from velvetrope.engine.realtime import EngineClosed, EngineRequest, RealtimeEngine
from velvetrope.errors import ClientDisconnected, ConfigError, PolicyError, RequestError
from velvetrope.tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "FILLER_WORDS",
    "EngineApp",
    "EngineConfig",
    "filler_text",
    "run_engine",
    "serve_engine",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Request bodies above this many bytes get 413 (an 8,192-token prompt is ~35 kB)."""

# fmt: off
FILLER_WORDS: tuple[str, ...] = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " with", " as", " was",
    " on", " be", " at", " by", " this", " had", " not", " are", " but", " from", " or",
    " have", " an", " they", " which", " one", " you", " were", " her", " all", " she",
    " there", " would", " their", " we", " him", " been", " has", " when", " who", " will",
    " more", " no", " if", " out", " so", " said", " what", " up", " its", " about", " into",
    " than", " them", " can", " only", " other", " new", " some", " could", " time", " these",
    " two", " may", " then", " do", " first", " any", " my", " now", " such", " like", " our",
    " over", " man", " me", " even", " most", " made", " after", " also", " did", " many",
    " before", " must", " through", " back", " years", " where", " much", " your", " way",
    " well", " down", " should", " because", " each", " just", " those", " people", " how",
    " too", " little", " state", " good", " very", " make", " world", " still", " own", " see",
    " men", " work", " long", " get", " here", " between", " both", " life", " being", " under",
    " never", " day", " same", " another", " know", " while", " last", " might", " us",
    " great", " old", " year", " off", " come", " since", " against", " go", " came", " right",
    " used", " take", " three",
)
# fmt: on
"""The filler vocabulary: 145 words, each one ``cl100k_base`` token with its leading space."""

_WORD_JSON: tuple[bytes, ...] = tuple(orjson.dumps(w) for w in FILLER_WORDS)
_STRIDE = 7  # coprime with len(FILLER_WORDS): consecutive tokens cycle through every word


def _word_index(base: int, i: int) -> int:
    return (base + i * _STRIDE) % len(FILLER_WORDS)


def filler_text(base: int, start: int, n: int) -> str:
    """Tokens ``start .. start+n-1`` of the filler text seeded by ``base``."""
    return "".join(FILLER_WORDS[_word_index(base, i)] for i in range(start, start + n))


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


# -- request parsing --------------------------------------------------------------------------


def _invalid_type(param: str, expected: str, value: object) -> RequestError:
    got = "null" if value is None else type(value).__name__
    return RequestError(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        code="invalid_type",
        param=param,
    )


def _invalid_value(param: str, message: str) -> RequestError:
    return RequestError(message, code="invalid_value", param=param)


def _missing(param: str) -> RequestError:
    return RequestError(
        f"Missing required parameter: '{param}'.", code="missing_required_parameter", param=param
    )


def _opt_bool(d: Mapping[str, Any], key: str, param: str | None = None) -> bool:
    v = d.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _invalid_type(param or key, "a boolean", v)
    return v


def _opt_int(d: Mapping[str, Any], key: str, minimum: int) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _invalid_type(key, "an integer", v)
    if v < minimum:
        raise _invalid_value(key, f"'{key}' must be >= {minimum}, got {v}.")
    return v


def _is_token_list(v: object) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
    )


@dataclass(slots=True)
class _Job:
    """A validated request, ready to run."""

    chat: bool
    rid: str
    created: int
    prompt_tokens: int
    decision: OutputDecision
    stream: bool
    include_usage: bool
    priority: int
    arrived: float
    """Clock reading when the HTTP request reached the app."""

    @classmethod
    def new(
        cls,
        chat: bool,
        prompt_tokens: int,
        decision: OutputDecision,
        stream: bool,
        include_usage: bool,
        priority: int,
        arrived: float,
    ) -> _Job:
        """A job with a fresh OpenAI-style id (``chatcmpl-...`` / ``cmpl-...``)."""
        rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()
        return cls(
            chat, rid, int(time.time()), prompt_tokens, decision, stream, include_usage,
            priority, arrived,
        )  # fmt: skip


_ROLES = frozenset({"system", "user", "assistant", "tool", "function", "developer"})


def _check_messages(messages: object) -> list[Mapping[str, Any]]:
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise _invalid_value("messages", "'messages' must contain at least one message.")
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _invalid_type(p, "an object", m)
        role = m.get("role")
        if role is None:
            raise _missing(f"{p}.role")
        if not isinstance(role, str):
            raise _invalid_type(f"{p}.role", "a string", role)
        if role not in _ROLES:
            raise _invalid_value(
                f"{p}.role", f"Invalid value for '{p}.role': {role!r} is not a known role."
            )
        content = m.get("content")
        if content is None and role != "assistant":
            raise _missing(f"{p}.content")
        if content is not None and not isinstance(content, str | list):
            raise _invalid_type(f"{p}.content", "a string or an array of parts", content)
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise _invalid_type(f"{p}.content[{j}]", "an object with a 'type'", part)
    return messages


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


_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_DONE = b"data: [DONE]\n\n"


class EngineApp:
    """The ASGI application (see the module docstring).

    :meth:`startup` must run in the serving loop before requests arrive (the ASGI lifespan
    protocol does it; so does :func:`serve_engine`); :meth:`shutdown` stops the engine,
    ending every stream.  Both are idempotent.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._profile = config.profile
        self._model = config.model_name
        self._model_json = orjson.dumps(config.model_name)
        self._tok = config.tokenizer
        self._outputs = config.outputs
        self._speed = config.speed
        self._clock: Clock = SystemClock()
        self._instant_stats: _InstantStats | None = None
        self._engine: RealtimeEngine | None = None
        if config.instant:
            self._instant_stats = _InstantStats()
            self.metrics = EngineMetrics(config.model_name, self._instant_stats)
        else:
            priority = config.scheduling == "priority"
            self._engine = RealtimeEngine(
                Batcher(config.profile, priority=priority),
                speed=config.speed,
                clock=self._clock,
                priority=priority,
                on_finish=self._observe,
            )
            self.metrics = EngineMetrics(config.model_name, self._engine)
        self._created = int(time.time())
        self._started = False
        self._stopping = False
        self._watchers: set[asyncio.Task[None]] = set()
        self._routes: dict[str, tuple[str, Callable[..., Awaitable[None]]]] = {
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
        }

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
        route = self._routes.get(scope["path"])
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            if route is None:
                raise RequestError(f"Unknown path {scope['path']!r}.", status=404, code="not_found")
            method, handler = route
            if scope["method"] != method:
                raise RequestError(
                    f"Method {scope['method']} is not allowed on {scope['path']}; use {method}.",
                    status=405,
                    code="method_not_allowed",
                )
            if method == "POST":
                body = await read_body(scope, receive, self.config.max_body_bytes)
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
                        error_type="server_error",
                    ),
                )

    # -- GET endpoints ----------------------------------------------------------------------

    async def _health(self, send: Send) -> None:
        if self._stopping or (self._engine is not None and not self._engine.running):
            raise RequestError(
                "The engine is shutting down.", status=503, code="engine_unavailable"
            )
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
        data = self.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", METRICS_CONTENT_TYPE.encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})

    # -- POST endpoints ---------------------------------------------------------------------

    def _parse_body(self, body: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RequestError(
                f"We could not parse the JSON body of your request: {exc}.", code="invalid_json"
            ) from None
        if not isinstance(data, dict):
            raise RequestError(
                "The request body must be a JSON object.", code="invalid_type", param=None
            )
        return data

    def _common(self, d: dict[str, Any]) -> tuple[bool, bool, int]:
        """Validate the fields shared by both endpoints; returns stream, usage, priority."""
        model = d.get("model")
        if model is None:
            raise _missing("model")
        if not isinstance(model, str):
            raise _invalid_type("model", "a string", model)
        stream = _opt_bool(d, "stream")
        include_usage = False
        options = d.get("stream_options")
        if options is not None:
            if not isinstance(options, dict):
                raise _invalid_type("stream_options", "an object", options)
            if not stream:
                raise _invalid_value(
                    "stream_options", "'stream_options' is only allowed when 'stream' is true."
                )
            include_usage = _opt_bool(options, "include_usage", "stream_options.include_usage")
        n = _opt_int(d, "n", 1)
        if n is not None and n != 1:
            raise _invalid_value("n", "Only n=1 is supported by the velvetrope engine.")
        priority = d.get("priority")
        if priority is None:
            priority = 0
        elif isinstance(priority, bool) or not isinstance(priority, int):
            raise _invalid_type("priority", "an integer", priority)
        if model != self._model:
            raise RequestError(
                f"The model `{model}` does not exist or you do not have access to it.",
                status=404,
                code="model_not_found",
                param="model",
            )
        return stream, include_usage, priority

    def _decide(
        self, prompt_tokens: int, max_tokens: int | None, key: bytes, d: dict[str, Any], what: str
    ) -> OutputDecision:
        ignore_eos = _opt_bool(d, "ignore_eos")
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
        return self._outputs.decide(key, cap, ignore_eos=ignore_eos)

    async def _chat(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        d = self._parse_body(body)
        messages = _check_messages(d.get("messages"))
        stream, include_usage, priority = self._common(d)
        max_tokens = _opt_int(d, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(d, "max_tokens", 1)
        prompt_tokens = max(1, self._tok.count_chat(messages))
        decision = self._decide(prompt_tokens, max_tokens, orjson.dumps(messages), d, "messages")
        job = _Job.new(True, prompt_tokens, decision, stream, include_usage, priority, arrived)
        await self._run(job, receive, send)

    async def _completions(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        d = self._parse_body(body)
        prompt = d.get("prompt")
        if prompt is None:
            raise _missing("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        key: bytes
        if isinstance(prompt, str):
            prompt_tokens = max(1, self._tok.count(prompt))
            key = prompt.encode("utf-8", "surrogatepass")
        elif _is_token_list(prompt):
            prompt_tokens = len(prompt)
            key = orjson.dumps(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            raise _invalid_value(
                "prompt", "Batched prompts are not supported: send one prompt per request."
            )
        else:
            raise _invalid_type(
                "prompt", "a string or an array of non-negative integer token ids", prompt
            )
        stream, include_usage, priority = self._common(d)
        max_tokens = _opt_int(d, "max_tokens", 1)
        if "max_tokens" not in d:
            max_tokens = 16  # OpenAI's (and vLLM's) default for completions
        decision = self._decide(prompt_tokens, max_tokens, key, d, "prompt")
        job = _Job.new(False, prompt_tokens, decision, stream, include_usage, priority, arrived)
        await self._run(job, receive, send)

    # -- generation -------------------------------------------------------------------------

    async def _run(self, job: _Job, receive: Receive, send: Send) -> None:
        if self._stopping:
            raise RequestError(
                "The engine is shutting down.", status=503, code="engine_unavailable"
            )
        if self._engine is None:
            await self._run_instant(job, send)
        else:
            await self._run_realtime(self._engine, job, receive, send)

    async def _run_instant(self, job: _Job, send: Send) -> None:
        stats = self._instant_stats
        assert stats is not None
        n = job.decision.tokens
        stats.in_flight += 1
        try:
            stats.prompt_tokens_total += job.prompt_tokens
            stats.generation_tokens_total += n
            self.metrics.observe_request(0.0, 0.0, 0.0)
            ext = {"model_queue_s": 0.0, "model_ttft_s": 0.0, "model_e2e_s": 0.0}
            if job.stream:
                w = _StreamWriter(job, self._model_json)
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                await send(
                    {
                        "type": "http.response.body",
                        "body": w.chunks(0, n, True, ext),
                        "more_body": False,
                    }
                )
            else:
                await _send_json(send, 200, self._full_body(job, ext))
        finally:
            stats.in_flight -= 1

    def _ext(self, r: EngineRequest) -> dict[str, float]:
        k = self._speed
        return {
            "model_queue_s": (r.model_queue_s or 0.0) / k,
            "model_ttft_s": (r.model_ttft_s or 0.0) / k,
            "model_e2e_s": (r.model_e2e_s or 0.0) / k,
        }

    async def _run_realtime(
        self, engine: RealtimeEngine, job: _Job, receive: Receive, send: Send
    ) -> None:
        try:
            r = engine.submit(
                job.rid,
                job.prompt_tokens,
                job.decision.tokens,
                priority=job.priority,
                arrived_at=job.arrived,
            )
        except PolicyError as exc:  # pre-checked above; a duplicate id or a profile limit
            raise RequestError(str(exc), param="prompt") from None
        except EngineClosed:
            raise RequestError(
                "The engine is not running.", status=503, code="engine_unavailable"
            ) from None
        watcher = asyncio.create_task(_watch_disconnect(receive, engine, r))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        try:
            if job.stream:
                await self._stream(job, r, send)
            else:
                try:
                    while await r.next_tokens():
                        pass
                except EngineClosed as exc:
                    raise RequestError(str(exc), status=503, code="engine_unavailable") from None
                if r.finished:
                    await _send_json(send, 200, self._full_body(job, self._ext(r)))
        finally:
            engine.abort(r)  # no-op unless the handler is leaving early
            watcher.cancel()

    async def _stream(self, job: _Job, r: EngineRequest, send: Send) -> None:
        w = _StreamWriter(job, self._model_json)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        sent = 0
        while True:
            try:
                n = await r.next_tokens()
            except EngineClosed as exc:
                await send(
                    {
                        "type": "http.response.body",
                        "body": _error_event(str(exc), "engine_unavailable"),
                        "more_body": False,
                    }
                )
                return
            if n == 0:  # aborted: the client is gone
                return
            last = r.finished and r.pending_tokens == 0
            ext = self._ext(r) if last else None
            body = w.chunks(sent, n, last, ext)
            sent += n
            await send({"type": "http.response.body", "body": body, "more_body": not last})
            if last:
                return

    def _full_body(self, job: _Job, ext: dict[str, float]) -> dict[str, Any]:
        n = job.decision.tokens
        text = filler_text(_base(job), 0, n)
        usage = {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": n,
            "total_tokens": job.prompt_tokens + n,
        }
        choice: dict[str, Any]
        if job.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": job.decision.finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": job.decision.finish_reason,
            }
            obj = "text_completion"
        return {
            "id": job.rid,
            "object": obj,
            "created": job.created,
            "model": self._model,
            "choices": [choice],
            "usage": usage,
            "velvetrope": ext,
        }


def _base(job: _Job) -> int:
    return int(job.decision.key_hash * 4294967296.0)


class _StreamWriter:
    """Pre-built byte templates for one request's SSE chunks (OpenAI's chunk format)."""

    __slots__ = ("_base", "_head", "_job", "_model", "_tail")

    def __init__(self, job: _Job, model_json: bytes) -> None:
        self._job = job
        self._model: str = orjson.loads(model_json)
        self._base = _base(job)
        usage_null = b',"usage":null' if job.include_usage else b""
        obj, piece, close = (
            (b"chat.completion.chunk", b'"delta":{"content":', b"}")
            if job.chat
            else (b"text_completion", b'"text":', b"")
        )
        self._head = (
            b'data: {"id":"' + job.rid.encode() + b'","object":"' + obj + b'","created":'
            + str(job.created).encode() + b',"model":' + model_json
            + b',"choices":[{"index":0,' + piece
        )  # fmt: skip
        self._tail = close + b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"

    def _envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        job = self._job
        d: dict[str, Any] = {
            "id": job.rid,
            "object": obj,
            "created": job.created,
            "model": self._model,
            "choices": choices,
        }
        d.update(extra)
        return b"data: " + orjson.dumps(d) + b"\n\n"

    def chunks(self, start: int, n: int, last: bool, ext: dict[str, float] | None) -> bytes:
        """SSE bytes for tokens ``start .. start+n-1``; with ``last`` also the finish chunk,
        the usage chunk (if asked for) and ``[DONE]``."""
        job = self._job
        head, tail, base = self._head, self._tail, self._base
        usage_extra: dict[str, Any] = {"usage": None} if job.include_usage else {}
        parts: list[bytes] = []
        if job.chat and start == 0:
            parts.append(
                self._envelope(
                    "chat.completion.chunk",
                    [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    **usage_extra,
                )
            )
        end = start + n
        stop_at = end - 1 if (last and not job.chat) else end
        for i in range(start, stop_at):
            parts.append(head + _WORD_JSON[_word_index(base, i)] + tail)
        if last:
            reason = job.decision.finish_reason
            if job.chat:
                parts.append(
                    self._envelope(
                        "chat.completion.chunk",
                        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}],
                        **usage_extra,
                    )
                )
            else:  # completions: the last token's chunk carries the finish reason (vLLM)
                parts.append(
                    self._envelope(
                        "text_completion",
                        [
                            {
                                "index": 0,
                                "text": FILLER_WORDS[_word_index(base, end - 1)],
                                "logprobs": None,
                                "finish_reason": reason,
                            }
                        ],
                        **usage_extra,
                    )
                )
            if job.include_usage:
                total = job.decision.tokens
                parts.append(
                    self._envelope(
                        "chat.completion.chunk" if job.chat else "text_completion",
                        [],
                        usage={
                            "prompt_tokens": job.prompt_tokens,
                            "completion_tokens": total,
                            "total_tokens": job.prompt_tokens + total,
                        },
                        velvetrope=ext or {},
                    )
                )
            parts.append(_DONE)
        return b"".join(parts)


async def _watch_disconnect(receive: Receive, engine: RealtimeEngine, r: EngineRequest) -> None:
    """Abort ``r`` as soon as the client disconnects (a no-op once it has finished)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            engine.abort(r)
            return


def _error_payload(exc: RequestError) -> dict[str, Any]:
    return {
        "error": {
            "message": exc.message,
            "type": exc.error_type,
            "code": exc.code,
            "param": exc.param,
        }
    }


def _error_event(message: str, code: str) -> bytes:
    payload = {"error": {"message": message, "type": "server_error", "code": code, "param": None}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _send_json(
    send: Send,
    status: int,
    body: Mapping[str, Any],
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await respond(send, status, orjson.dumps(body), extra_headers)


async def _send_error(send: Send, exc: RequestError) -> None:
    extra = [(b"connection", b"close")] if exc.status == 413 else []
    await _send_json(send, exc.status, _error_payload(exc), extra)


# -- serving --------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn, with SIGINT/SIGTERM meaning "shut down and exit 0" and the engine stopped
    before uvicorn waits for open streams to finish."""

    def __init__(self, config: uvicorn.Config, app: EngineApp) -> None:
        super().__init__(config)
        self._app = app

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGINT, signal.SIGTERM)
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._app.shutdown()
        await super().shutdown(sockets)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"engine: cannot listen on {host}:{port}: {reason}") from None
    return sock


async def serve_engine(
    config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``config`` on ``host:port`` in the running loop until SIGINT/SIGTERM.

    ``port=0`` picks a free port.  ``on_ready`` is called once with the base URL
    (``http://host:port``) when the socket accepts connections.  Raises
    :class:`~velvetrope.errors.ConfigError` if the address cannot be bound.
    """
    sock = _bind(host, port)
    app = EngineApp(config)
    uv_config = uvicorn.Config(
        app,
        http="httptools",
        interface="asgi3",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(uv_config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started and on_ready is not None:
            bound_host, bound_port = sock.getsockname()[:2]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            on_ready(f"http://{shown}:{bound_port}")
        await task
    finally:
        sock.close()


def run_engine(
    host: str = "127.0.0.1",
    port: int = 8001,
    profile: EngineProfile | str = "llama3-8b-h100",
    speed: float = 1.0,
    model_name: str = "velvetrope-sim",
    tokenizer: Tokenizer | str = "cl100k_base",
    outputs: OutputPolicy | None = None,
    *,
    scheduling: Literal["fcfs", "priority"] = "fcfs",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Run an engine server in this process (blocking, on uvloop) until SIGINT/SIGTERM.

    ``profile`` and ``tokenizer`` may be given as names (:func:`load_profile`,
    :func:`get_tokenizer`); ``speed=math.inf`` is instant mode.  Returns normally after a
    signal; raises :class:`~velvetrope.errors.ConfigError` /
    :class:`~velvetrope.errors.PolicyError` for a bad configuration before listening.
    """
    config = EngineConfig(
        profile=load_profile(profile) if isinstance(profile, str) else profile,
        speed=speed,
        model_name=model_name,
        tokenizer=get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer,
        outputs=outputs if outputs is not None else OutputPolicy(),
        scheduling=scheduling,
        max_body_bytes=max_body_bytes,
    )
    coro = serve_engine(config, host, port, on_ready=on_ready, log_level=log_level)
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it; fall back to asyncio's loop
        asyncio.run(coro)
        return
    if sys.platform == "win32":  # pragma: no cover - uvloop does not exist there
        asyncio.run(coro)
    else:
        uvloop.run(coro)
