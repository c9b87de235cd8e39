"""Scraping the engines' ``/metrics`` for the core's saturation rule.

The rule itself is sans-IO and lives in :mod:`velvetrope.core.saturation` (the simulator
runs it too, fed by :mod:`velvetrope.sim.scrape` from its engine models); this module only
reads.  Every ``policy.saturation.scrape_interval_s`` :class:`Scraper` fetches each
upstream's ``metrics_url`` (default ``url + /metrics``), reads vLLM's gauges from the
Prometheus text (:func:`parse_vllm_metrics`) and hands the reading to its pool's
:class:`~velvetrope.core.saturation.EngineSaturation` with the time it arrived; an
endpoint that cannot be read (an error, a timeout, no readable vLLM gauge in its text)
gives ``None``, which leaves the last reading to grow stale.  After each round it calls
``on_update`` so that work the fresh readings allow is dispatched.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from velvetrope.clock import Clock
from velvetrope.core import EngineReading, EngineSaturation
from velvetrope.gateway.upstreams import Periodic, UpstreamPools, UpstreamState

__all__ = ["Scraper", "parse_vllm_metrics"]

_WAITING = "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
_KV = "vllm:kv_cache_usage_perc"
_GAUGE_LINES = (_WAITING, _RUNNING, _KV)


def parse_vllm_metrics(text: str) -> EngineReading | None:
    """vLLM's gauges in the Prometheus text ``text``, summed over all label sets (one engine
    may serve several models; the KV usage is the largest of them).

    The lines of the three gauges are read by ``prometheus_client``'s parser, so the
    format's sample timestamps, escaped label values and ``NaN`` are read as Prometheus
    reads them; the other lines are not read (a sample is one line: a label value's newline
    is escaped).  A sample whose value is not finite (``NaN``, ``±Inf``) says nothing of the
    engine's load and is skipped.  ``None`` when no finite sample of the three gauges is
    left, or when a line of theirs is not valid exposition format."""
    # the parser costs ~10 µs a line, on the event loop: an engine's whole text (100s of
    # lines of histograms) would cost milliseconds per scrape
    ours = [line for line in text.splitlines() if line.lstrip(" \t").startswith(_GAUGE_LINES)]
    waiting = running = kv = 0.0
    seen = False
    try:
        for family in text_string_to_metric_families("\n".join(ours)):
            for sample in family.samples:
                name, v = sample.name, sample.value
                if not math.isfinite(v):
                    continue
                if name == _WAITING:
                    waiting += v
                elif name == _RUNNING:
                    running += v
                elif name == _KV:
                    kv = max(kv, v)
                else:  # a longer name that starts like one of them
                    continue
                seen = True
    except ValueError:
        return None
    return EngineReading(running, waiting, kv) if seen else None


class Scraper:
    """Feeds each pool's saturation rule from its upstreams' ``/metrics``."""

    def __init__(
        self,
        upstreams: UpstreamPools,
        rules: Mapping[str, EngineSaturation],
        clock: Clock,
        interval_s: float,
    ) -> None:
        self.upstreams = upstreams
        self.rules = rules
        self.clock = clock
        self.interval_s = interval_s
        self.failures = 0
        """Scrapes that could not be read (cumulative)."""
        self._loop = Periodic()

    async def _one(self, session: aiohttp.ClientSession, up: UpstreamState) -> None:
        try:
            async with session.get(
                up.metrics_url, timeout=aiohttp.ClientTimeout(total=self.interval_s)
            ) as r:
                text = await r.text() if r.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
            text = ""
        reading = parse_vllm_metrics(text) if text else None
        if reading is None:
            self.failures += 1
        rule = self.rules.get(up.pool)
        if rule is not None:
            rule.observe(up.url, reading, self.clock.now())

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """Read every healthy upstream of every pool with a rule, once."""
        await asyncio.gather(
            *(
                self._one(session, u)
                for pool in self.rules
                for u in self.upstreams.pools.get(pool, ())
                if u.healthy
            )
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
