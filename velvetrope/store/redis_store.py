"""Bucket levels and fleet-wide slot leases in Redis (or Valkey), one Lua script per atomic
operation.

Scripts ship as package data (``velvetrope/store/lua``) and run with EVALSHA, reloaded on
NOSCRIPT (redis-py's ``Script``).  Redis ``TIME`` is the only clock inside them, so replicas
whose clocks disagree still share one bucket arithmetic (that of
:class:`~velvetrope.core.bucket.MemoryBuckets`; one table of test vectors runs against
both).  Every key expires: a bucket once it would be full again (plus a slack), a settled
job's hold after ``hold_ttl_s`` (a job running longer
loses its settlement), leases after twice their TTL without renewal.

Key layout (``ns`` is the deployment namespace, ``{...}`` the hash tag)::

    ns:{t:<tenant>}:b:<claim key>      a bucket, when only tenants have limits
    ns:{shared}:b:<claim key>          every bucket, when tiers or models have limits too
                                       (a job's claims then span tenants: one slot for all)
    ns:{...}:held:<job id>             a job's reservation awaits settlement (deleted by it)
    ns:{pool:<pool>}:leases / :lease_tokens   a pool's leases (zset) and their tokens (hash)
    ns:{fleet}:replicas / :queues             heartbeats (zset) and queue depths (hash)

One admission costs one round trip (the reserve script); acquiring a lease is a second one
only when a job is dispatched, and settlement and release leave through the outbox.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, SettleLine
from velvetrope.store.base import FleetView, LeaseAnswer

__all__ = ["RedisStore", "load_script"]

_SLACK_MS = 5_000


def load_script(name: str) -> str:
    """The Lua source of ``name`` (``reserve``, ``settle``, ...), from package data, after
    the shared prelude ``common.lua`` (the bucket refill and lease bookkeeping, once)."""
    lua = resources.files("velvetrope.store").joinpath("lua")
    return lua.joinpath("common.lua").read_text() + lua.joinpath(f"{name}.lua").read_text()


def _f(x: Any) -> float:
    return float(x.decode() if isinstance(x, bytes) else x)


class RedisStore:
    """:class:`~velvetrope.store.base.BucketStore` and
    :class:`~velvetrope.store.base.FleetSlots` on one Redis client.

    Calls raise redis-py's errors (connection, timeout, script); the
    :class:`~velvetrope.store.guard.GuardedStore` around it turns them into a policy."""

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "velvetrope",
        shared_tag: bool = False,
        lease_ttl_s: float = 30.0,
        replica_ttl_s: float = 10.0,
        hold_ttl_s: float = 6 * 3600.0,
    ) -> None:
        self.client = client
        self.ns = namespace
        self.shared_tag = shared_tag
        self.lease_ttl_s = lease_ttl_s
        self.replica_ttl_s = replica_ttl_s
        self.hold_ttl_s = hold_ttl_s
        reg = client.register_script
        self._reserve: AsyncScript = reg(load_script("reserve"))
        self._settle: AsyncScript = reg(load_script("settle"))
        self._levels: AsyncScript = reg(load_script("levels"))
        self._acquire: AsyncScript = reg(load_script("lease_acquire"))
        self._release: AsyncScript = reg(load_script("lease_release"))
        self._renew: AsyncScript = reg(load_script("lease_renew"))
        self._heartbeat: AsyncScript = reg(load_script("heartbeat"))
        self._fleet = (f"{namespace}:{{fleet}}:replicas", f"{namespace}:{{fleet}}:queues")

    # -- keys ----------------------------------------------------------------------

    def _tag(self, tenant: str) -> str:
        return f"{self.ns}:{{shared}}" if self.shared_tag else f"{self.ns}:{{t:{tenant}}}"

    def bucket_key(self, tenant: str, claim_key: str) -> str:
        """The Redis key of bucket ``claim_key`` for a job of ``tenant``."""
        return f"{self._tag(tenant)}:b:{claim_key}"

    def _lease_keys(self, pool: str) -> list[str]:
        base = f"{self.ns}:{{pool:{pool}}}"
        return [base + ":leases", base + ":lease_tokens"]

    # -- buckets ---------------------------------------------------------------------

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        if not claims:
            return Grant(())
        tag = self._tag(tenant)
        keys = [f"{tag}:b:{c.key}" for c in claims]
        keys.append(f"{tag}:held:{job_id}")
        args: list[Any] = []
        for c in claims:
            floor = -c.capacity if c.floor is None else c.floor
            args += [repr(c.amount), repr(c.capacity), repr(c.rate), repr(floor)]
        args += [_SLACK_MS, math.ceil(self.hold_ttl_s)]
        r = await self._reserve(keys=keys, args=args)
        if int(r[0]) == 1:
            return Grant(tuple(claims), _snaps(claims, r, 1))
        wait = _f(r[1])
        worst = claims[int(r[2]) - 1].key
        return Denial(wait, worst, _snaps(claims, r, 3))

    async def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> bool:
        tag = self._tag(tenant)
        keys = [f"{tag}:held:{job_id}"]
        args: list[Any] = [_SLACK_MS]
        for c, (key, reserved, actual) in zip(claims, lines, strict=True):
            keys.append(f"{tag}:b:{key}")
            floor = -c.capacity if c.floor is None else c.floor
            args += [repr(reserved), repr(actual), repr(c.capacity), repr(c.rate), repr(floor)]
        return int(await self._settle(keys=keys, args=args)) == 1

    async def snapshots(self, tenant: str, claims: Sequence[Claim]) -> tuple[BucketSnapshot, ...]:
        if not claims:
            return ()
        tag = self._tag(tenant)
        args: list[Any] = []
        for c in claims:
            args += [repr(c.capacity), repr(c.rate)]
        r = await self._levels(keys=[f"{tag}:b:{c.key}" for c in claims], args=args)
        return _snaps(claims, [b"1", *r], 1)

    # -- fleet slots ---------------------------------------------------------------------

    async def acquire(
        self, pool: str, job_id: str, tokens: int, max_in_flight: int, max_tokens: int | None
    ) -> LeaseAnswer:
        r = await self._acquire(
            keys=self._lease_keys(pool),
            args=[
                job_id,
                int(tokens),
                int(max_in_flight),
                -1 if max_tokens is None else int(max_tokens),
                repr(self.lease_ttl_s),
            ],
        )
        return LeaseAnswer(int(r[0]) == 1, int(r[1]), int(r[2]))

    async def release(self, pool: str, job_ids: Sequence[str]) -> int:
        if not job_ids:
            return 0
        return int(await self._release(keys=self._lease_keys(pool), args=list(job_ids)))

    async def renew(self, pool: str, job_ids: Sequence[str]) -> int:
        if not job_ids:
            return 0
        args: list[Any] = [repr(self.lease_ttl_s), *job_ids]
        return int(await self._renew(keys=self._lease_keys(pool), args=args))

    async def heartbeat(self, replica: str, queue_depth: int) -> FleetView:
        r = await self._heartbeat(
            keys=list(self._fleet), args=[replica, repr(self.replica_ttl_s), int(queue_depth)]
        )
        return FleetView(int(r[0]), int(r[1]))

    async def ping(self) -> None:
        """One round trip (a breaker's probe)."""
        await self.client.ping()

    async def close(self) -> None:
        """Close the client and its connection pool."""
        pool = getattr(self.client, "connection_pool", None)
        await self.client.aclose()
        if pool is not None:
            await pool.disconnect()


def _snaps(claims: Sequence[Claim], r: Sequence[Any], start: int) -> tuple[BucketSnapshot, ...]:
    out = []
    for i, c in enumerate(claims):
        level = _f(r[start + 2 * i])
        reset = _f(r[start + 2 * i + 1])
        out.append(BucketSnapshot(c.key, c.kind, c.owner, c.capacity, level, reset))
    return tuple(out)
