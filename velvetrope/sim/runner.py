"""The simulator's event loop on the event environment (:mod:`velvetrope.sim.env`).

:class:`SimDriver` runs one prepared workload: every source of events is an event of the
one environment, at its time.  A replica's step end (or the moment an idle replica was
given work) is the environment's timer number ``k`` for replica ``k``
(:class:`~velvetrope.sim.replica_steps.ReplicaSteps`): at a time, step ends come first, by
replica number.  Every other event is on the environment's heap with a priority class, and
a tie in time goes by class, then by rank within the class, then by scheduling order:

==========  =========================================================  ===============
class       event                                                      rank
==========  =========================================================  ===============
1 SCRAPE    the engines are read for the saturation rule (fleet)
2 READY     a starting replica's start-up is over                      replica number
3 PROM      Prometheus scrapes the autoscaler's signal
4 SCALE     the autoscaler's poll or sync
5 DEADLINE  the earliest queue deadline
6 TIMEOUT   the earliest client timeout pending (all those due go)
7 ARRIVAL   the next request arrives                                   arrival index
==========  =========================================================  ===============

Handlers drive the request machine (:class:`~velvetrope.core.request_machine.RequestMachine`)
as the gateway's driver does, through :class:`~velvetrope.sim.request_side.RequestSide`,
which carries out its effects: an arrival is made a job and reserved; a step's events are
delivered when it ends, then the replica's next step is scheduled; a client timeout ends a
queued or dispatched job; the deadline, scrape and start-up events tick the machine.
Arrivals are scheduled one at a time (each schedules the next); the earliest queue
deadline and client timeout are read again after every event that is not a step end and
scheduled anew, the older event becoming stale (ignored).  A deadline or timeout event that
finds nothing to do still moves the clock.  The :class:`~velvetrope.clock.ManualClock` the
core reads is set by the handlers that touch the core (a step end only if it delivers
events), so a run's span is the last such moment.  Fast-forward through pure-decode
stretches, and what each event reads of a stretch in progress, is
:mod:`velvetrope.sim.replica_steps`'s.
"""

from __future__ import annotations

import gc
import math
from heapq import heappush
from typing import Final

from velvetrope.clock import ManualClock
from velvetrope.core.request_machine import RequestMachine
from velvetrope.sim.drive_inputs import Autoscaling, Inputs, LogEntry, Trace
from velvetrope.sim.env import Environment, priority
from velvetrope.sim.fleet import Fleet
from velvetrope.sim.replica_steps import BY_ALL, ReplicaSteps
from velvetrope.sim.replicas import Replica
from velvetrope.sim.request_side import RequestSide
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.store.memory import MemoryStore

__all__ = ["SimDriver"]

SCRAPE, READY, PROM, SCALE, DEADLINE, TIMEOUT, ARRIVAL = range(1, 8)
_SCRAPE_PRIO: Final = priority(SCRAPE)
_PROM_PRIO: Final = priority(PROM)
_SCALE_PRIO: Final = priority(SCALE)
_DEADLINE_PRIO: Final = priority(DEADLINE)
_TIMEOUT_PRIO: Final = priority(TIMEOUT)
_ARRIVAL_PRIO: Final = priority(ARRIVAL, 0)
"""Arrival ``i``'s priority is ``_ARRIVAL_PRIO + i``: ``priority(ARRIVAL, i)`` (checked in
:meth:`SimDriver.run`)."""


