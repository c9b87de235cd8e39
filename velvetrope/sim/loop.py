"""The simulator's event loop: a virtual clock driving the real admission core and real engines.

:func:`run_simulation` replays a workload against a modelled fleet.  Nothing of the policy or
of the engine is re-implemented: every admission decision is the
:class:`~velvetrope.core.controller.AdmissionController`'s, every iteration is a
:class:`~velvetrope.engine.Batcher` step, and the loop only moves time and carries events
between them, the way the gateway does with real time:

* an arrival at ``t`` becomes a :class:`~velvetrope.core.request.Job`, is routed by
  ``ctl.route`` (the policy's ``routes``, and its tier's degradation: a capped ``max_tokens``
  caps what the engine generates) and goes to ``ctl.arrive``; a dispatched job goes to the
  least-loaded replica of its pool (:class:`~velvetrope.sim.fleet.Fleet`) and is ``add``-ed
  to that replica's batcher;
* capacity per engine is per engine × the pool's replicas, and with
  ``policy.saturation.enabled`` the replicas are read every ``scrape_interval_s`` into the
  core's saturation rule, after which ``ctl.dispatchable()`` is asked again
  (:mod:`velvetrope.sim.scrape`); the rule is told which replica took each job;
* each busy replica runs back-to-back iterations: the step is computed when it starts
  (vLLM schedules at the start of an iteration, so work added during a step waits for the
  next one) and its events are delivered when it ends: ``FirstToken`` → ``ctl.first_token``,
  ``Finished`` → ``ctl.complete(id, Usage(prompt, output))``; after a step that finished
  work, the loop asks ``ctl.dispatchable()`` for what may start now.  An idle replica starts
  a step the moment work is added to it;
* queued jobs expire at ``ctl.next_deadline()`` (``ctl.tick()``), and with
  ``client_timeout_s`` a client gives up that long after it arrived: a queued job is
  cancelled in the core, a dispatched one is also aborted in its batcher and charged its
  prompt and the tokens generated so far (the tokens of a step in progress count).
  ``dispatchable()`` is asked again after each arrival that queued, each expiry and each
  cancellation (any of them can unblock the head of the queue).

Engines reject what they cannot hold: a request whose ``prompt + output`` exceeds the
profile's ``max_model_len`` is failed with ``upstream_error`` when dispatched (vLLM answers
400), which releases its slot.  A trace row with 0 output tokens generates one token (an
engine always samples at least one).  A row without ``max_tokens`` declares
``max(default_max_tokens, output)``.

Ties in time are resolved in one fixed order, so a run is a pure function of its inputs:
step ends (by replica number) first, then scrapes, then queue deadlines, then client
timeouts (in arrival order), then arrivals (in workload order).

Tiers: a request runs in the tier the gateway would give it,
``ctl.resolve_tier(tenant, requested=row.tier)``, except that a tenant the config does not
list takes the row's tier when the row names a tier that exists (the trace's tenants stand
for tenants the config would list).

Speed: the loop holds its state in local variables, keeps arrivals and client timeouts as
sorted lists walked by index (only replica step ends live in a heap), runs replica steps in an
inner loop up to the next arrival, deadline or timeout, delivers only non-empty event lists
and uses ``Batcher(token_events=False)`` (TPOT comes from the first-token and finish times).
The cyclic garbage collector is paused during the run (nothing the loop allocates forms
cycles; reference counting frees it).  See ``bench/sim_bench.py``.

Fast-forward: when a replica's next iterations are pure decode (every running sequence
decoding, nothing to admit, every block they need free), the loop plans the whole stretch
up to and including the step where sequences finish
(:func:`~velvetrope.engine.fastforward.plan_decode_run`) and puts only its end in the heap.
The stretch is applied to the batcher in closed form when it ends, or earlier, up to the
step in progress, the moment anything touches that replica (a dispatch to it, a client
timeout of one of its jobs): a step starting exactly then counts as started when a
step-by-step loop would have handled that step end first (ties go by replica number, and every
step end before the arrival, deadline or timeout at the same time).  The result is the same,
bit for bit, as stepping every iteration (``fast_forward=False``).
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Admitted,
    Job,
    JobState,
    Outcome,
    OutputEstimator,
    PolicyConfig,
    Queued,
    Reason,
    Rejected,
    Usage,
)
from velvetrope.core.policy import SloPolicy
from velvetrope.engine import EngineEvent, EngineProfile, Finished, FirstToken
from velvetrope.engine.fastforward import DecodeRun, plan_decode_run
from velvetrope.errors import PolicyError
from velvetrope.sim.capacity import Capacity, fleet_capacity
from velvetrope.sim.fleet import Fleet, pool_replicas
from velvetrope.sim.lengths import LengthKnowledge, parse_lengths, predicted_outputs
from velvetrope.sim.metrics import JobRecords, config_slos
from velvetrope.sim.result import LogEntry, RunInfo, SimResult
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.sim.workload import TraceRequest, rescale_time, trace_stats

__all__ = ["policy_label", "run_simulation", "scale_to_load"]

_INF = math.inf
_QUEUED = JobState.QUEUED
_DISPATCHED = JobState.DISPATCHED


def policy_label(config: PolicyConfig) -> str:
    """A one-line description of a config's queue discipline (preset applied)."""
    from velvetrope.core import apply_preset

    c = apply_preset(config)
    q = c.queue
    head = c.preset or "custom"
    return f"{head} (bands={q.bands}, fairness={q.fairness}, ordering={q.ordering})"


