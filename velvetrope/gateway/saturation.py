"""Backend saturation read from the engines' own ``/metrics`` (vLLM's names).

A continuous-batching engine accepts everything it is sent and queues what it cannot run;
once it has a queue of its own, more dispatches only move the backlog to where the gateway
can no longer order, shed or cancel it.  :class:`EngineSaturation` scrapes each upstream's
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` every ``interval_s`` and,
as a core :class:`~velvetrope.core.capacity.SaturationSignal`, holds dispatch to a pool
while its healthy engines are full: the requests they hold — running + waiting at the last
scrape, corrected by what the gateway sent and got back since, plus dispatches on their way
— reach what they can run plus ``max_waiting`` each.  What an engine can run is learned
from scrapes that show it queueing (``running`` while ``waiting > 0``); an engine whose KV
cache usage reached ``max_kv_usage`` counts as full.  An upstream whose metrics cannot be
read, or that was never seen queueing and is not queueing now, may have room, so the pool
is not held: a missing ``/metrics`` never stalls the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from velvetrope.core import Job
from velvetrope.gateway.upstreams import Periodic, UpstreamPools, UpstreamState

__all__ = ["EngineLoad", "EngineSaturation", "parse_vllm_metrics"]

_WAITING = "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
_KV = "vllm:kv_cache_usage_perc"


@dataclass(slots=True)
class EngineLoad:
    """What the last scrape of one upstream said.  ``ours_at_scrape``: the gateway's own
    requests in flight to it at that moment."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    scraped: bool = False
    ours_at_scrape: int = 0


def parse_vllm_metrics(text: str) -> EngineLoad:
    """Sum the vLLM gauges over all label sets (one engine may serve several models)."""
    load = EngineLoad(scraped=True)
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            v = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        if name == _WAITING:
            load.waiting += v
        elif name == _RUNNING:
            load.running += v
        elif name == _KV:
            load.kv_usage = max(load.kv_usage, v)
    return load


class EngineSaturation:
    """A saturation signal for one pool, fed by periodic scrapes of its upstreams."""

    def __init__(
        self,
        upstreams: UpstreamPools,
        pool: str,
        *,
        max_waiting: int = 2,
        max_kv_usage: float = 0.97,
        interval_s: float = 1.0,
    ) -> None:
        self.upstreams = upstreams
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_kv_usage = max_kv_usage
        self.interval_s = interval_s
        self.loads: dict[str, EngineLoad] = {}
        self.capacity: dict[str, float] = {}
        self.held = 0
        self.pending = 0
        self._scrapes = Periodic()

    def _saturated(self, ups: list[UpstreamState]) -> bool:
        """The pool's projected engine load reaches its learned capacity plus the slack."""
        projected = float(self.pending)
        cap = 0.0
        for up in ups:
            load = self.loads.get(up.url)
            if load is None or not load.scraped:
                return False  # no data for this one: it may have room
            if load.kv_usage < self.max_kv_usage:
                c = self.capacity.get(up.url)
                if c is None:
                    if load.waiting <= self.max_waiting:
                        return False  # never seen queueing and not queueing now
                    c = load.running
                cap += c + self.max_waiting
            projected += load.running + load.waiting + (up.in_flight - load.ours_at_scrape)
        return projected >= cap

    def admits(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """True unless the pool's engines are saturated; counts an admitted dispatch until
        :meth:`sent` reports that it reached an upstream."""
        ups = [u for u in self.upstreams.pools.get(self.pool, []) if u.healthy]
        if ups and self._saturated(ups):
            self.held += 1
            return False
        self.pending += 1
        return True

    def sent(self) -> None:
        """A dispatched request was handed to an upstream (its ``in_flight`` counts it)."""
        if self.pending > 0:
            self.pending -= 1

    def observe(self, up: UpstreamState, load: EngineLoad) -> None:
        """Take one scrape of ``up`` (``EngineLoad()`` when it could not be read): remember
        it with the gateway's own requests in flight to ``up`` at that moment, and learn
        what ``up`` can run from a scrape that shows it queueing."""
        load.ours_at_scrape = up.in_flight
        if load.waiting > 0 and load.running > 0:
            self.capacity[up.url] = load.running
        self.loads[up.url] = load

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """Scrape every upstream of the pool once (at most ``interval_s`` each)."""

        async def one(up: UpstreamState) -> None:
            try:
                async with session.get(
                    up.url + "/metrics", timeout=aiohttp.ClientTimeout(total=self.interval_s)
                ) as r:
                    text = await r.text() if r.status == 200 else ""
            except (aiohttp.ClientError, TimeoutError, OSError):
                text = ""
            self.observe(up, parse_vllm_metrics(text) if text else EngineLoad())

        await asyncio.gather(*(one(u) for u in self.upstreams.pools.get(self.pool, [])))

    def start(self, session: aiohttp.ClientSession, on_update: Callable[[], None]) -> None:
        """Scrape every ``interval_s`` and call ``on_update`` (to dispatch what now fits)."""

        async def step() -> None:
            await self.scrape_once(session)
            on_update()

        self._scrapes.start(step, self.interval_s)

    async def stop(self) -> None:
        """Stop scraping."""
        await self._scrapes.stop()
