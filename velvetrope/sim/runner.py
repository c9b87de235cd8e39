"""The simulator's event loop on the event environment (:mod:`velvetrope.sim.env`).

:func:`drive` runs one prepared workload: every source of events is an event of the one
environment, at its time.  A replica's step end (or the moment an idle replica was given
work) is the environment's timer number ``k`` for replica ``k``: at a time, step ends come
first, by replica number.  Every other event is on the environment's heap with a priority
class, and a tie in time goes by class, then by rank within the class, then by scheduling
order:

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
as the gateway's driver does, and carry out its effects (``Send`` to a replica's batcher,
``Cancel`` aborts there, ``Settle`` into the in-memory store): an arrival is made a
:class:`~velvetrope.core.Job` and reserved in the store; a step's events are delivered when
it ends (``FirstToken``, then each ``Finished`` with what it lets go), then the replica's
next step is scheduled; a client timeout ends a queued or dispatched job; the deadline,
scrape and start-up events tick the machine.  A degraded job's capped ``max_tokens`` caps
what its engine generates.  Arrivals are scheduled one at a time (each schedules the next);
the earliest queue deadline and client timeout are read again after every event that is
not a step end and scheduled anew, the older event becoming stale (ignored).  A deadline or
timeout event that finds nothing to do still moves the clock.  The
:class:`~velvetrope.clock.ManualClock` the core reads is set by the handlers that touch the
core (a step end only if it delivers events), so a run's span is the last such moment.

Fast-forward (:mod:`velvetrope.engine.fastforward`): a replica whose next steps are pure
decode has its step end at the end of the whole stretch.  Anything that touches it
earlier (a dispatch to it, a client timeout of one of its jobs) first applies the stretch
up to the step in progress (``settle``) and moves its step end there (its timer: nothing
stale is left behind).  A scrape reads each run as it stands at
the step in progress without applying it (``projected``: only its KV blocks change before
its last step) and lets it go on; the autoscaler's signal, which reads the batchers
themselves, applies every run up to the step in progress first (``bring_up``).  A step
starting exactly at that moment counts as started when a step-by-step loop would have
handled that step end first (a lower replica number while handling a step end; always for
the other events).
"""

from __future__ import annotations

import gc
import math
from heapq import heappush

from velvetrope.clock import ManualClock
from velvetrope.core import Job, JobState, Reason, Usage
from velvetrope.core.effects import Cancel, Effect, Reserve, Send, Settle
from velvetrope.core.kinds import PROMPT_ONLY, size_prompt_only
from velvetrope.core.request_machine import RequestMachine
from velvetrope.core.tuples import new_tuple
from velvetrope.engine import EngineEvent, Finished, FirstToken
from velvetrope.engine.fastforward import DecodeRun, RunCounts
from velvetrope.sim.drive_inputs import Autoscaling, Inputs, LogEntry, Trace
from velvetrope.sim.env import Environment, priority
from velvetrope.sim.fleet import Fleet
from velvetrope.sim.replicas import Replica
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.store.memory import MemoryStore

__all__ = ["drive"]

SCRAPE, READY, PROM, SCALE, DEADLINE, TIMEOUT, ARRIVAL = range(1, 8)
_BY_ALL = 1 << 30
"""The ``by`` of events that are not step ends: after every replica's (fast-forward)."""
_QUEUED = JobState.QUEUED
_DISPATCHED = JobState.DISPATCHED


