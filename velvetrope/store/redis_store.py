"""Bucket levels and fleet-wide slot leases in Redis (or Valkey), one Lua script per atomic
operation.

Scripts ship as package data (``velvetrope/store/lua``) and run with EVALSHA, reloaded on
NOSCRIPT (redis-py's ``Script``).  Redis ``TIME`` is the only clock inside them, so replicas
whose clocks disagree still share one bucket arithmetic (that of
:class:`~velvetrope.core.bucket.MemoryBuckets`; one table of test vectors runs against
both).  Every key expires: a bucket once it would be full again (plus a slack; a
settlement that does not lower its level leaves the later expiry it had), a settled job's
hold after ``hold_ttl_s`` (a job running longer loses its settlement), leases after twice
their TTL without renewal.

Key layout (``ns`` is the deployment namespace, ``{...}`` the hash tag)::

    ns:{t:<tenant>}:b:<claim key>      a bucket, when only tenants have limits
    ns:{shared}:b:<claim key>          every bucket, when tiers or models have limits too
                                       (a job's claims then span tenants: one slot for all)
    ns:{...}:held:<job id>             a job's reservation awaits settlement (deleted by it)
    ns:{pool:<pool>}:leases / :lease_tokens   a pool's leases (zset: job id -> expiry in
                                              whole ms), the tokens of those taken under a
                                              token cap (hash)
    ns:{fleet}:replicas / :queues             heartbeats (zset) and queue depths (hash)

Calls go through an :class:`~velvetrope.store.pipeline.AutoPipeline` (one round trip per
event-loop tick for everything issued in it); a job admitted at once reserves its buckets
and its slot lease in the same tick, so one round trip; settlements and releases leave
through the outbox, batched the same way, and those of jobs sharing a slot (one tag and,
for a finish, one pool) as one call of ``finish_many.lua`` / ``settle_many.lua`` (each job
settled by the rules of ``settle.lua``, a bucket read and written once per call).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Final

from redis.commands.core import AsyncScript

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, SettleLine
from velvetrope.store.base import FleetView, LeaseAnswer, Slot
from velvetrope.store.pipeline import AutoPipeline
from velvetrope.store.replies import parse_lease, parse_reserve, parse_reserve_leased, snapshots
from velvetrope.store.resp import arg, evalsha, fill, number, template, text

__all__ = [
    "RedisStore",
    "SettleItem",
    "load_script",
    "packed",
    "parse_lease",
    "parse_reserve",
    "parse_reserve_leased",
]

_SLACK_MS: Final = 5_000

SettleItem = tuple[str, str, Sequence[Claim], Sequence[SettleLine]]
"""One job's settlement in a batch: ``(job id, tenant, claims, lines)``."""


def load_script(name: str) -> str:
    """The Lua source of ``name`` (``reserve``, ``settle``, ...), from package data, after
    the shared prelude ``common.lua`` (the bucket refill and lease bookkeeping, once)."""
    lua = resources.files("velvetrope.store").joinpath("lua")
    return lua.joinpath("common.lua").read_text() + lua.joinpath(f"{name}.lua").read_text()


