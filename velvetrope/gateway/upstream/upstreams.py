"""Upstream engines per pool: discovery, health, circuit breakers and the replica choice.

**Discovery.**  A static upstream is one URL.  A ``discovery: dns`` upstream is every
address its host resolves to (A and AAAA), re-resolved every ``fleet.dns_refresh_s``: a
Kubernetes headless Service lists its ready pods that way, so engines that KEDA adds are
found and those it removes leave (see :class:`~velvetrope.config_sections.Upstream`).  A new address
is probed before it joins; an address that no longer resolves leaves the pool at once (its
requests in flight finish).  A failed resolution keeps the last answer: a DNS hiccup must
not empty a pool.

**Health** (liveness).  An upstream is healthy until a request to it fails to connect
(passive: out at once) or its liveness path (``/health``, or what
:mod:`~velvetrope.gateway.upstream.upstream_access` chose) stops answering 200 within
``fleet.health_timeout_s`` (active, every ``fleet.health_interval_s``); it rejoins when the
check passes again.

**Circuit breaker** (serving), one per upstream, the store's sans-IO
:class:`~velvetrope.store.breaker.CircuitBreaker`: requests the engine accepted but failed
(timeout, broken stream, a 502/503/504 answer; a 500 only once two tenants or more got one
since its last good answer, so one client's requests cannot take an engine out) count;
after ``fleet.breaker_failures`` in a row it opens and the engine takes no request for
``fleet.breaker_open_s``; then one probe request goes through (half-open) and its success
closes the breaker, its failure opens it again (the closed / open / half-open states of
Nygard's pattern, martinfowler.com/bliki/CircuitBreaker).

**Live engines.**  An engine is *live* when healthy with its breaker closed, and
*probing* when healthy and half-open.  ``on_change`` is called whenever the live or probing
set of any pool changes, so capacity per engine × live engines, the saturation rule's
engines and the fleet gate follow the fleet.

**Choice.**  :meth:`UpstreamPools.pick` is the core's
:func:`~velvetrope.core.routing.least_loaded` over the healthy upstreams whose breaker lets
a request through, ties rotated; those the saturation rule gives room first, when asked
(:meth:`~velvetrope.gateway.upstream.engines.Engines.pick`).  A pool routed ``prefix_affinity`` or
``prefix_hash`` asks the core's :class:`~velvetrope.core.prefix_routing.PrefixRouter`
instead, with the request's prefix hashes, the upstreams' URLs as their names and their
requests in flight as their loads, over the same upstreams, and records what it used.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from velvetrope.clock import Clock, SystemClock
from velvetrope.config import GatewayConfig
from velvetrope.config_sections import FleetSettings, Upstream
from velvetrope.core import least_loaded
from velvetrope.core.prefix_routing import PrefixRouter
from velvetrope.gateway.upstream.upstream_access import UpstreamAccess, access_for
from velvetrope.store.breaker import CircuitBreaker

__all__ = ["Periodic", "Resolver", "UpstreamPools", "UpstreamState", "resolve_host"]

log = logging.getLogger("velvetrope.gateway")

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port) -> addresses``: how ``discovery: dns`` names are resolved."""


class Periodic:
    """One background task that awaits ``step()`` every ``interval_s`` until stopped (the
    gateway's health checks, DNS refreshes and saturation scrapes)."""

    __slots__ = ("_task",)

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self, step: Callable[[], Awaitable[None]], interval_s: float) -> None:
        """Start the loop in the running event loop (the first step runs at once)."""

        async def loop() -> None:
            while True:
                await step()
                await asyncio.sleep(interval_s)

        self._task = asyncio.get_running_loop().create_task(loop())

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end; a no-op if it is not running."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA, first-seen order, no repeats)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _with_host(url: str, address: str) -> str:
    """``url`` with its host replaced by ``address`` (an IPv6 address in brackets)."""
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


