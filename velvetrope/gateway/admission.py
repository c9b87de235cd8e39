"""A request's admission, from arrival to settlement: the one owner of the controller's
lifecycle in the gateway.

:meth:`Admission.enter` takes a parsed job and returns a :class:`Ticket` (the job is
dispatched: proxy it), a :class:`Refusal` (answer it) or ``None`` (the client went away
first).  In order, with no other caller in between:

1. draining? → refused before anything is reserved;
2. route and size (:meth:`~velvetrope.core.controller.AdmissionController.route`,
   :meth:`~velvetrope.core.controller.AdmissionController.claims`);
   with the job's budgets and ledger counters (:class:`~velvetrope.gateway.quotas.Quotas`);
3. the store's reservation (:class:`~velvetrope.store.base.Store`): without I/O when the
   store can answer so (memory; a shared store whose state is away), else one round trip
   that also takes the job's fleet slot when it will start at once; denied by a spent
   budget that downgrades, the job is downgraded (:func:`~velvetrope.core.quota.downgrade`)
   and steps 2-3 run again without that budget;
4. arrive in the controller; if queued, wait for dispatch, expiry or the client's
   disconnect (a single timer armed at the controller's next deadline);
5. with fleet slots, the dispatched job's slot (:class:`~velvetrope.gateway.slots.FleetSlot`).

The ticket records the first token and ends the job exactly once (:meth:`Ticket.complete`,
:meth:`Ticket.fail`, :meth:`Ticket.cancel`); every end, whatever ended it (the ticket, a
rejection after the store granted, an expiry, a disconnect while queued), is settled in the
store and gives back the job's slot right here, then whatever now fits is dispatched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, NamedTuple

from velvetrope.core import (
    AdmissionController,
    BucketSnapshot,
    Grant,
    Job,
    Outcome,
    Preempted,
    Queued,
    Reason,
    Rejected,
    Usage,
)
from velvetrope.core.bucket import Claim, SettleLine, settle_lines
from velvetrope.core.lifecycle import JobState
from velvetrope.core.quota import downgrade
from velvetrope.errors import LifecycleError, StoreUnavailable
from velvetrope.gateway.quotas import Quotas
from velvetrope.gateway.slots import FleetSlot
from velvetrope.store.base import Store

__all__ = ["Admission", "Refusal", "Ticket"]

_QUEUED: Final = JobState.QUEUED
_DISPATCHED: Final = JobState.DISPATCHED
_GONE: Final = "gone"
_EXPIRED: Final = Reason.EXPIRED
_EXPIRED_MESSAGE: Final = "the request waited past its deadline in the queue"
_REMOVED_MESSAGE: Final = (
    "a configuration reload removed the tenant, tier or pool this request was queued for"
)


class Refusal(NamedTuple):
    """Why a request gets no ticket: the HTTP ``status``, OpenAI's error ``code``, a
    ``message``, ``retry_after_s`` (``None`` when retrying cannot help) and the claimed
    buckets' ``snapshots`` (for ``x-ratelimit-*`` headers)."""

    status: int
    code: str
    message: str
    retry_after_s: float | None
    snapshots: tuple[BucketSnapshot, ...] = ()


def _refusal(r: Rejected) -> Refusal:
    return Refusal(r.reason.status, r.reason.code, r.message, r.retry_after_s, r.snapshots)


