"""The admission controller: the single policy surface of velvetrope.

It takes events and returns decisions; it never reads the wall clock (time comes from the
injected :class:`~velvetrope.clock.Clock`), never awaits and never does I/O::

    ctl = AdmissionController(policy, clock)
    ctl.route(job)                   # pool by the policy's rules; degrade under pressure
    decision = ctl.arrive(job)       # Dispatched | Queued(position, eta_s) | Rejected(...)
    for job in ctl.dispatchable():   # queued jobs that may start now, in policy order
        ...
    ctl.sent(job.id)                 # handed to an engine: preemptible until its first token
    for p in ctl.take_preempted():   # taken back to make room for a higher tier: cancel
        ...                          # it at its engine (queued again, or ended 503)
    ctl.first_token(job.id)
    ctl.complete(job.id, usage)      # also: cancel(), fail(); tick() expires deadlines

Routing (:meth:`AdmissionController.route`, :mod:`velvetrope.core.routing`) picks the
pool and degrades under pressure; each pool's capacity is slots and tokens per engine × live
engines (:mod:`velvetrope.core.capacity`) and, with ``saturation.enabled``, the engines' own
readings (:mod:`velvetrope.core.saturation`, :meth:`AdmissionController.saturation`).

Admission of one job: draining? → edge buckets (429) → start at once if the pool is idle
enough → queue bounds (global 503, tenant 429, band 503) → predicted wait against the tier's
``max_wait_s`` (503) → queue.  A job rejected after its buckets granted is refunded in full.

Invariant: every job reaches exactly one terminal state, and at that moment, exactly once,
its slot and token budget are released and its bucket reservation is settled against the
tokens actually used.  Each terminal :class:`~velvetrope.core.job.Outcome` is handed to
every observer and returned to the caller.

The buckets live in a store (:mod:`velvetrope.store`: memory or Redis), never here: a driver
reserves :meth:`AdmissionController.claims` there and passes its ``Grant`` *or* ``Denial`` to
:meth:`arrive` (a denial runs the same lifecycle: one rejected outcome, 429), and applies each
outcome's ``Settlement`` there, idempotently per job id.  The one such driver is the request
machine (:mod:`velvetrope.core.request_machine`), for the gateway and the simulator alike.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection
from typing import Any, Final, NamedTuple

from velvetrope.clock import Clock
from velvetrope.core.bucket import (
    BucketSnapshot,
    Denial,
    Grant,
)
from velvetrope.core.capacity import PoolCapacity
from velvetrope.core.claims import ClaimSpecs
from velvetrope.core.estimate import OutputEstimator
from velvetrope.core.job import Job, Outcome
from velvetrope.core.job_ends import Preempted
from velvetrope.core.job_sizing import JobSizing
from velvetrope.core.lifecycle import JobState, Reason, Settlement, denied
from velvetrope.core.limit import AdaptiveLimit
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.pool import Pool
from velvetrope.core.predictor import make_estimator
from velvetrope.core.presets import apply_preset
from velvetrope.core.reload import orphaned, restart_needed
from velvetrope.core.routing import Router
from velvetrope.core.saturation import EngineSaturation
from velvetrope.core.tuples import new_tuple
from velvetrope.errors import LifecycleError, PolicyError

__all__ = [
    "AdmissionController",
    "Decision",
    "Dispatched",
    "Preempted",
    "Queued",
    "Rejected",
    "make_estimator",
]

_ARRIVED: Final = JobState.ARRIVED
_QUEUED: Final = JobState.QUEUED
_DISPATCHED: Final = JobState.DISPATCHED
_COMPLETED: Final = JobState.COMPLETED
_EXPIRED: Final = JobState.EXPIRED
_DONE: Final = Reason.COMPLETED
_NONE: Final = Settlement(())  # what a job with no claims owes
_MISSING: Final[Any] = object()


class Dispatched(NamedTuple):
    """The job was dispatched at once: start it now."""

    job: Job


class Queued(NamedTuple):
    """The job waits; ``position`` jobs (at most) are ahead, ``eta_s`` is the predicted
    wait (``None`` before a drain rate is known)."""

    job: Job
    position: int
    eta_s: float | None


class Rejected(NamedTuple):
    """Turned away (``retry_after_s`` None: do not retry); ``settlement`` refunds a grant."""

    job: Job
    reason: Reason
    retry_after_s: float | None
    message: str
    snapshots: tuple[BucketSnapshot, ...] = ()
    settlement: Settlement = _NONE

    @property
    def status(self) -> int:
        return self.reason.status


Decision = Dispatched | Queued | Rejected


class AdmissionController(JobSizing):
    """Every admission decision for one gateway (or one simulated gateway); how a job is
    placed and sized is :class:`~velvetrope.core.job_sizing.JobSizing`'s, the ends of what
    it admitted are :class:`~velvetrope.core.job_ends.JobEnds`'."""

    def __init__(
        self,
        config: PolicyConfig,
        clock: Clock,
        *,
        estimator: OutputEstimator | None = None,
        observers: list[Callable[[Outcome], None]] | None = None,
    ) -> None:
        config = apply_preset(config)
        self.clock = clock
        self.estimator: OutputEstimator = estimator or make_estimator(config.estimator)
        self.observers: list[Callable[[Outcome], None]] = list(observers or [])
        self._pools: dict[str, Pool] = {}
        self._saturation: dict[str, EngineSaturation] = {}
        self._configure(config)
        self._jobs: dict[str, Job] = {}
        self._deadlines: list[tuple[float, int, Job]] = []
        self._tenant_queued: dict[str, int] = {}
        self._unreported: list[Outcome] = []
        self._preempted: list[Preempted] = []
        self._asks: list[tuple[float, int, Job]] = []  # when queued jobs may ask for room
        self._seq = 0
        self.queued = 0
        self.in_flight = 0
        self.draining = False

    def _configure(self, config: PolicyConfig) -> None:
        """Build every table ``config`` decides (at start, and at each reload: existing
        pools keep their queue, drain meter, adaptive limit and saturation rule)."""
        self.config = config
        self._reserve_max = config.estimator.reserve == "max_tokens"
        self._tenants = {t.name: t for t in config.tenants}
        self._tier_index = {t.name: i for i, t in enumerate(config.tiers)}
        slo = config.queue.wait_from_slo
        self._tier_max_wait = [t.wait_bound_s if slo else t.max_wait_s for t in config.tiers]
        self._specs = ClaimSpecs(config, lambda tenant: self.tenant_policy(tenant).limits)
        self._bounds: dict[str, int | None] = {}
        self._max_queued = config.queue.max_queued
        self._shadow_tiers = [not config.enforce or not t.enforce for t in config.tiers]
        self._any_shadow = any(self._shadow_tiers) or any(not t.enforce for t in config.tenants)
        if config.default_tenant is not None and not config.default_tenant.enforce:
            self._any_shadow = True
        now = self.clock.now()
        for p in config.pools:
            pool = self._pools.get(p.name)
            if pool is not None:
                pool.retake(p, config)
            else:
                pool = self._pools[p.name] = Pool(p, config, self._weight, now)
                if pool.saturation is not None:
                    self._saturation[p.name] = pool.saturation
        self._pool_list = list(self._pools.values())
        self.router = Router(config)

    def reconfigure(
        self, config: PolicyConfig, gone_tenants: Collection[str] = ()
    ) -> list[Outcome]:
        """Apply ``config`` now, keeping what was learned (:mod:`velvetrope.core.reload`);
        PolicyError, nothing changed, for a setting that needs a restart.  Returns the
        outcomes of the queued jobs left with no place (their tenant, tier or pool removed,
        or their tenant in ``gone_tenants``: ``removed_by_reload``), for the caller to
        settle and report; other jobs keep their place, or run on."""
        config = apply_preset(config)
        needs = restart_needed(self.config, config)
        if needs:
            raise PolicyError("needs a restart to change: " + ", ".join(needs))
        now = self.clock.now()
        queued = [j for j in self._jobs.values() if j.state is _QUEUED]
        out = [
            self._end_queued(j, JobState.REJECTED, Reason.REMOVED_BY_RELOAD, now)
            for j in orphaned(queued, self.config, config, gone_tenants)
        ]
        self._configure(config)
        for job in self._jobs.values():
            job.band = self._pools[job.pool].sched.band_named(job.tier)
        return out

    # -- events ----------------------------------------------------------------------

    def arrive(self, job: Job, reservation: Grant | Denial | None = None) -> Decision:
        """Admit, queue or reject ``job`` (state ARRIVED).

        ``reservation`` is the bucket store's answer to :meth:`claims` (required when the job
        has claims; ignored otherwise).  A
        :class:`~velvetrope.core.bucket.Denial` rejects the job (429) through the same
        lifecycle as an in-memory denial; with a :class:`~velvetrope.core.bucket.Grant` a
        job rejected later in admission settles its claims with nothing used."""
        now = self.clock.now()
        # each Job field is read once into a local: a read is a generic attribute lookup
        if job.state is not _ARRIVED:
            raise LifecycleError(f"job {job.id!r} already {job.state.value}")
        job_id = job.id
        live = self._jobs
        if job_id in live:
            raise LifecycleError(f"job id {job_id!r} is already live")
        arrival = job.arrival
        if math.isnan(arrival):
            job.arrival = arrival = now
        tier_name = job.tier
        tier = self._tier_index.get(tier_name)
        if tier is None:
            raise PolicyError(f"job {job_id!r}: unknown tier {tier_name!r}")
        pool = self._pools.get(job.pool)
        if pool is None:
            raise PolicyError(f"job {job_id!r}: unknown pool {job.pool!r}")
        seq = self._seq = self._seq + 1
        job.seq = seq
        if self.draining:
            if type(reservation) is Grant:
                job.claims = reservation.claims  # granted elsewhere: the rejection refunds it
            return self._reject(job, Reason.DRAINING, None, "the gateway is draining", now)
        tenant = job.tenant  # 0. shadow mode (enforce: false): decided, then passed through
        if self._any_shadow and (
            self._shadow_tiers[tier] or not self.tenant_policy(tenant).enforce
        ):
            return self._arrive_shadow(job, pool, tier, reservation, now)
        # 1. edge buckets
        cost = job.cost
        if not cost:
            cost = self._size(job)
        denial = self._take(job, reservation)
        if denial is not None:
            return self._deny(job, denial, now)
        # 2. start at once when nothing is waiting and capacity allows
        sched = pool.sched
        cap = pool.capacity
        band = sched.band_of(tier)
        job.band = band
        if sched.queued == 0 and cap.fits(job, now):
            live[job_id] = job
            self._start(job, pool, now)
            sched.on_start_direct(job)
            return new_tuple(Dispatched, (job,))
        # 3-4. queue bounds and the predicted wait against the tier's max_wait
        shed = self._shed(job, pool, band, tier, tenant)
        if shed is not None:
            return self._reject(job, shed[0], shed[1], shed[2], now)
        ahead_n, ahead_tokens = sched.ahead(band)
        eta = pool.drain.seconds_for(ahead_tokens)
        tq = self._tenant_queued.get(tenant, 0)
        # 5. queue (ARRIVED -> QUEUED, checked on entry)
        job.state = _QUEUED
        live[job_id] = job
        sched.enqueue(job, band, cost)
        self.queued += 1
        self._tenant_queued[tenant] = tq + 1
        deadline = self._deadline(job, tier)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, seq, job))
        ask = pool.ask_at(job)
        if ask is not None:
            heapq.heappush(self._asks, (ask, seq, job))
        return new_tuple(Queued, (job, ahead_n, eta))

    def _take(self, job: Job, reservation: Grant | Denial | None) -> Denial | None:
        """:meth:`arrive`'s step 1, the edge buckets: the store's denial, or ``None``
        (granted: ``job.claims`` set to what was reserved)."""
        if reservation is None:
            if self._specs.of(job):
                raise PolicyError(f"job {job.id!r}: its claims need the store's reservation")
        elif isinstance(reservation, Denial):
            return reservation
        else:
            job.claims = reservation.claims
        return None

    def _shed(
        self, job: Job, pool: Pool, band: int, tier: int, tenant: str
    ) -> tuple[Reason, float | None, str] | None:
        """:meth:`Pool.shed` with this controller's bounds and counts: why a job that cannot
        start at once may not queue, or ``None``."""
        tbound = self._bounds.get(tenant, _MISSING)
        if tbound is _MISSING:  # looked up once per tenant, cached
            tbound = self._bounds[tenant] = self.tenant_policy(tenant).max_queued
        tq = self._tenant_queued.get(tenant, 0)
        wait = self._tier_max_wait[tier]
        if job.deadline is not None:  # the request's own, tighter bound (a header)
            own = job.deadline - job.arrival
            wait = own if wait is None or own < wait else wait
        return pool.shed(job, band, wait, tq, tbound, self.queued, self._max_queued)

    def _arrive_shadow(
        self, job: Job, pool: Pool, tier: int, reservation: Grant | Denial | None, now: float
    ) -> Dispatched:
        """Shadow mode (``enforce: false``): decide as :meth:`arrive` would (buckets, start
        at once or queue, bounds, predicted wait), record it on the job (``shadow``,
        ``shadow_reason``) and dispatch the job now, whatever it says.  Granted claims are
        kept and settled when the job ends, with nothing used if the decision was a
        rejection (enforcement would have refunded them): the buckets see what enforcement
        would have charged."""
        if not job.cost:
            self._size(job)
        denial = self._take(job, reservation)
        decision, why = "admitted", ""
        sched = pool.sched
        band = job.band = sched.band_of(tier)
        if denial is not None:
            decision = "rejected"
            why = "request_too_large" if denial.never else denied(denial.key, 0.0)[0].code
        elif not (sched.queued == 0 and pool.capacity.fits(job, now)):
            shed = self._shed(job, pool, band, tier, job.tenant)
            decision, why = ("queued", "capacity") if shed is None else ("rejected", shed[0].code)
        job.shadow = decision
        job.shadow_reason = why
        self._jobs[job.id] = job
        self._start(job, pool, now)
        sched.on_start_direct(job)
        return new_tuple(Dispatched, (job,))

    def standing(self, job_id: str) -> tuple[int, float | None] | None:
        """Where a queued job stands: ``(ahead, eta_s)``, at most ``ahead`` jobs before it
        (those queued in its band and above, as :meth:`arrive` counts them) and the
        predicted wait for their work (``None`` before a drain rate is known).  ``None``
        when the job is not queued."""
        job = self._jobs.get(job_id)
        if job is None or job.state is not _QUEUED:
            return None
        pool = self._pools[job.pool]
        n, tokens = pool.sched.ahead(job.band)
        return max(0, n - 1), pool.drain.seconds_for(max(0.0, tokens - job.cost))

    def would_start(self, job: Job) -> bool:
        """Whether ``job`` (sized by :meth:`claims`) would be dispatched at once if it
        arrived now: its pool has nothing queued and room for it.  Lets a driver take a
        slot elsewhere (a fleet lease) in the same round trip as the bucket reservation."""
        pool = self._pools.get(job.pool)
        if pool is None or self.draining:
            return False
        return pool.sched.queued == 0 and pool.capacity.fits(job, self.clock.now())

    def reject(
        self, job: Job, reason: Reason, message: str, retry_after_s: float | None = None
    ) -> Rejected:
        """Turn away ``job`` (state ARRIVED) for a reason found outside the core (e.g. the
        bucket store cannot be reached): one rejected outcome, as for any rejection."""
        if job.state is not JobState.ARRIVED:
            raise LifecycleError(f"job {job.id!r} already {job.state.value}")
        if math.isnan(job.arrival):
            job.arrival = self.clock.now()
        return self._reject(job, reason, retry_after_s, message, self.clock.now())

    def dispatchable(self) -> list[Job]:
        """Queued jobs that may start now, in policy order; each is moved to DISPATCHED.

        Expires overdue jobs first, and on its way any job that would reach its first token
        past its objective if dispatched now (:mod:`velvetrope.core.first_token_lead`);
        their outcomes go to observers and the next :meth:`tick`."""
        now = self.clock.now()
        if self._deadlines and self._deadlines[0][0] <= now:
            self._unreported.extend(self._expire(now))
        asks = self._asks
        while asks and asks[0][0] <= now:  # a wake-up to ask for room: this call asks
            heapq.heappop(asks)
        out: list[Job] = []
        for pool in self._pool_list:
            sched = pool.sched
            cap = pool.capacity
            pre = pool.preemption
            while sched.queued:
                if pre is None and cap.in_flight >= cap.max_in_flight:
                    break  # no slot: do not even look at the queue
                job = sched.peek()
                if job is None:
                    break
                if pool.lead is not None and pool.lead.too_late(job, now):
                    self._unreported.append(self._end_queued(job, _EXPIRED, Reason.EXPIRED, now))
                    continue
                if not cap.fits(job, now):
                    if pre is None:
                        break
                    victim = pre.make_room(job, now)
                    if victim is None:
                        break
                    self._take_back(victim, pool, now)  # one per pool and call
                    if not cap.fits(job, now):
                        break
                sched.pop()
                self.queued -= 1
                self._tenant_queued[job.tenant] -= 1
                self._start(job, pool, now)
                out.append(job)
        return out

    def start_draining(self) -> None:
        """Reject every new arrival with ``draining``; queued and in-flight work goes on."""
        self.draining = True

    # -- introspection -------------------------------------------------------------

    def job(self, job_id: str) -> Job | None:
        """A live (queued or dispatched) job, or ``None``."""
        return self._jobs.get(job_id)

    def status(self) -> dict[str, Any]:
        """Queue by pool, band and tenant; in-flight work (the buckets are the store's)."""
        pools = {p.name: p.status(self.clock.now()) for p in self._pool_list}
        return {
            "draining": self.draining,
            "queued": self.queued,
            "in_flight": self.in_flight,
            "tenants_queued": {t: n for t, n in self._tenant_queued.items() if n},
            "pools": pools,
        }

    def pool_capacity(self, pool: str) -> PoolCapacity:
        """The capacity object of ``pool`` (to attach saturation signals or change limits)."""
        return self._pools[pool].capacity

    def saturation(self, pool: str) -> EngineSaturation | None:
        """``pool``'s engine-saturation rule (``None`` when ``saturation.enabled`` is off):
        feed it readings and the live engines, and report each job sent to an engine."""
        return self._saturation.get(pool)

    def engines_ordered(self, pool: str, ordered: bool) -> None:
        """Whether ``pool``'s engines order their own waiting queues by the priority the
        pool forwards (``engine_priority``; :mod:`.engine_priority`).  The driver learns
        it from the engines: one that refuses the field, or runs FCFS, does not.  The
        headroom rule and the prefill backlog the replica choice reads count on that order
        only while it holds (and only in a pool that forwards the priority)."""
        sat = self._saturation.get(pool)
        if sat is None:
            return
        forwards = any(p.engine_priority for p in self.config.pools if p.name == pool)
        if sat.headroom is not None:
            sat.headroom.ordered = ordered and forwards
        if sat.backlog is not None:
            sat.backlog.ordered = ordered and forwards

    def pool_limit(self, pool: str) -> AdaptiveLimit | None:
        """The adaptive in-flight limit of ``pool`` (``None`` with a fixed ``max_in_flight``)."""
        return self._pools[pool].limit

    # -- internals -------------------------------------------------------------------

    def _start(self, job: Job, pool: Pool, now: float) -> None:
        # ARRIVED or QUEUED -> DISPATCHED: callers hold a job in one of those states
        job.state = _DISPATCHED
        job.dispatched_at = now
        self.in_flight += 1
        pool.acquire(job, now)

    def _reject(
        self, job: Job, reason: Reason, retry: float | None, message: str, now: float
    ) -> Rejected:
        job.move(JobState.REJECTED)
        settlement = self._settlement(job, 0)
        self._emit(job, JobState.REJECTED, reason, settlement, now)
        return Rejected(job, reason, retry, message, (), settlement)

    def _deny(self, job: Job, denial: Denial, now: float) -> Rejected:
        job.move(JobState.REJECTED)
        if denial.never:
            reason, retry = Reason.REQUEST_TOO_LARGE, None
            msg = (
                f"request needs {job.cost} tokens, more than the capacity of bucket {denial.key!r}"
            )
        else:
            retry = denial.retry_after_s
            reason, msg = denied(denial.key, retry)
        self._emit(job, JobState.REJECTED, reason, Settlement(()), now)
        return Rejected(job, reason, retry, msg, denial.snapshots)
