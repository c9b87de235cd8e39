"""The chaos run's fault schedule, played during the load.

Faults, each at a fixed fraction of the load's duration (:func:`schedule`):

* ``redis_restart``: Redis SIGKILLed, restarted on the same port after 1 s, from its
  append-only file (or empty, without persistence: ``DeploymentSpec.redis_empty``);
* ``redis_pause``: Redis SIGSTOPped for 3 s, then SIGCONT;
* ``engine_restart``: ``engine-a`` SIGKILLed, restarted on its port after 2 s (a new
  journal; the instant just before the signal is kept: it held its requests until then);
* ``gateway_drain``: ``gateway-b`` gets SIGTERM and drains; the load balancer (the
  :class:`~harness.chaos_load.Rotation`) keeps sending to it for 1 s (those requests get
  503 ``draining``), then stops; while it drains its ``/admin/status`` and ``/metrics`` are
  read every 100 ms, and the last ``/metrics`` read while it had nothing queued or in flight
  and no request sent to it was still under way is kept as its final counters (with the
  gateway's ``drain_notice_s`` long enough, there is such a moment before it exits); once
  it exited a new one starts on its port and rejoins the rotation.

Blocking work (signals and waits, starting processes) runs in threads, so the load's event
loop keeps sending.  Each fault is logged as an :class:`Event` with its times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from harness.chaos_deployment import Deployment, Slot
from harness.chaos_load import Rotation

__all__ = ["Event", "play", "schedule"]


@dataclass
class Event:
    """A fault: its name, when it began and ended (``time.monotonic``), and a note."""

    name: str
    start: float
    end: float | None = None
    note: str = ""


Fault = Callable[[Deployment, Rotation, list[Event]], Awaitable[None]]


def _restart(deployment: Deployment) -> None:
    deployment.redis.stop()
    time.sleep(1.0)
    deployment.redis.start()


def _pause(deployment: Deployment) -> None:
    deployment.redis.pause()
    try:
        time.sleep(3.0)
    finally:
        deployment.redis.resume()


async def redis_restart(deployment: Deployment, rotation: Rotation, log: list[Event]) -> None:
    ev = Event("redis_restart", time.monotonic())
    log.append(ev)
    await asyncio.to_thread(_restart, deployment)  # timed in a thread: the load's loop is busy
    ev.end = time.monotonic()


async def redis_pause(deployment: Deployment, rotation: Rotation, log: list[Event]) -> None:
    ev = Event("redis_pause", time.monotonic())
    log.append(ev)
    await asyncio.to_thread(_pause, deployment)
    ev.end = time.monotonic()


async def engine_restart(deployment: Deployment, rotation: Rotation, log: list[Event]) -> None:
    slot = deployment.engines[0]
    ev = Event("engine_restart", time.monotonic(), note=slot.name)
    log.append(ev)
    await asyncio.to_thread(deployment.kill, slot)
    await asyncio.sleep(2.0)
    await asyncio.to_thread(deployment.start_engine, slot)
    ev.end = time.monotonic()


def _idle(status: dict[str, object]) -> bool:
    return (
        status.get("queued") == 0
        and status.get("in_flight") == 0
        and (status.get("waiting_requests") == 0)
    )


async def _watch_drain(
    deployment: Deployment, slot: Slot, rotation: Rotation, removed: asyncio.Event, bound_s: float
) -> str:
    """Read the draining gateway until it exits (at most ``bound_s``): keep its last
    ``/metrics`` taken while it was idle, out of the rotation, and none of the requests
    sent to it was still under way (so nothing more can reach its counters).  Returns a
    note."""
    inc = slot.current
    where = (slot.name, len(slot.runs) - 1)
    end = time.monotonic() + bound_s
    reads = 0
    while not deployment.exited(slot):
        if time.monotonic() > end:
            return f"still running after {bound_s:g}s"
        try:
            status = await asyncio.to_thread(deployment.admin_status, slot, 1.0)
            if _idle(status) and removed.is_set() and rotation.pending[where] == 0:
                text = await asyncio.to_thread(deployment.scrape, slot, 1.0)
                inc.metrics, inc.metrics_at = text, time.monotonic()
                reads += 1
        except httpx.HTTPError:
            pass  # closing its listener: it is about to exit
        await asyncio.sleep(0.1)
    return f"exited; {reads} idle reads of /metrics"


async def gateway_drain(deployment: Deployment, rotation: Rotation, log: list[Event]) -> None:
    slot = deployment.gateways[1]
    ev = Event("gateway_drain", time.monotonic(), note=slot.name)
    log.append(ev)
    deployment.terminate(slot)
    removed = asyncio.Event()
    watch = asyncio.create_task(_watch_drain(deployment, slot, rotation, removed, 60.0))
    await asyncio.sleep(1.0)  # a load balancer's /readyz period: it still sends meanwhile
    rotation.remove(slot.name)
    removed.set()
    ev.note += ": " + await watch
    slot.current.finish()
    await asyncio.to_thread(deployment.start_gateway, slot)
    rotation.add(slot.name, slot.url, len(slot.runs) - 1)
    ev.end = time.monotonic()


FULL: tuple[tuple[float, Fault], ...] = (
    (0.13, redis_restart),
    (0.32, redis_pause),
    (0.50, engine_restart),
    (0.68, gateway_drain),
)
"""The full scenario: each fault at this fraction of the load's duration."""

SHORT: tuple[tuple[float, Fault], ...] = ((0.33, redis_restart),)
"""The short scenario (the test suite's): one Redis restart."""


def schedule(full: bool) -> tuple[tuple[float, Fault], ...]:
    return FULL if full else SHORT


async def play(
    faults: tuple[tuple[float, Fault], ...],
    deployment: Deployment,
    rotation: Rotation,
    t0: float,
    seconds: float,
    log: list[Event],
) -> None:
    """Play ``faults`` one after the other, each at ``t0 + fraction * seconds`` (or as soon
    as the one before ended, if later)."""
    for fraction, fault in faults:
        delay = t0 + fraction * seconds - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await fault(deployment, rotation, log)
