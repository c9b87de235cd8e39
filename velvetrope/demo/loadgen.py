"""An open-loop load generator: replay a workload against OpenAI-compatible servers.

:func:`replay` sends each :class:`~velvetrope.sim.trace_request.TraceRequest` at its arrival time
``t`` (seconds after the start of the run), whether or not earlier requests have finished:
the offered load is the trace's, never throttled by the servers' answers (*open loop*).
Each request is a ``POST {base_url}/v1/completions``, streaming unless its client's plan
says otherwise (below); a request whose ``endpoint`` is ``embeddings`` is a ``POST
/v1/embeddings`` of one input of ``prompt_tokens`` tokens, answered whole (its first token
is its answer, its output 0).  A completion has

* a synthetic prompt of exactly ``prompt_tokens`` tokens under ``cl100k_base`` (and under the
  4-characters-per-token ``approx`` estimate): :data:`FILLER_WORD` repeated (:func:`prompt_text`);
* ``max_tokens = output_tokens`` (at least 1) and vLLM's ``ignore_eos: true``, so an engine
  that honours it generates exactly the trace's output length;
* ``stream_options: {"include_usage": true}`` when it streams;
* vLLM's ``priority``, only when the
  :class:`~velvetrope.demo.replay_config.ReplayConfig` maps tiers to priorities
  (``priorities``: the request's tier's; an engine in priority mode serves lower first);
* ``Authorization: Bearer <key>``, the key of the request's tenant (the ``ReplayConfig``'s).

Requests go to ``base_urls`` round-robin by their index in the workload (one URL: all there).

How each client behaves is its :class:`~velvetrope.demo.replay_config.ClientPlan`
(``clients``, one per request; by default every client streams and waits for the end): a
plan may ask for one JSON answer instead of a stream (``stream: false``, no
``stream_options``), or hang up on purpose: after some seconds, whatever it is waiting for
then (a place in the gateway's queue, the first token, the rest of a stream), or after some
streamed tokens.  Hanging up closes the connection, so the server sees the disconnect.

What is recorded per request (:class:`~velvetrope.demo.replay_results.RequestResult`):
tenant and tier, the HTTP status, the OpenAI error ``code`` of a rejection, time to first
token and end-to-end latency measured by the client from the moment the request was sent,
the gateway's ``x-velvetrope-queue-ms`` header, ``Retry-After``, the completion tokens
received (one per streamed chunk with text) and the usage the server reported.  Each
request ends in exactly one :class:`~velvetrope.demo.replay_results.ReplayOutcome`.

Bounds: the run stops by itself.  No request is sent after ``deadline_s`` (from the start of
the run); each request is given at most ``request_timeout_s``, and every request still open
at the deadline is cut (its connection closed, so the server sees a disconnect).  Concurrency
is unbounded by design, but sockets are capped by ``max_connections`` (a request waiting
for a socket counts its wait in its latency, as a real client's would).

Live progress is readable while a run goes on from
:class:`~velvetrope.demo.replay_results.LiveCounters` (single event loop, no locking).
Bad arguments raise :class:`~velvetrope.errors.PolicyError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Final

import aiohttp
import orjson

from velvetrope.demo.replay_config import ClientPlan, ReplayConfig
from velvetrope.demo.replay_results import LiveCounters, ReplayOutcome, ReplayResult, RequestResult
from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import TraceRequest

__all__ = [
    "FILLER_WORD",
    "KEEPALIVE_S",
    "prompt_text",
    "replay",
    "replay_sync",
]

FILLER_WORD = " the"
"""One ``cl100k_base`` token per repetition, and 4 characters (one ``approx`` token)."""

KEEPALIVE_S = 2.0
"""How long an idle connection is kept for the next request: well under the servers'
keep-alive (uvicorn's 5 s).  A request sent on a connection as the server closes it for
idleness fails before any answer (``ServerDisconnectedError``; a POST is not retried), a
race of the client's making; a stalled machine, where both sides wake late, widens it."""


def prompt_text(tokens: int) -> str:
    """A prompt of exactly ``tokens`` (``>= 1``) tokens under ``cl100k_base`` and ``approx``."""
    if tokens < 1:
        raise PolicyError(f"a prompt needs at least 1 token, got {tokens}")
    return FILLER_WORD * tokens


_WAITS = ClientPlan()


def _embedding_body(req: TraceRequest, model: str, priority: int | None) -> bytes:
    body: dict[str, object] = {"model": model, "input": prompt_text(req.prompt_tokens)}
    if priority is not None:
        body["priority"] = priority
    return orjson.dumps(body)


def _body(req: TraceRequest, model: str, stream: bool, priority: int | None) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt_text(req.prompt_tokens),
        "max_tokens": max(1, req.output_tokens),
        "stream": stream,
        "ignore_eos": True,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if priority is not None:
        body["priority"] = priority
    return orjson.dumps(body)


def _error_code(body: bytes) -> str | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        return str(code) if code is not None else None
    return None


def _float_header(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


_HUNG_UP: Final = "hung_up"


async def _stream(
    resp: aiohttp.ClientResponse,
    res: RequestResult,
    live: LiveCounters,
    t_send: float,
    stop_after: int | None,
) -> bool | str:
    """Read an SSE stream into ``res``; True if it ended with ``[DONE]`` and no error,
    :data:`_HUNG_UP` once ``stop_after`` tokens came (the caller closes the connection)."""
    errored = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return not errored
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            errored = True
            continue
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            errored = True
            err = obj["error"]
            if isinstance(err, dict) and err.get("code") is not None:
                res.error_code = str(err["code"])
            continue
        for ch in obj.get("choices") or ():
            if isinstance(ch, dict) and ch.get("text"):
                if res.tokens == 0:
                    res.ttft_s = time.monotonic() - t_send
                    live.first_token += 1
                res.tokens += 1
                live.tokens += 1
                if res.tokens == stop_after:
                    return _HUNG_UP
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            res.usage_tokens = usage["completion_tokens"]
    return False


async def _whole(resp: aiohttp.ClientResponse, res: RequestResult, t_send: float) -> bool:
    """Read a non-streaming answer into ``res``; True if it holds choices and no error."""
    try:
        obj = orjson.loads(await resp.read())
    except orjson.JSONDecodeError:
        return False
    if not isinstance(obj, dict) or "error" in obj or not (obj.get("choices") or obj.get("data")):
        return False
    res.ttft_s = time.monotonic() - t_send
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        res.usage_tokens = res.tokens = usage["completion_tokens"]
    return True


async def _one(
    session: aiohttp.ClientSession,
    req: TraceRequest,
    res: RequestResult,
    cfg: ReplayConfig,
    live: LiveCounters,
    t0: float,
    deadline: float,
    plan: ClientPlan,
) -> None:
    t_send = time.monotonic()
    res.sent_s = t_send - t0
    live.sent += 1
    live.open += 1
    headers = {
        **cfg.headers_for(req.tier),
        "Authorization": f"Bearer {cfg.key_for(req.tenant)}",
        "Content-Type": "application/json",
    }
    budget = min(cfg.request_timeout_s, deadline - t_send)
    hang_s = plan.hang_up_after_s
    planned = hang_s is not None and hang_s < budget
    if hang_s is not None and planned:
        budget = hang_s
    prio = cfg.priority_for(req.tier)
    embed = req.endpoint == "embeddings"
    stream = plan.stream and not embed
    if embed:
        path, data = "/v1/embeddings", _embedding_body(req, cfg.model, prio)
    else:
        path, data = "/v1/completions", _body(req, cfg.model, stream, prio)
    try:
        async with asyncio.timeout(max(budget, 0.0)):
            async with session.post(res.url + path, data=data, headers=headers) as resp:
                res.status = resp.status
                if resp.status == 200:
                    live.accepted += 1
                res.queue_ms = _float_header(resp.headers.get("x-velvetrope-queue-ms"))
                res.retry_after_s = _float_header(resp.headers.get("Retry-After"))
                if resp.status != 200:
                    res.error_code = _error_code(await resp.read())
                    res.e2e_s = time.monotonic() - t_send
                    if resp.status in (429, 503):
                        res.outcome = ReplayOutcome.REJECTED
                        live.rejected[res.error_code or str(resp.status)] += 1
                    else:
                        res.outcome = ReplayOutcome.ERROR
                        live.errors += 1
                    return
                if stream:
                    ended = await _stream(resp, res, live, t_send, plan.hang_up_after_tokens)
                else:
                    ended = await _whole(resp, res, t_send)
                if ended == _HUNG_UP:
                    resp.close()  # the connection, not only this response: the server sees it
                    res.outcome = ReplayOutcome.HUNG_UP
                    live.hung_up += 1
                elif ended:
                    res.e2e_s = time.monotonic() - t_send
                    res.outcome = ReplayOutcome.COMPLETED
                    live.completed += 1
                else:
                    res.outcome = ReplayOutcome.ERROR
                    live.errors += 1
    except TimeoutError:
        if planned:
            res.outcome = ReplayOutcome.HUNG_UP
            live.hung_up += 1
        else:
            res.outcome = ReplayOutcome.TIMEOUT
            res.error_code = res.error_code or "client_timeout"
            live.timeouts += 1
    except (aiohttp.ClientError, OSError) as e:
        if res.status == 200:
            res.outcome = ReplayOutcome.ERROR
            live.errors += 1
        else:
            res.outcome = ReplayOutcome.FAILED
            live.failed += 1
        res.error_code = res.error_code or type(e).__name__
    finally:
        res.elapsed_s = time.monotonic() - t_send
        live.open -= 1


async def replay(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    live: LiveCounters | None = None,
    clients: Sequence[ClientPlan] | None = None,
) -> ReplayResult:
    """Replay ``requests`` (sorted by ``t``) open-loop against ``config.base_urls``.

    ``clients``: how the client of each request behaves, one :class:`ClientPlan` per
    request (default: every client streams and waits for the end).

    Returns when every request has an outcome: at the latest ``deadline_s`` after the start
    (plus the moment it takes to close the cut connections).  Requests whose arrival time is
    past the deadline are never sent; they are recorded as :attr:`ReplayOutcome.TIMEOUT` with
    ``error_code = "not_sent"``.  ``live`` (optional) is updated as the run goes.
    """
    for i in range(1, len(requests)):
        if requests[i].t < requests[i - 1].t:
            raise PolicyError(f"requests must be sorted by t; request {i} is out of order")
    if clients is not None and len(clients) != len(requests):
        raise PolicyError(f"{len(clients)} client plans for {len(requests)} requests")
    if not isinstance(config.api_keys, str):
        for tenant in {r.tenant for r in requests}:
            config.key_for(tenant)
    for tier in {r.tier for r in requests}:
        config.priority_for(tier)
    live = live if live is not None else LiveCounters()
    live.total += len(requests)
    urls = config.base_urls
    results = [
        RequestResult(
            index=i,
            tenant=r.tenant,
            tier=r.tier,
            url=urls[i % len(urls)],
            prompt_tokens=r.prompt_tokens,
            max_tokens=max(1, r.output_tokens),
            scheduled_s=r.t,
        )
        for i, r in enumerate(requests)
    ]
    connector = aiohttp.TCPConnector(
        limit=config.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic()
    deadline = t0 + config.deadline_s
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        try:
            for i, (req, res) in enumerate(zip(requests, results, strict=True)):
                at = t0 + req.t
                if at >= deadline:
                    res.outcome = ReplayOutcome.TIMEOUT
                    res.error_code = "not_sent"
                    live.timeouts += 1
                    continue
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    live.max_send_lag_s = max(live.max_send_lag_s, -delay)
                plan = _WAITS if clients is None else clients[i]
                task = asyncio.create_task(
                    _one(session, req, res, config, live, t0, deadline, plan)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks))
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
    return ReplayResult(results, time.monotonic() - t0, live.max_send_lag_s)


def replay_sync(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    live: LiveCounters | None = None,
    clients: Sequence[ClientPlan] | None = None,
) -> ReplayResult:
    """:func:`replay` in a fresh event loop (``asyncio.run``)."""
    return asyncio.run(replay(requests, config, live, clients))
