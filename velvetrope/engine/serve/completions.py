"""``POST /v1/completions`` and ``POST /v1/chat/completions`` of ``velvetrope engine``
(:class:`CompletionsServer`; :class:`~velvetrope.engine.serve.app.EngineApp` routes them).

Requests
--------
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
is not enabled.").  Sampling fields (temperature, stop, logprobs, ...) are accepted and
ignored.

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from velvetrope.engine.outputs import OutputDecision
from velvetrope.engine.serve.bodies import Completion, StreamWriter, full_body
from velvetrope.engine.serve.engine_config import EngineConfig
from velvetrope.engine.serve.engine_request import EngineClosed, EngineRequest
from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.metrics import EngineMetrics
from velvetrope.engine.serve.progress import progress, unavailable, until_done, watch_disconnect
from velvetrope.engine.serve.realtime import RealtimeEngine
from velvetrope.errors import PolicyError, RequestError
from velvetrope.openai.errors import invalid_value, model_not_found
from velvetrope.openai.prefix import CHARS_PER_TOKEN, prefix_hashes
from velvetrope.openai.request import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    CompletionRequest,
    Kind,
    count_prompt_tokens,
    parse,
)
from velvetrope.openai.sse import SSE_HEADERS, error_event
from velvetrope.openai.tokenizer import ApproxTokenizer
from velvetrope.serving.asgi import Receive, Send, respond

__all__ = ["CompletionsServer", "InstantStats"]


class InstantStats:
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


class CompletionsServer:
    """The handlers of ``/v1/completions`` and ``/v1/chat/completions`` (see the module
    docstring) of the engine ``config`` describes.  ``engine`` is the real-time driver, or
    ``None`` in instant mode, where ``stats`` counts what is answered at once; ``load``
    holds the requests; ``metrics`` records the latencies of instant answers; ``stopping``
    says whether the server is shutting down (503)."""

    def __init__(
        self,
        config: EngineConfig,
        engine: RealtimeEngine | None,
        stats: InstantStats | None,
        load: RequestLoad,
        metrics: EngineMetrics,
        stopping: Callable[[], bool],
    ) -> None:
        self._config = config
        self._profile = config.profile
        self._model = config.model_name
        self._model_json = orjson.dumps(config.model_name)
        self._tok = config.tokenizer
        tok = config.tokenizer
        self._cpt = tok.chars_per_token if isinstance(tok, ApproxTokenizer) else CHARS_PER_TOKEN
        self._outputs = config.outputs
        self._speed = config.speed
        self._engine = engine
        self._instant_stats = stats
        self.load = load
        self.metrics = metrics
        self._stopping = stopping
        self._watchers: set[asyncio.Task[None]] = set()

    async def chat(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/chat/completions``."""
        await self._complete("chat", body, arrived, receive, send)

    async def completions(self, body: bytes, arrived: float, receive: Receive, send: Send) -> None:
        """``POST /v1/completions``."""
        await self._complete("completions", body, arrived, receive, send)

    async def _complete(
        self, kind: Kind, body: bytes, arrived: float, receive: Receive, send: Send
    ) -> None:
        req = parse(body, kind)
        if self._config.faults:
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
        if self._stopping():
            raise unavailable()
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
            raise unavailable() from None
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