class SimDriver:
    """One run of the event loop (see the module docstring): every event of the workload
    ``inp`` through ``machine``, ``store`` holding the buckets, on the replicas of
    ``fleet``; an autoscaler's polls and scrapes go on at least ``until``.  The
    environment, the handler of each event class and what they share; :meth:`run` runs
    it, once."""

    def __init__(
        self,
        machine: RequestMachine,
        store: MemoryStore,
        clock: ManualClock,
        fleet: Fleet,
        scrapes: EngineScrapes,
        inp: Inputs,
        *,
        timeout: float | None,
        decisions: list[LogEntry],
        record: bool,
        fast_forward: bool,
        autoscaling: Autoscaling | None,
        until: float,
    ) -> None:
        self.env = Environment(timers=len(fleet))
        self.clock = clock
        self.ctl = machine.ctl
        self.fleet = fleet
        self.scrapes = scrapes
        self.decisions = decisions
        self.record = record
        self.auto = autoscaling
        self.until = until
        self.steps = ReplicaSteps(self.env, fleet.batchers, scrapes.fresh, fast_forward)
        self.requests = RequestSide(
            machine, store, fleet, scrapes, self.steps, inp,
            timeout=timeout, decisions=decisions, record=record,
        )  # fmt: skip
        self.draining: dict[int, Replica] = {}
        """The autoscaled pool's replicas draining (no new work), by engine slot."""
        # The queue deadline, the next client timeout and the next scrape are read again
        # after every event that is not a step end; an event left behind by a later one is
        # stale (its version no longer matches).
        self.deadline_version = 0
        self.timeout_version = 0

    def run(self) -> Trace:
        """Schedule the first events, run them all (the garbage collector paused) and
        return the trace."""
        env, auto, req = self.env, self.auto, self.requests
        env.on_timer = self.on_step
        if auto is not None:
            self.set_live()
            if auto.signal is not None:
                env.schedule(0.0, _PROM_PRIO, self.on_prom, None)
            env.schedule(auto.scaler.next_at(), _SCALE_PRIO, self.on_scale, None)
        if self.scrapes.next_at < math.inf:
            env.schedule(self.scrapes.next_at, _SCRAPE_PRIO, self.on_scrape, None)
        if req.n:
            priority(ARRIVAL, req.n - 1)  # every arrival's rank is in range
            env.schedule(req.times[0], _ARRIVAL_PRIO, self.on_arrival, 0)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run()
        finally:
            if was_enabled:
                gc.enable()
        return Trace(
            req.jobs, self.decisions, req.samples_t, req.samples_q, req.samples_f,
            self.clock.now(), self.steps.counts,
        )  # fmt: skip

    def horizon(self, now: float) -> None:
        """Schedule the earliest queue deadline and client timeout pending (not before
        ``now``), making those scheduled before stale."""
        d = self.ctl.next_deadline()
        self.deadline_version += 1
        if d is not None:
            self.env.schedule(max(d, now), _DEADLINE_PRIO, self.on_deadline, self.deadline_version)
        self.timeout_version += 1
        due = self.requests.next_timeout()
        if due is not None:
            self.env.schedule(max(due, now), _TIMEOUT_PRIO, self.on_timeout, self.timeout_version)

    # -- the events -----------------------------------------------------------------------

    def on_step(self, k: int) -> None:
        """Replica ``k``'s step ends: deliver its events, then start its next step (or,
        with no work left, it goes idle, and leaves if it was draining)."""
        t = self.env.now
        ev = self.steps.ended(k)
        if ev:
            self.clock.set(t)
            self.requests.deliver(k, ev, t)
        if not self.steps.next_step(k, t):
            self.fleet.stop_busy(k, t)
            if k in self.draining:
                self.leave(k, t)

    def on_scrape(self, _: None) -> None:
        """The engines are read for the saturation rule (decode runs as they stand), then
        the machine is ticked; the next scrape is scheduled while work is left."""
        now = self.env.now
        if not self.requests.work_left():
            return  # the last work ended before this scrape: nothing left to read
        self.clock.set(now)
        self.scrapes.fire(now, self.steps.projected(now))
        self.requests.dispatch(now, BY_ALL)
        self.env.schedule(self.scrapes.next_at, _SCRAPE_PRIO, self.on_scrape, None)
        self.horizon(now)

    def on_deadline(self, version: int) -> None:
        """The earliest queue deadline (unless stale): tick the machine."""
        if version != self.deadline_version:
            return
        now = self.env.now
        self.clock.set(now)
        self.requests.dispatch(now, BY_ALL)
        self.horizon(now)

    def on_timeout(self, version: int) -> None:
        """The earliest client timeout pending (unless stale): every one due goes, then the
        machine is ticked."""
        if version != self.timeout_version:
            return
        now = self.env.now
        self.clock.set(now)
        self.requests.time_out(now)
        self.requests.dispatch(now, BY_ALL)
        self.horizon(now)

    def on_arrival(self, i: int) -> None:
        """Request ``i`` arrives; the next one is scheduled."""
        now = self.env.now
        self.clock.set(now)
        req = self.requests
        req.arrive(i, now)
        if i + 1 < req.n:  # (the workload is sorted: never before now)
            env = self.env
            heappush(
                env.heap,
                (req.times[i + 1], _ARRIVAL_PRIO + i + 1, next(env.order), self.on_arrival, i + 1),
            )
        self.horizon(now)

    # -- the autoscaled pool ---------------------------------------------------------------

    def set_live(self) -> None:
        """Tell the scrapes which of the autoscaled pool's replicas take work, and which
        are there to read (those and the draining ones)."""
        auto = self.auto
        assert auto is not None
        live = list(self.fleet.members[auto.pool])
        self.scrapes.set_live(auto.pool, live, sorted([*live, *self.draining]))

    def on_ready(self, r: Replica) -> None:
        """Replica ``r``'s start-up is over: unless it was drained meanwhile, it takes
        work, and the machine is ticked."""
        auto = self.auto
        assert auto is not None
        now = self.env.now
        if not auto.replicas.become_ready(r, now):
            return
        k = r.slot
        self.fleet.enable(k)
        if self.record:
            self.decisions.append((now, "ready", "", str(k)))
        self.set_live()
        self.clock.set(now)
        self.requests.dispatch(now, BY_ALL)

    def leave(self, k: int, now: float) -> None:
        """Draining replica ``k``, now idle, is gone."""
        auto = self.auto
        assert auto is not None
        auto.replicas.leave(self.draining.pop(k), now)
        self.set_live()
        if self.record:
            self.decisions.append((now, "gone", "", str(k)))

    def on_scale(self, _: None) -> None:
        """The autoscaler polls or syncs: a new replica count starts replicas or drains
        them.  Its next poll is scheduled while :meth:`keep_going`."""
        auto = self.auto
        assert auto is not None
        now = self.env.now
        pool = auto.replicas
        want = auto.scaler.fire(now, pool.asked, pool.ready)
        if want != pool.asked:
            if self.record:
                self.decisions.append((now, "scale", "", f"{pool.asked}->{want}"))
            started, drained = pool.scale(now, want)
            self.start(started)
            self.drain(drained, now)
        nxt = auto.scaler.next_at()
        if nxt < math.inf and self.keep_going(nxt):
            self.env.schedule(nxt, _SCALE_PRIO, self.on_scale, None)

    def start(self, started: list[Replica]) -> None:
        """Track the replicas the pool started (each took a new engine slot from the fleet)
        and schedule the end of each one's start-up."""
        steps = self.steps
        for r in started:
            k = r.slot
            while len(steps.pend) <= k:
                self.scrapes.add(len(steps.pend))
                steps.add_replica()
            self.env.schedule(r.ready_at, priority(READY, k), self.on_ready, r)

    def drain(self, drained: list[Replica], now: float) -> None:
        """The pool drains these replicas: no new work; each idle one leaves at once."""
        for r in drained:
            k = r.slot
            self.fleet.disable(k)
            self.draining[k] = r
            if self.record:
                self.decisions.append((now, "drain", "", str(k)))
        self.set_live()
        for r in drained:
            if not self.fleet.active[r.slot]:
                self.leave(r.slot, now)

    def on_prom(self, _: None) -> None:
        """Prometheus scrapes the autoscaler's signal (every decode run brought up to now
        first: the signal reads the batchers); the next scrape while :meth:`keep_going`."""
        auto = self.auto
        assert auto is not None and auto.signal is not None and auto.record is not None
        now = self.env.now
        self.steps.bring_up(now)
        auto.record(now, auto.signal(now))
        nxt = now + auto.scrape_interval_s
        if self.keep_going(nxt):
            self.env.schedule(nxt, _PROM_PRIO, self.on_prom, None)

    def keep_going(self, t: float) -> bool:
        """Whether the autoscaler's clockwork goes on to ``t``: until ``until`` and while
        requests are still to come or to finish, or replicas to start or to leave."""
        auto = self.auto
        assert auto is not None
        return t <= self.until or bool(
            self.requests.work_left() or self.draining
            or auto.replicas.ready != auto.replicas.asked
        )  # fmt: skip