def packed(sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """The RESP of ``EVALSHA sha`` with ``keys`` and ``args`` (strings and numbers): the
    bytes ``pack`` writes for them."""
    return evalsha(sha, [text(x) for x in keys], [arg(x) for x in args])


def _shape(c: Claim) -> tuple[float, float, float]:
    """A bucket's capacity, refill rate and floor as script arguments (numbers are packed
    as ``repr`` writes them, which reads back as the same double), as floats, a zero floor
    as 0.0: equal shapes are the same arguments (see :meth:`RedisStore._packed_reserve`)."""
    cap = float(c.capacity)
    return cap, float(c.rate), -cap if c.floor is None else float(c.floor) + 0.0


class RedisStore:
    """Buckets, their reservations and settlements, and leases on one Redis client.

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
        self._reserve_leased: AsyncScript = reg(load_script("reserve_leased"))
        self._finish: AsyncScript = reg(load_script("finish"))
        self._finish_many: AsyncScript = reg(load_script("finish_many"))
        self._settle_many: AsyncScript = reg(load_script("settle_many"))
        self._ledger_many: AsyncScript = reg(load_script("ledger_many"))
        self._fleet = (f"{namespace}:{{fleet}}:replicas", f"{namespace}:{{fleet}}:queues")
        # a cluster client routes each command by its slot: call scripts one by one there
        self._pipe = None if hasattr(client, "get_nodes") else AutoPipeline(client)
        # the constant pieces of reservations per (tenant, pool, buckets): see _packed_reserve
        self._templates: dict[tuple[Any, ...], list[bytes]] = {}

    def observe_round_trips(self, observe: Callable[[float], None]) -> None:
        """Hear the duration of every pipelined round trip (write to full reply)."""
        if self._pipe is not None:
            self._pipe.observe = observe

    def _run(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> Any:
        """One script call, auto-pipelined with the other calls of this tick."""
        if self._pipe is not None:
            return self._pipe.run(script, keys, args)
        return script(keys=keys, args=args)

    # -- keys ----------------------------------------------------------------------

    def tag(self, tenant: str) -> str:
        """The prefix, hash tag included, of ``tenant``'s bucket and hold keys (one slot)."""
        return f"{self.ns}:{{shared}}" if self.shared_tag else f"{self.ns}:{{t:{tenant}}}"

    def bucket_key(self, tenant: str, claim_key: str) -> str:
        """The Redis key of bucket ``claim_key`` for a job of ``tenant``."""
        return f"{self.tag(tenant)}:b:{claim_key}"

    def _lease_keys(self, pool: str) -> list[str]:
        base = f"{self.ns}:{{pool:{pool}}}"
        return [base + ":leases", base + ":lease_tokens"]

    # -- buckets ---------------------------------------------------------------------

    def _reserve_call(
        self, job_id: str, tenant: str, claims: Sequence[Claim]
    ) -> tuple[list[Any], list[Any]]:
        tag = self.tag(tenant)
        keys: list[Any] = [f"{tag}:b:{c.key}" for c in claims]
        keys.append(f"{tag}:held:{job_id}")
        args: list[Any] = []
        for c in claims:
            args.append(c.amount)
            args += _shape(c)
        args += [_SLACK_MS, math.ceil(self.hold_ttl_s)]
        return keys, args

    def _settle_call(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> tuple[list[Any], list[Any]]:
        tag = self.tag(tenant)
        keys: list[Any] = [f"{tag}:held:{job_id}"]
        args: list[Any] = [_SLACK_MS]
        for c, (key, reserved, actual) in zip(claims, lines, strict=True):
            keys.append(f"{tag}:b:{key}")
            args += [reserved, actual, *_shape(c)]
        return keys, args

    def _settle_many_call(
        self, jobs: Sequence[SettleItem], keys: list[Any], with_ids: bool, hold: str = "held"
    ) -> tuple[list[Any], list[Any]]:
        """``keys`` followed by settle_many's (common.lua), and its arguments: each bucket
        once (a bucket key and shape seen before gets its index again), then the jobs'
        holds (``{tag}:{hold}:{job}``: ``held``, or the ledger's markers, ``ledgered``)."""
        tag = self.tag(jobs[0][1])
        index: dict[tuple[str, float, float, float | None], int] = {}
        head: list[Any] = [_SLACK_MS, None]  # None: the number of buckets, known last
        holds: list[Any] = []
        tail: list[Any] = []
        first = jobs[0][1]
        for job_id, tenant, claims, lines in jobs:
            if tenant != first and self.tag(tenant) != tag:
                raise ValueError(f"tenants {first!r} and {tenant!r} do not share a slot")
            holds.append(f"{tag}:{hold}:{job_id}")
            if with_ids:
                tail.append(job_id)
            n = len(lines)
            if len(claims) != n:
                raise ValueError(f"job {job_id!r}: {len(claims)} claims, {n} settle lines")
            tail.append(n)
            for i in range(n):  # not zip(strict=True): compiled, that is a Python-level call
                c = claims[i]
                key, reserved, actual = lines[i]
                a: Any = c  # untyped: the claim's own objects (compiled, no float boxed again)
                spec = (key, a.capacity, a.rate, a.floor)  # equal specs: equal shapes
                b = index.get(spec)
                if b is None:
                    b = index[spec] = len(index) + 1
                    keys.append(f"{tag}:b:{key}")
                    head += _shape(c)
                tail += (b, reserved, actual)
        head[1] = len(index)
        keys += holds
        return keys, head + tail

    def _send_many(
        self,
        script: AsyncScript,
        jobs: Sequence[SettleItem],
        keys: list[str],
        with_ids: bool,
        hold: str = "held",
    ) -> Any:
        """A settle_many call (finish_many.lua, settle_many.lua, ledger_many.lua) after
        ``keys``, with :meth:`_settle_many_call`'s keys and arguments: packed here
        (:func:`packed`) when pipelined."""
        k, a = self._settle_many_call(jobs, list(keys), with_ids, hold)
        if self._pipe is None:
            return self._run(script, k, a)
        return self._pipe.send(script, packed(script.sha, k, a))

    def _lease_args(self, job_id: str, slot: Slot) -> list[Any]:
        return [
            job_id,
            int(slot.tokens),
            int(slot.max_in_flight),
            -1 if slot.max_tokens is None else int(slot.max_tokens),
            self.lease_ttl_s,
        ]

    async def reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Grant | Denial:
        if not claims:
            return Grant(())
        return parse_reserve(claims, await self.send_reserve(job_id, tenant, claims))

    def send_reserve(self, job_id: str, tenant: str, claims: Sequence[Claim]) -> Any:
        """:meth:`reserve` (with claims) as an awaitable of the raw reply (see
        :func:`parse_reserve`)."""
        if self._pipe is not None:
            return self._pipe.send(self._reserve, self._packed_reserve(job_id, tenant, claims))
        keys, args = self._reserve_call(job_id, tenant, claims)
        return self._run(self._reserve, keys, args)

    def answering(self, within_s: float) -> bool:
        """Whether Redis answered any pipelined call in the last ``within_s`` seconds (so
        a late reply is this process's backlog, not Redis's)."""
        pipe = self._pipe
        return pipe is not None and time.monotonic() - pipe.last_reply < within_s

    async def settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> bool:
        return int(await self.send_settle(job_id, tenant, claims, lines)) == 1

    def send_settle(
        self, job_id: str, tenant: str, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> Any:
        """:meth:`settle` as an awaitable of the raw reply (a future when pipelined)."""
        keys, args = self._settle_call(job_id, tenant, claims, lines)
        return self._run(self._settle, keys, args)

    @property
    def combined(self) -> bool:
        """Whether buckets and leases can be touched by one script (not on a cluster,
        where they live in different slots)."""
        return self._pipe is not None

    async def reserve_leased(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        slot: Slot,
    ) -> tuple[Grant | Denial, LeaseAnswer | None]:
        """:meth:`reserve`, then (if granted) :meth:`acquire`, atomically in one call
        (requires :attr:`combined`).  The lease is ``None`` when the reservation was denied."""
        r = await self.send_reserve_leased(job_id, tenant, claims, slot)
        return parse_reserve_leased(claims, r)

    def send_reserve_leased(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        slot: Slot,
    ) -> Any:
        """:meth:`reserve_leased` as an awaitable of the raw reply (see
        :func:`parse_reserve_leased`): the job's reservation and, if granted, its lease, in one
        script call."""
        if self._pipe is not None:
            return self._pipe.send(
                self._reserve_leased, self._packed_reserve(job_id, tenant, claims, slot)
            )
        keys, args = self._reserve_leased_call(job_id, tenant, claims, slot)
        return self._run(self._reserve_leased, keys, args)

    def _reserve_leased_call(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot
    ) -> tuple[list[Any], list[Any]]:
        keys, args = self._reserve_call(job_id, tenant, claims)
        keys += self._lease_keys(slot.pool)
        args += self._lease_args(job_id, slot)
        return keys, args

    def _packed_reserve(
        self, job_id: str, tenant: str, claims: Sequence[Claim], slot: Slot | None = None
    ) -> bytes:
        """The RESP of :meth:`send_reserve`'s call (``slot`` ``None``) or
        :meth:`send_reserve_leased`'s: the bytes ``pack`` writes for :meth:`_reserve_call`'s
        (:meth:`_reserve_leased_call`'s) arguments, from a
        :func:`~velvetrope.store.resp.template` per tenant, pool and claimed buckets, with
        the hold, the amounts, the job id and its tokens filled in."""
        ck: tuple[Any, ...] = (tenant,)
        if slot is not None:
            ck = (tenant, slot.pool, slot.max_in_flight, slot.max_tokens)
        for c in claims:
            a: Any = c  # untyped: the claim's own objects (compiled, no float boxed again)
            ck += ((a.key, a.capacity, a.rate, a.floor),)
        runs = self._templates.get(ck)
        if runs is None:
            if len(self._templates) >= 1024:
                self._templates.clear()
            runs = self._templates[ck] = self._reserve_template(tenant, claims, slot)
        values = [text(f"{self.tag(tenant)}:held:{job_id}")]
        for c in claims:
            values.append(number(c.amount))
        if slot is not None:
            values += (text(job_id), number(int(slot.tokens)))
        return fill(runs, values)

    def _reserve_template(
        self, tenant: str, claims: Sequence[Claim], slot: Slot | None
    ) -> list[bytes]:
        n = len(claims)
        if slot is None:
            keys, args = self._reserve_call("", tenant, claims)
            script = self._reserve
        else:
            keys, args = self._reserve_leased_call("", tenant, claims, slot)
            script = self._reserve_leased
        k = len(keys)
        varying = [n, *range(k, k + 4 * n, 4)]  # the hold; each claim's amount
        if slot is not None:
            varying += (k + 4 * n + 2, k + 4 * n + 3)  # the job id, its tokens
        return template(script.sha, keys, args, varying)

    async def finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> tuple[bool, int]:
        """:meth:`settle` and :meth:`release` of one job in one call (requires
        :attr:`combined`); returns (settled, leases released)."""
        r = await self.send_finish(job_id, tenant, claims, lines, pool)
        return int(r[0]) == 1, int(r[1])

    def send_finish(
        self,
        job_id: str,
        tenant: str,
        claims: Sequence[Claim],
        lines: Sequence[SettleLine],
        pool: str,
    ) -> Any:
        """:meth:`finish` as an awaitable of the raw reply (a future when pipelined)."""
        keys, args = self._settle_call(job_id, tenant, claims, lines)
        keys += self._lease_keys(pool)
        args.append(job_id)
        return self._run(self._finish, keys, args)

    async def finish_many(self, pool: str, jobs: Sequence[SettleItem]) -> list[tuple[bool, int]]:
        """:meth:`finish` of several jobs in one call (requires :attr:`combined`; their
        tenants share one :meth:`tag`), as if each ran alone at one instant; returns
        (settled, leases released) per job, in order."""
        r = await self.send_finish_many(pool, jobs)
        return [(int(r[i]) == 1, int(r[i + 1])) for i in range(0, len(r), 2)]

    def send_finish_many(self, pool: str, jobs: Sequence[SettleItem]) -> Any:
        """:meth:`finish_many` as an awaitable of the raw reply (a future when pipelined)."""
        return self._send_many(self._finish_many, jobs, self._lease_keys(pool), True)

    async def settle_many(self, jobs: Sequence[SettleItem]) -> list[bool]:
        """:meth:`settle` of several jobs whose tenants share one :meth:`tag`, in one call,
        as if each ran alone at one instant; returns whether each was settled, in order."""
        return [int(x) == 1 for x in await self.send_settle_many(jobs)]

    def send_settle_many(self, jobs: Sequence[SettleItem]) -> Any:
        """:meth:`settle_many` as an awaitable of the raw reply."""
        return self._send_many(self._settle_many, jobs, [], False)

    def send_ledger_many(self, jobs: Sequence[SettleItem]) -> Any:
        """Write the ledger lines of jobs settled in a replica's local fallback (each line
        ``(key, 0, count)``, its claim the ledger claim), each job at most once
        (``ledger_many.lua``), as an awaitable of the raw reply (1/0 per job)."""
        return self._send_many(self._ledger_many, jobs, [], False, "ledgered")

    async def snapshots(self, tenant: str, claims: Sequence[Claim]) -> tuple[BucketSnapshot, ...]:
        if not claims:
            return ()
        tag = self.tag(tenant)
        args: list[Any] = []
        for c in claims:
            args += [c.capacity, c.rate]
        r = await self._run(self._levels, [f"{tag}:b:{c.key}" for c in claims], args)
        return snapshots(claims, r, 0)

    # -- leases --------------------------------------------------------------------------

    async def acquire(self, job_id: str, slot: Slot) -> LeaseAnswer:
        return parse_lease(await self.send_acquire(job_id, slot))

    def send_acquire(self, job_id: str, slot: Slot) -> Any:
        """:meth:`acquire` as an awaitable of the raw reply (see :func:`parse_lease`)."""
        return self._run(self._acquire, self._lease_keys(slot.pool), self._lease_args(job_id, slot))

    async def release(self, pool: str, job_ids: Sequence[str]) -> int:
        if not job_ids:
            return 0
        return int(await self.send_release(pool, job_ids))

    def send_release(self, pool: str, job_ids: Sequence[str]) -> Any:
        """:meth:`release` as an awaitable of the raw reply (a future when pipelined)."""
        return self._run(self._release, self._lease_keys(pool), list(job_ids))

    async def renew(self, pool: str, leases: Mapping[str, int]) -> int:
        """Extend the leases of ``pool``'s running jobs (job id -> tokens, negative when
        taken without a token cap), taking again any that Redis no longer has (expired, or
        lost with its data) whatever the pool's limits; returns how many were re-created."""
        if not leases:
            return 0
        args: list[Any] = [self.lease_ttl_s]
        for job_id, tokens in leases.items():
            args += [job_id, int(tokens)]
        return int(await self._run(self._renew, self._lease_keys(pool), args))

    async def heartbeat(self, replica: str, queue_depth: int) -> FleetView:
        args: list[Any] = [replica, self.replica_ttl_s, int(queue_depth)]
        r = await self._run(self._heartbeat, list(self._fleet), args)
        return FleetView(int(r[0]), int(r[1]), bool(int(r[2])))

    async def close(self) -> None:
        """Wait for pipelined calls in flight; close the client, its connection pool and (on
        a Sentinel URL) the clients that asked the Sentinels for the master."""
        if self._pipe is not None:
            await self._pipe.close()
        pool = getattr(self.client, "connection_pool", None)
        await self.client.aclose()
        if pool is not None:
            await pool.disconnect()
            manager = getattr(pool, "sentinel_manager", None)
            for sentinel in getattr(manager, "sentinels", ()):
                await sentinel.aclose()
                await sentinel.connection_pool.disconnect()
