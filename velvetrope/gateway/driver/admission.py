"""A request's admission in the gateway: the asyncio driver of the request machine
(:class:`~velvetrope.core.request_machine.RequestMachine`), from arrival to settlement.

:meth:`Admission.enter` takes a parsed job and returns a :class:`Ticket` (the job is
dispatched: proxy it), a :class:`~velvetrope.core.effects.Refusal` (answer it) or ``None``
(the client went away first).  The order is the machine's; this class does its I/O:

* :class:`~velvetrope.core.effects.Reserve`: the store's reservation (without I/O when the
  store can answer so: memory, or a shared store whose state is away; else one round trip
  that also takes the job's lease when it will start at once);
* a queued job waits for its next effect, the client's disconnect or a shutdown (a single
  timer armed at the machine's next deadline ticks it);
* :class:`~velvetrope.core.effects.Acquire`: the dispatched job's lease
  (:class:`~velvetrope.gateway.driver.lease_taker.LeaseTaker`);
* :class:`~velvetrope.core.effects.Send`: the job's :class:`Ticket`;
* :class:`~velvetrope.core.effects.Settle`: the store's settlement (which gives back the
  lease), waking a lease waiter of the pool;
* :class:`~velvetrope.core.effects.Cancel`: the ticket of a job taken back is voided and
  its relay cancelled (which closes the upstream request);
* :class:`~velvetrope.core.effects.Respond`: the waiter's (or the caller's) refusal.

The ticket records the first token and ends the job exactly once (:meth:`Ticket.complete`,
:meth:`Ticket.fail`, :meth:`Ticket.cancel`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Final

from velvetrope.core import AdmissionController, BucketSnapshot, Job, Reason, Usage
from velvetrope.core.effects import Acquire, Cancel, Effect, Refusal, Reserve, Respond, Settle
from velvetrope.core.lifecycle import JobState
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.request_machine import RequestMachine
from velvetrope.errors import LifecycleError, StoreUnavailable
from velvetrope.gateway.driver.lease_taker import LeaseTaker
from velvetrope.gateway.driver.quotas import Quotas
from velvetrope.store.base import Store

__all__ = ["Admission", "Refusal", "Ticket"]

_QUEUED: Final = JobState.QUEUED
_DISPATCHED: Final = JobState.DISPATCHED
_NO_WORK: Final = Usage(0, 0)


class Ticket:
    """A dispatched request.  Record its first token; end it once (later calls do
    nothing): the end settles its reservation and gives back its lease.

    While its answer is relayed (``task`` set), the machine may take the job back before
    its first token (:meth:`preempt`): the ticket is then void (``preempted`` true;
    ``refusal`` its answer, or ``None`` when it is queued again) and ``task`` is cancelled,
    which closes the upstream request."""

    __slots__ = ("_admission", "ended", "job", "preempted", "refusal", "snapshots", "task")

    def __init__(
        self, admission: Admission, job: Job, snapshots: tuple[BucketSnapshot, ...]
    ) -> None:
        self._admission = admission
        self.job = job
        self.snapshots = snapshots
        """The claimed buckets after the reservation (``x-ratelimit-*`` headers)."""
        self.ended = False
        self.preempted = False
        self.refusal: Refusal | None = None
        self.task: asyncio.Task[None] | None = None
        admission._tickets[job.id] = self

    def sent(self, task: asyncio.Task[None]) -> None:
        """The request is on its way to an engine, relayed by ``task``: until its first
        token the machine may take it back (streamed answers only: a whole answer's
        first token cannot be seen)."""
        self.task = task
        if not self.ended:
            self._admission.machine.sent(self.job)

    def preempt(self, refusal: Refusal | None) -> None:
        """The machine took the job back: void this ticket and stop its relay."""
        self.ended = True
        self.preempted = True
        self.refusal = refusal
        if self.task is not None:
            self.task.cancel()

    def first_token(self) -> None:
        """The upstream sent the first token (ignored after the first, or once ended)."""
        if self.ended or self.job.first_token_at is not None:
            return
        try:
            self._admission.machine.first_token(self.job)
        except LifecycleError:  # not contextlib.suppress: a context manager per call costs
            return

    def complete(self, usage: Usage) -> None:
        """The upstream answered: charge ``usage``."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.machine.completed(self.job, usage)
            adm.apply()

    def fail(self, reason: Reason, usage: Usage | None = None) -> None:
        """The upstream failed (``reason``); charge ``usage`` (default: nothing)."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.machine.failed(self.job, reason, usage)
            adm.apply()

    def cancel(self, usage: Usage | None = None) -> None:
        """The client went away; charge ``usage`` (default: the prompt)."""
        if not self.ended:
            self.ended = True
            adm = self._admission
            adm.machine.client_gone(self.job, usage)
            adm.apply()


class Admission:
    """The gateway's admission: the request machine over the controller, the store and
    the pools' leases."""

    def __init__(
        self,
        ctl: AdmissionController,
        store: Store,
        on_route: Callable[[Job], None] | None = None,
        quotas: Quotas | None = None,
        timer: bool = True,
    ) -> None:
        self.ctl = ctl
        self._timed = timer  # false: the owner calls pump() at next_deadline (a replay)
        self.store = store
        self._on_route = on_route
        self.quotas = quotas
        """Budgets and the ledger: claimed, answered and settled with the buckets."""
        self.machine = RequestMachine(ctl, leases=store.shared, budgets=quotas)
        self.lease_takers: dict[str, LeaseTaker] = {}
        """Per pool, its lease taker (shared stores only)."""
        if store.shared:
            for p in ctl.config.pools:
                self.lease_takers[p.name] = LeaseTaker(p.name, store)
        self._waiters: dict[str, asyncio.Future[Effect]] = {}
        self._ready: dict[str, Effect] = {}  # for a job taken back, before it waits again
        self._tickets: dict[str, Ticket] = {}
        self._timer: asyncio.TimerHandle | None = None  # at the machine's next deadline
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
        """Admit ``job`` (state ARRIVED): a :class:`Ticket` once it is dispatched (and has
        its lease), a :class:`Refusal`, or ``None`` when ``gone`` (the client's
        disconnect) completed first.  While queued, ``progress`` (if given) is awaited
        every ``every_s`` seconds.  Raises what routing raises for a job the policy cannot
        place (:class:`~velvetrope.errors.PolicyError`)."""
        m = self.machine
        m.arrived(job)
        mine = self._apply(m.effects(), job)
        if self._on_route is not None and type(mine) is Reserve:
            self._on_route(job)
        snapshots: tuple[BucketSnapshot, ...] = ()
        store = self.store
        while type(mine) is Reserve:  # again only for a downgrade
            claims, slot = mine.claims, mine.slot
            try:
                res = store.reserve_now(job.id, job.tenant, claims, slot)
                if res is None:
                    res = await store.reserve(job.id, job.tenant, claims, slot)
            except StoreUnavailable as e:
                m.unreserved(job, str(e))
            except asyncio.CancelledError:  # shut down mid-trip: undo what may have been taken
                m.abandoned(job, claims)
                self._apply(m.effects())
                raise
            else:
                leased = slot is not None and store.has_lease(job.id, job.pool)
                snapshots = m.reserved(job, claims, res, leased)
            mine = self._apply(m.effects(), job)
        if mine is None:
            return await self._queued(job, gone, progress, every_s, snapshots)
        if type(mine) is not Respond and gone.done():
            self.abandon(job)
            return None
        got = self._own(job, mine, snapshots)
        if type(got) is Acquire:
            return await self._take_slot(job, got, gone, snapshots)
        return got  # type: ignore[return-value]

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
        assert ticket.preempted, "again() for a ticket that was not preempted"
        if ticket.refusal is not None:
            return ticket.refusal
        return await self._queued(ticket.job, gone, progress, every_s, ticket.snapshots)

    def _own(
        self, job: Job, mine: Effect, snapshots: tuple[BucketSnapshot, ...]
    ) -> Ticket | Refusal | Acquire:
        """The job's own effect, where no I/O is needed: its refusal, or its ticket; an
        ``Acquire`` is handed back, for the caller to take the lease (:meth:`_take_slot`).
        Not a coroutine: a request that starts at once awaits none."""
        if type(mine) is Respond:
            return mine.refusal
        if type(mine) is Acquire:
            return mine
        return Ticket(self, job, snapshots)

    async def _queued(
        self,
        job: Job,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None,
        every_s: float,
        snapshots: tuple[BucketSnapshot, ...],
    ) -> Ticket | Refusal | None:
        """:meth:`enter`'s end for a queued job: its ticket once dispatched (and having
        its lease), the refusal of its expiry or removal, or ``None`` (the client left)."""
        mine = await self._wait(job, gone, progress, every_s)
        if mine is None:
            return None
        got = self._own(job, mine, snapshots)
        if type(got) is Acquire:
            return await self._take_slot(job, got, gone, snapshots)
        return got  # type: ignore[return-value]

    async def _take_slot(
        self,
        job: Job,
        ask: Acquire,
        gone: asyncio.Future[None],
        snapshots: tuple[BucketSnapshot, ...],
    ) -> Ticket | Refusal | None:
        """The dispatched job's lease, then its ticket; else the job is ended, and refused
        (the store would not answer) or ``None`` (the client left while it waited)."""
        m = self.machine
        try:
            got = await self.lease_takers[job.pool].take(job, ask.slot, gone)
        except StoreUnavailable as e:
            m.slot_failed(job, str(e))
            mine = self._apply(m.effects(), job)
            assert type(mine) is Respond
            return mine.refusal
        except asyncio.CancelledError:
            m.slot_failed(job, None)
            self._apply(m.effects())
            raise
        if not got:
            m.slot_failed(job, None)
            self._apply(m.effects())
            return None
        m.slot_granted(job)
        self._apply(m.effects(), job)
        return Ticket(self, job, snapshots)

    async def _wait(
        self,
        job: Job,
        gone: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None,
        every_s: float,
    ) -> Effect | None:
        """Wait for the queued ``job``'s next effect (its dispatch, lease to take, or
        refusal); ``None`` when the client left (the job was cancelled, even if dispatched
        in the same tick)."""
        ready = self._ready.pop(job.id, None)
        if ready is not None:
            return ready
        fut: asyncio.Future[Effect] = gone.get_loop().create_future()
        self._waiters[job.id] = fut
        self._arm()
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
        return None

    def abandon(self, job: Job) -> None:
        """End ``job`` if it is still live and has no ticket: cancel it while queued
        (refunded in full), or end it dispatched but never sent upstream (nothing used).
        For a waiter that went away, and for a driver that failed before its ticket."""
        self._waiters.pop(job.id, None)
        self._ready.pop(job.id, None)
        if job.state is _QUEUED:
            self.machine.client_gone(job)
        elif job.state is _DISPATCHED:
            self.machine.client_gone(job, _NO_WORK)
        else:
            return
        self.apply()

    def standing(self, job_id: str) -> tuple[int, float | None] | None:
        """Where a queued job stands: ``(ahead, eta_s)``, or ``None`` when not queued."""
        return self.ctl.standing(job_id)

    def start_draining(self) -> None:
        """Refuse every new request (503 ``draining``); queued and in-flight work goes on."""
        self.ctl.start_draining()

    def reloaded(self, config: PolicyConfig, gone_tenants: Collection[str] = ()) -> int:
        """Apply a reloaded policy (raises what the controller's ``reconfigure`` raises);
        returns how many queued requests it removed (answered ``removed_by_reload``).
        Call :meth:`pump` once the rest of the reload is in place."""
        m = self.machine
        m.reloaded(config, gone_tenants)
        effects = m.effects()
        self._apply(effects)
        return sum(1 for e in effects if type(e) is Respond)

    # -- effects --------------------------------------------------------------------

    def pump(self) -> None:
        """Capacity may have changed (an engine came or went, a reading moved): dispatch
        what fits now, take back what must make room, expire what is overdue."""
        self.machine.tick()
        self.apply()

    def apply(self) -> None:
        """Carry out the machine's pending effects."""
        self._apply(self.machine.effects())

    def _apply(self, effects: list[Effect], job: Job | None = None) -> Effect | None:
        """Carry out ``effects`` in order; the one addressed to ``job`` (the caller's own
        job: its reservation, dispatch or refusal) is returned instead."""
        mine: Effect | None = None
        for e in effects:
            t = type(e)
            j = e.job
            if t is Settle:
                self._tickets.pop(j.id, None)
                self.store.finish(j.id, j.tenant, e.claims, e.lines, j.pool)  # type: ignore[union-attr]
                if self.lease_takers:
                    self._lease_freed(j.pool)
            elif j is job:
                mine = e
            elif t is Cancel:
                ticket = self._tickets.pop(j.id, None)
                if ticket is not None:
                    ticket.preempt(e.refusal)  # type: ignore[union-attr]
                if e.refusal is None and self.lease_takers:  # type: ignore[union-attr]
                    # queued again: its lease is free for the job dispatched in its place
                    self.store.release(j.id, j.pool)
                    self._lease_freed(j.pool)
            else:  # Send, Acquire, Respond: wake the job's waiter
                fut = self._waiters.pop(j.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(e)
                elif j.state is _DISPATCHED or t is Respond:
                    self._ready[j.id] = e  # taken back and sent again before it waits
        if self.ctl.queued:
            self._arm()
        return mine

    def _lease_freed(self, pool: str) -> None:
        """A lease of ``pool`` was given back here: wake the job waiting for one."""
        taker = self.lease_takers.get(pool)
        if taker is not None:
            taker.released()

    def _arm(self) -> None:
        if not self._timed:
            return
        nd = self.machine.next_deadline()
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
        self.machine.tick()
        self.apply()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
