"""The gateway's ASGI application.

Routes: the admitted endpoints (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/messages``, ``/v1/embeddings``, rerank and score:
:mod:`velvetrope.gateway.endpoints`, with each one's cost),
``POST /v1/messages/count_tokens`` (forwarded, not queued), ``GET``/``DELETE
/v1/responses/{id}`` (on the engine that created it), ``GET /v1/models`` (the models of
every pool: :mod:`velvetrope.gateway.models`), ``GET /v1/models/{id}`` (that model's
object, or 404 ``model_not_found``), ``GET /metrics``,
``GET /healthz``, ``GET /readyz`` and the authenticated ``GET /admin/status`` and ``GET
/admin/usage`` (the usage ledger: :mod:`velvetrope.gateway.usage`).  An error
that retrying cannot help carries ``x-should-retry: false``.

An admitted request goes: authenticate (401) → read the body within the size limit (413)
and ``gateway.request_timeout_s`` (408, the connection closed) → parse and validate (400) →
count prompt tokens → build the job → route it (the policy's rules pick the pool; a
backed-up tier may be degraded: capped ``max_tokens``, a fallback pool or model) →
admission (429/503, or wait in the queue) → proxy to the least-loaded live upstream of its
pool (:mod:`velvetrope.gateway.engines`) → settle.  A client that disconnects while queued
or mid-stream cancels the job, and the upstream request is closed at once.  Every job ends
in the controller exactly once, whatever happens, so in-flight counts and bucket balances
stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import math
import os
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
import orjson

from velvetrope.clock import Clock, SystemClock
from velvetrope.config import ConfigSource, GatewayConfig, hash_key
from velvetrope.core import AdmissionController, Job, Reason, Usage
from velvetrope.core.quota import is_ledger_key
from velvetrope.errors import (
    ClientDisconnected,
    RequestError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from velvetrope.gateway.admission import Admission, Refusal, Ticket
from velvetrope.gateway.admission_headers import admitted_headers, ratelimit_headers
from velvetrope.gateway.client_stream import PROGRESS_HEADER, ClientStream
from velvetrope.gateway.disconnects import DisconnectWatches, Watch
from velvetrope.gateway.endpoints import (
    COUNT_TOKENS,
    ENDPOINTS,
    Endpoint,
    events_for,
    make_job,
    read_request,
    read_usage,
    shape_body,
)
from velvetrope.gateway.engines import Engines
from velvetrope.gateway.httpclient import HttpClient
from velvetrope.gateway.metrics import GatewayMetrics
from velvetrope.gateway.models import answer_models
from velvetrope.gateway.other_paths import OtherPaths, is_other_path, no_route
from velvetrope.gateway.parse import (
    EXPECTED_TOKENS_HEADER,
    ParsedRequest,
    set_engine_priority,
)
from velvetrope.gateway.proxy import UpstreamAnswer, forward
from velvetrope.gateway.quotas import Quotas
from velvetrope.gateway.relay import UsageTally
from velvetrope.gateway.reload import Reloader
from velvetrope.gateway.request_slo import DO_NOT_QUEUE_HEADER, SLO_TTFT_HEADER, request_deadline
from velvetrope.gateway.response_homes import response_homes
from velvetrope.gateway.responses import (
    ResponsesRelay,
    pinned_exclude,
    responses_usage,
    stored_response,
)
from velvetrope.gateway.upstreams import Resolver, UpstreamState
from velvetrope.gateway.usage import answer_usage
from velvetrope.openai.errors import error_body, retry_headers
from velvetrope.openai.tokenizer import ApproxTokenizer, Tokenizer, get_tokenizer
from velvetrope.serving.asgi import Receive, Scope, Send, header, read_body, respond, serve_lifespan
from velvetrope.store.open import open_store

__all__ = ["Gateway"]

log = logging.getLogger("velvetrope.gateway")


class Gateway:
    """The ASGI app and everything it owns (controller, upstreams, metrics)."""

    def __init__(
        self,
        config: GatewayConfig,
        clock: Clock | None = None,
        resolver: Resolver | None = None,
        config_source: ConfigSource | None = None,
    ) -> None:
        self.config = config
        self.settings = config.gateway
        self.clock = clock or SystemClock()
        self.ctl = AdmissionController(config.policy, self.clock, external_buckets=True)
        self.metrics = GatewayMetrics(self.ctl, self.settings.metrics_tenant_label)
        self.store = open_store(
            config,
            self.clock,
            observe_call=self.metrics.observe_store_call,
            queue_depth=lambda: self.ctl.queued,
        )
        self.metrics.attach_store(self.store)
        self.quotas = Quotas(config.quotas)
        self.quotas.register(self.metrics.registry)
        self.admission = Admission(self.ctl, self.store, self.metrics.on_route, self.quotas)
        self.tokenizer: Tokenizer = get_tokenizer(self.settings.tokenizer)
        cpt = self.tokenizer.chars_per_token if isinstance(self.tokenizer, ApproxTokenizer) else 4
        self.engines = Engines(
            config,
            self.ctl,
            self.clock,
            resolver=resolver,
            admission=self.settings.admission,
            chars_per_token=cpt,
        )
        self.upstreams = self.engines.upstreams
        self.metrics.attach_engines(self.engines)
        self.keys = {k.digest: k.tenant for k in config.api_keys}
        self.admin_token = config.resolved_admin_token()
        self._priority_header = self.settings.priority_header.lower().encode()
        self._strict = self.settings.unknown_parameters == "refuse"
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.settings.upstream_connect_timeout_s,
            sock_read=self.settings.upstream_read_timeout_s,
        )
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()
        self.session: aiohttp.ClientSession | None = None
        self.http = HttpClient(
            self.settings.upstream_connect_timeout_s, self.settings.upstream_read_timeout_s
        )
        self.draining = False
        self.homes = response_homes(self.store, config.state)  # who created each response
        self.watches = DisconnectWatches()
        self.other = OtherPaths(
            self.admission, self.engines, self.watches, lambda: self.session, self._timeout,
            lambda: f"{self._id_prefix}-{next(self._ids)}",
        )  # fmt: skip
        self.reloader = Reloader(self, config_source)

    # -- lifecycle ---------------------------------------------------------------

    async def startup(self) -> None:
        """Open the upstream connection pool and start health checks.  Everything alive at
        start-up (modules, config, the core's tables) is moved out of the garbage
        collector's reach (``gc.freeze``): collections then walk only what requests
        allocate, not the whole heap of a process that imported numpy and friends; and a young
        generation of 50,000 objects (not 700) lets the many short-lived objects of a
        request die by reference counting before any collection looks at them."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                auto_decompress=False,
            )
            await self.engines.start(self.session, self.admission.pump)
            self.store.start()
            self.reloader.start(self.settings.reload_watch_s)

    async def shutdown(self) -> None:
        await self.reloader.stop()
        self.watches.close()
        await self.engines.stop()
        await self.store.stop()
        self.admission.close()
        self.http.close()
        if self.session is not None:
            await self.session.close()
            self.session = None

    def start_draining(self) -> None:
        """Stop admitting (503 ``draining``); queued and in-flight work goes on."""
        self.draining = True
        self.admission.start_draining()

    async def drained(self, grace_s: float) -> bool:
        """Wait until nothing is queued or in flight, at most ``grace_s``; True if drained."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while self.ctl.in_flight or self.ctl.queued:
            if loop.time() >= end:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- ASGI --------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send, self.startup, self.shutdown)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if method != "POST":
                await self._door(send, endpoint.name, 405, _not_allowed(method, path, "POST"))
                return
            await self._completion(scope, receive, send, endpoint)
        elif path == "/admin/reload":
            if method != "POST":
                await self._door(send, "other", 405, _not_allowed(method, path, "POST"))
            else:
                await self._reload(scope, send)
        elif path == COUNT_TOKENS.upstream:
            if method != "POST":
                await self._door(send, COUNT_TOKENS.name, 405, _not_allowed(method, path, "POST"))
            else:
                await self._count_tokens(scope, receive, send)
        elif path.startswith("/v1/responses/") and len(path) > 14:
            await self._stored(scope, send, method, path[14:])
        elif path not in _GET_PATHS and not (path.startswith("/v1/models/") and len(path) > 11):
            if self.settings.other_paths == "pass" and is_other_path(path):
                tenant = self._tenant(scope)
                await self.other.handle(scope, receive, send, tenant, self.settings, self._door)
            else:  # gateway.other_paths: refuse (the default), or not a path it decides
                await self._door(send, "other", 404, no_route(path), "not_found")
        elif method != "GET":
            await self._door(send, "other", 405, _not_allowed(method, path, "GET"))
        elif path == "/metrics":
            await respond(
                send, 200, self.metrics.render(), [(b"content-type", b"text/plain; version=0.0.4")]
            )
        elif path == "/healthz":
            await respond(send, 200, b'{"status":"ok"}')
        elif path == "/readyz":
            if self.draining:
                await respond(send, 503, b'{"status":"draining"}')
            elif not self.upstreams.any_healthy():
                await respond(send, 503, b'{"status":"no healthy upstream"}')
            else:
                await respond(send, 200, b'{"status":"ready"}')
        elif path == "/v1/models":
            await self._models(scope, send, None)
        elif path.startswith("/v1/models/") and len(path) > 11:
            await self._models(scope, send, path[11:])
        elif path == "/admin/usage":
            await answer_usage(self.store, self.quotas, scope, send, self._is_admin(scope))
        else:
            await self._admin(scope, send)

    async def _door(
        self,
        send: Send,
        endpoint: str,
        status: int,
        message: str,
        code: str = "method_not_allowed",
        param: str | None = None,
    ) -> None:
        """Refuse a request before admission, in OpenAI's shape, and count it
        (``velvetrope_refused_total``): ``endpoint`` is the admitted endpoint's name or
        ``other`` (never the path: a client must not grow the label set)."""
        self.metrics.refused.labels(endpoint, str(status), code).inc()
        headers = _BEARER if status == 401 else ()
        if endpoint in ("messages", COUNT_TOKENS.name):  # Anthropic's API, Anthropic's shape
            await ClientStream(send, anthropic=True).error(status, message, code, headers)
        else:
            await _error(send, status, message, code, param, headers)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``: validated, then forwarded to an upstream of
        the model's pool (authenticated, not queued: nothing is generated)."""
        ep = COUNT_TOKENS
        tenant = self._tenant(scope)
        if tenant is None:
            await self._door(send, ep.name, 401, _NO_KEY, "invalid_api_key")
            return
        try:
            raw = await read_body(scope, receive, self.settings.max_body_bytes)
            parsed = read_request(ep, raw, self.tokenizer, 1 << 30, self._strict)
        except RequestError as e:
            await self._door(send, ep.name, e.status, e.message, e.code, e.param)
            return
        except ClientDisconnected:
            return
        job = make_job(ep, parsed, "count", tenant, self.ctl.resolve_tier(tenant, None), 1, None)
        await self._passthrough(ep, self.ctl.router.match(job)[0], False, raw, send)

    async def _stored(self, scope: Scope, send: Send, method: str, response_id: str) -> None:
        """``GET``/``DELETE /v1/responses/{id}``: on the engine that created the response."""
        tenant = self._tenant(scope)
        if method not in ("GET", "DELETE"):
            await self._door(send, "responses", 405, _not_allowed(method, scope["path"], "GET"))
        elif tenant is None:
            await self._door(send, "responses", 401, _NO_KEY, "invalid_api_key")
        else:
            up = self.upstreams
            got = await stored_response(
                self.session, self.homes, up, tenant, method, response_id, self._timeout
            )
            await respond(send, got[0], got[1], retry_headers(got[0]))

    def _tenant(self, scope: Scope) -> str | None:
        """The tenant of the request's API key: ``Authorization: Bearer KEY``, or
        Anthropic's ``x-api-key: KEY``; ``None`` if neither names a known key."""
        auth = header(scope, b"authorization")
        if auth is not None and auth[:7].lower() == b"bearer ":
            key = auth[7:]
        else:
            key = header(scope, b"x-api-key") or b""
        return self.keys.get(hash_key(key.decode("latin-1").strip())) if key else None

    async def _models(self, scope: Scope, send: Send, model_id: str | None) -> None:
        """``GET /v1/models`` (``model_id`` None) or ``GET /v1/models/{model_id}``
        (:mod:`velvetrope.gateway.models`)."""
        if self._tenant(scope) is None:
            await self._door(send, "models", 401, _NO_KEY, "invalid_api_key")
            return
        order = [p.name for p in self.config.policy.pools if self.upstreams.pools.get(p.name)]
        await answer_models(send, self.session, self.upstreams, order, self._timeout, model_id)

    def _is_admin(self, scope: Scope) -> bool:
        auth = header(scope, b"authorization")
        return self.admin_token is not None and auth == b"Bearer " + self.admin_token.encode()

    async def _reload(self, scope: Scope, send: Send) -> None:
        """``POST /admin/reload``: 200 with what changed, or the reason in OpenAI's error
        shape (400 ``invalid_config``, 409 ``needs_restart``); the running config stays."""
        if not self._is_admin(scope):
            await _unauthorized(send, "the admin token is missing or wrong")
            return
        r = self.reloader.reload()
        if r.result == "ok":
            body = {
                "result": "ok",
                "message": r.message,
                "changes": list(r.changes),
                "took_ms": round(r.took_ms, 3),
            }
            await respond(send, 200, orjson.dumps(body))
        else:
            await _error(send, r.status, r.message, r.code)

    async def _admin(self, scope: Scope, send: Send) -> None:
        if not self._is_admin(scope):
            await _unauthorized(send, "the admin token is missing or wrong")
            return
        status = self.ctl.status()
        levels = self.store.levels().items()
        status["buckets"] = {k: lvl for k, (lvl, _) in levels if not is_ledger_key(k)}
        status["budgets"] = self.quotas.burn(levels)
        status["state"] = self.store.status()
        status["waiting_requests"] = self.admission.waiting
        status["upstreams"] = self.engines.upstream_status(self.clock.now())
        status["engine_load"] = self.engines.engine_load(self.clock.now())
        status["dispatch_held_by_saturation"] = self.engines.saturation_holds()
        status["other_paths"] = self.settings.other_paths  # /tokenize, /v1/audio/*, ...
        await respond(send, 200, orjson.dumps(status))

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        tenant = self._tenant(scope)
        if tenant is None:
            await self._door(send, endpoint.name, 401, _NO_KEY, "invalid_api_key")
            return
        try:
            raw = await read_body(scope, receive, self.settings.max_body_bytes)
            limit = self.settings.max_tokens_limit
            parsed = read_request(endpoint, raw, self.tokenizer, limit, self._strict)
        except RequestError as e:
            await self._door(send, endpoint.name, e.status, e.message, e.code, e.param)
            return
        except ClientDisconnected:
            return
        except Exception:  # a bug in reading a request: logged, answered in OpenAI's shape
            log.exception("velvetrope: unexpected error reading a request")
            await _error(send, 500, "internal error in the gateway", "internal_error")
            return
        requested = header(scope, self._priority_header)
        tier = self.ctl.resolve_tier(tenant, requested.decode("latin-1") if requested else None)
        job = make_job(
            endpoint,
            parsed,
            f"{self._id_prefix}-{next(self._ids)}",
            tenant,
            tier,
            self.settings.default_max_tokens,
            header(scope, EXPECTED_TOKENS_HEADER),
        )
        try:
            job.deadline = request_deadline(
                header(scope, SLO_TTFT_HEADER),
                header(scope, DO_NOT_QUEUE_HEADER),
                self.ctl.clock.now(),
            )
        except RequestError as e:
            await self._door(send, endpoint.name, e.status, e.message, e.code, e.param)
            return
        if not self.settings.admission:
            pool, _ = self.ctl.router.match(job)  # rules on model and tier; no prediction
            await self._passthrough(endpoint, pool, parsed.stream, parsed.raw, send)
            return
        watch = self.watches.watch(receive)
        client = ClientStream(send, endpoint.anthropic)
        ticket: Ticket | None = None
        try:
            progress = None
            if parsed.stream and (
                self.ctl.tenant_policy(tenant).queue_progress
                or header(scope, PROGRESS_HEADER) == b"1"
            ):
                progress = self._progress(job, client)
            entry = await self.admission.enter(
                job, watch.gone, progress, self.settings.progress_interval_s
            )
            if isinstance(entry, Ticket):
                shape_body(endpoint, parsed, job)  # the engine generates no more than reserved
            # the engines' priority field: on OpenAI's APIs only (Anthropic's has none)
            band = None if endpoint.anthropic else self.engines.priority.band(job.pool, job.tier)
            while isinstance(entry, Ticket):  # again when it is taken back (preemption)
                ticket = entry
                if not await self._proxy(endpoint, ticket, parsed, client, watch, band):
                    break
                entry = await self.admission.again(
                    ticket, watch.gone, progress, self.settings.progress_interval_s
                )
                ticket = None
            if isinstance(entry, Refusal):
                await self._refuse(client, entry)
        except Exception:
            # A bug must not leak a stack trace or a job: log it, end the job exactly
            # once, and answer in OpenAI's shape if nothing was sent yet.
            log.exception("velvetrope: unexpected error serving %s", job.id)
            if ticket is not None:
                ticket.fail(Reason.UPSTREAM_ERROR, Usage(0, 0))
            else:
                self.admission.abandon(job)
            with contextlib.suppress(Exception):
                await client.error(500, "internal error in the gateway", "internal_error")
        finally:
            self.watches.done(watch)

    async def _passthrough(
        self, endpoint: Endpoint, pool: str, stream: bool, body: bytes, send: Send
    ) -> None:
        """Admission switched off: forward as a plain proxy (the benchmark's baseline)."""
        up = self.upstreams.pick(pool)
        if up is None:
            await _error(send, 503, "no healthy upstream", "no_healthy_upstream")
            return
        client = ClientStream(send)
        try:
            answer = await forward(
                self.http,
                up.url + endpoint.upstream,
                body,
                up.access,
                stream=stream,
                client_wants_usage=True,
                relay=None,  # nothing to settle: the bytes as they come
                start=client.start,
                send=client.chunk,
                end=client.end,
                on_first_token=lambda: None,
                extra_headers=[],
            )
        except UpstreamError as e:
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            await _error(send, status, str(e), "upstream_error")
            return
        if stream:
            await client.end()
        else:
            await respond(
                send, answer.status, answer.body or b"", [(b"content-type", answer.content_type)]
            )

    def _progress(self, job: Job, client: ClientStream) -> Callable[[], Awaitable[None]]:
        """The comment a waiting streaming request gets every ``progress_interval_s``."""

        async def tell() -> None:
            standing = self.admission.standing(job.id)
            if standing is None:
                return
            ahead, eta = standing
            when = "unknown" if eta is None else f"{eta:.1f}"
            await client.comment(f"velvetrope queued ahead<={ahead} eta_s={when}")

        return tell

    async def _refuse(self, client: ClientStream, r: Refusal) -> None:
        headers = ratelimit_headers(r.snapshots) + self.quotas.headers(r.snapshots)
        if r.retry_after_s is not None and math.isfinite(r.retry_after_s):
            headers.append((b"retry-after", str(max(1, math.ceil(r.retry_after_s))).encode()))
        await client.error(r.status, r.message, r.code, headers)

    async def _proxy(
        self,
        endpoint: Endpoint,
        ticket: Ticket,
        parsed: ParsedRequest,
        client: ClientStream,
        watch: Watch,
        band: int | None,
    ) -> bool:
        """Forward the ticket's job to the least-loaded upstream of its pool, trying the
        next one when one cannot be reached, and end the ticket with what happened; true
        when the controller took the job back before its first token instead (the
        upstream request was closed; nothing was sent to the client).  ``band``: the
        priority the pool forwards, sent as each upstream reads it (``None``: none)."""
        job = ticket.job
        stream = parsed.stream
        forwarding = self.engines.priority
        tally = UsageTally(job.prompt_tokens, job.max_tokens // max(1, job.n))  # told the cap
        extra = admitted_headers(job, ticket.snapshots) + self.quotas.headers(ticket.snapshots, job)
        if job.shadow is not None:  # shadow mode: what enforcement would have done
            self.metrics.shadow.labels(job.tier, job.shadow, job.shadow_reason, job.kind).inc()
            said = job.shadow if not job.shadow_reason else f"{job.shadow}; {job.shadow_reason}"
            extra.append((b"x-velvetrope-shadow", said.encode()))
        engines = self.engines
        tried: tuple[str, ...] = ()  # upstreams that could not be reached
        events = events_for(endpoint)
        home = await self.homes.find(parsed.body.get("previous_response_id"), job.tenant)
        # the prefix identity, once, for a prefix-routed pool only (else: nothing to do)
        hashes = engines.prefix_hashes(job.pool, parsed.body) if engines.prefix else ()
        again: UpstreamState | None = None  # it refused the priority: again, without it
        while True:
            if again is None:
                pinned = pinned_exclude(self.upstreams, job.pool, home) if home else ()
                up = engines.pick(job.pool, tried + pinned, hashes) if pinned else None
                up = up or engines.pick(job.pool, tried, hashes)
            else:
                up, again = again, None
            if up is None:
                ticket.fail(Reason.NO_HEALTHY_UPSTREAM)
                msg = f"no healthy upstream in pool {job.pool!r}"
                await client.error(503, msg, "no_healthy_upstream", [(b"retry-after", b"1")])
                return False
            sent = None if band is None else forwarding.wire(up, band)
            set_engine_priority(parsed, sent)
            body = parsed.upstream_body()
            engines.sent(job, up)
            me = asyncio.current_task(watch.loop)
            assert me is not None
            watch.target = me
            ticket.sent(me)
            try:
                answer = await forward(
                    self.http,
                    up.url + endpoint.upstream,
                    body,
                    up.access,
                    stream=stream,
                    client_wants_usage=parsed.client_wants_usage,
                    relay=tally,
                    start=client.start,
                    send=client.chunk,
                    end=client.end,
                    on_first_token=ticket.first_token,
                    extra_headers=extra,
                    events=events,
                )
            except asyncio.CancelledError:
                if ticket.preempted and not watch.gone.done():
                    # taken back before its first token: the upstream request is closed
                    # (the engine stops), the client has been sent nothing
                    me.uncancel()
                    self.upstreams.abandoned(up, False)
                    return True
                # our watcher cancels us when the client hangs up; anything else is a
                # shutdown.  Either way the upstream request is closed (which stops the
                # engine's generation) and the job settled: with what the stream showed,
                # or, for an answer that comes whole, its reservation (the engine worked
                # until the hang-up and cannot say how much).
                ticket.cancel(tally.usage_so_far() if stream else reserved_usage(job))
                self.upstreams.abandoned(up, tally.first_token)
                if watch.gone.done():
                    me.uncancel()
                    return False
                raise
            except UpstreamUnreachable as e:
                self.upstreams.mark_failed(up, str(e))
                tried += (up.url,)
                continue
            except UpstreamTimeout as e:
                self.upstreams.failed(up, str(e))
                ticket.fail(Reason.UPSTREAM_TIMEOUT, tally.usage_so_far())
                await client.error(504, str(e), "upstream_timeout")
                return False
            except UpstreamError as e:
                self.upstreams.failed(up, str(e))
                ticket.fail(Reason.UPSTREAM_ERROR, tally.usage_so_far())
                await client.error(502, str(e), "upstream_error")
                return False
            finally:
                watch.target = None
                ticket.task = None
                engines.returned(up)
            if sent is not None and forwarding.learn(up, sent, answer.status, answer.body):
                again = up
                continue
            break
        if answer.body is not None:  # an endpoint with a usage of its own: read here
            tally.usage = read_usage(endpoint, answer.body) or tally.usage
        if isinstance(events, ResponsesRelay) and answer.status == 200:
            rid = events.response_id or responses_usage(answer.body)[1]
            self.homes.record(rid, up.url, job.tenant)
        await self._finish(ticket, up, answer, tally, client, extra)
        return False

    async def _finish(
        self,
        ticket: Ticket,
        up: UpstreamState,
        answer: UpstreamAnswer,
        tally: UsageTally,
        client: ClientStream,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        """End the ticket from the upstream's answer and complete the client's response."""
        send = client.send
        if answer.status < 500:
            self.upstreams.succeeded(up)
        else:
            self.upstreams.answered_error(up, answer.status, ticket.job.tenant)
        if answer.status == 200:
            ticket.first_token()
            ticket.complete(tally.usage_so_far())
            if client.started:
                await client.end()
            else:
                await respond(
                    send, 200, answer.body or b"", [(b"content-type", answer.content_type), *extra]
                )
            return
        if 400 <= answer.status < 500:
            # the engine refused the request as sent (e.g. too long for the model): no work
            # done, and the client's mistake, not an upstream failure
            ticket.fail(Reason.UPSTREAM_REJECTED, Usage(0, 0))
            await client.passthrough(answer.status, answer.body or b"", answer.content_type)
            return
        ticket.fail(Reason.UPSTREAM_ERROR, Usage(0, 0))
        detail = (answer.body or b"")[:200].decode("utf-8", "replace")
        msg = f"upstream answered {answer.status}: {detail}"
        await client.error(502, msg, "upstream_error")


def reserved_usage(job: Job) -> Usage:
    """What a dispatched job whose answer never came is charged: its prompt and the output
    reserved for it at admission."""
    return Usage(job.prompt_tokens, job.reserved_output)


async def _error(
    send: Send,
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer an error in OpenAI's shape, with ``x-should-retry: false`` when retrying
    cannot help (:func:`~velvetrope.openai.errors.retry_headers`)."""
    body = error_body(status, message, code, param)
    await respond(send, status, body, [*headers, *retry_headers(status, code)])


_NO_KEY = "missing or invalid API key"
_BEARER = ((b"www-authenticate", b"Bearer"),)
_GET_PATHS = frozenset(
    {"/metrics", "/healthz", "/readyz", "/v1/models", "/admin/status", "/admin/usage"}
)
"""The GET routes (and ``/v1/models/{id}``); any path not admitted nor here is a 404."""


def _not_allowed(method: str, path: str, allowed: str) -> str:
    return f"{method} not allowed on {path}; use {allowed}"


async def _unauthorized(send: Send, message: str = _NO_KEY) -> None:
    await _error(send, 401, message, "invalid_api_key", None, _BEARER)