def drive(
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
    fast_forward: bool = True,
    autoscaling: Autoscaling | None = None,
    until: float = 0.0,
) -> Trace:
    """Run every event of the workload (see the module docstring) through ``machine``,
    ``store`` holding the buckets; an autoscaler's polls and scrapes go on at least
    ``until``."""
    ctl = machine.ctl
    env = Environment(timers=len(fleet))
    schedule = env.schedule
    heap, order = env.heap, env.order  # arrivals are never before now: pushed
    step_end = env.timers  # replica k's next step end (never before now); inf: none
    n = len(inp.times)
    times, prompts, outputs = inp.times, inp.prompts, inp.outputs
    templates, prefix_tokens = inp.templates, inp.prefix_tokens
    blocks, block_tokens = inp.blocks, inp.block_tokens
    tenants, tiers, caps, preds, models = inp.tenants, inp.tiers, inp.caps, inp.preds, inp.models
    max_len = inp.max_len
    kinds = inp.kinds
    engine_prio = inp.engine_priority
    pool_index = inp.pool_index
    jobs: list[Job | None] = [None] * n
    replica_of = [-1] * n
    req_pool = [0] * n
    batchers = fleet.batchers
    load_ = fleet.load
    active = fleet.active
    route = scrapes.route
    members = fleet.members
    pend: list[list[EngineEvent] | None] = [None] * len(fleet)
    runs: list[DecodeRun | None] = [None] * len(fleet)  # each replica's run in progress
    counts = RunCounts()
    plans = [DecodeRun(b, counts) for b in batchers]  # each replica's, planned again and again
    arrival_prio = priority(ARRIVAL, 0)  # + i: priority(ARRIVAL, i) (checked below)
    deadline_prio, timeout_prio = priority(DEADLINE), priority(TIMEOUT)
    set_clock = clock.set
    effects = machine.effects
    tick = machine.tick
    first_token = machine.first_token
    complete = machine.completed
    live_job = ctl.job
    sent = scrapes.sent
    mark_sent = machine.sent
    reserve_now = store.reserve_now
    finish = store.finish
    preempts = any(p.get("preemptions") is not None for p in ctl.status()["pools"].values())
    fresh = scrapes.fresh
    samples_t: list[float] = []
    samples_q: list[int] = []
    samples_f: list[int] = []
    draining: dict[int, Replica] = {}
    auto = autoscaling

    def settle(k: int, now: float, by: int) -> None:
        """Apply replica ``k``'s pending decode run up to its step in progress at ``now``
        (seen while handling the step end of replica ``by``, :data:`_BY_ALL` for the other
        events) and move its step end there.  Called before anything reads or changes
        batcher ``k``."""
        run = runs[k]
        if run is None:
            return
        runs[k] = None
        j = run.started(now, inclusive=k < by)
        pend[k] = run.apply(j)
        if j < run.steps:
            step_end[k] = run.start(j)

    def send(job: Job, now: float, by: int) -> None:
        """Send a dispatched job to a replica; one too long, or with no engine to take it,
        fails at once."""
        idx = int(job.id)
        pool = req_pool[idx]
        if prompts[idx] + outputs[idx] > max_len or not members[pool]:
            machine.failed(job, Reason.UPSTREAM_ERROR)  # too long, or no engine to take it
            return
        hashes = blocks[idx]
        k = route(pool, now, hashes, block_tokens[idx])
        if runs[k] is not None:
            settle(k, now, by)
        batchers[k].add(
            job.id,
            prompts[idx],
            outputs[idx],
            now,
            priority=engine_prio.get((job.pool, job.tier), 0) if engine_prio else 0,
            prefix_id=templates[idx],
            prefix_tokens=prefix_tokens[idx],
            block_ids=hashes,
            block_tokens=block_tokens[idx],
        )
        sent(job, k)
        mark_sent(job)
        fresh[k] += 1
        load_[k] += 1
        replica_of[idx] = k
        if record:
            decisions.append((now, "dispatch", job.id, str(k)))
        if not active[k]:
            fleet.start_busy(k, now)
            pend[k] = None
            step_end[k] = now

    def cancel(job: Job, requeued: bool, now: float, by: int) -> None:
        """Cancel at its replica a job the machine took back (preemption)."""
        k = replica_of[int(job.id)]
        settle(k, now, by)
        if batchers[k].abort(job.id):
            load_[k] -= 1
        if record:
            decisions.append((now, "preempt", job.id, "requeued" if requeued else "ended"))

    def apply(now: float, by: int, todo: list[Effect] | None = None) -> None:
        """Carry out ``todo`` (default: the machine's pending effects), in order, and those
        they lead to (a send that fails ends its job, which may dispatch more: after)."""
        if todo is None:
            todo = effects()
        while todo:
            for e in todo:
                t = type(e)
                if t is Send:
                    send(e.job, now, by)
                elif t is Settle:
                    j = e.job
                    finish(j.id, j.tenant, e.claims, e.lines, j.pool)  # type: ignore[union-attr]
                elif t is Cancel:
                    cancel(e.job, e.refusal is None, now, by)  # type: ignore[union-attr]
            todo = effects()

    def dispatch(now: float, by: int) -> None:
        tick()
        apply(now, by)

    def on_step(k: int) -> None:
        t = env.now
        run = runs[k]
        if run is None:
            ev = pend[k]
        else:  # a decode run ends: apply it, deliver its last step's events
            runs[k] = None
            ev = run.apply(run.steps)
        if ev:
            set_clock(t)
            for e in ev:
                if timeout is not None or preempts:
                    # the client gave up during the step, or the job was taken back (and
                    # perhaps sent again: an attempt sent at t has no step ending at t)
                    j = live_job(e.seq_id)
                    if j is None or j.state is not _DISPATCHED or j.dispatched_at == t:
                        continue
                if type(e) is FirstToken:
                    first_token(jobs[int(e.seq_id)])  # type: ignore[arg-type]
                elif type(e) is Finished:
                    job = jobs[int(e.seq_id)]
                    assert job is not None
                    complete(job, new_tuple(Usage, (e.prompt_tokens, e.output_tokens, 0)))
                    load_[k] -= 1
                    apply(t, k)  # as the gateway: each end, then what it lets go
        b = batchers[k]
        # A job added since the step began is most likely admitted now, when a plan would
        # find no run: step at once (stepping is as exact as a run, only slower).
        if fast_forward and not fresh[k]:
            run = plans[k]
            if run.plan(t):
                runs[k] = run
                pend[k] = None
                step_end[k] = run.end
                return
        fresh[k] = 0
        if b.has_work:
            res = b.step(t)
            pend[k] = res.events
            step_end[k] = t + res.duration
        else:
            pend[k] = None
            fleet.stop_busy(k, t)
            if k in draining:
                leave(k, t)

    # The queue deadline, the next client timeout and the next scrape are read again after
    # every event that is not a step end, as the loop before the environment did at each
    # pass; an event left behind by a later one is stale (its version no longer matches).
    hver = [0, 0]  # deadline, timeout
    tp = [0]  # the next arrival whose client timeout is pending
    arrived = [0]

    def horizon(now: float) -> None:
        d = ctl.next_deadline()
        hver[0] += 1
        if d is not None:
            schedule(max(d, now), deadline_prio, on_deadline, hver[0])
        hver[1] += 1
        if timeout is not None and tp[0] < arrived[0]:
            schedule(max(times[tp[0]] + timeout, now), timeout_prio, on_timeout, hver[1])

    def bring_up(now: float) -> None:
        """Apply every pending decode run up to the step in progress at ``now`` (a scrape
        reads every engine); a run that goes on past ``now`` keeps its end."""
        for k, run in enumerate(runs):
            if run is not None:
                j = run.started(now, inclusive=True)
                if j < run.steps:
                    run.apply(j)
                else:
                    settle(k, now, _BY_ALL)

    def projected(now: float) -> list[float | None]:
        """Each replica's KV usage with its pending decode run brought up to the step in
        progress at ``now``, the run left pending (``None``: no run, read the batcher); a
        run that ends by ``now`` is settled."""
        usage: list[float | None] = [None] * len(runs)
        for k, run in enumerate(runs):
            if run is not None:
                j = run.started(now, inclusive=True)
                if j < run.steps:
                    usage[k] = run.kv_usage(j)
                else:
                    settle(k, now, _BY_ALL)
        return usage

    def on_scrape(_: None) -> None:
        now = env.now
        if not (arrived[0] < n or ctl.queued or ctl.in_flight):
            return  # the last work ended before this scrape: nothing left to read
        set_clock(now)
        scrapes.fire(now, projected(now))
        dispatch(now, _BY_ALL)
        schedule(scrapes.next_at, priority(SCRAPE), on_scrape, None)
        horizon(now)

    def on_deadline(v: int) -> None:
        if v != hver[0]:
            return
        now = env.now
        set_clock(now)
        dispatch(now, _BY_ALL)
        horizon(now)

    def on_timeout(v: int) -> None:
        if v != hver[1]:
            return
        assert timeout is not None
        now = env.now
        set_clock(now)
        j = tp[0]
        while j < arrived[0] and times[j] + timeout <= now:
            job = jobs[j]
            assert job is not None
            if job.state is _QUEUED:
                machine.client_gone(job)
            elif job.state is _DISPATCHED:
                k = replica_of[j]
                settle(k, now, _BY_ALL)
                snap = batchers[k].seq_state(job.id)
                batchers[k].abort(job.id)
                load_[k] -= 1
                gen = snap.generated_tokens if snap is not None else 0
                machine.client_gone(job, Usage(job.prompt_tokens, gen))
            apply(now, _BY_ALL)  # as the gateway: each end, then what it lets go
            j += 1
        tp[0] = j
        dispatch(now, _BY_ALL)
        horizon(now)

    def on_arrival(i: int) -> None:
        h = env.now
        set_clock(h)
        job = Job(
            str(i),
            tenants[i],
            tiers[i],
            prompts[i],
            caps[i],
            model=models[i],
            predicted_output=preds[i],
            template=templates[i],  # a shared system prompt: the template
        )
        if kinds:
            job.kind = kinds[i]
            if job.kind in PROMPT_ONLY:
                size_prompt_only(job)
        jobs[i] = job
        machine.arrived(job)
        todo = effects()
        decided = job.state
        while todo and type(todo[0]) is Reserve:  # the same store, answering without I/O
            claims = todo[0].claims
            machine.reserved(job, claims, reserve_now(job.id, job.tenant, claims))
            decided = job.state  # before what the decision lets go
            todo = effects()
        req_pool[i] = pool_index[job.pool]
        if job.max_tokens < outputs[i]:  # degraded: the engine stops at the cap
            outputs[i] = job.max_tokens
        if record:
            decisions.append((h, "arrive", job.id, _detail(job, decided)))
        apply(h, _BY_ALL, todo)
        samples_t.append(h)
        samples_q.append(ctl.queued)
        samples_f.append(ctl.in_flight)
        arrived[0] = i + 1
        if i + 1 < n:  # (the workload is sorted: never before now)
            heappush(heap, (times[i + 1], arrival_prio + i + 1, next(order), on_arrival, i + 1))
        horizon(h)

    # -- the autoscaled pool ---------------------------------------------------------------

    def set_live(now: float) -> None:
        assert auto is not None
        live = list(members[auto.pool])
        scrapes.set_live(auto.pool, live, sorted([*live, *draining]))

    def on_ready(r: Replica) -> None:
        assert auto is not None
        now = env.now
        if not auto.replicas.become_ready(r, now):
            return
        k = r.slot
        fleet.enable(k)
        if record:
            decisions.append((now, "ready", "", str(k)))
        set_live(now)
        set_clock(now)
        dispatch(now, _BY_ALL)

    def leave(k: int, now: float) -> None:
        assert auto is not None
        auto.replicas.leave(draining.pop(k), now)
        set_live(now)
        if record:
            decisions.append((now, "gone", "", str(k)))

    def on_scale(_: None) -> None:
        assert auto is not None
        now = env.now
        pool = auto.replicas
        want = auto.scaler.fire(now, pool.asked, pool.ready)
        if want != pool.asked:
            if record:
                decisions.append((now, "scale", "", f"{pool.asked}->{want}"))
            started, drained = pool.scale(now, want)
            for r in started:  # the pool took a new engine slot from the fleet for each
                k = r.slot
                while len(pend) <= k:
                    scrapes.add(len(pend))
                    pend.append(None)
                    runs.append(None)
                    plans.append(DecodeRun(batchers[len(plans)], counts))
                    step_end.append(math.inf)
                schedule(r.ready_at, priority(READY, k), on_ready, r)
            for r in drained:
                k = r.slot
                fleet.disable(k)
                draining[k] = r
                if record:
                    decisions.append((now, "drain", "", str(k)))
            set_live(now)
            for r in drained:
                if not active[r.slot]:
                    leave(r.slot, now)
        nxt = auto.scaler.next_at()
        if nxt < math.inf and keep_going(nxt):
            schedule(nxt, priority(SCALE), on_scale, None)

    def on_prom(_: None) -> None:
        assert auto is not None and auto.signal is not None and auto.record is not None
        now = env.now
        bring_up(now)  # the signal reads the batchers
        auto.record(now, auto.signal(now))
        nxt = now + auto.scrape_interval_s
        if keep_going(nxt):
            schedule(nxt, priority(PROM), on_prom, None)

    def keep_going(t: float) -> bool:
        """Whether the autoscaler's clockwork goes on to ``t``: until ``until`` and while
        requests are still to come or to finish, or replicas to start or to leave."""
        assert auto is not None
        return t <= until or bool(
            arrived[0] < n or ctl.queued or ctl.in_flight or draining
            or auto.replicas.ready != auto.replicas.asked
        )  # fmt: skip

    env.on_timer = on_step
    if auto is not None:
        set_live(0.0)
        if auto.signal is not None:
            schedule(0.0, priority(PROM), on_prom, None)
        schedule(auto.scaler.next_at(), priority(SCALE), on_scale, None)
    if scrapes.next_at < math.inf:
        schedule(scrapes.next_at, priority(SCRAPE), on_scrape, None)
    if n:
        priority(ARRIVAL, n - 1)  # every arrival's rank is in range
        schedule(times[0], arrival_prio, on_arrival, 0)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if was_enabled:
            gc.enable()
    return Trace(jobs, decisions, samples_t, samples_q, samples_f, clock.now(), counts)


def _detail(job: Job, state: JobState) -> str:
    """What the arrival's decision was, from the job's ``state`` just after it."""
    if state is _QUEUED:
        return "queued"
    if state is JobState.REJECTED:
        assert job.reason is not None
        return f"rejected:{job.reason.code}"
    return "admitted"