def scale_to_load(
    workload: Sequence[TraceRequest], load: float, capacity: Capacity
) -> list[TraceRequest]:
    """``workload`` with arrivals rescaled so its mean rate is ``load × capacity.rps``."""
    if not (math.isfinite(load) and load > 0):
        raise PolicyError(f"load must be finite and > 0, got {load!r}")
    rate = trace_stats(workload).mean_rps
    return rescale_time(workload, load * capacity.rps / rate)


def _check_sorted(workload: Sequence[TraceRequest]) -> None:
    prev = -_INF
    for i, r in enumerate(workload):
        if r.t < prev:
            raise PolicyError(f"the workload must be sorted by t (request {i} at t={r.t!r})")
        prev = r.t


def run_simulation(
    config: PolicyConfig,
    workload: Sequence[TraceRequest],
    replicas: int | Mapping[str, int],
    profile: EngineProfile,
    *,
    load: float | None = None,
    router: str = "least_loaded",
    lengths: str | LengthKnowledge = "estimator",
    estimator: OutputEstimator | None = None,
    client_timeout_s: float | None = None,
    default_max_tokens: int = 1024,
    slos: Mapping[str, SloPolicy] | None = None,
    seed: int = 0,
    label: str = "workload",
    record_decisions: bool = False,
    record_engines: bool = False,
    fast_forward: bool = True,
) -> SimResult:
    """Replay ``workload`` (sorted by ``t``) through ``config`` on a modelled fleet.

    ``replicas`` per pool (an int for every pool of ``config``, or a mapping pool → count);
    every replica runs ``profile``.  ``load``: rescale arrivals first so that the offered load
    is ``load`` × the fleet's capacity (:mod:`velvetrope.sim.capacity`: per-replica
    saturation throughput on this workload's length mix × all replicas).  ``router``:
    ``least_loaded`` or ``round_robin``.  ``lengths``: what the core knows of output lengths
    (:mod:`velvetrope.sim.lengths`); ``estimator`` replaces the core's default estimator.
    Pools come from the policy's ``routes`` (the gateway's rules, on model, tier and
    predicted output).  ``slos`` per tier
    (``*`` for the rest; see :mod:`velvetrope.sim.metrics`).  ``seed`` drives the noisy
    predictor and the capacity measurement.  ``record_decisions`` keeps the decision log
    (:attr:`SimResult.decisions`); ``record_engines`` samples every replica's running and
    waiting sequences at each scrape interval (:attr:`SimResult.engines`).
    ``fast_forward=False`` steps every engine iteration one by one instead of advancing
    pure-decode stretches in closed form (the result is the same, bit for bit; it exists for
    the tests that prove it).  Bad parameters raise :class:`~velvetrope.errors.PolicyError`.
    The same inputs give the same result, bit for bit.
    """
    knowledge = parse_lengths(lengths)
    if client_timeout_s is not None and not (
        client_timeout_s > 0 and math.isfinite(client_timeout_s)
    ):
        raise PolicyError(f"client_timeout_s must be finite and > 0, got {client_timeout_s!r}")
    if default_max_tokens < 1:
        raise PolicyError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    _check_sorted(workload)
    clock = ManualClock(0.0)
    decisions: list[LogEntry] = []
    observers: list[Callable[[Outcome], None]] = []
    if record_decisions:

        def observe(o: Outcome) -> None:
            decisions.append((o.at, "end", o.job.id, f"{o.state.value}:{o.reason.code}"))

        observers.append(observe)
    ctl = AdmissionController(config, clock, estimator=estimator, observers=observers)
    policy = ctl.config
    pool_names = [p.name for p in policy.pools]
    fleet = Fleet(profile, pool_replicas(pool_names, replicas), router)
    scrapes = EngineScrapes(ctl, fleet, record=record_engines)
    capacity: Capacity | None = None
    if load is not None:
        capacity = fleet_capacity(profile, workload, len(fleet), seed=seed)
        workload = scale_to_load(workload, load, capacity)

    # -- per-request inputs, prepared once ---------------------------------------------
    n = len(workload)
    times = [r.t for r in workload]
    outputs = [r.output_tokens if r.output_tokens > 0 else 1 for r in workload]
    prompts = [r.prompt_tokens for r in workload]
    caps = [
        r.max_tokens if r.max_tokens is not None else max(default_max_tokens, o)
        for r, o in zip(workload, outputs, strict=True)
    ]
    preds = predicted_outputs(knowledge, outputs, caps, seed)
    models = [r.model for r in workload]
    listed = {t.name for t in policy.tenants}
    tier_names = {t.name for t in policy.tiers}
    tier_cache: dict[tuple[str, str | None], str] = {}
    tiers: list[str] = []
    for r in workload:
        key = (r.tenant, r.tier)
        tier = tier_cache.get(key)
        if tier is None:
            if r.tier is not None and r.tenant not in listed and r.tier in tier_names:
                tier = r.tier
            else:
                tier = ctl.resolve_tier(r.tenant, r.tier)
            tier_cache[key] = tier
        tiers.append(tier)
    pool_index = {p: i for i, p in enumerate(pool_names)}
    req_pool = [0] * n
    max_len = profile.max_model_len
    shared = [(r.prefix_id, r.prefix_tokens) for r in workload]
    replica_of = [-1] * n
    jobs: list[Job | None] = [None] * n

    # -- the loop ----------------------------------------------------------------------
    batchers = fleet.batchers
    load_ = fleet.load
    active = fleet.active
    route = fleet.route
    start_busy = fleet.start_busy
    stop_busy = fleet.stop_busy
    heap: list[tuple[float, int]] = []
    pend: list[list[EngineEvent] | None] = [None] * len(fleet)
    starts: list[int] = []
    set_clock = clock.set
    dispatchable = ctl.dispatchable
    route_job = ctl.route
    sent = scrapes.sent
    fresh = scrapes.fresh
    first_token = ctl.first_token
    complete = ctl.complete
    live_job = ctl.job
    heappush = heapq.heappush
    heappop = heapq.heappop
    heapreplace = heapq.heapreplace
    heapify = heapq.heapify
    timeout = client_timeout_s
    samples_t: list[float] = []
    samples_q: list[int] = []
    samples_f: list[int] = []

    runs: list[DecodeRun | None] = [None] * len(fleet)
    plan = plan_decode_run if fast_forward else None
    horizon = len(fleet)  # "by" of the events that are not step ends: after every replica

    def settle(k: int, now: float, by: int) -> None:
        """Apply replica ``k``'s pending decode run up to its step in progress at ``now``
        (seen while handling the step end of replica ``by``; ``horizon`` for the other
        events) and move its heap entry to that step's end.  Called before anything reads
        or changes batcher ``k``."""
        run = runs[k]
        if run is None:
            return
        runs[k] = None
        j = run.started(now, inclusive=k < by)
        pend[k] = run.apply(j)
        if j < run.steps:
            heap[heap.index((run.end, k))] = (run.starts[j], k)
            heapify(heap)

    def launch(batch: list[Job], now: float, by: int) -> bool:
        """Send dispatched jobs to replicas; True if some failed (capacity was released)."""
        failed = False
        for job in batch:
            idx = int(job.id)
            if prompts[idx] + outputs[idx] > max_len:
                ctl.fail(job.id, Reason.UPSTREAM_ERROR)
                failed = True
                continue
            k = route(req_pool[idx])
            if runs[k] is not None:
                settle(k, now, by)
            pid, ptok = shared[idx]
            batchers[k].add(
                job.id, prompts[idx], outputs[idx], now, prefix_id=pid, prefix_tokens=ptok
            )
            sent(job, k)
            fresh[k] += 1
            load_[k] += 1
            replica_of[idx] = k
            if record_decisions:
                decisions.append((now, "dispatch", job.id, str(k)))
            if not active[k]:
                start_busy(k, now)
                starts.append(k)
        return failed

    def dispatch(now: float, by: int) -> None:
        while True:
            batch = dispatchable()
            if not batch or not launch(batch, now, by):
                return

    def flush(now: float) -> None:
        for k in starts:
            heappush(heap, (now, k))
            pend[k] = None
        starts.clear()

    i = 0
    tp = 0
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        while True:
            ta = times[i] if i < n else _INF
            tto = times[tp] + timeout if timeout is not None and tp < i else _INF
            dl = ctl.next_deadline()
            td = dl if dl is not None else _INF
            tsc = scrapes.next_at if (i < n or ctl.queued or ctl.in_flight) else _INF
            h = ta if ta < tto else tto
            if td < h:
                h = td
            if tsc < h:
                h = tsc
            # replica steps that end by the horizon
            while heap:
                top = heap[0]
                t = top[0]
                if t > h:
                    break
                k = top[1]
                run = runs[k]
                if run is None:
                    ev = pend[k]
                else:  # a decode run ends: apply it, deliver its last step's events
                    runs[k] = None
                    ev = run.apply(run.steps)
                if ev:
                    set_clock(t)
                    freed = False
                    for e in ev:
                        if timeout is not None and live_job(e.seq_id) is None:
                            continue  # the client gave up during the step
                        if type(e) is FirstToken:
                            first_token(e.seq_id)
                        elif type(e) is Finished:
                            complete(e.seq_id, Usage(e.prompt_tokens, e.output_tokens))
                            load_[k] -= 1
                            freed = True
                    if freed and ctl.queued:
                        dispatch(t, k)
                b = batchers[k]
                fresh[k] = 0
                run = plan(b, t) if plan is not None else None
                if run is not None:
                    runs[k] = run
                    pend[k] = None
                    heapreplace(heap, (run.end, k))
                elif b.has_work:
                    res = b.step(t)
                    pend[k] = res.events
                    heapreplace(heap, (t + res.duration, k))
                else:
                    heappop(heap)
                    pend[k] = None
                    stop_busy(k, t)
                if starts:
                    flush(t)
            if tsc <= h and not (i < n or ctl.queued or ctl.in_flight):
                tsc = _INF  # the last work ended before this scrape: nothing left to read
                h = min(ta, tto, td)
            if h == _INF:
                break
            if h < clock.now():  # a deadline already handled by dispatchable()
                h = clock.now()
            set_clock(h)
            if tsc <= h:
                for k in range(horizon):  # a scrape reads the batchers: bring them to h
                    settle(k, h, horizon)
                scrapes.fire(h)
                dispatch(h, horizon)
            elif td <= h:
                ctl.tick()
                dispatch(h, horizon)
            elif tto <= h:
                assert timeout is not None
                while tp < i and times[tp] + timeout <= h:
                    job = jobs[tp]
                    assert job is not None
                    if job.state is _QUEUED:
                        ctl.cancel(job.id)
                    elif job.state is _DISPATCHED:
                        k = replica_of[tp]
                        settle(k, h, horizon)
                        snap = batchers[k].seq_state(job.id)
                        batchers[k].abort(job.id)
                        load_[k] -= 1
                        gen = snap.generated_tokens if snap is not None else 0
                        ctl.cancel(job.id, Usage(job.prompt_tokens, gen))
                    tp += 1
                dispatch(h, horizon)
            else:
                job = Job(
                    str(i),
                    workload[i].tenant,
                    tiers[i],
                    prompts[i],
                    caps[i],
                    model=models[i],
                    predicted_output=preds[i],
                    template=workload[i].prefix_id,  # a shared system prompt: the template
                )
                jobs[i] = job
                route_job(job)
                req_pool[i] = pool_index[job.pool]
                if job.max_tokens < outputs[i]:  # degraded: the engine stops at the cap
                    outputs[i] = job.max_tokens
                d = ctl.arrive(job)
                kind = d.__class__
                if record_decisions:
                    decisions.append((h, "arrive", job.id, _decision_detail(d)))
                if kind is Admitted:
                    if launch([job], h, horizon):
                        dispatch(h, horizon)
                elif kind is Queued:
                    dispatch(h, horizon)
                samples_t.append(h)
                samples_q.append(ctl.queued)
                samples_f.append(ctl.in_flight)
                i += 1
            flush(h)
    finally:
        if was_enabled:
            gc.enable()

    span = clock.now()
    records = _records(jobs, tiers, prompts, outputs)
    info = RunInfo(
        label=label,
        requests=n,
        policy=policy_label(config),
        profile=profile.name,
        replicas={p: fleet.ranges[j][1] - fleet.ranges[j][0] for j, p in enumerate(pool_names)},
        router=router,
        lengths=str(knowledge),
        client_timeout_s=client_timeout_s,
        load=load,
        capacity=capacity,
        seed=seed,
    )
    return SimResult(
        info=info,
        records=records,
        span_s=span,
        pools=fleet.stats(span),
        tiers=tuple(t.name for t in policy.tiers),
        slos={**config_slos(policy), **(slos or {})},
        samples=(
            np.asarray(samples_t, dtype=np.float64),
            np.asarray(samples_q, dtype=np.int64),
            np.asarray(samples_f, dtype=np.int64),
        ),
        decisions=tuple(decisions) if record_decisions else None,
        engines=scrapes.samples(),
    )


