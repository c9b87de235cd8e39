"""The gateway's ASGI application.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /metrics``, ``GET /healthz``, ``GET /readyz`` and the authenticated
``GET /admin/status``.

A completion request goes: authenticate (401) → read the body within the size limit (413)
→ parse and validate (400) → count prompt tokens → build the job → route it (the policy's
rules pick the pool; a backed-up tier may be degraded: capped ``max_tokens``, a fallback
pool or model) → admission (429/503, or wait in the queue) → proxy to the least-loaded
live upstream of its pool (:mod:`velvetrope.gateway.fleet`) → settle.  A
client that disconnects while queued or mid-stream cancels the job, and the upstream
request is closed at once.  Every job ends in the controller exactly once, whatever
happens, so in-flight counts and bucket balances stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import math
import os
from collections.abc import Awaitable, Callable
from functools import partial

import aiohttp
import orjson

from velvetrope.clock import Clock, SystemClock
from velvetrope.config import GatewayConfig, hash_key
from velvetrope.core import (
    AdmissionController,
    Admitted,
    BucketSnapshot,
    Denial,
    Grant,
    Job,
    Outcome,
    Reason,
    Rejected,
    Usage,
)
from velvetrope.core.request import JobState
from velvetrope.errors import (
    ClientDisconnected,
    RequestError,
    StoreUnavailable,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from velvetrope.gateway.admission import Admission
from velvetrope.gateway.admission_headers import admitted_headers, ratelimit_headers
from velvetrope.gateway.client_stream import PROGRESS_HEADER, ClientStream
from velvetrope.gateway.disconnects import DisconnectWatches, Watch
from velvetrope.gateway.fleet import GatewayFleet, degrade_body
from velvetrope.gateway.httpclient import HttpClient
from velvetrope.gateway.metrics import GatewayMetrics
from velvetrope.gateway.parse import (
    EXPECTED_TOKENS_HEADER,
    Kind,
    expected_tokens,
    job_for,
    parse_request,
)
from velvetrope.gateway.proxy import UpstreamAnswer, forward
from velvetrope.gateway.relay import Relay
from velvetrope.gateway.state import FleetGate, LocalState, build_state
from velvetrope.gateway.upstreams import Resolver, UpstreamState
from velvetrope.openai.errors import error_body
from velvetrope.openai.tokenizer import Tokenizer, get_tokenizer
from velvetrope.serving.asgi import Receive, Scope, Send, header, read_body, respond, serve_lifespan

__all__ = ["Gateway"]

log = logging.getLogger("velvetrope.gateway")

_UPSTREAM_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class Gateway:
    """The ASGI app and everything it owns (controller, upstreams, metrics)."""

    def __init__(
        self, config: GatewayConfig, clock: Clock | None = None, resolver: Resolver | None = None
    ) -> None:
        self.config = config
        self.settings = config.gateway
        self.clock = clock or SystemClock()
        self.ctl = AdmissionController(config.policy, self.clock, external_buckets=True)
        self.admission = Admission(self.ctl)
        self.metrics = GatewayMetrics(self.ctl, self.settings.metrics_tenant_label)
        self.state = build_state(
            config,
            self.clock,
            observe_call=self.metrics.observe_store_call,
            queue_depth=lambda: self.ctl.queued,
        )
        self.metrics.attach_state(self.state)
        # memory://'s store, reserved from without a coroutine (None for shared state)
        state = self.state
        self._local = state.store if isinstance(state, LocalState) else None
        # memory://: settled in this process, with no fleet slots to give back
        self.ctl.observers.append(
            state.store.settle_ended if isinstance(state, LocalState) else self._on_outcome
        )
        self.gates: dict[str, FleetGate] = {}
        if self.state.fleet and self.settings.admission:
            for p in config.policy.pools:
                gate = FleetGate(p.name, p.in_flight_ceiling, p.max_tokens_in_flight)
                self.ctl.pool_capacity(p.name).signals.append(gate)
                self.gates[p.name] = gate
        self.fleet = GatewayFleet(
            config,
            self.ctl,
            self.clock,
            gates=self.gates,
            resolver=resolver,
            admission=self.settings.admission,
        )
        self.upstreams = self.fleet.upstreams
        self.metrics.attach_fleet(self.fleet)
        self.keys = {k.digest: k.tenant for k in config.api_keys}
        self.admin_token = config.resolved_admin_token()
        self.tokenizer: Tokenizer = get_tokenizer(self.settings.tokenizer)
        self._priority_header = self.settings.priority_header.lower().encode()
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
        self.watches = DisconnectWatches()

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
            await self.fleet.start(self.session, self.admission.pump)
            self.state.start()

    async def shutdown(self) -> None:
        self.watches.close()
        await self.fleet.stop()
        await self.state.stop()
        self.admission.close()
        self.http.close()
        if self.session is not None:
            await self.session.close()
            self.session = None

    def start_draining(self) -> None:
        """Stop admitting (503 ``draining``); queued and in-flight work goes on."""
        self.draining = True
        self.ctl.start_draining()

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
        if path == "/v1/chat/completions" or path == "/v1/completions":
            if method != "POST":
                await respond(send, 405, error_body(405, f"{method} not allowed on {path}"))
                return
            k: Kind = "chat" if path == "/v1/chat/completions" else "completions"
            await self._completion(scope, receive, send, k)
        elif method != "GET":
            await respond(send, 405, error_body(405, f"{method} not allowed on {path}"))
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
            await self._models(scope, send)
        elif path == "/admin/status":
            await self._admin(scope, send)
        else:
            await respond(send, 404, error_body(404, f"no route {path}", "not_found"))

    def _tenant(self, scope: Scope) -> str | None:
        auth = header(scope, b"authorization")
        if auth is None or auth[:7].lower() != b"bearer ":
            return None
        return self.keys.get(hash_key(auth[7:].decode("latin-1").strip()))

    async def _models(self, scope: Scope, send: Send) -> None:
        if self._tenant(scope) is None:
            await _unauthorized(send)
            return
        pool = self.config.policy.pools[0].name
        up = self.upstreams.pick(pool)
        if up is None or self.session is None:
            await respond(send, 503, error_body(503, "no healthy upstream", "no_healthy_upstream"))
            return
        try:
            async with self.session.get(up.url + "/v1/models", timeout=self._timeout) as r:
                await respond(send, r.status, await r.read())
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            await respond(send, 502, error_body(502, f"upstream failed: {e}", "upstream_error"))

    async def _admin(self, scope: Scope, send: Send) -> None:
        auth = header(scope, b"authorization")
        if self.admin_token is None or auth != b"Bearer " + self.admin_token.encode():
            await _unauthorized(send, "the admin token is missing or wrong")
            return
        status = self.ctl.status()
        if isinstance(self.state, LocalState):
            status["buckets"] = {k: lvl for k, (lvl, _) in self.state.levels().items()}
        status["state"] = self.state.status()
        status["waiting_requests"] = self.admission.waiting
        status["upstreams"] = self.upstreams.status()
        status["engine_load"] = self.fleet.engine_load(self.clock.now())
        status["dispatch_held_by_saturation"] = self.fleet.held()
        await respond(send, 200, orjson.dumps(status))

    async def _completion(self, scope: Scope, receive: Receive, send: Send, kind: Kind) -> None:
        tenant = self._tenant(scope)
        if tenant is None:
            await _unauthorized(send)
            return
        try:
            raw = await read_body(scope, receive, self.settings.max_body_bytes)
            tok = self.tokenizer
            parsed = parse_request(
                raw,
                kind,
                max_tokens_limit=self.settings.max_tokens_limit,
                count_text=tok.count,
                count_chat=tok.count_chat,
            )
        except RequestError as e:
            await respond(send, e.status, error_body(e.status, e.message, e.code, e.param))
            return
        except ClientDisconnected:
            return
        requested = header(scope, self._priority_header)
        tier = self.ctl.resolve_tier(tenant, requested.decode("latin-1") if requested else None)
        job = job_for(
            parsed,
            f"{self._id_prefix}-{next(self._ids)}",
            tenant,
            tier,
            self.settings.default_max_tokens,
            expected_tokens(header(scope, EXPECTED_TOKENS_HEADER)),
        )
        if not self.settings.admission:
            pool, _ = self.ctl.router.match(job)  # rules on model and tier; no prediction
            await self._passthrough(kind, pool, parsed.stream, parsed.raw, send)
            return
        self.ctl.route(job)  # the pool, and a degradation: the body is rewritten for it
        self.metrics.on_route(job)
        degrade_body(parsed, job)
        watch = self.watches.watch(receive)
        client = ClientStream(send)
        try:
            claims = self.ctl.claims(job)
            gate = self.gates.get(job.pool)
            slotted = False  # holds its fleet slot already
            try:
                if self._local is not None:  # memory://: no I/O, so no coroutine either
                    reservation: Grant | Denial = self._local.reserve_now(claims)
                elif gate is not None and self.ctl.would_start(job):
                    # a job that will start at once takes its fleet slot in the same trip
                    reservation, slotted = await self.state.admit(
                        job.id, tenant, claims, gate.slot(job)
                    )
                else:
                    reservation = await self.state.reserve(job.id, tenant, claims)
            except StoreUnavailable as e:
                rej = self.ctl.reject(job, Reason.STATE_UNAVAILABLE, str(e), 1.0)
                await self._reject(client, rej)
                return
            res = self.admission.arrive(job, watch.gone, reservation)
            if res is None:  # queued
                progress = None
                if parsed.stream and (
                    self.ctl.tenant_policy(tenant).queue_progress
                    or header(scope, PROGRESS_HEADER) == b"1"
                ):
                    progress = self._progress(job, client)
                res = await self.admission.wait(
                    job, watch.gone, progress, self.settings.progress_interval_s
                )
            if isinstance(res, Admitted):
                snaps = reservation.snapshots if isinstance(reservation, Grant) else ()
                await self._proxy(
                    kind,
                    job,
                    parsed.stream,
                    parsed.client_wants_usage,
                    parsed.upstream_body(),
                    client,
                    watch,
                    snaps,
                    slotted,
                )
            elif isinstance(res, Rejected):
                await self._reject(client, res)
            elif isinstance(res, Outcome):
                msg = "the request waited past its deadline in the queue"
                await client.error(503, msg, "expired", [(b"retry-after", b"1")])
        except Exception:
            # A bug must not leak a stack trace or a job: log it, end the job exactly
            # once, and answer in OpenAI's shape if nothing was sent yet.
            log.exception("velvetrope: unexpected error serving %s", job.id)
            live = self.ctl.job(job.id)
            if live is not None and live.state is JobState.QUEUED:
                self.admission.cancel(job.id)
            elif live is not None:
                self.admission.fail(job.id, Reason.UPSTREAM_ERROR, Usage(0, 0))
            with contextlib.suppress(Exception):
                await client.error(500, "internal error in the gateway", "internal_error")
        finally:
            self.watches.done(watch)

    async def _passthrough(
        self, kind: Kind, pool: str, stream: bool, body: bytes, send: Send
    ) -> None:
        """Admission switched off: forward as a plain proxy (the benchmark's baseline)."""
        up = self.upstreams.pick(pool)
        if up is None:
            await respond(send, 503, error_body(503, "no healthy upstream", "no_healthy_upstream"))
            return
        client = ClientStream(send)
        try:
            answer = await forward(
                self.http,
                up.url + _UPSTREAM_PATH[kind],
                body,
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
            await respond(send, status, error_body(status, str(e), "upstream_error"))
            return
        if stream:
            await client.end()
        else:
            await respond(
                send, answer.status, answer.body or b"", [(b"content-type", answer.content_type)]
            )

    def _on_outcome(self, o: Outcome) -> None:
        """Settle every ended job in the store it reserved from; give back its fleet slot."""
        job = o.job
        gate = self.gates.get(job.pool)
        # settle; give back the slot if it held one (dispatched, or leased with its
        # reservation)
        pool = job.pool if gate is not None else None
        self.state.finish(job.id, job.tenant, job.claims, o.settlement.lines, pool)
        if gate is not None:
            gate.released()

    def _progress(self, job: Job, client: ClientStream) -> Callable[[], Awaitable[None]]:
        """The comment a waiting streaming request gets every ``progress_interval_s``."""

        async def tell() -> None:
            standing = self.ctl.standing(job.id)
            if standing is None:
                return
            ahead, eta = standing
            when = "unknown" if eta is None else f"{eta:.1f}"
            await client.comment(f"velvetrope queued ahead<={ahead} eta_s={when}")

        return tell

    async def _reject(self, client: ClientStream, r: Rejected) -> None:
        headers = ratelimit_headers(r.snapshots)
        if r.retry_after_s is not None and math.isfinite(r.retry_after_s):
            headers.append((b"retry-after", str(max(1, math.ceil(r.retry_after_s))).encode()))
        await client.error(r.status, r.message, r.reason.code, headers)

    async def _proxy(
        self,
        kind: Kind,
        job: Job,
        stream: bool,
        wants_usage: bool,
        body: bytes,
        client: ClientStream,
        watch: Watch,
        snaps: tuple[BucketSnapshot, ...],
        slotted: bool,
    ) -> None:
        """Take the job's fleet slot unless ``slotted`` (taken with its reservation), then
        forward it to the least-loaded upstream of its pool, trying the next one when one
        cannot be reached, and settle it."""
        adm = self.admission
        gate = self.gates.get(job.pool)
        if gate is not None and not slotted:
            try:
                got = await gate.hold(self.state, job, watch.gone, adm.pump)
            except StoreUnavailable as e:
                adm.fail(job.id, Reason.STATE_UNAVAILABLE, Usage(0, 0))
                await client.error(503, str(e), "state_unavailable", [(b"retry-after", b"1")])
                return
            if not got:
                adm.cancel(job.id, Usage(0, 0))
                return
        relay = Relay(job.prompt_tokens)
        extra = admitted_headers(job, snaps)
        tried: tuple[str, ...] = ()  # upstreams that could not be reached
        while True:
            up = self.upstreams.pick(job.pool, exclude=tried)
            if up is None:
                adm.fail(job.id, Reason.NO_HEALTHY_UPSTREAM)
                msg = f"no healthy upstream in pool {job.pool!r}"
                await client.error(503, msg, "no_healthy_upstream", [(b"retry-after", b"1")])
                return
            self.fleet.sent(job, up)
            up.in_flight += 1
            up.requests += 1
            me = asyncio.current_task(watch.loop)
            assert me is not None
            watch.target = me
            try:
                answer = await forward(
                    self.http,
                    up.url + _UPSTREAM_PATH[kind],
                    body,
                    stream=stream,
                    client_wants_usage=wants_usage,
                    relay=relay,
                    start=client.start,
                    send=client.chunk,
                    end=client.end,
                    on_first_token=partial(adm.first_token, job.id),
                    extra_headers=extra,
                )
            except asyncio.CancelledError:
                # our watcher cancels us when the client hangs up; anything else is a
                # shutdown.  Either way the upstream request is closed and the job settled.
                adm.cancel(job.id, relay.usage_so_far())
                self.upstreams.abandoned(up, relay.first_token)
                if watch.gone.done():
                    me.uncancel()
                    return
                raise
            except UpstreamUnreachable as e:
                self.upstreams.mark_failed(up, str(e))
                tried += (up.url,)
                continue
            except UpstreamTimeout as e:
                self.upstreams.failed(up, str(e))
                adm.fail(job.id, Reason.UPSTREAM_TIMEOUT, relay.usage_so_far())
                await client.error(504, str(e), "upstream_timeout")
                return
            except UpstreamError as e:
                self.upstreams.failed(up, str(e))
                adm.fail(job.id, Reason.UPSTREAM_ERROR, relay.usage_so_far())
                await client.error(502, str(e), "upstream_error")
                return
            finally:
                watch.target = None
                up.in_flight -= 1
            break
        await self._finish(job, up, answer, relay, client, extra)

    async def _finish(
        self,
        job: Job,
        up: UpstreamState,
        answer: UpstreamAnswer,
        relay: Relay,
        client: ClientStream,
        extra: list[tuple[bytes, bytes]],
    ) -> None:
        """Settle the job from the upstream's answer and complete the client's response."""
        adm = self.admission
        send = client.send
        if answer.status < 500:
            self.upstreams.succeeded(up)
        else:
            self.upstreams.failed(up, f"answered {answer.status}")
        if answer.status == 200:
            if not relay.first_token:
                adm.first_token(job.id)
            adm.complete(job.id, answer.usage or relay.usage_so_far())
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
            adm.fail(job.id, Reason.UPSTREAM_REJECTED, Usage(0, 0))
            await client.passthrough(answer.status, answer.body or b"", answer.content_type)
            return
        adm.fail(job.id, Reason.UPSTREAM_ERROR, Usage(0, 0))
        detail = (answer.body or b"")[:200].decode("utf-8", "replace")
        msg = f"upstream answered {answer.status}: {detail}"
        await client.error(502, msg, "upstream_error")


async def _unauthorized(send: Send, message: str = "missing or invalid API key") -> None:
    await respond(
        send,
        401,
        error_body(401, message, "invalid_api_key"),
        [(b"www-authenticate", b"Bearer")],
    )