class Ticket:
    """A dispatched request.  Record its first token; end it once (later calls do
    nothing): the end settles its reservation and gives back its slot.

    While its answer is relayed (``task`` set), the controller may take the job back before
    its first token (:meth:`preempt`): the ticket is then void (``preempted`` says what
    became of the job) and ``task`` is cancelled, which closes the upstream request."""

    __slots__ = ("_admission", "ended", "job", "preempted", "snapshots", "task")

    def __init__(
        self, admission: Admission, job: Job, snapshots: tuple[BucketSnapshot, ...]
    ) -> None:
        self._admission = admission
        self.job = job
        self.snapshots = snapshots
        """The claimed buckets after the reservation (``x-ratelimit-*`` headers)."""
        self.ended = False
        self.preempted: Preempted | None = None
        self.task: asyncio.Task[None] | None = None
        admission._tickets[job.id] = self

    def sent(self, task: asyncio.Task[None]) -> None:
        """The request is on its way to an engine, relayed by ``task``: until its first
        token the controller may take it back (streamed answers only: a whole answer's
        first token cannot be seen)."""
        self.task = task
        if self.job.streamed and not self.ended:
            self._admission.ctl.sent(self.job.id)

    def preempt(self, p: Preempted) -> None:
        """The controller took the job back: void this ticket and stop its relay."""
        self.ended = True
        self.preempted = p
        if self.task is not None:
            self.task.cancel()

    def first_token(self) -> None:
        """The upstream sent the first token (ignored after the first, or once ended)."""
        if self.ended or self.job.first_token_at is not None:
            return
        try:
            self._admission.ctl.first_token(self.job.id)
        except LifecycleError:  # not contextlib.suppress: a context manager per call costs
            return

    def complete(self, usage: Usage) -> None:
        """The upstream answered: charge ``usage``."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.ended(adm.ctl.complete(self.job.id, usage))

    def fail(self, reason: Reason, usage: Usage | None = None) -> None:
        """The upstream failed (``reason``); charge ``usage`` (default: nothing)."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.ended(adm.ctl.fail(self.job.id, reason, usage))

    def cancel(self, usage: Usage | None = None) -> None:
        """The client went away; charge ``usage`` (default: the prompt)."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.ended(adm.ctl.cancel(self.job.id, usage))


class Admission:
    """The gateway's admission: the controller, the store and the pools' fleet slots."""

    def __init__(
        self,
        ctl: AdmissionController,
        store: Store,
        on_route: Callable[[Job], None] | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.ctl = ctl
        self.store = store
        self._on_route = on_route
        self.quotas = quotas
        """Budgets and the ledger: claimed, answered and settled with the buckets."""
        self.slots: dict[str, FleetSlot] = {}
        """Per pool, its fleet slot (shared stores only)."""
        if store.shared:
            for p in ctl.config.pools:
                self.slots[p.name] = FleetSlot(p.name, ctl.pool_capacity(p.name), store)
        self._waiters: dict[str, asyncio.Future[Outcome | None]] = {}
        self._tickets: dict[str, Ticket] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting in the queue."""
        return len(self._waiters)

    # -- the request's way in --------------------------------------------------------

    async def enter(
        self,
        job: Job,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None = None,
        every_s: float = 2.0,
    ) -> Ticket | Refusal | None:
        """Admit ``job`` (state ARRIVED): a :class:`Ticket` once it is dispatched (and holds
        its fleet slot), a :class:`Refusal`, or ``None`` when ``gone`` (the client's
        disconnect) completed first.  While queued, ``progress`` (if given) is awaited
        every ``every_s`` seconds.  Raises what routing raises for a job the policy cannot
        place (:class:`~velvetrope.errors.PolicyError`)."""
        ctl = self.ctl
        if ctl.draining:  # before the store: a refused request reserves nothing
            return _refusal(ctl.reject(job, Reason.DRAINING, "the gateway is draining"))
        ctl.route(job)
        if self._on_route is not None:
            self._on_route(job)
        quotas = self.quotas
        spent: tuple[str, ...] = ()
        while True:  # again only for a downgrade: a spent budget is claimed once at most
            claims = ctl.claims(job)
            if quotas is not None:
                claims = quotas.claims(job, claims, spent)
            fleet = self.slots.get(job.pool) if self.slots else None
            slot = fleet.ask(job) if fleet is not None and ctl.would_start(job) else None
            store = self.store
            try:
                res = store.reserve_now(job.id, job.tenant, claims, slot)
                if res is None:
                    res = await store.reserve(job.id, job.tenant, claims, slot)
            except StoreUnavailable as e:
                return _refusal(ctl.reject(job, Reason.STATE_UNAVAILABLE, str(e), 1.0))
            except asyncio.CancelledError:  # shut down mid-trip: undo what may have been taken
                self._settle(job, settle_lines(claims, 0), claimed=claims)
                raise
            if quotas is None:
                break
            res = quotas.answer(job, claims, res)
            down = quotas.downgrade(res)
            if down is None or down.key in spent:
                break
            spent += (down.key,)  # nothing was reserved: downgrade, and reserve again
            downgrade(job, down, ctl.route)
        d = ctl.arrive(job, res)
        if isinstance(d, Rejected):
            self._settle(job, d.settlement.lines)
            return _refusal(d)
        snapshots = res.snapshots if isinstance(res, Grant) else ()
        if isinstance(d, Queued):
            return await self._queued(job, gone, progress, every_s, snapshots)
        if gone.done():
            self.abandon(job)
            return None
        if fleet is not None and job.id in fleet.brake.lacking:
            return await self._take_slot(fleet, job, gone, snapshots)
        return Ticket(self, job, snapshots)

    async def again(
        self,
        ticket: Ticket,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None = None,
        every_s: float = 2.0,
    ) -> Ticket | Refusal | None:
        """What becomes of a job taken back from its engine (``ticket.preempted``): a new
        ticket once it is dispatched again, the 503 ``preempted`` refusal when it could no
        longer start in time (or the refusal of its expiry while queued again), or ``None``
        when the client went away."""
        p = ticket.preempted
        assert p is not None, "again() for a ticket that was not preempted"
        if p.outcome is not None:
            msg = "taken back from the engine before its first token for a higher tier, "
            msg += "and it can no longer start within its SLO"
            return Refusal(503, Reason.PREEMPTED.code, msg, p.retry_after_s)
        return await self._queued(ticket.job, gone, progress, every_s, ticket.snapshots)

    async def _queued(
        self,
        job: Job,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None,
        every_s: float,
        snapshots: tuple[BucketSnapshot, ...],
    ) -> Ticket | Refusal | None:
        """:meth:`enter`'s end for a queued job: its ticket once dispatched (and holding
        its fleet slot), the refusal of its expiry or removal, or ``None`` (the client
        left)."""
        waited = await self._wait(job, gone, progress, every_s)
        if waited is not None:
            if isinstance(waited, Outcome):
                r = waited.reason
                if r is _EXPIRED:
                    return Refusal(r.status, r.code, _EXPIRED_MESSAGE, 1.0)
                return Refusal(r.status, r.code, _REMOVED_MESSAGE, None)
            return None
        fleet = self.slots.get(job.pool) if self.slots else None
        if fleet is not None and job.id in fleet.brake.lacking:
            return await self._take_slot(fleet, job, gone, snapshots)
        return Ticket(self, job, snapshots)

    async def _take_slot(
        self,
        fleet: FleetSlot,
        job: Job,
        gone: asyncio.Future[None],
        snapshots: tuple[BucketSnapshot, ...],
    ) -> Ticket | Refusal | None:
        """:meth:`enter`'s last step for a dispatched job without its fleet slot: the
        ticket once the slot is taken; else the job is ended, and refused (the store
        would not answer) or ``None`` (the client left while it waited)."""
        try:
            got = await fleet.take(job, gone)
        except StoreUnavailable as e:
            self.ended(self.ctl.fail(job.id, Reason.STATE_UNAVAILABLE, Usage(0, 0)))
            return Refusal(503, Reason.STATE_UNAVAILABLE.code, str(e), 1.0)
        except asyncio.CancelledError:
            self.ended(self.ctl.cancel(job.id, Usage(0, 0)))
            raise
        if not got:
            self.ended(self.ctl.cancel(job.id, Usage(0, 0)))
            return None
        self.pump()  # the brake is off: the next job may go
        return Ticket(self, job, snapshots)

    async def _wait(
        self,
        job: Job,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None,
        every_s: float,
    ) -> Outcome | str | None:
        """Wait for the queued ``job``: ``None`` once dispatched, the expiry's ``Outcome``,
        or ``"gone"`` (the client left; the job was cancelled, even if dispatched in the
        same tick)."""
        fut: asyncio.Future[Outcome | None] = gone.get_loop().create_future()
        self._waiters[job.id] = fut
        self.pump()
        timeout = every_s if progress is not None else None
        while not fut.done() and not gone.done():
            try:
                done, _ = await asyncio.wait(
                    (fut, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done and progress is not None:
                    await progress()
            except asyncio.CancelledError:
                self.abandon(job)
                raise
        if fut.done() and not gone.done():
            return fut.result()
        self.abandon(job)
        return _GONE

    def abandon(self, job: Job) -> None:
        """End ``job`` if it is still live and has no ticket: cancel it while queued
        (refunded in full), or end it dispatched but never sent upstream (nothing used).
        For a waiter that went away, and for a driver that failed before its ticket."""
        self._waiters.pop(job.id, None)
        if job.state is _QUEUED:
            self.ended(self.ctl.cancel(job.id))
        elif job.state is _DISPATCHED:
            self.ended(self.ctl.cancel(job.id, Usage(0, 0)))

    def standing(self, job_id: str) -> tuple[int, float | None] | None:
        """Where a queued job stands: ``(ahead, eta_s)``, or ``None`` when not queued."""
        return self.ctl.standing(job_id)

    # -- ends ---------------------------------------------------------------------

    def ended(self, o: Outcome) -> None:
        """A job ended: settle it in the store, give back its slot, dispatch what fits."""
        self._release(o)
        self.pump()

    def _release(self, o: Outcome) -> None:
        """:meth:`ended` but for the dispatch: forget the job's ticket, settle it in the
        store, wake its pool's fleet slot."""
        job = o.job
        self._tickets.pop(job.id, None)
        self._settle(job, o.settlement.lines)
        if self.slots:
            fleet = self.slots.get(job.pool)
            if fleet is not None:
                fleet.released()

    def _settle(
        self, job: Job, lines: tuple[SettleLine, ...], claimed: tuple[Claim, ...] | None = None
    ) -> None:
        """Settle ``job``'s granted claims (or ``claimed``, the claims it asked for when the
        store's answer never came) with ``lines``, and give back its slot."""
        claims = job.claims if claimed is None else claimed
        if self.quotas is not None:
            lines = self.quotas.settle(job, claims, lines)
        self.store.finish(job.id, job.tenant, claims, lines, job.pool)

    def start_draining(self) -> None:
        """Refuse every new request (503 ``draining``); queued and in-flight work goes on."""
        self.ctl.start_draining()

    # -- dispatch and expiry ----------------------------------------------------------

    def pump(self) -> None:
        """Dispatch whatever the controller allows now, waking the waiters; settle what
        expired (with nothing queued there is nothing to dispatch or expire)."""
        if not self.ctl.queued:
            return
        for job in self.ctl.dispatchable():
            fut = self._waiters.pop(job.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        taken = self.ctl.take_preempted()
        if taken:
            self._take_back(taken)
        self._tick()
        self._arm()

    def _take_back(self, taken: list[Preempted]) -> None:
        """Stop the relays of jobs the controller took back from their engines; settle
        those it ended (refunded), give back their slots."""
        for p in taken:
            ticket = self._tickets.pop(p.job.id, None)
            if p.outcome is not None:
                self._release(p.outcome)
            if ticket is not None:
                ticket.preempt(p)

    def _tick(self) -> None:
        """Settle the expired jobs and wake their waiters (expiries happen only in the
        controller's ``dispatchable`` and ``tick``, and ``tick`` returns them all)."""
        self.deliver(self.ctl.tick())

    def deliver(self, outcomes: list[Outcome]) -> None:
        """Settle queued jobs the controller ended on its own (expired; removed by a
        reload) and wake their waiters with the outcome."""
        for o in outcomes:
            self._settle(o.job, o.settlement.lines)
            fut = self._waiters.pop(o.job.id, None)
            if fut is not None and not fut.done():
                fut.set_result(o)

    def _arm(self) -> None:
        nd = self.ctl.next_deadline()
        if nd is None or (self._timer_at is not None and self._timer_at <= nd):
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, nd - self.ctl.clock.now())
        self._timer_at = nd
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self._tick()
        self.pump()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