@dataclass(slots=True, eq=False)
class UpstreamState:
    """One upstream as the gateway sees it."""

    url: str
    pool: str
    metrics_url: str
    breaker: CircuitBreaker
    healthy: bool = True
    in_flight: int = 0
    failures: int = 0
    requests: int = 0
    last_error: str | None = field(default=None)
    erred_tenants: set[str] = field(default_factory=set)
    """Tenants whose requests it answered 500 since it last answered well."""
    source: str | None = None
    """The DNS name it was discovered from (``None``: listed statically)."""
    access: UpstreamAccess = field(default_factory=UpstreamAccess)
    """TLS and the engine's API key, carried by every call to it."""
    health_path: str = "/health"
    """The path its liveness check asks (see
    :mod:`~velvetrope.gateway.upstream.upstream_access`)."""

    @property
    def breaker_state(self) -> str:
        """``closed``, ``open`` or ``half_open``."""
        return self.breaker.state

    @property
    def live(self) -> bool:
        """Healthy with its breaker closed: counts for the pool's capacity."""
        return self.healthy and self.breaker.closed

    @property
    def probing(self) -> bool:
        """Healthy with its breaker half-open: one probe request may go."""
        return self.healthy and self.breaker.state == "half_open"


class UpstreamPools:
    """All upstreams, by pool; see the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        clock: Clock | None = None,
        *,
        resolver: Resolver | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.settings: FleetSettings = config.gateway.fleet
        self.clock = clock or SystemClock()
        self.resolver: Resolver = resolver or resolve_host
        self.on_change = on_change
        self.pools: dict[str, list[UpstreamState]] = {}
        self._dns: list[tuple[str, Upstream, UpstreamAccess]] = []
        self._listed: dict[tuple[str, str], Upstream] = {}
        self.dns_errors: dict[str, str] = {}
        self.reconfigure(config)
        self._rr = itertools.count()
        self._checks = Periodic()
        self._resolves = Periodic()
        self._shape: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._dns_lock = asyncio.Lock()

    def reconfigure(self, config: GatewayConfig) -> None:
        """Take ``config``'s upstreams (at start, and at a reload, before :meth:`changed`):
        an upstream listed as before keeps its state (health, breaker, requests in flight);
        a new or changed one starts fresh (healthy until its first check says otherwise);
        one no longer listed leaves its pool (its requests in flight finish).  Addresses
        found through DNS are kept until the next refresh.  Raises ConfigError as
        :func:`~velvetrope.gateway.upstream.upstream_access.access_for` does, changing nothing."""
        old, listed = self.pools, self._listed
        pools: dict[str, list[UpstreamState]] = {}
        dns: list[tuple[str, Upstream, UpstreamAccess]] = []
        now_listed: dict[tuple[str, str], Upstream] = {}
        for pool, ups in config.upstreams.items():
            states = pools[pool] = []
            for i, u in enumerate(ups):
                access = access_for(u, f"upstreams.{pool}[{i}] ({u.url})")
                if u.discovery == "dns":
                    dns.append((pool, u, access))
                    if listed.get((pool, u.url)) == u:
                        states.extend(x for x in old.get(pool, ()) if x.source == u.url)
                else:
                    same = listed.get((pool, u.url)) == u
                    kept = [x for x in old.get(pool, ()) if x.url == u.url and x.source is None]
                    states.append(kept[0] if same and kept else self._state(pool, u.url, u, access))
                now_listed[(pool, u.url)] = u
        self.pools, self._dns, self._listed = pools, dns, now_listed

    def _state(
        self, pool: str, url: str, u: Upstream, access: UpstreamAccess, source: str | None = None
    ) -> UpstreamState:
        if u.metrics_url is None:
            metrics = url + "/metrics"
        elif source is None:
            metrics = u.metrics_url
        else:
            metrics = _with_host(u.metrics_url, urlsplit(url).hostname or "")
        s = self.settings
        breaker = CircuitBreaker(self.clock, failures=s.breaker_failures, reset_s=s.breaker_open_s)
        return UpstreamState(
            url,
            pool,
            metrics,
            breaker,
            source=source,
            access=access,
            health_path=access.health_paths[0],
        )

    # -- the pool's view ---------------------------------------------------------------

    @property
    def has_dns(self) -> bool:
        """Whether any upstream is discovered through DNS."""
        return bool(self._dns)

    def live(self, pool: str) -> list[UpstreamState]:
        """Upstreams of ``pool`` that count for its capacity (healthy, breaker closed)."""
        return [u for u in self.pools.get(pool, ()) if u.live]

    def probing(self, pool: str) -> list[UpstreamState]:
        """Upstreams of ``pool`` whose breaker is half-open (healthy)."""
        return [u for u in self.pools.get(pool, ()) if u.probing]

    def any_healthy(self) -> bool:
        return any(u.healthy for ups in self.pools.values() for u in ups)

    def pick(
        self,
        pool: str,
        exclude: Iterable[str] = (),
        room: Callable[[str], bool] | None = None,
        prefix: PrefixRouter | None = None,
        hashes: Sequence[int] = (),
        block_tokens: int = 0,
        ahead: Callable[[str], int] | None = None,
    ) -> UpstreamState | None:
        """The least-loaded upstream of ``pool`` that may take a request now (healthy, not
        in ``exclude``, breaker closed, or half-open with no probe out: picking it sends the
        probe), or ``None``.  With ``room`` (an upstream URL → whether its engine can take
        one more, the saturation rule's say) the least-loaded of those with room is
        preferred; none with room: the least-loaded of all.  With ``ahead`` (an upstream URL
        → the prompt tokens its engine prefills before the request's first token) the
        fewest of those comes first and the load breaks ties
        (:func:`~velvetrope.core.routing.least_loaded`).  With ``prefix`` (the pool's
        prefix-aware router) the same candidates go to ``prefix.choose`` with the request's
        ``hashes`` (blocks of ``block_tokens`` tokens) instead of least-loaded picking."""
        ups = self.pools.get(pool)
        if not ups:
            return None
        if len(ups) == 1 and not exclude:  # the common case, without the scan below
            u = ups[0]
            return u if u.healthy and u.breaker.allow() else None
        skip = set(exclude)
        banned: set[int] = set()

        def eligible(i: int) -> bool:
            u = ups[i]
            return i not in banned and u.healthy and u.url not in skip and u.breaker.state != "open"

        def roomy_(i: int) -> bool:
            return eligible(i) and room is not None and room(ups[i].url)

        roomy = roomy_ if room is not None else None

        if prefix is not None:
            return self._pick_prefix(ups, prefix, hashes, block_tokens, eligible, roomy, banned)
        start = next(self._rr) % len(ups)
        first = None if ahead is None else [ahead(u.url) for u in ups]  # fixed while it picks
        while True:
            loads = [u.in_flight for u in ups]
            i = least_loaded(loads, start, roomy, first) if roomy is not None else -1
            if i < 0:
                i = least_loaded(loads, start, eligible, first)
            if i < 0:
                return None
            if ups[i].breaker.allow():
                return ups[i]
            banned.add(i)  # half-open with its probe already out

    @staticmethod
    def _pick_prefix(
        ups: list[UpstreamState],
        prefix: PrefixRouter,
        hashes: Sequence[int],
        block_tokens: int,
        eligible: Callable[[int], bool],
        roomy: Callable[[int], bool] | None,
        banned: set[int],
    ) -> UpstreamState | None:
        names = [u.url for u in ups]
        while True:
            loads = [u.in_flight for u in ups]
            choice = None
            if roomy is not None:
                choice = prefix.choose(hashes, block_tokens, names, loads, roomy)
            if choice is None or choice.at < 0:
                choice = prefix.choose(hashes, block_tokens, names, loads, eligible)
            i = choice.at
            if i < 0:
                return None
            if ups[i].breaker.allow():
                prefix.commit(choice, hashes, names[i])
                return ups[i]
            banned.add(i)  # half-open with its probe already out

    # -- what requests tell us -----------------------------------------------------------

    def mark_failed(self, up: UpstreamState, error: str) -> None:
        """A request could not connect to ``up``: out until its health check passes."""
        up.healthy = False
        up.failures += 1
        up.last_error = error
        self.changed()

    def succeeded(self, up: UpstreamState) -> None:
        """``up`` answered (2xx or 4xx): its breaker closes."""
        was = up.breaker.closed
        up.breaker.success()
        up.erred_tenants.clear()
        if not was:
            self.changed()

    def answered_error(self, up: UpstreamState, status: int, tenant: str) -> None:
        """``up`` answered ``status`` (5xx).  A 502, 503, 504 (or another 5xx) says the
        engine, or what fronts it, cannot serve now: it counts against its breaker.  A 500
        says this request failed: it counts once 500s came from two tenants or more since
        ``up`` last answered well (or when it answers a probe), so one client whose requests
        make an engine fail cannot take it out of rotation, while an engine that fails
        everyone's requests still leaves."""
        if status == 500 and up.breaker.closed:
            up.erred_tenants.add(tenant)
            if len(up.erred_tenants) < 2:
                up.failures += 1
                up.last_error = f"answered {status}"
                return
        self.failed(up, f"answered {status}")

    def failed(self, up: UpstreamState, error: str) -> None:
        """``up`` accepted a request and failed it (timeout, broken stream, a 5xx answer
        that counts, see :meth:`answered_error`)."""
        up.failures += 1
        up.last_error = error
        up.breaker.failure()
        self.changed()

    def abandoned(self, up: UpstreamState, answered: bool) -> None:
        """The client left mid-request: a success if ``up`` had answered, else (for a
        breaker that is not closed) an inconclusive probe, which opens it for another
        period rather than leave it waiting for a probe that never reports."""
        if answered:
            self.succeeded(up)
        elif not up.breaker.closed:
            up.breaker.failure()
            self.changed()

    def changed(self) -> None:
        """Call ``on_change`` if any pool's live or probing set changed since last time."""
        shape = {
            p: (
                tuple(u.url for u in ups if u.live),
                tuple(u.url for u in ups if u.probing),
            )
            for p, ups in self.pools.items()
        }
        if shape != self._shape:
            self._shape = shape
            if self.on_change is not None:
                self.on_change()

    # -- background work ---------------------------------------------------------------

    async def _probe(self, session: aiohttp.ClientSession, u: UpstreamState) -> None:
        """One liveness check of ``u``; an engine that answers its default ``/health`` with
        404 has no such route: it is checked at the fallback path from then on."""
        while True:
            path = u.health_path
            status = await self._ask(session, u, path)
            paths = u.access.health_paths
            if status == 404 and path == paths[0] and len(paths) > 1:
                u.health_path = paths[1]
                log.info("upstream %s answered %s with 404: checking %s", u.url, path, paths[1])
                continue
            break
        u.healthy = status == 200
        if not u.healthy:
            u.last_error = f"{path} answered {status}" if isinstance(status, int) else status

    async def _ask(self, session: aiohttp.ClientSession, u: UpstreamState, path: str) -> int | str:
        """The status ``u`` answers ``GET path`` with, or why it did not answer."""
        a = u.access
        try:
            async with session.get(
                u.url + path,
                timeout=aiohttp.ClientTimeout(total=self.settings.health_timeout_s),
                headers=a.headers,
                ssl=a.aiohttp_ssl,
            ) as r:
                await r.read()
                return r.status
        except aiohttp.ClientConnectorCertificateError as e:
            return f"{path} failed: the engine's TLS certificate was refused: {e.certificate_error}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return f"{path} failed: {type(e).__name__}"

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        """Probe every upstream's ``/health`` once (and notice breakers that half-opened)."""
        await asyncio.gather(*(self._probe(session, u) for ups in self.pools.values() for u in ups))
        self.changed()

    async def refresh_dns(self, session: aiohttp.ClientSession) -> None:
        """Re-resolve every ``discovery: dns`` upstream; probe new addresses before they
        join, drop addresses that no longer resolve.  One refresh at a time."""
        async with self._dns_lock:
            await self._refresh_dns(session)
        self.changed()

    async def _refresh_dns(self, session: aiohttp.ClientSession) -> None:
        for pool, u, access in self._dns:
            parts = urlsplit(u.url)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                addresses = await self.resolver(host, port)
            except (OSError, UnicodeError) as e:
                self.dns_errors[u.url] = f"{type(e).__name__}: {e}"
                continue
            self.dns_errors.pop(u.url, None)
            current = self.pools[pool]
            mine = {x.url: x for x in current if x.source == u.url}
            wanted = [_with_host(u.url, a) for a in addresses]
            new = [self._state(pool, url, u, access, u.url) for url in wanted if url not in mine]
            await asyncio.gather(*(self._probe(session, x) for x in new))
            keep = set(wanted)
            self.pools[pool] = [x for x in current if x.source != u.url or x.url in keep] + new

    def start(self, session: aiohttp.ClientSession) -> None:
        """Run the health checks (and DNS refreshes, if any) in the background."""
        self._checks.start(lambda: self.check_once(session), self.settings.health_interval_s)
        if self._dns:
            self._resolves.start(lambda: self.refresh_dns(session), self.settings.dns_refresh_s)

    async def stop(self) -> None:
        """Stop the background work."""
        await self._checks.stop()
        await self._resolves.stop()

    def status(self) -> list[dict[str, object]]:
        return [
            {
                "url": u.url,
                "pool": u.pool,
                "healthy": u.healthy,
                "breaker": u.breaker_state,
                "in_flight": u.in_flight,
                "requests": u.requests,
                "failures": u.failures,
                "last_error": u.last_error,
                "source": u.source,
                "health_path": u.health_path,
            }
            for ups in self.pools.values()
            for u in ups
        ]
