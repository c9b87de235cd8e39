"""Upstream engines per pool: least-loaded choice, passive and active health.

An upstream is healthy until a request to it fails to connect (passive) or its ``/health``
stops answering 200 (active, every ``interval_s``); an unhealthy upstream is retried by the
active check and rejoins as soon as it answers.  :meth:`UpstreamPools.pick` returns the
healthy upstream of a pool with the fewest requests in flight (ties: round-robin).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from velvetrope.config import GatewayConfig

__all__ = ["Periodic", "UpstreamPools", "UpstreamState"]


class Periodic:
    """One background task that awaits ``step()`` every ``interval_s`` until stopped (the
    gateway's health checks and saturation scrapes)."""

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


@dataclass(slots=True)
class UpstreamState:
    """One upstream as the gateway sees it."""

    url: str
    pool: str
    healthy: bool = True
    in_flight: int = 0
    failures: int = 0
    requests: int = 0
    last_error: str | None = field(default=None)


class UpstreamPools:
    """All upstreams, by pool."""

    def __init__(self, config: GatewayConfig) -> None:
        self.pools: dict[str, list[UpstreamState]] = {
            pool: [UpstreamState(u.url.rstrip("/"), pool) for u in ups]
            for pool, ups in config.upstreams.items()
        }
        self._rr = itertools.count()
        self._checks = Periodic()

    def pick(self, pool: str) -> UpstreamState | None:
        """The least-loaded healthy upstream of ``pool``, or ``None`` if none is healthy."""
        ups = self.pools.get(pool)
        if not ups:
            return None
        n = len(ups)
        start = next(self._rr) % n
        best: UpstreamState | None = None
        for i in range(n):
            u = ups[(start + i) % n]
            if u.healthy and (best is None or u.in_flight < best.in_flight):
                best = u
        return best

    def any_healthy(self) -> bool:
        return any(u.healthy for ups in self.pools.values() for u in ups)

    def mark_failed(self, up: UpstreamState, error: str) -> None:
        """A request could not reach ``up``: take it out until the health check passes."""
        up.healthy = False
        up.failures += 1
        up.last_error = error

    def status(self) -> list[dict[str, object]]:
        return [
            {
                "url": u.url,
                "pool": u.pool,
                "healthy": u.healthy,
                "in_flight": u.in_flight,
                "requests": u.requests,
                "failures": u.failures,
                "last_error": u.last_error,
            }
            for ups in self.pools.values()
            for u in ups
        ]

    async def check_once(self, session: aiohttp.ClientSession, timeout_s: float = 2.0) -> None:
        """Probe every upstream's ``/health`` once."""

        async def probe(u: UpstreamState) -> None:
            try:
                async with session.get(
                    u.url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as r:
                    await r.read()
                    ok = r.status == 200
                    err = None if ok else f"/health answered {r.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                ok, err = False, f"/health failed: {type(e).__name__}"
            u.healthy = ok
            if err is not None:
                u.last_error = err

        await asyncio.gather(*(probe(u) for ups in self.pools.values() for u in ups))

    def start(self, session: aiohttp.ClientSession, interval_s: float = 2.0) -> None:
        """Run :meth:`check_once` every ``interval_s`` in the background."""
        self._checks.start(lambda: self.check_once(session), interval_s)

    async def stop(self) -> None:
        """Stop the background checks."""
        await self._checks.stop()