def _decision_detail(d: Admitted | Queued | Rejected) -> str:
    if isinstance(d, Admitted):
        return "admitted"
    if isinstance(d, Queued):
        return "queued"
    return f"rejected:{d.reason.code}"


def _records(
    jobs: Sequence[Job | None], tiers: list[str], prompts: list[int], outputs: list[int]
) -> JobRecords:
    nan = math.nan
    arrival, dispatched, first, end, state, reason, tenant, pred = [], [], [], [], [], [], [], []
    pool: list[str] = []
    route: list[str] = []
    degraded: list[str] = []
    for job in jobs:
        assert job is not None
        arrival.append(job.arrival)
        dispatched.append(job.dispatched_at if job.dispatched_at is not None else nan)
        first.append(job.first_token_at if job.first_token_at is not None else nan)
        end.append(job.finished_at if job.finished_at is not None else nan)
        state.append(job.state.value)
        reason.append(job.reason.code if job.reason is not None else "")
        tenant.append(job.tenant)
        pred.append(job.predicted_output if job.predicted_output is not None else -1)
        pool.append(job.pool)
        route.append(job.route or "")
        degraded.append(",".join(job.degraded))
    return JobRecords(
        arrival=np.asarray(arrival, dtype=np.float64),
        dispatched=np.asarray(dispatched, dtype=np.float64),
        first_token=np.asarray(first, dtype=np.float64),
        end=np.asarray(end, dtype=np.float64),
        state=np.asarray(state, dtype=np.str_),
        reason=np.asarray(reason, dtype=np.str_),
        tenant=np.asarray(tenant, dtype=np.str_),
        tier=np.asarray(tiers, dtype=np.str_),
        prompt=np.asarray(prompts, dtype=np.int64),
        output=np.asarray(outputs, dtype=np.int64),
        predicted=np.asarray(pred, dtype=np.int64),
        pool=np.asarray(pool, dtype=np.str_),
        route=np.asarray(route, dtype=np.str_),
        degraded=np.asarray(degraded, dtype=np.str_),
    )
