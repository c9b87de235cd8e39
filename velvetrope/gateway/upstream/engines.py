"""The gateway's engines: its upstreams wired to the admission core's capacity and saturation.

:class:`Engines` owns the :class:`~velvetrope.gateway.upstream.upstreams.UpstreamPools` and the
:class:`~velvetrope.gateway.upstream.scrape.Scraper`.  Whenever a pool's live engines change
(health, breaker, DNS), :meth:`Engines.follow` tells the core: the pool's capacity becomes
per engine × live engines (plus one slot per engine whose breaker is half-open, for its
probe), and the saturation rule judges exactly those engines; then whatever now fits is
dispatched.  It also counts each request on its way to an engine and back
(:meth:`Engines.sent`, :meth:`Engines.returned`): the upstream's in-flight count that
least-loaded picking reads, and the saturation rule's count of work it has not seen in a
scrape yet; and it picks the upstream of each request (:meth:`Engines.pick`), preferring the
engines the saturation rule gives room.  A pool routed ``prefix_affinity`` or ``prefix_hash``
has its core :class:`~velvetrope.core.prefix_routing.PrefixRouter` here
(:attr:`Engines.prefix`); :meth:`Engines.prefix_hashes` computes a request's prefix identity
for it, once per request and only for such a pool; an upstream that leaves the pool (DNS)
is forgotten by its index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.core import AdmissionController, EngineSaturation, Job
from velvetrope.core.prefix_routing import PrefixRouter, prefix_routers
from velvetrope.gateway.upstream.priority_forwarding import PriorityForwarding
from velvetrope.gateway.upstream.scrape import Scraper
from velvetrope.gateway.upstream.upstreams import Resolver, UpstreamPools, UpstreamState
from velvetrope.openai.prefix import CHARS_PER_TOKEN, prefix_hashes

__all__ = ["Engines"]


class Engines:
    """Upstreams, scrapes and the capacity that follows them; see the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        ctl: AdmissionController,
        clock: Clock,
        *,
        resolver: Resolver | None = None,
        admission: bool = True,
        chars_per_token: float = CHARS_PER_TOKEN,
    ) -> None:
        self.ctl = ctl
        self.prefix: dict[str, PrefixRouter] = prefix_routers(ctl.config)
        """Per prefix-routed pool, its router (least-loaded pools have none)."""
        self._prefix_urls: dict[str, set[str]] = {pool: set() for pool in self.prefix}
        self._chars_per_token = chars_per_token
        self._clock = clock
        self.pump: Callable[[], None] = lambda: None
        self.upstreams = UpstreamPools(config, clock, resolver=resolver, on_change=self.follow)
        self.rules: dict[str, EngineSaturation] = {}
        self._admission = admission
        if admission:
            for pool in config.upstreams:
                rule = ctl.saturation(pool)
                if rule is not None:
                    self.rules[pool] = rule
        sat = ctl.config.saturation
        also = frozenset(self.prefix)  # prefix-routed: read for their prefix-cache counters
        self.scraper = (
            Scraper(config, self.upstreams, self.rules, clock, sat.scrape_interval_s, also)
            if self.rules or also
            else None
        )
        self.priority = PriorityForwarding(config, ctl, clock, self._spoken)
        """The ``priority`` each upstream is sent (the tier, in its engine's reading)."""
        self.upstreams.changed()

    def _spoken(self, url: str) -> str | None:
        w = None if self.scraper is None else self.scraper.watches.get(url)
        return None if w is None else w.spoken

    def reconfigure(self, config: GatewayConfig) -> None:
        """Take a reloaded ``config``'s upstreams, after the controller took its policy:
        new pools get their saturation rules, the scraper its entries, and capacity
        follows the live engines (:meth:`follow`).  Raises ConfigError as
        :meth:`UpstreamPools.reconfigure` does, changing nothing."""
        self.upstreams.reconfigure(config)
        if self._admission:
            for pool in config.upstreams:
                rule = self.ctl.saturation(pool)
                if rule is not None:
                    self.rules.setdefault(pool, rule)
        if self.scraper is not None:
            self.scraper.reconfigure(config)
        self.priority.reconfigure(config)
        self.upstreams.changed()

    def follow(self) -> None:
        """The pools' live engines changed: resize capacity and the saturation rules'
        engines, then dispatch what fits."""
        for pool in self.upstreams.pools:
            live = self.upstreams.live(pool)
            probing = self.upstreams.probing(pool)
            cap = self.ctl.pool_capacity(pool)
            cap.set_engines(len(live), probes=len(probing))
            rule = self.rules.get(pool)
            if rule is not None:
                rule.set_engines([u.url for u in (*live, *probing)])
        for pool, router in self.prefix.items():  # an upstream gone from the pool (DNS):
            urls = {u.url for u in self.upstreams.pools.get(pool, ())}  # its index entries go
            for gone in self._prefix_urls[pool] - urls:
                router.index.forget(gone)
            self._prefix_urls[pool] = urls
        self.pump()

    def prefix_hashes(self, pool: str, body: dict[str, Any]) -> tuple[int, ...]:
        """The prefix identity of a request with ``body`` going to ``pool``: the chained hashes
        of its leading blocks (:func:`~velvetrope.openai.prefix.prefix_hashes`) when the pool
        routes by prefix, else ``()`` at the cost of one dictionary lookup."""
        router = self.prefix.get(pool)
        if router is None:
            return ()
        s = router.settings
        return prefix_hashes(body, s.block_tokens, s.max_blocks, self._chars_per_token)

    def pick(
        self,
        pool: str,
        exclude: tuple[str, ...] = (),
        hashes: tuple[int, ...] = (),
        job: Job | None = None,
    ) -> UpstreamState | None:
        """The upstream of ``pool`` that takes the next request (``job``'s): among
        those its saturation rule gives room (:meth:`EngineSaturation.has_room`: a blind or
        stale engine always has), else among all, the one with the least prefill ahead of
        the request (:meth:`EngineSaturation.prefill_ahead`), then the least-loaded
        (:meth:`UpstreamPools.pick`).  So in a pool that mixes engines read and engines not
        read, the ones read still take no more than their readings allow while another can
        take the work.  In a prefix-routed pool the choice among them is its router's, on
        ``hashes``."""
        rule = self.rules.get(pool)
        prefix = self.prefix.get(pool) if self.prefix else None
        if prefix is not None and len(self.upstreams.pools.get(pool, ())) > 1:
            bt = prefix.settings.block_tokens
            if rule is None:
                return self.upstreams.pick(pool, exclude, None, prefix, hashes, bt)
            now = self._clock.now()
            room = lambda url: rule.has_room(url, now)  # noqa: E731
            return self.upstreams.pick(pool, exclude, room, prefix, hashes, bt)
        if rule is None or len(self.upstreams.pools.get(pool, ())) < 2:  # nothing to prefer
            return self.upstreams.pick(pool, exclude)
        now = self._clock.now()
        ahead: Callable[[str], int] | None = None
        if job is not None:
            subject = job
            ahead = lambda url: rule.prefill_ahead(url, subject)  # noqa: E731
        return self.upstreams.pick(pool, exclude, lambda url: rule.has_room(url, now), ahead=ahead)

    def sent(self, job: Job, up: UpstreamState) -> None:
        """``job`` is being handed to ``up``: count it there (and in the saturation rule,
        until a scrape sees it); :meth:`returned` when the attempt is over."""
        up.in_flight += 1
        up.requests += 1
        rule = self.rules.get(job.pool)
        if rule is not None:
            rule.sent(job.id, up.url)

    def returned(self, up: UpstreamState) -> None:
        """A request :meth:`sent` to ``up`` is no longer in flight there."""
        up.in_flight -= 1

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

    def upstream_status(self, now: float) -> list[dict[str, object]]:
        """:meth:`UpstreamPools.status` with each upstream's ``engine``: the dialect its
        metrics are read in, its saturation state (``on``, ``blind``, ``stale``; ``off``: a
        prefix-routed pool without the rule, read for its prefix-cache counters), the last
        scrape's failure, if any, and its prefix cache (:meth:`Scraper.status`; ``None``:
        its pool is not scraped, or it was not scraped yet); and ``priority``, how it is
        sent the tier (:meth:`PriorityForwarding.state`)."""
        out = self.upstreams.status()
        scraper = self.scraper
        states = [up for ups in self.upstreams.pools.values() for up in ups]  # status's order
        for u, up in zip(out, states, strict=True):
            u["engine"] = None if scraper is None else scraper.status(up.url, now)
            u["priority"] = self.priority.state(up, now)
        return out

    def saturation_holds(self) -> int:
        """Dispatches held by saturation, over all pools (cumulative)."""
        return sum(r.holds for r in self.rules.values())
