"""Scraping the engines' ``/metrics`` for the core's saturation rule, in each one's dialect.

The rule itself is sans-IO and lives in :mod:`velvetrope.core.saturation` (the simulator
runs it too, fed by :mod:`velvetrope.sim.scrape` from its engine models); the dialects are
data in :mod:`velvetrope.dialects`.  This module only reads, and says what it could not.

Every ``policy.saturation.scrape_interval_s`` :class:`Scraper` fetches each healthy
upstream's ``metrics_url`` (default ``url + /metrics``), with the interval as its timeout,
and reads it in the upstream's dialect: the one its config pins (``engine``, or the gauges
it names in ``engine_metrics``), else the one detected in the text
(:func:`velvetrope.dialects.read_metrics`: a mixed pool works, each upstream in its own).
A reading goes to its pool's :class:`~velvetrope.core.saturation.EngineSaturation` with the
time it arrived; a scrape that gives none (an error, a timeout, a status other than 200,
a text in no known dialect) is counted in ``velvetrope_engine_scrape_errors_total{upstream,
reason}`` and told to the rule as ``None``: an engine never read is then blind (no
saturation for it), one read before keeps its last reading until it is stale.  An upstream
configured ``engine: none`` is not fetched: blind from the start.  After each round it
calls ``on_update`` so that work the fresh readings allow is dispatched.

**Never silently blind, never silently stuck.**  Each upstream's saturation state
(:meth:`~velvetrope.core.saturation.EngineSaturation.state`: ``on``, ``blind``, ``stale``)
and the dialect it is read in are logged once at the first round and again whenever they
change (``blind`` and ``stale`` as warnings: the engine is then served without saturation,
held by the in-flight limit only, until readings return), exported as gauges, and shown
per upstream in ``/admin/status`` with the reason (:meth:`Scraper.status`).

**Prefix caching.**  The pools the scraper reads are those with a saturation rule and those
routed by prefix (``also``).  Where an engine reports its prefix cache
(:class:`~velvetrope.dialects.PrefixCacheSample`), the gateway re-exports it per upstream
(:meth:`Scraper.families`) and keeps, per upstream, the prompt tokens looked up and found
cached *since it first read them* (:class:`PrefixTally`: increments of the engine's
counters, a counter that went down, an engine restart, counts from zero again), from which
``velvetrope_prefix_observed_hit_ratio{pool}`` is the pool's hit rate as its engines saw it
— beside ``velvetrope_prefix_expected_hit_ratio``, what the router expected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from velvetrope.clock import Clock
from velvetrope.config import GatewayConfig
from velvetrope.config_sections import Upstream
from velvetrope.core import EngineSaturation
from velvetrope.dialects import (
    DIALECTS,
    Dialect,
    EngineSample,
    PrefixCacheSample,
    ScrapeFailure,
    read_metrics,
)
from velvetrope.gateway.upstream.upstream_access import UpstreamAccess
from velvetrope.gateway.upstream.upstreams import Periodic, UpstreamPools, UpstreamState

__all__ = ["EngineWatch", "PrefixTally", "Scraper"]

log = logging.getLogger("velvetrope.gateway")

STATES = ("on", "blind", "stale")
"""The saturation states of an upstream (:meth:`EngineSaturation.state`)."""


@dataclass(slots=True)
class PrefixTally:
    """Prompt tokens an engine looked up in its prefix cache and found there, counted from
    the first reading on (:meth:`add` takes each reading of its cumulative counters)."""

    queries: float = 0.0
    hits: float = 0.0
    _last: tuple[float, float] | None = None

    def add(self, sample: PrefixCacheSample) -> None:
        """Count the increments since the last reading; a counter that went down (the
        engine restarted) counts its whole value.  A reading without both counters is
        skipped (the next one that has them starts a new baseline)."""
        q, h = sample.queries, sample.hits
        if q is None or h is None:
            self._last = None
            return
        if self._last is not None:
            lq, lh = self._last
            self.queries += q - lq if q >= lq else q
            self.hits += h - lh if h >= lh else h
        self._last = (q, h)


@dataclass(slots=True, eq=False)
class EngineWatch:
    """What the gateway knows of one upstream's metrics."""

    url: str
    pool: str
    engine: str
    """As configured: ``auto``, ``none``, a dialect's name, or ``custom`` (engine_metrics)."""
    dialect: Dialect | None
    """The pinned dialect (``None``: detected, or not read at all for ``none``)."""
    sample: EngineSample | None = None
    """The last reading."""
    failure: ScrapeFailure | None = None
    """Why the last scrape gave no reading (``None``: it gave one)."""
    errors: dict[str, int] = field(default_factory=dict)
    """Failed scrapes by reason (cumulative)."""
    told: tuple[str, str | None] | None = None
    """The last (state, dialect) logged."""
    prefix: PrefixTally = field(default_factory=PrefixTally)
    """Its prefix cache's lookups and hits since the first reading."""

    @property
    def spoken(self) -> str | None:
        """The dialect the upstream was last read in."""
        return None if self.sample is None else self.sample.dialect


