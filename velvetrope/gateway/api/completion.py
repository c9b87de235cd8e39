"""The completion path of the gateway: one admitted request from its key to its answer.

:class:`CompletionPath` is the base of :class:`~velvetrope.gateway.api.app.Gateway` (the app
routes, this class serves what it routes to an admitted endpoint): authenticate
(:meth:`~CompletionPath._tenant`), read, parse and validate, make the job, enter admission
(:class:`~velvetrope.gateway.driver.admission.Admission`), shape the body, forward to an
upstream and relay its answer (:meth:`~CompletionPath._proxy`), and end the ticket exactly
once (:meth:`~CompletionPath._finish`), whatever happens: a refusal, a disconnect, a job
taken back before its first token, an upstream that fails.  The state it shares with the
app is set by the app's constructor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence

from velvetrope.config import hash_key
from velvetrope.config_sections import GatewaySettings
from velvetrope.core import AdmissionController, Job, Reason, Usage
from velvetrope.errors import (
    ClientDisconnected,
    RequestError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from velvetrope.gateway.api.admission_headers import dispatched_headers, ratelimit_headers
from velvetrope.gateway.api.client_stream import PROGRESS_HEADER, ClientStream
from velvetrope.gateway.api.disconnects import DisconnectWatches, Watch
from velvetrope.gateway.api.endpoints import (
    COUNT_TOKENS,
    Endpoint,
    events_for,
    make_job,
    read_request,
    read_usage,
    shape_body,
)
from velvetrope.gateway.api.parse import EXPECTED_TOKENS_HEADER, ParsedRequest, set_engine_priority
from velvetrope.gateway.api.request_slo import (
    DO_NOT_QUEUE_HEADER,
    SLO_TTFT_HEADER,
    request_deadline,
)
from velvetrope.gateway.api.responses import ResponsesRelay, pinned_exclude, responses_usage
from velvetrope.gateway.driver.admission import Admission, Refusal, Ticket
from velvetrope.gateway.driver.quotas import Quotas
from velvetrope.gateway.ops.metrics import GatewayMetrics
from velvetrope.gateway.upstream.engines import Engines
from velvetrope.gateway.upstream.httpclient import HttpClient
from velvetrope.gateway.upstream.proxy import UpstreamAnswer, forward
from velvetrope.gateway.upstream.relay import UsageTally
from velvetrope.gateway.upstream.response_homes import ResponseHomes
from velvetrope.gateway.upstream.upstreams import UpstreamPools, UpstreamState
from velvetrope.openai.errors import error_body, retry_headers
from velvetrope.openai.tokenizer import Tokenizer
from velvetrope.serving.asgi import Receive, Scope, Send, header, read_body, respond

__all__ = ["BEARER", "NO_KEY", "CompletionPath", "answer_error", "reserved_usage"]

log = logging.getLogger("velvetrope.gateway")

NO_KEY = "missing or invalid API key"
BEARER = ((b"www-authenticate", b"Bearer"),)


class CompletionPath:
    """An admitted request's way through the gateway (see the module docstring)."""

    settings: GatewaySettings
    ctl: AdmissionController
    admission: Admission
    metrics: GatewayMetrics
    quotas: Quotas
    tokenizer: Tokenizer
    engines: Engines
    upstreams: UpstreamPools
    http: HttpClient
    homes: ResponseHomes
    watches: DisconnectWatches
    keys: dict[str, str]
    _priority_header: bytes
    _strict: bool
    _ids: itertools.count[int]
    _id_prefix: str

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
        headers = BEARER if status == 401 else ()
        if endpoint in ("messages", COUNT_TOKENS.name):  # Anthropic's API, Anthropic's shape
            await ClientStream(send, anthropic=True).error(status, message, code, headers)
        else:
            await answer_error(send, status, message, code, param, headers)

    def _tenant(self, scope: Scope) -> str | None:
        """The tenant of the request's API key: ``Authorization: Bearer KEY``, or
        Anthropic's ``x-api-key: KEY``; ``None`` if neither names a known key."""
        auth = header(scope, b"authorization")
        if auth is not None and auth[:7].lower() == b"bearer ":
            key = auth[7:]
        else:
            key = header(scope, b"x-api-key") or b""
        return self.keys.get(hash_key(key.decode("latin-1").strip())) if key else None

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        tenant = self._tenant(scope)
        if tenant is None:
            await self._door(send, endpoint.name, 401, NO_KEY, "invalid_api_key")
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
            await answer_error(send, 500, "internal error in the gateway", "internal_error")
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
            await answer_error(send, 503, "no healthy upstream", "no_healthy_upstream")
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
            await answer_error(send, status, str(e), "upstream_error")
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
        extra = dispatched_headers(job, ticket.snapshots) + self.quotas.headers(
            ticket.snapshots, job
        )
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
                up = engines.pick(job.pool, tried + pinned, hashes, job) if pinned else None
                up = up or engines.pick(job.pool, tried, hashes, job)
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


async def answer_error(
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
