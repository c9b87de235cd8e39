"""Watching a run: polling the servers and drawing the live view.

:class:`Monitor` polls the gateway's ``/admin/status`` and the engines' ``/metrics``
(read in any engine dialect the gateway knows,
:func:`velvetrope.dialects.read_metrics`); :func:`run_phase` replays the
workload open-loop while it samples them and redraws the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from velvetrope.core import EngineReading
from velvetrope.demo.loadgen import replay
from velvetrope.demo.replay_config import ReplayConfig
from velvetrope.demo.replay_results import LiveCounters, ReplayResult
from velvetrope.demo.settings import GATEWAY, DemoSettings
from velvetrope.dialects import EngineSample, read_metrics
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.top.sections import bar

__all__ = ["Monitor", "PhaseSample", "RunResult", "run_phase"]


def _reading(body: bytes | None) -> EngineReading | None:
    """An engine's load from its ``/metrics`` body (``None``: no body, or none readable)."""
    if body is None:
        return None
    got = read_metrics(body.decode("utf-8", "replace"))
    return got.reading() if isinstance(got, EngineSample) else None


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """One poll of the servers during a run (``t``: seconds since the run started)."""

    t: float
    queued: Mapping[str, int]
    gateway_in_flight: int
    engine_running: int
    engine_waiting: int
    completed: int
    rejected: int


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run: the loadgen's records and the samples polled while it went."""

    name: str
    replay: ReplayResult
    samples: list[PhaseSample]


@dataclass(slots=True)
class Monitor:
    """Polls the gateway's ``/admin/status`` and the engines' ``/metrics`` (1 s timeout each)."""

    session: aiohttp.ClientSession
    gateway_url: str
    admin_token: str | None
    engine_urls: Sequence[str]
    status: dict[str, Any] | None = None
    engines: list[EngineReading | None] = field(default_factory=list)
    """The last scrape of each engine (``None`` when it could not be read)."""

    async def _get(self, url: str, headers: Mapping[str, str] | None = None) -> bytes | None:
        try:
            async with self.session.get(url, headers=headers) as r:
                return await r.read() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def poll(self) -> None:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else None
        got = await asyncio.gather(
            self._get(self.gateway_url + "/admin/status", headers),
            *(self._get(u + "/metrics") for u in self.engine_urls),
        )
        if got[0] is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                self.status = orjson.loads(got[0])
        self.engines = [_reading(b) for b in got[1:]]

    def bands(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pool in ((self.status or {}).get("pools") or {}).values():
            for band, b in (pool.get("bands") or {}).items():
                out[band] = out.get(band, 0) + int(b.get("queued", 0))
        return out

    def engine_sum(self, name: Literal["running", "waiting"]) -> int:
        """Requests running (or waiting) in all engines at the last poll."""
        return int(sum(getattr(e, name) for e in self.engines if e is not None))

    async def wait_engines_idle(self, timeout_s: float) -> bool:
        """Poll until no engine runs or holds a request; False if still busy at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.poll()
            if all(e is not None and e.running + e.waiting == 0 for e in self.engines):
                return True
            await asyncio.sleep(0.2)
        return False


def _view(
    title: str,
    elapsed: float,
    s: DemoSettings,
    live: LiveCounters,
    mon: Monitor,
    band_limits: Mapping[str, int],
    gateway_run: bool,
    priorities: Mapping[str, int] | None,
) -> RenderableType:
    head = Text.assemble(
        (f"{title}", "bold"),
        f"   t = {elapsed:5.1f}s  (load for {s.window_s:g}s, then up to {s.drain_s:g}s drain)",
    )
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    rej = ", ".join(f"{k} {v}" for k, v in live.rejected.most_common()) or "0"
    t.add_row(
        "loadgen",
        f"sent {live.sent}/{live.total}   open {live.open}   completed {live.completed}   "
        f"rejected {sum(live.rejected.values())} ({rej})   cut {live.timeouts}   "
        f"errors {live.errors + live.failed}   tokens {live.tokens:,}",
    )
    if gateway_run:
        st = mon.status or {}
        bands = mon.bands()
        for band, n in bands.items():
            limit = band_limits.get(band, 0)
            t.add_row(f"queue {band}", f"{bar(n, limit)} {n:4d}/{limit}")
        pools = st.get("pools") or {}
        inflight = sum(int(p.get("in_flight", 0)) for p in pools.values())
        cap = sum(int(p.get("max_in_flight", 0) or 0) for p in pools.values())
        t.add_row("in flight", f"{bar(inflight, cap)} {inflight:4d}/{cap}")
        t.add_row(
            "gateway",
            f"admitted {live.accepted}   queued {st.get('queued', 0)}   "
            f"rejected {sum(live.rejected.values())}",
        )
    else:
        t.add_row("gateway", "bypassed: requests go round-robin straight to the engines")
        if priorities is not None:
            t.add_row(
                "priority",
                "each request's vLLM `priority` is its tier's (lower served first): "
                + ", ".join(f"{tier} {p}" for tier, p in priorities.items()),
            )
    eng = "   ".join(
        f"engine {i + 1}: running {int(e.running):3d} waiting {int(e.waiting):4d} "
        f"kv {100 * e.kv_usage:3.0f}%"
        if e is not None
        else f"engine {i + 1}: unreadable"
        for i, e in enumerate(mon.engines)
    )
    t.add_row("engines", eng or "-")
    return Group(head, t)


async def run_phase(
    name: str,
    title: str,
    requests: Sequence[TraceRequest],
    rcfg: ReplayConfig,
    mon: Monitor,
    s: DemoSettings,
    band_limits: Mapping[str, int],
    view: Live | None,
    console: Console,
) -> RunResult:
    """Replay ``requests`` open-loop with ``rcfg`` while polling the servers every
    ``s.poll_s`` (drawing ``view``, or a line every 5 s on ``console``); return the run
    with its samples.  The replay is cancelled if this is."""
    live = LiveCounters()
    samples: list[PhaseSample] = []
    t0 = time.monotonic()
    task = asyncio.create_task(replay(requests, rcfg, live))
    last_line = -10.0
    try:
        while not task.done():
            await mon.poll()
            now = time.monotonic() - t0
            samples.append(
                PhaseSample(
                    t=now,
                    queued=mon.bands() if name == GATEWAY else {},
                    gateway_in_flight=int((mon.status or {}).get("in_flight", 0))
                    if name == GATEWAY
                    else 0,
                    engine_running=mon.engine_sum("running"),
                    engine_waiting=mon.engine_sum("waiting"),
                    completed=live.completed,
                    rejected=sum(live.rejected.values()),
                )
            )
            if view is not None:
                view.update(
                    _view(title, now, s, live, mon, band_limits, name == GATEWAY, rcfg.priorities)
                )
                view.refresh()
            elif now - last_line >= 5.0:
                last_line = now
                console.print(
                    f"  {name} t={now:4.1f}s sent {live.sent}/{live.total} open {live.open} "
                    f"completed {live.completed} rejected {sum(live.rejected.values())} "
                    f"cut {live.timeouts}"
                )
            await asyncio.wait({task}, timeout=s.poll_s)
        result = task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return RunResult(name, result, samples)
