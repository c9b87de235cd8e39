"""A request's life as one sans-IO state machine: events go in, effects come out.

:class:`RequestMachine` is the one owner of the order in which a request is admitted,
dispatched and ended, for every driver: the gateway's
:class:`~velvetrope.gateway.driver.admission.Admission` (asyncio, a real store, real engines) and
the simulator's :class:`~velvetrope.sim.runner.SimDriver` (a virtual clock, the in-memory store,
the engine model) call the same methods in the same order and carry out the same effects
(:mod:`velvetrope.core.effects`).  The decisions are the controller's
(:class:`~velvetrope.core.controller.AdmissionController`); this class sequences them with
the store's reservation, the lease and the settlement:

1. :meth:`arrived`: refused at once while draining (:class:`~.effects.Respond`); else
   routed and sized, and the job's claims (rate buckets, then budgets) go out to be
   reserved (:class:`~.effects.Reserve`; with a shared store, and when the job would start
   at once, its lease rides on the same trip).
2. :meth:`reserved`: the store's answer.  A denial by a budget that downgrades downgrades
   the job and reserves again (once per budget).  Then the controller decides: refused
   (:class:`~.effects.Settle` to give back what was reserved, :class:`~.effects.Respond`),
   queued (nothing for the job now), or dispatched: :class:`~.effects.Send`, or first
   :class:`~.effects.Acquire` when it has no lease (the pool's :class:`~.leases.LeaseBrake`
   holds the pool's next dispatches until :meth:`slot_granted`).
3. While it runs: :meth:`sent`, :meth:`first_token`.
4. Its end, exactly once: :meth:`completed`, :meth:`failed`, :meth:`client_gone` (queued
   or dispatched), :meth:`slot_failed`, or, while queued, an expiry or a reload that
   removed its place.  Every end settles (:class:`~.effects.Settle`, which gives back the
   lease), and whatever now fits is dispatched.
5. :meth:`tick` (the driver's timer at :meth:`next_deadline`, or any moment capacity may
   have changed), then :meth:`effects`: expiries (:class:`~.effects.Settle`,
   :class:`~.effects.Respond`), preemptions (:class:`~.effects.Cancel`: before their
   first token, lower-tier jobs are taken back for a higher tier, queued again or answered
   503 ``preempted``) and the dispatches that now fit, in that order: cancellations, then
   sends, then expiries.

Events return nothing: their effects wait in the machine until the driver takes them
(:meth:`RequestMachine.effects`), after one event or after several that happened at the
same moment (an engine step's ends).  Whatever may let queued work go (an end, a queued
arrival, a lease granted, :meth:`RequestMachine.tick`) makes the next
:meth:`~RequestMachine.effects` dispatch what fits first; a job dispatched at once does
not.

With ``record`` set, each event and each effect is appended to it as ``(time, what, job
id, detail)``: two drivers fed the same events must write the same record.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final, Protocol

from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, SettleLine, settle_lines
from velvetrope.core.controller import AdmissionController, Queued, Rejected
from velvetrope.core.effects import Acquire, Cancel, Effect, Refusal, Reserve, Respond, Send, Settle
from velvetrope.core.job import Job, Outcome
from velvetrope.core.leases import LeaseBrake, Slot
from velvetrope.core.lifecycle import Reason, Usage
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.quota import Downgrade, downgrade
from velvetrope.core.tuples import new_tuple

__all__ = ["Budgets", "RequestMachine", "refusal_of"]

_EXPIRED: Final = Reason.EXPIRED
_EXPIRED_MESSAGE: Final = "the request waited past its deadline in the queue"
_REMOVED_MESSAGE: Final = (
    "a configuration reload removed the tenant, tier or pool this request was queued for"
)
_PREEMPTED_MESSAGE: Final = (
    "taken back from the engine before its first token for a higher tier, "
    "and it can no longer start within its SLO"
)
_NO_WORK: Final = Usage(0, 0)


class Budgets(Protocol):
    """Budgets and the ledger at the reservation and the settlement
    (:class:`~velvetrope.gateway.driver.quotas.Quotas`)."""

    def claims(
        self, job: Job, claims: tuple[Claim, ...], skip: Sequence[str] = ()
    ) -> tuple[Claim, ...]: ...

    def answer(self, job: Job, claims: Sequence[Claim], res: Grant | Denial) -> Grant | Denial: ...

    def downgrade(self, res: Grant | Denial) -> Downgrade | None: ...

    def settle(
        self, job: Job, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> tuple[SettleLine, ...]: ...


def refusal_of(r: Rejected) -> Refusal:
    """The answer to a request the controller rejected."""
    return Refusal(r.reason.status, r.reason.code, r.message, r.retry_after_s, r.snapshots)


def _ended_refusal(o: Outcome) -> Refusal:
    """The answer to a queued job the controller ended on its own (expired; removed)."""
    r = o.reason
    if r is _EXPIRED:
        return Refusal(r.status, r.code, _EXPIRED_MESSAGE, 1.0)
    return Refusal(r.status, r.code, _REMOVED_MESSAGE, None)


class RequestMachine:
    """Every request's life in one gateway (or one simulated gateway); see the module
    docstring.  ``leases``: the store is shared and each dispatched job needs a lease."""

    def __init__(
        self,
        ctl: AdmissionController,
        *,
        leases: bool = False,
        budgets: Budgets | None = None,
        record: list[tuple[float, str, str, str]] | None = None,
    ) -> None:
        self.ctl = ctl
        self.budgets = budgets
        self.record = record
        self.brakes: dict[str, LeaseBrake] = {}
        """Per pool, its lease brake (``leases`` only)."""
        if leases:
            self._brake_pools()
        self._spent: dict[str, tuple[str, ...]] = {}
        self._out: list[Effect] = []
        self._due = False

    def effects(self) -> list[Effect]:
        """The effects of the events since the last call, in order; then, if any of them
        may have let queued work go, cancellations of jobs taken back, dispatches, and the
        expiries' settlements and answers."""
        if self._due:
            self._due = False
            self._pump()
        out = self._out
        if not out:
            return out
        self._out = []
        rec = self.record
        if rec is not None:
            now = self.ctl.clock.now()
            for e in out:
                rec.append((now, type(e).__name__.lower(), e.job.id, _detail(e)))
        return out

    # -- the way in ------------------------------------------------------------------

    def arrived(self, job: Job) -> None:
        """``job`` (state ARRIVED) came in: its :class:`~.effects.Reserve`, or its
        :class:`~.effects.Respond` when the gateway is draining.  Raises what routing
        raises for a job the policy cannot place
        (:class:`~velvetrope.errors.PolicyError`)."""
        ctl = self.ctl
        if self.record is not None:
            self._note("arrived", job, job.tier)
        if ctl.draining:  # before the store: a refused request reserves nothing
            r = ctl.reject(job, Reason.DRAINING, "the gateway is draining")
            self._out.append(Respond(job, refusal_of(r)))
            return
        ctl.route(job)
        self._out.append(self._reserve(job, ()))

    def _reserve(self, job: Job, spent: tuple[str, ...]) -> Reserve:
        ctl = self.ctl
        claims = ctl.claims(job)
        if self.budgets is not None:
            claims = self.budgets.claims(job, claims, spent)
        slot = self.slot(job) if self.brakes and ctl.would_start(job) else None
        return new_tuple(Reserve, (job, claims, slot))

    def slot(self, job: Job) -> Slot:
        """The lease ``job`` (sized) asks of its pool now (sized from the pool's capacity
        at this moment, so it follows the engines)."""
        cap = self.ctl.pool_capacity(job.pool)
        return new_tuple(Slot, (job.pool, job.cost, cap.max_in_flight, cap.max_tokens))

    def reserved(
        self, job: Job, claims: tuple[Claim, ...], res: Grant | Denial, leased: bool = False
    ) -> tuple[BucketSnapshot, ...]:
        """The store answered ``job``'s :class:`~.effects.Reserve` of ``claims`` with
        ``res`` (``leased``: it took the job's lease too).  Effects: another
        :class:`~.effects.Reserve` (downgraded by a spent budget); or the controller's
        decision: refused (settle, respond), queued (whatever dispatches now), dispatched
        (send, or acquire the lease first).  Returns the claimed buckets' snapshots as
        granted (``x-ratelimit-*`` headers; empty unless granted)."""
        budgets = self.budgets
        if budgets is not None:
            res = budgets.answer(job, claims, res)
            down = budgets.downgrade(res)
            spent = self._spent.get(job.id, ())
            if down is not None and down.key not in spent:
                spent = self._spent[job.id] = (*spent, down.key)
                downgrade(job, down, self.ctl.route)  # nothing was reserved: again
                if self.record is not None:
                    self._note("downgraded", job, job.tier)
                self._out.append(self._reserve(job, spent))
                return ()
            self._spent.pop(job.id, None)
        if leased:
            self.brakes[job.pool].leased(job.id)
        if self.record is not None:
            self._note("reserved", job, "granted" if type(res) is Grant else "denied")
        d = self.ctl.arrive(job, res)
        if type(d) is Rejected:
            self._out.append(Settle(job, job.claims, d.settlement.lines))
            self._out.append(Respond(job, refusal_of(d)))
            return ()
        if type(d) is Queued:
            self._due = True
        else:
            self._out.append(self._dispatch(job))
        return res.snapshots if type(res) is Grant else ()

    def unreserved(self, job: Job, message: str) -> None:
        """The store would not answer ``job``'s reservation (``fail_closed``): 503
        ``state_unavailable``, nothing reserved."""
        r = self.ctl.reject(job, Reason.STATE_UNAVAILABLE, message, 1.0)
        self._out.append(Respond(job, refusal_of(r)))

    def abandoned(self, job: Job, claims: tuple[Claim, ...]) -> None:
        """The driver stopped while ``job``'s reservation of ``claims`` was on its way:
        give back whatever it may have taken."""
        self._out.append(Settle(job, claims, settle_lines(claims, 0)))

    def _dispatch(self, job: Job) -> Send | Acquire:
        brakes = self.brakes
        if brakes and job.id in brakes[job.pool].lacking:
            return new_tuple(Acquire, (job, self.slot(job)))
        return new_tuple(Send, (job,))

    def slot_granted(self, job: Job) -> None:
        """The dispatched ``job`` got its lease: send it; the brake is off."""
        self.brakes[job.pool].slotted(job.id)
        self._out.append(Send(job))
        self._due = True

    def slot_failed(self, job: Job, message: str | None) -> None:
        """The dispatched ``job`` got no lease: the store would not answer (``message``;
        503 ``state_unavailable``) or the client left while it waited (``None``)."""
        if message is None:
            self.client_gone(job, _NO_WORK)
            return
        self._ended(self.ctl.fail(job.id, Reason.STATE_UNAVAILABLE, _NO_WORK))
        code = Reason.STATE_UNAVAILABLE
        self._out.append(Respond(job, Refusal(code.status, code.code, message, 1.0)))

    # -- while it runs ----------------------------------------------------------------

    def sent(self, job: Job) -> None:
        """``job`` was handed to an engine (streamed: it may be taken back until its first
        token)."""
        if self.record is not None:
            self._note("sent", job, "")
        if job.streamed:
            self.ctl.sent(job.id)

    def first_token(self, job: Job) -> None:
        """``job``'s first token came."""
        if self.record is not None:
            self._note("first_token", job, "")
        self.ctl.first_token(job.id)

    # -- its end ----------------------------------------------------------------------

    def completed(self, job: Job, usage: Usage) -> None:
        """``job``'s engine answered: charge ``usage``."""
        if self.record is not None:
            self._note("completed", job, f"{usage[0]}+{usage[1]}")
        self._ended(self.ctl.complete(job.id, usage))

    def failed(self, job: Job, reason: Reason, usage: Usage | None = None) -> None:
        """``job``'s engine failed (``reason``): charge ``usage`` (default: nothing)."""
        if self.record is not None:
            self._note("failed", job, reason.code)
        self._ended(self.ctl.fail(job.id, reason, usage))

    def client_gone(self, job: Job, usage: Usage | None = None) -> None:
        """``job``'s client went away: refunded in full while queued; dispatched, charged
        ``usage`` (default: its prompt)."""
        if self.record is not None:
            self._note("client_gone", job, "" if usage is None else f"{usage[0]}+{usage[1]}")
        self._ended(self.ctl.cancel(job.id, usage))

    def tick(self) -> None:
        """Time passed or capacity changed: the next :meth:`effects` dispatches what fits,
        takes back what must make room and expires what is overdue."""
        if self.record is not None:
            self.record.append((self.ctl.clock.now(), "tick", "", ""))
        self._due = True

    def reloaded(self, config: PolicyConfig, gone_tenants: Collection[str] = ()) -> None:
        """Apply ``config`` (:meth:`~velvetrope.core.controller.AdmissionController.reconfigure`;
        raises what it raises): queued jobs left with no place are settled and answered."""
        for o in self.ctl.reconfigure(config, gone_tenants):
            self._ended(o)
            self._out.append(Respond(o.job, _ended_refusal(o)))
        if self.brakes:
            self._brake_pools()

    def next_deadline(self) -> float | None:
        """When :meth:`tick` is next due (``None``: nothing queued is due)."""
        return self.ctl.next_deadline()

    # -- internals --------------------------------------------------------------------

    def _brake_pools(self) -> None:
        """Give every pool a lease brake (a pool added by a reload gets its own)."""
        for p in self.ctl.config.pools:
            if p.name not in self.brakes:
                brake = self.brakes[p.name] = LeaseBrake(p.name)
                cap = self.ctl.pool_capacity(p.name)
                cap.signals.append(brake)
                cap.trackers.append(brake)

    def _ended(self, o: Outcome) -> None:
        """Settle the ended job (its lease given back); queued work may go."""
        job = o.job
        brakes = self.brakes
        if brakes:
            brake = brakes.get(job.pool)
            if brake is not None:
                brake.forget(job.id)
        lines = o.settlement.lines
        budgets = self.budgets
        if budgets is not None:
            lines = budgets.settle(job, job.claims, lines)
        self._out.append(new_tuple(Settle, (job, job.claims, lines)))
        self._due = True

    def _pump(self) -> None:
        """Cancellations of jobs taken back, dispatches, then the expiries' settlements and
        answers."""
        ctl = self.ctl
        if not ctl.queued:
            return
        batch = ctl.dispatchable()
        out = self._out
        brakes = self.brakes
        for p in ctl.take_preempted():
            if p.outcome is None:
                if brakes:  # its lease goes back with the Cancel; it asks again when dispatched
                    brakes[p.job.pool].forget(p.job.id)
                out.append(Cancel(p.job, None))
                continue
            code = Reason.PREEMPTED
            refusal = Refusal(code.status, code.code, _PREEMPTED_MESSAGE, p.retry_after_s)
            out.append(Cancel(p.job, refusal))
            self._ended(p.outcome)
        for job in batch:
            out.append(self._dispatch(job))
        for o in ctl.tick():
            self._ended(o)
            out.append(Respond(o.job, _ended_refusal(o)))
        self._due = False

    def _note(self, what: str, job: Job, detail: str) -> None:
        assert self.record is not None
        self.record.append((self.ctl.clock.now(), what, job.id, detail))


def _detail(e: Effect) -> str:
    t = type(e)
    if t is Respond or t is Cancel:
        r = e.refusal  # type: ignore[union-attr]
        return "" if r is None else r.code
    if t is Settle:
        return ",".join(f"{k}:{res:g}/{act:g}" for k, res, act in e.lines)  # type: ignore[union-attr]
    if t is Reserve:
        return ",".join(c.key for c in e.claims) + (" +lease" if e.slot else "")  # type: ignore[union-attr]
    return ""
