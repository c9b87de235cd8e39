"""The gateway's ASGI application.

Routes: the admitted endpoints (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/messages``, ``/v1/embeddings``, rerank and score:
:mod:`velvetrope.gateway.api.endpoints`, with each one's cost),
``POST /v1/messages/count_tokens`` (forwarded, not queued), ``GET``/``DELETE
/v1/responses/{id}`` (on the engine that created it), ``GET /v1/models`` (the models of
every pool: :mod:`velvetrope.gateway.api.models`), ``GET /v1/models/{id}`` (that model's
object, or 404 ``model_not_found``), ``GET /metrics``,
``GET /healthz``, ``GET /readyz`` and the authenticated ``GET /admin/status`` and ``GET
/admin/usage`` (the usage ledger: :mod:`velvetrope.gateway.ops.usage`).  An error
that retrying cannot help carries ``x-should-retry: false``.

An admitted request goes: authenticate (401) → read the body within the size limit (413)
and ``gateway.request_timeout_s`` (408, the connection closed) → parse and validate (400) →
count prompt tokens → build the job → route it (the policy's rules pick the pool; a
backed-up tier may be degraded: capped ``max_tokens``, a fallback pool or model) →
admission (429/503, or wait in the queue) → proxy to the least-loaded live upstream of its
pool (:mod:`velvetrope.gateway.upstream.engines`) → settle.  A client that disconnects while queued
or mid-stream cancels the job, and the upstream request is closed at once.  Every job ends
in the controller exactly once, whatever happens, so in-flight counts and bucket balances
stay exact.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os

import aiohttp
import orjson

from velvetrope.clock import Clock, SystemClock
from velvetrope.config import ConfigSource, GatewayConfig
from velvetrope.core import AdmissionController
from velvetrope.core.quota import is_ledger_key
from velvetrope.errors import (
    ClientDisconnected,
    RequestError,
)
from velvetrope.gateway.api.completion import BEARER, NO_KEY, CompletionPath, answer_error
from velvetrope.gateway.api.disconnects import DisconnectWatches
from velvetrope.gateway.api.endpoints import (
    COUNT_TOKENS,
    ENDPOINTS,
    make_job,
    read_request,
)
from velvetrope.gateway.api.models import answer_models
from velvetrope.gateway.api.other_paths import OtherPaths, is_other_path, no_route
from velvetrope.gateway.api.responses import (
    stored_response,
)
from velvetrope.gateway.driver.admission import Admission
from velvetrope.gateway.driver.quotas import Quotas
from velvetrope.gateway.ops.metrics import GatewayMetrics
from velvetrope.gateway.ops.reload import Reloader
from velvetrope.gateway.ops.usage import answer_usage
from velvetrope.gateway.upstream.engines import Engines
from velvetrope.gateway.upstream.httpclient import HttpClient
from velvetrope.gateway.upstream.response_homes import response_homes
from velvetrope.gateway.upstream.upstreams import Resolver
from velvetrope.openai.errors import retry_headers
from velvetrope.openai.tokenizer import ApproxTokenizer, Tokenizer, get_tokenizer
from velvetrope.serving.asgi import Receive, Scope, Send, header, read_body, respond, serve_lifespan
from velvetrope.store.open import open_store

__all__ = ["Gateway"]

log = logging.getLogger("velvetrope.gateway")


class Gateway(CompletionPath):
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
        self.ctl = AdmissionController(config.policy, self.clock)
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

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/messages/count_tokens``: validated, then forwarded to an upstream of
        the model's pool (authenticated, not queued: nothing is generated)."""
        ep = COUNT_TOKENS
        tenant = self._tenant(scope)
        if tenant is None:
            await self._door(send, ep.name, 401, NO_KEY, "invalid_api_key")
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
            await self._door(send, "responses", 401, NO_KEY, "invalid_api_key")
        else:
            up = self.upstreams
            got = await stored_response(
                self.session, self.homes, up, tenant, method, response_id, self._timeout
            )
            await respond(send, got[0], got[1], retry_headers(got[0]))

    async def _models(self, scope: Scope, send: Send, model_id: str | None) -> None:
        """``GET /v1/models`` (``model_id`` None) or ``GET /v1/models/{model_id}``
        (:mod:`velvetrope.gateway.api.models`)."""
        if self._tenant(scope) is None:
            await self._door(send, "models", 401, NO_KEY, "invalid_api_key")
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
            await answer_error(send, r.status, r.message, r.code)

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


_GET_PATHS = frozenset(
    {"/metrics", "/healthz", "/readyz", "/v1/models", "/admin/status", "/admin/usage"}
)
"""The GET routes (and ``/v1/models/{id}``); any path not admitted nor here is a 404."""


def _not_allowed(method: str, path: str, allowed: str) -> str:
    return f"{method} not allowed on {path}; use {allowed}"


async def _unauthorized(send: Send, message: str = NO_KEY) -> None:
    await answer_error(send, 401, message, "invalid_api_key", None, BEARER)
