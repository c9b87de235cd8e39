"""Paths the gateway does not meter: ``/tokenize``, ``/detokenize``, ``/v1/audio/*`` and
any other path under ``/v1/`` it does not know.

What becomes of them is ``gateway.other_paths``:

``refuse`` (the default)
    404 ``not_found`` in OpenAI's error shape, naming the setting.  The gateway cannot tell
    what such a call costs an engine (a transcription runs the model over minutes of
    audio), and a path it forwards unmetered is a path around every tenant's budget: an
    operator opens it knowingly.
``pass``
    Passed through with **request-count admission**: the API key is checked (401), the body
    read within ``max_body_bytes`` (413), and the request becomes a job (in the tenant's tier,
    or the one ``gateway.priority_header`` asks for where the tenant may) of fixed cost
    ``gateway.other_paths_cost_tokens`` (1 token by default, nothing reserved for output)
    that queues in its tenant's tier and band with every other job of its pool, takes a
    slot of the pool while it runs, and is settled at that same cost whatever the engine
    answers.  So a tenant's tokenize calls count in its request rate and concurrency, are
    ordered behind a higher tier's chats, and cost its token bucket one token each, not
    the work of a generation.  The pool is chosen by the routing rules from the body's
    ``model`` when the body is a JSON object that names one (a multipart upload's model is
    not read: the tenant's default pool).  The method, query string, ``content-type`` and
    body go to the least-loaded live upstream of the pool unchanged; the answer (status,
    ``content-type`` and body) comes back whole.  An upstream that cannot be connected to is
    tried no more and the next one is (none left: 503 ``no_healthy_upstream``); one that
    fails after the request was sent is not retried (the call may have done its work): 502
    ``upstream_error``, charged the fixed cost.

Contract: every admitted pass-through job ends exactly once (completed, failed, or
cancelled by the client's disconnect, which closes the upstream request), so in-flight
counts and balances stay exact.  With ``gateway.admission: false`` (a pure proxy) a passed
path is only routed and forwarded, like every other request then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson

from velvetrope.config_sections import GatewaySettings
from velvetrope.core import Job, Reason, Usage
from velvetrope.core.kinds import size_prompt_only
from velvetrope.errors import ClientDisconnected, RequestError
from velvetrope.gateway.api.disconnects import DisconnectWatches
from velvetrope.gateway.driver.admission import Admission, Ticket
from velvetrope.gateway.upstream.engines import Engines
from velvetrope.openai.errors import error_body, retry_headers
from velvetrope.serving.asgi import Receive, Scope, Send, header, read_body, respond

__all__ = ["PASSTHROUGH", "OtherPaths", "is_other_path", "no_route", "passthrough_job"]

PASSTHROUGH = "passthrough"
"""The endpoint kind of a passed-through request (metrics' ``endpoint`` label)."""

log = logging.getLogger("velvetrope.gateway")

Door = Callable[..., Awaitable[None]]
"""The gateway's refusal at the door: ``(send, endpoint, status, message, code[, param])``."""

_ROOT_PATHS = frozenset({"/tokenize", "/detokenize"})


def is_other_path(path: str) -> bool:
    """Whether ``path`` is one that ``gateway.other_paths`` decides: ``/tokenize``,
    ``/detokenize`` or any path under ``/v1/`` (the caller tried its known routes first)."""
    return path in _ROOT_PATHS or (path.startswith("/v1/") and len(path) > 4)


def no_route(path: str) -> str:
    """The message of a 404 for ``path``: one :func:`is_other_path` accepts names the
    setting that refused it."""
    if is_other_path(path):
        return f"no route {path} (gateway.other_paths: refuse)"
    return f"no route {path}"


def body_model(body: bytes) -> str | None:
    """The ``model`` a JSON object body names (``None``: not JSON, no model, not a string)."""
    if not body or body[:1] != b"{":
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    m = doc.get("model") if isinstance(doc, dict) else None
    return m if isinstance(m, str) else None


def passthrough_job(job_id: str, tenant: str, tier: str, model: str | None, cost: int) -> Job:
    """A pass-through request's job: a fixed ``cost`` in tokens (its "prompt"), nothing
    predicted or reserved for output, its first token its whole answer."""
    return size_prompt_only(Job(job_id, tenant, tier, cost, 1, model=model, kind=PASSTHROUGH))


class OtherPaths:
    """Pass-through of the paths :func:`is_other_path` accepts (``gateway.other_paths:
    pass``), admitted as :func:`passthrough_job` jobs."""

    def __init__(
        self,
        admission: Admission,
        engines: Engines,
        watches: DisconnectWatches,
        session: Callable[[], aiohttp.ClientSession | None],
        timeout: aiohttp.ClientTimeout,
        new_id: Callable[[], str],
    ) -> None:
        self.admission = admission
        self.engines = engines
        self.watches = watches
        self._session = session
        self.timeout = timeout
        self.new_id = new_id

    async def handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        tenant: str | None,
        settings: GatewaySettings,
        door: Door,
    ) -> None:
        """Pass the request through for ``tenant`` (``None``: no known API key, 401), its body
        read within ``settings.max_body_bytes`` (413); ``door`` answers and counts a refusal
        at the door."""
        if tenant is None:
            await door(send, PASSTHROUGH, 401, "missing or invalid API key", "invalid_api_key")
            return
        try:
            body = await read_body(scope, receive, settings.max_body_bytes)
        except RequestError as e:
            await door(send, PASSTHROUGH, e.status, e.message, e.code, e.param)
            return
        except ClientDisconnected:
            return
        asked = header(scope, settings.priority_header.lower().encode())
        tier = self.admission.ctl.resolve_tier(tenant, asked.decode("latin-1") if asked else None)
        cost = settings.other_paths_cost_tokens
        job = passthrough_job(self.new_id(), tenant, tier, body_model(body), cost)
        if settings.admission:
            await self.serve(scope, receive, send, job, body)
        else:  # a pure proxy (gateway.admission: false): routed, not admitted
            await self.proxy(scope, send, job, body)

    async def proxy(self, scope: Scope, send: Send, job: Job, body: bytes) -> None:
        """Forward without admission to an upstream of the pool the rules choose."""
        up = self.engines.pick(self.admission.ctl.router.match(job)[0])
        if up is None:
            await error(send, 503, "no healthy upstream", "no_healthy_upstream")
            return
        try:
            status, ctype, answer = await self._forward(scope, up, body)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            await error(send, 502, f"upstream {up.url} failed: {e}", "upstream_error")
            return
        await respond(send, status, answer, [(b"content-type", ctype)])

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, job: Job, body: bytes
    ) -> None:
        """Admit ``job`` (an authenticated request whose ``body`` was read) and forward it;
        answer the client in every case (the refusal, the upstream's answer, or an error in
        OpenAI's shape)."""
        watch = self.watches.watch(receive)
        ticket: Ticket | None = None
        try:
            entry = await self.admission.enter(job, watch.gone)
            if entry is None:
                return
            if not isinstance(entry, Ticket):
                hs = []
                wait = entry.retry_after_s
                if wait is not None and math.isfinite(wait):
                    hs.append((b"retry-after", str(max(1, math.ceil(wait))).encode()))
                await error(send, entry.status, entry.message, entry.code, hs)
                return
            ticket = entry
            tried: tuple[str, ...] = ()
            while True:
                up = self.engines.pick(job.pool, tried, (), job)
                if up is None:
                    ticket.fail(Reason.NO_HEALTHY_UPSTREAM)
                    msg = f"no healthy upstream in pool {job.pool!r}"
                    hs = [(b"retry-after", b"1")]
                    await error(send, 503, msg, "no_healthy_upstream", hs)
                    return
                self.engines.sent(job, up)
                me = asyncio.current_task()
                assert me is not None
                watch.target = me
                ticket.sent(me)
                try:
                    status, ctype, answer = await self._forward(scope, up, body)
                except asyncio.CancelledError:
                    ticket.cancel(Usage(job.cost, 0))
                    self.engines.upstreams.abandoned(up, False)
                    if watch.gone.done():
                        me.uncancel()
                        return
                    raise
                except aiohttp.ClientConnectorError as e:  # not reached: nothing was sent
                    self.engines.upstreams.mark_failed(up, str(e))
                    tried += (up.url,)
                    continue
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    self.engines.upstreams.failed(up, str(e))
                    ticket.fail(Reason.UPSTREAM_ERROR, Usage(job.cost, 0))
                    await error(send, 502, f"upstream {up.url} failed: {e}", "upstream_error")
                    return
                finally:
                    watch.target = None
                    ticket.task = None
                    self.engines.returned(up)
                break
            if status < 500:
                self.engines.upstreams.succeeded(up)
                ticket.first_token()
                ticket.complete(Usage(job.cost, 0))
            else:
                self.engines.upstreams.answered_error(up, status, job.tenant)
                ticket.fail(Reason.UPSTREAM_ERROR, Usage(job.cost, 0))
            await respond(send, status, answer, [(b"content-type", ctype)])
        except Exception:  # a bug: logged, the job ended once, answered in OpenAI's shape
            log.exception("velvetrope: unexpected error passing %s through", job.id)
            if ticket is not None:
                ticket.fail(Reason.UPSTREAM_ERROR, Usage(job.cost, 0))
            else:
                self.admission.abandon(job)
            with contextlib.suppress(Exception):
                await error(send, 500, "internal error in the gateway", "internal_error")
        finally:
            self.watches.done(watch)

    async def _forward(self, scope: Scope, up: Any, body: bytes) -> tuple[int, bytes, bytes]:
        """The request as the client sent it (method, path, query, content type, body) to
        ``up``: its status, content type and whole body."""
        session = self._session()
        if session is None:
            raise aiohttp.ClientConnectionError("the gateway is not started")
        url = up.url + scope["path"]
        qs = scope.get("query_string") or b""
        if qs:
            url += "?" + qs.decode("latin-1")
        headers = dict(up.access.headers)
        for k, v in scope["headers"]:
            if k == b"content-type":
                headers["Content-Type"] = v.decode("latin-1")
        async with session.request(
            scope["method"],
            url,
            data=body or None,
            headers=headers,
            timeout=self.timeout,
            ssl=up.access.aiohttp_ssl,
        ) as r:
            answer = await r.read()
            ctype = r.headers.get("Content-Type", "application/json").encode("latin-1")
            return r.status, ctype, answer


async def error(
    send: Send, status: int, message: str, code: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """An error in OpenAI's shape (``x-should-retry: false`` where retrying cannot help)."""
    body = error_body(status, message, code)
    await respond(send, status, body, [*headers, *retry_headers(status, code)])
