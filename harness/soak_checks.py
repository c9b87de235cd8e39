"""After the soak's load: is the state clean, and what did the gateway count?

:func:`wait_idle` polls ``/admin/status`` (bounded) until the gateway holds nothing: no job
in flight or queued, no request waiting for admission, no settlement or release waiting in
the outbox, no lease held.  :func:`redis_leftovers` then reads Redis: reservations
never settled (``ns:{...}:held:<job>`` keys), slot leases still in a pool's lease set, and
keys that would never expire (every key of the store has a TTL, by design).
:func:`gateway_counts` reads the gateway's terminal outcomes from ``/metrics``.

:class:`Leftovers` adds them up: each is a request whose end the system lost track of, and
counts as an error of the soak.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from harness.soak_load import ADMISSION_CODES
from harness.soak_probe import metric_sums

__all__ = ["GatewayCounts", "Leftovers", "gateway_counts", "redis_leftovers", "wait_idle"]

_FINE_REASONS = ADMISSION_CODES | {"completed", "cancelled"}
"""Terminal reasons that are the load doing what it should (everything else is an error)."""


@dataclass(slots=True)
class Leftovers:
    """What was still held after the load ended and the gateway had time to settle."""

    in_flight: int = 0
    queued: int = 0
    waiting: int = 0
    outbox: int = 0
    leases_local: int = 0
    held_keys: int = 0
    lease_entries: int = 0
    keys_without_ttl: int = 0
    outbox_lost: int = 0
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return (
            self.in_flight
            + self.queued
            + self.waiting
            + self.outbox
            + self.leases_local
            + self.held_keys
            + self.lease_entries
            + self.keys_without_ttl
            + self.outbox_lost
        )

    def describe(self) -> str:
        return (
            f"in_flight={self.in_flight} queued={self.queued} waiting={self.waiting} "
            f"outbox={self.outbox} leases={self.leases_local} held_keys={self.held_keys} "
            f"lease_entries={self.lease_entries} keys_without_ttl={self.keys_without_ttl} "
            f"outbox_lost={self.outbox_lost}"
        )


@dataclass(frozen=True, slots=True)
class GatewayCounts:
    """Terminal outcomes the gateway counted (``velvetrope_requests_total``), by reason."""

    by_reason: Mapping[str, float]
    outbox_lost: float

    @property
    def total(self) -> int:
        return round(sum(self.by_reason.values()))

    @property
    def errors(self) -> int:
        """Jobs that ended for a reason other than completion, a client's leaving or an
        admission rejection (an upstream failure, shared state unavailable, draining, ...)."""
        return round(sum(n for r, n in self.by_reason.items() if r not in _FINE_REASONS))


async def _status(
    session: aiohttp.ClientSession, url: str, admin_token: str | None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    async with session.get(
        url + "/admin/status", headers=headers, timeout=aiohttp.ClientTimeout(total=5.0)
    ) as r:
        r.raise_for_status()
        data: dict[str, Any] = orjson.loads(await r.read())
        return data


def _held(status: Mapping[str, Any]) -> Leftovers:
    state = status.get("state") or {}
    return Leftovers(
        in_flight=int(status.get("in_flight", 0)),
        queued=int(status.get("queued", 0)),
        waiting=int(status.get("waiting_requests", 0)),
        outbox=int(state.get("outbox", 0)),
        leases_local=sum(int(n) for n in (state.get("leases") or {}).values()),
        status=status,
    )


async def wait_idle(
    session: aiohttp.ClientSession, url: str, admin_token: str | None, timeout_s: float = 30.0
) -> Leftovers:
    """Poll the gateway until it holds nothing (module docstring), at most ``timeout_s``;
    return what it still held at the last poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = _held(await _status(session, url, admin_token))
        if held.total == 0 or time.monotonic() >= deadline:
            return held
        await asyncio.sleep(0.2)


async def redis_leftovers(client: Any, namespace: str, into: Leftovers) -> Leftovers:
    """Count, into ``into``, the held keys, lease entries and keys without a TTL under
    ``namespace`` (``client``: an asyncio redis-py client); return it."""
    async for raw in client.scan_iter(match=f"{namespace}:*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if ":held:" in key:
            into.held_keys += 1
        elif key.endswith(":leases"):
            into.lease_entries += int(await client.zcard(key))
        if int(await client.ttl(key)) == -1:
            into.keys_without_ttl += 1
    return into


async def gateway_counts(session: aiohttp.ClientSession, url: str) -> GatewayCounts:
    """The gateway's terminal outcomes by reason, and its outbox's lost settlements."""
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10.0)) as r:
        r.raise_for_status()
        text = await r.text()
    reasons = metric_sums(text, ("velvetrope_requests_total",), label="reason")
    lost = metric_sums(text, ("velvetrope_state_outbox_lost_total",))
    return GatewayCounts({k[1]: v for k, v in reasons.items()}, sum(lost.values()))
