"""The gateway's fleet: its upstreams wired to the admission core's capacity and saturation.

:class:`GatewayFleet` owns the :class:`~velvetrope.gateway.upstreams.UpstreamPools` and the
:class:`~velvetrope.gateway.saturation.Scraper`.  Whenever a pool's live engines change
(health, breaker, DNS), :meth:`GatewayFleet.follow` tells the core: the pool's capacity
becomes per engine × live engines (plus one slot per engine whose breaker is half-open, for
its probe), the fleet gate's limits follow it (fleet-wide slots on Redis, when configured),
and the saturation rule judges exactly those engines; then whatever now fits is dispatched.

It also carries the gateway's side of degradation: the rewrite of the upstream body of a
degraded request (its capped ``max_tokens``, the fallback ``model``); the response headers
that say where a request went and what was given up are
:mod:`velvetrope.gateway.admission_headers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.core import AdmissionController, EngineSaturation, Job
from velvetrope.core.routing import FALLBACK_POOL, MAX_TOKENS
from velvetrope.gateway.parse import ParsedRequest
from velvetrope.gateway.scrape import Scraper
from velvetrope.gateway.upstreams import Resolver, UpstreamPools, UpstreamState

__all__ = ["GatewayFleet", "degrade_body"]


class _Limits:
    """What a fleet gate exposes to be resized (see ``velvetrope.gateway.state.FleetGate``)."""

    max_in_flight: int
    max_tokens: int | None


class GatewayFleet:
    """Upstreams, scrapes and the capacity that follows them; see the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        ctl: AdmissionController,
        clock: Clock,
        *,
        gates: Mapping[str, Any] | None = None,
        resolver: Resolver | None = None,
        admission: bool = True,
    ) -> None:
        self.ctl = ctl
        self.gates = dict(gates or {})
        self.pump: Callable[[], None] = lambda: None
        self.upstreams = UpstreamPools(config, clock, resolver=resolver, on_change=self.follow)
        self.rules: dict[str, EngineSaturation] = {}
        if admission:
            for pool in config.upstreams:
                rule = ctl.saturation(pool)
                if rule is not None:
                    self.rules[pool] = rule
        sat = ctl.config.saturation
        self.scraper = (
            Scraper(self.upstreams, self.rules, clock, sat.scrape_interval_s)
            if self.rules
            else None
        )
        self.upstreams.changed()

    def follow(self) -> None:
        """The pools' live engines changed: resize capacity, the fleet gates and the
        saturation rules' engines, then dispatch what fits."""
        for pool in self.upstreams.pools:
            live = self.upstreams.live(pool)
            probing = self.upstreams.probing(pool)
            cap = self.ctl.pool_capacity(pool)
            cap.set_engines(len(live), probes=len(probing))
            gate: _Limits | None = self.gates.get(pool)
            if gate is not None:
                gate.max_in_flight = cap.max_in_flight
                gate.max_tokens = cap.max_tokens
            rule = self.rules.get(pool)
            if rule is not None:
                rule.set_engines([u.url for u in (*live, *probing)])
        self.pump()

    def sent(self, job: Job, up: UpstreamState) -> None:
        """``job`` is being handed to ``up`` (the saturation rule counts it there)."""
        rule = self.rules.get(job.pool)
        if rule is not None:
            rule.sent(job.id, up.url)

    async def start(self, session: aiohttp.ClientSession, pump: Callable[[], None]) -> None:
        """Resolve DNS upstreams once, then run health checks, DNS refreshes and scrapes."""
        self.pump = pump
        if self.upstreams.has_dns:
            await self.upstreams.refresh_dns(session)
        self.upstreams.start(session)
        if self.scraper is not None:
            self.scraper.start(session, pump)

    async def stop(self) -> None:
        await self.upstreams.stop()
        if self.scraper is not None:
            await self.scraper.stop()

    def engine_load(self, now: float) -> dict[str, dict[str, Any]]:
        """Per engine: the saturation rule's view (last reading, age, corrected load)."""
        out: dict[str, dict[str, Any]] = {}
        for rule in self.rules.values():
            out.update(rule.status(now))
        return out

    def held(self) -> int:
        """Dispatches held by saturation, over all pools (cumulative)."""
        return sum(r.held for r in self.rules.values())


def degrade_body(parsed: ParsedRequest, job: Job) -> None:
    """Rewrite ``parsed``'s upstream body for a degraded ``job``: the capped
    ``max_tokens`` per completion (``max_completion_tokens`` when a chat request used it)
    and the fallback model.  A job that was not degraded leaves the body alone."""
    if not job.degraded:
        return
    body = parsed.body
    if MAX_TOKENS in job.degraded:
        cap = job.max_tokens // max(1, job.n)
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        body[key] = cap
        if key == "max_completion_tokens" and "max_tokens" in body:
            body["max_tokens"] = cap
    if FALLBACK_POOL in job.degraded and job.model is not None:
        body["model"] = job.model
    parsed.rewritten = True