def _pinned(u: Upstream) -> tuple[str, Dialect | None]:
    if u.engine_metrics is not None:
        return "custom", u.dialect()
    return u.engine, u.dialect()


class Scraper:
    """Feeds each pool's saturation rule from its upstreams' ``/metrics``."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: UpstreamPools,
        rules: Mapping[str, EngineSaturation],
        clock: Clock,
        interval_s: float,
        also: frozenset[str] = frozenset(),
    ) -> None:
        """Read the upstreams of the pools in ``rules`` (feeding each pool's rule) and of
        the pools in ``also`` (for their prefix-cache counters only)."""
        self.upstreams = upstreams
        self.rules = rules
        self.also = also
        self.clock = clock
        self.interval_s = interval_s
        self._config: dict[str, Upstream] = {}
        """The config entry of each static URL and of each DNS name (``source``)."""
        self.watches: dict[str, EngineWatch] = {}
        self.reconfigure(config)
        self._loop = Periodic()

    def reconfigure(self, config: GatewayConfig) -> None:
        """Take ``config``'s upstreams (a reload, after the upstreams took them): the
        watch of an upstream whose entry changed or that left is dropped, and made again
        from its new entry when next seen."""
        before = self._config
        self._config = {u.url: u for ups in config.upstreams.values() for u in ups}
        entries = {u.url: u.source or u.url for ups in self.upstreams.pools.values() for u in ups}
        for url in list(self.watches):
            entry = entries.get(url)
            if entry is None or self._config.get(entry) != before.get(entry):
                del self.watches[url]

    def watch(self, up: UpstreamState) -> EngineWatch:
        """The watch of ``up`` (made at first sight, from its config entry)."""
        w = self.watches.get(up.url)
        if w is None:
            u = self._config.get(up.source or up.url)
            engine, dialect = ("auto", None) if u is None else _pinned(u)
            w = self.watches[up.url] = EngineWatch(up.url, up.pool, engine, dialect)
        return w

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str, access: UpstreamAccess
    ) -> str | ScrapeFailure:
        try:
            async with session.get(
                url,
                timeout=aiohttp.ClientTimeout(total=self.interval_s),
                headers=access.headers,
                ssl=access.aiohttp_ssl,
            ) as r:
                if r.status != 200:
                    return ScrapeFailure("http_status", f"GET {url} answered {r.status}")
                return await r.text()
        except TimeoutError:
            return ScrapeFailure("timeout", f"GET {url}: no answer within {self.interval_s:g} s")
        except UnicodeDecodeError:
            return ScrapeFailure("invalid", f"GET {url}: the text is not UTF-8")
        except (aiohttp.ClientError, OSError) as e:
            return ScrapeFailure("connect", f"GET {url} failed: {type(e).__name__}: {e}")

    async def _one(self, session: aiohttp.ClientSession, up: UpstreamState) -> None:
        w = self.watch(up)
        rule = self.rules.get(up.pool)
        if w.engine == "none":
            w.failure = ScrapeFailure("engine_none", "engine: none in the configuration")
            if rule is not None:
                rule.observe(up.url, None, self.clock.now())
            return
        text = await self._fetch(session, up.metrics_url, up.access)
        got: EngineSample | ScrapeFailure
        if isinstance(text, ScrapeFailure):
            got = text
        else:
            pinned = w.dialect
            dialects = DIALECTS if pinned is None else (pinned,)
            got = read_metrics(text, dialects, detected=pinned is None)
        if isinstance(got, ScrapeFailure):
            w.failure = got
            w.errors[got.reason] = w.errors.get(got.reason, 0) + 1
            reading = None
        else:
            w.failure = None
            w.sample = got
            reading = got.reading()
            if got.prefix is not None:
                w.prefix.add(got.prefix)
        if rule is not None:
            rule.observe(up.url, reading, self.clock.now())

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """Read every healthy upstream of every pool with a rule, once; then log the
        upstreams whose state changed, and forget those no longer in a pool."""
        pools = [*self.rules, *(p for p in sorted(self.also) if p not in self.rules)]
        present = [u for pool in pools for u in self.upstreams.pools.get(pool, ())]
        ups = [u for u in present if u.healthy]
        await asyncio.gather(*(self._one(session, u) for u in ups))
        now = self.clock.now()
        for u in ups:
            self._tell(self.watch(u), now)
        gone = self.watches.keys() - {u.url for u in present}
        for url in gone:  # an address DNS no longer lists: its series end with it
            del self.watches[url]

    def state(self, w: EngineWatch, now: float) -> str:
        """``w``'s saturation state (``off``: its pool has no rule)."""
        rule = self.rules.get(w.pool)
        return "off" if rule is None else rule.state(w.url, now)

    def _tell(self, w: EngineWatch, now: float) -> None:
        """Log ``w``'s state if it changed since it was last logged (pools without a
        saturation rule have none to tell)."""
        if w.pool not in self.rules:
            return
        state = self.state(w, now)
        key = (state, w.spoken)  # not the reason: a failure that changes its kind each
        if key == w.told:  # scrape (404, then a timeout...) is one state, said once
            return
        first = w.told is None
        w.told = key
        where = f"upstream {w.url} (pool {w.pool})"
        how = "configured" if w.dialect is not None else "detected"
        if state == "on":
            said = "saturation on" if first else "readings are back: saturation on"
            level = logging.INFO if first else logging.WARNING
            if w.spoken is None:  # not read yet: held by the slow-start window
                log.log(level, "velvetrope: %s: %s, not read yet", where, said)
            else:
                log.log(level, "velvetrope: %s: %s, %s dialect %s", where, said, how, w.spoken)
            return
        detail = "" if w.failure is None else f" ({w.failure.reason}: {w.failure.detail})"
        if w.engine == "none":
            log.warning(
                "velvetrope: %s: served WITHOUT saturation (engine: none in the "
                "configuration); only the in-flight limit holds its requests",
                where,
            )
        elif state == "blind":
            log.warning(
                "velvetrope: %s: served WITHOUT saturation, its metrics cannot be read%s; "
                "only the in-flight limit holds its requests (pin its dialect with "
                "upstreams.%s[].engine, or name its gauges in engine_metrics)",
                where,
                detail,
                w.pool,
            )
        else:  # stale
            rule = self.rules[w.pool]
            log.warning(
                "velvetrope: %s: its last reading is older than %g s%s: served WITHOUT "
                "saturation until readings return (only the in-flight limit holds)",
                where,
                rule.stale_after_s,
                detail,
            )

    def start(self, session: aiohttp.ClientSession, on_update: Callable[[], None]) -> None:
        """Scrape every ``interval_s`` and call ``on_update`` after each round."""

        async def step() -> None:
            await self.scrape_once(session)
            on_update()

        self._loop.start(step, self.interval_s)

    async def stop(self) -> None:
        """Stop scraping."""
        await self._loop.stop()

    # -- what it says ------------------------------------------------------------------

    def status(self, url: str, now: float) -> dict[str, object] | None:
        """The ``engine`` field of an upstream in ``/admin/status``: its configured engine,
        the dialect it is read in, its saturation state, the reason (why the last scrape
        gave no reading, if it did not), the gauges read and the failed scrapes by reason;
        ``None`` for an upstream not scraped yet."""
        w = self.watches.get(url)
        if w is None:
            return None
        state = self.state(w, now)
        reason = None  # the last scrape's failure (while on: its last reading still holds)
        if w.failure is not None:
            reason = f"{w.failure.reason}: {w.failure.detail}"
        elif state == "stale":
            reason = "no reading for longer than stale_after_s"
        s = w.sample
        return {
            "configured": w.engine,
            "dialect": w.spoken,
            "saturation": state,
            "reason": reason,
            "gauges": None if s is None else dict(s.gauges),
            "kv_usage_read": None if s is None else s.kv_usage is not None,
            "preemptions": None if s is None else s.preemptions,
            "prefix_cache": _prefix_status(w),
            "scrape_errors": dict(w.errors),
        }

    def families(self, now: float) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """``velvetrope_engine_scrape_errors_total{upstream,reason}``,
        ``velvetrope_engine_saturation_state{pool,upstream,state}`` (1 for the current one),
        ``velvetrope_engine_dialect{pool,upstream,dialect}`` and the engine's own gauges as
        read (``velvetrope_engine_scraped{pool,upstream,metric}``, the name as spelled)."""
        errors = CounterMetricFamily(
            "velvetrope_engine_scrape_errors",
            "Scrapes of an engine's /metrics that gave no reading, by reason: timeout, "
            "connect, http_status, invalid, unknown_dialect, missing_gauges.",
            labels=["upstream", "reason"],
        )
        state = GaugeMetricFamily(
            "velvetrope_engine_saturation_state",
            "1 for the engine's saturation state: on (its readings hold dispatch), blind "
            "(its metrics cannot be read) or stale (its readings stopped); blind and stale "
            "engines are held by the in-flight limit only.",
            labels=["pool", "upstream", "state"],
        )
        dialect = GaugeMetricFamily(
            "velvetrope_engine_dialect",
            "1 for the dialect the engine's metrics are read in.",
            labels=["pool", "upstream", "dialect"],
        )
        scraped = GaugeMetricFamily(
            "velvetrope_engine_scraped",
            "The engine's own gauge at the last scrape (metric: its name as the engine "
            "spells it; KV usage as a ratio).",
            labels=["pool", "upstream", "metric"],
        )
        for w in self.watches.values():
            for reason, n in w.errors.items():
                errors.add_metric([w.url, reason], float(n))
            if w.pool in self.rules:
                st = self.state(w, now)
                for name in STATES:
                    state.add_metric([w.pool, w.url, name], 1.0 if name == st else 0.0)
            s = w.sample
            if s is None:
                continue
            dialect.add_metric([w.pool, w.url, s.dialect], 1.0)
            values = {"running": s.running, "waiting": s.waiting, "kv_usage": s.kv_usage}
            for quantity, gauge in s.gauges:
                v = values.get(quantity)
                if v is not None:
                    scraped.add_metric([w.pool, w.url, gauge], v)
        return [errors, state, dialect, scraped, *self._prefix_families()]

    def _prefix_families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """The engines' prefix caches: their own counters and rate as last read, per
        upstream, and per pool the hit rate over what was counted since each engine was
        first read (only series that have a reading)."""
        queries = CounterMetricFamily(
            "velvetrope_engine_prefix_cache_queries",
            "Prompt tokens the engine looked up in its prefix cache (its own counter, as "
            "last read: vllm:prefix_cache_queries_total, sglang:prompt_tokens_total).",
            labels=["pool", "upstream"],
        )
        hits = CounterMetricFamily(
            "velvetrope_engine_prefix_cache_hits",
            "Prompt tokens the engine found in its prefix cache (its own counter, as last "
            "read: vllm:prefix_cache_hits_total, sglang:cached_tokens_total).",
            labels=["pool", "upstream"],
        )
        rate = GaugeMetricFamily(
            "velvetrope_engine_prefix_cache_hit_rate",
            "The engine's own prefix-cache hit rate gauge, where it reports one "
            "(vllm:gpu_prefix_cache_hit_rate, sglang:cache_hit_rate).",
            labels=["pool", "upstream"],
        )
        observed = GaugeMetricFamily(
            "velvetrope_prefix_observed_hit_ratio",
            "The pool's prefix-cache hit rate as its engines counted it since the gateway "
            "first read them: prompt tokens found cached over prompt tokens looked up.",
            labels=["pool"],
        )
        per_pool: dict[str, tuple[float, float]] = {}
        for w in self.watches.values():
            p = None if w.sample is None else w.sample.prefix
            if p is None:
                continue
            if p.queries is not None:
                queries.add_metric([w.pool, w.url], p.queries)
            if p.hits is not None:
                hits.add_metric([w.pool, w.url], p.hits)
            if p.hit_rate is not None:
                rate.add_metric([w.pool, w.url], p.hit_rate)
            q, h = per_pool.get(w.pool, (0.0, 0.0))
            per_pool[w.pool] = (q + w.prefix.queries, h + w.prefix.hits)
        for pool, (q, h) in sorted(per_pool.items()):
            if q > 0:
                observed.add_metric([pool], h / q)
        return [queries, hits, rate, observed]


def _prefix_status(w: EngineWatch) -> dict[str, float | None] | None:
    """The ``prefix_cache`` field of an upstream in ``/admin/status``: the engine's counters
    and rate as last read and the lookups and hits counted since it was first read
    (``None``: it reports no prefix cache)."""
    p = None if w.sample is None else w.sample.prefix
    if p is None:
        return None
    seen = w.prefix
    return {
        "queries": p.queries,
        "hits": p.hits,
        "hit_rate": p.hit_rate,
        "queries_seen": seen.queries,
        "hits_seen": seen.hits,
    }
