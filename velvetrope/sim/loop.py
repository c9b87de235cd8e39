"""The simulator's event loop: a virtual clock driving the real admission core and real engines.

:func:`run_simulation` replays a workload against a modelled fleet.  Nothing of the policy or
of the engine is re-implemented: every admission decision is the
:class:`~velvetrope.core.controller.AdmissionController`'s, every iteration is a
:class:`~velvetrope.engine.Batcher` step, and the loop only moves time and carries events
between them, the way the gateway does with real time:

* an arrival at ``t`` becomes a :class:`~velvetrope.core.job.Job`, is routed by
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

Events come from one event environment (:mod:`velvetrope.sim.env`, driven by
:class:`velvetrope.sim.runner.SimDriver`): ties in time are resolved in one fixed order, so a run
is a pure function of its inputs: step ends (by replica number) first, then scrapes, then
queue deadlines, then client timeouts (in arrival order), then arrivals (in workload order).

Tiers: a request runs in the tier the gateway would give it,
``ctl.resolve_tier(tenant, requested=row.tier)``, except that a tenant the config does not
list takes the row's tier when the row names a tier that exists (the trace's tenants stand
for tenants the config would list).

Speed: the handlers hold their state in local variables, arrivals are scheduled one at a
time, only non-empty event lists are delivered and the batchers run with
``Batcher(token_events=False)`` (TPOT comes from the first-token and finish times).  The
cyclic garbage collector is paused during the run (nothing the loop allocates forms cycles;
reference counting frees it).  See ``bench/sim_bench.py``.

Fast-forward: when a replica's next iterations are pure decode (every running sequence
decoding, nothing to admit, every block they need free), the loop plans the whole stretch
up to and including the step where sequences finish
(:func:`~velvetrope.engine.fastforward.plan_decode_run`) and schedules only its end.
The stretch is applied to the batcher in closed form when it ends, or earlier, up to the
step in progress, the moment anything touches that replica (a dispatch to it, a client
timeout of one of its jobs, an engine scrape): a step starting exactly then counts as
started when a
step-by-step loop would have handled that step end first (ties go by replica number, and every
step end before the arrival, deadline or timeout at the same time).  The result is the same,
bit for bit, as stepping every iteration (``fast_forward=False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Job,
    JobState,
    Outcome,
    OutputEstimator,
    PolicyConfig,
)
from velvetrope.core.engine_priority import EnginePriority
from velvetrope.core.kinds import PROMPT_ONLY
from velvetrope.core.policy import SloPolicy
from velvetrope.core.request_machine import RequestMachine
from velvetrope.engine import EngineProfile
from velvetrope.errors import PolicyError
from velvetrope.sim.capacity import Capacity, fleet_capacity
from velvetrope.sim.drive_inputs import Inputs
from velvetrope.sim.fleet import Fleet, pool_replicas
from velvetrope.sim.lengths import LengthKnowledge, parse_lengths, predicted_outputs
from velvetrope.sim.metrics import JobRecords, config_slos
from velvetrope.sim.result import LogEntry, RunInfo, SimResult
from velvetrope.sim.runner import SimDriver
from velvetrope.sim.scrape import EngineScrapes
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import rescale_time, trace_stats
from velvetrope.store.memory import MemoryStore

if TYPE_CHECKING:
    from velvetrope.sim.autoscale import AutoscaleSpec

__all__ = ["Budgets", "policy_label", "run_simulation", "scale_to_load"]

Budgets = Callable[[Sequence[TraceRequest]], tuple[Sequence[TraceRequest], Sequence[str | None]]]
"""A what-if's budgets: the requests kept, and the tier each is forced to (or ``None``)."""

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
    autoscale: AutoscaleSpec | None = None,
    engine_names: Sequence[str] | None = None,
    engine_scheduling: str = "fcfs",
    budgets: Budgets | None = None,
    machine_record: list[tuple[float, str, str, str]] | None = None,
) -> SimResult:
    """Replay ``workload`` (sorted by ``t``) through ``config`` on a modelled fleet.

    ``replicas`` per pool (an int for every pool of ``config``, or a mapping pool → count);
    every replica runs ``profile``.  ``load``: rescale arrivals first so that the offered load
    is ``load`` × the fleet's capacity (:mod:`velvetrope.sim.capacity`: per-replica
    saturation throughput on this workload's length mix × all replicas).  ``router``:
    ``least_loaded``, ``round_robin`` or ``prefix_oracle`` (:mod:`velvetrope.sim.fleet`); a
    pool whose policy routes ``prefix_affinity`` or ``prefix_hash`` routes so on the
    requests' ``block_hashes``, naming its replicas ``engine_names`` (one per replica, pool
    by pool; default ``"0"``, ``"1"``...: give the gateway's upstream URLs to replay its
    choices).  ``lengths``: what the core knows of output lengths
    (:mod:`velvetrope.sim.lengths`); ``estimator`` replaces the core's default estimator.
    Pools come from the policy's ``routes`` (the gateway's rules, on model, tier and
    predicted output).  ``slos`` per tier
    (``*`` for the rest; see :mod:`velvetrope.sim.metrics`).  ``seed`` drives the noisy
    predictor and the capacity measurement.  ``record_decisions`` keeps the decision log
    (:attr:`SimResult.decisions`); ``record_engines`` samples every replica's running and
    waiting sequences at each scrape interval (:attr:`SimResult.engines`).
    ``fast_forward=False`` steps every engine iteration one by one instead of advancing
    pure-decode stretches in closed form (the result is the same, bit for bit; it exists for
    the tests that prove it).  ``autoscale`` makes one pool's replicas come and go under
    KEDA's model (:mod:`velvetrope.sim.autoscale`; the result's :attr:`SimResult.autoscale`).
    ``engine_scheduling``: the engines' waiting-queue policy, ``fcfs`` or ``priority``
    (vLLM's ``--scheduling-policy``); a job's priority is what the gateway would forward
    (a pool's ``engine_priority``: the tier's index), else 0.  FCFS engines refuse a
    priority (vLLM answers 400), so, as the gateway learns from the first refusal, none is
    forwarded to them and the pools' headroom rules do not count on the engines' order.
    ``machine_record`` (if given) receives the request machine's record of every event and
    effect (:class:`~velvetrope.core.request_machine.RequestMachine`: the gateway's driver
    fed the same events writes the same).  ``budgets`` takes the workload once rescaled and
    returns the requests its budgets let through and, one per request, the tier a downgrade
    forces (``None``: resolved as usual), whatever its tenant may ask for
    (:func:`velvetrope.sim.quotas.apply_quotas`). Bad parameters raise
    :class:`~velvetrope.errors.PolicyError`.  The same inputs give the
    same result, bit for bit.
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
    machine = RequestMachine(ctl, record=machine_record)
    policy = ctl.config
    pool_names = [p.name for p in policy.pools]
    counts = pool_replicas(pool_names, replicas)
    configured = dict(counts)
    scaled = None
    if autoscale is not None:
        scaled = autoscale.pool or pool_names[0]
        if scaled not in counts:
            raise PolicyError(f"autoscale pool {scaled!r} is not in the policy's pools")
        counts[scaled] = max(1, autoscale.scaled_object.min_replicas)
    fleet = Fleet(
        profile, counts, router, policy=policy, names=engine_names, scheduling=engine_scheduling
    )
    scrapes = EngineScrapes(ctl, fleet, record=record_engines)
    capacity: Capacity | None = None
    if load is not None:
        capacity = fleet_capacity(profile, workload, len(fleet), seed=seed)
        workload = scale_to_load(workload, load, capacity)
    forced_tiers: Sequence[str | None] | None = None
    if budgets is not None:
        workload, forced_tiers = budgets(workload)

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
    kinds = [r.endpoint for r in workload]
    for i, kind in enumerate(kinds):
        if kind in PROMPT_ONLY:  # sized as the gateway sizes it: no output predicted
            caps[i], preds[i] = 1, 0
    models = [r.model for r in workload]
    listed = {t.name for t in policy.tenants}
    tier_names = {t.name for t in policy.tiers}
    tier_cache: dict[tuple[str, str | None], str] = {}
    tiers: list[str] = []
    if forced_tiers is not None and len(forced_tiers) != len(workload):
        raise PolicyError("budgets must give one tier (or None) per request it keeps")
    for i, r in enumerate(workload):
        forced = forced_tiers[i] if forced_tiers is not None else None
        if forced is not None:
            tiers.append(forced)
            continue
        key = (r.tenant, r.tier)
        tier = tier_cache.get(key)
        if tier is None:
            if r.tier is not None and r.tenant not in listed and r.tier in tier_names:
                tier = r.tier
            else:
                tier = ctl.resolve_tier(r.tenant, r.tier)
            tier_cache[key] = tier
        tiers.append(tier)
    inputs = Inputs(
        times=times, tenants=[r.tenant for r in workload], tiers=tiers, prompts=prompts,
        outputs=outputs, caps=caps, preds=preds, models=models,
        templates=[r.prefix_id for r in workload], pool_index={p: i for i, p in
        enumerate(pool_names)}, max_len=profile.max_model_len,
        prefix_tokens=[r.prefix_tokens for r in workload],
        blocks=[r.block_hashes for r in workload],
        block_tokens=[r.block_tokens for r in workload],
        engine_priority=EnginePriority(policy).table() if engine_scheduling == "priority"
        else {}, kinds=kinds,
    )  # fmt: skip
    if engine_scheduling != "priority":
        for name in pool_names:
            ctl.engines_ordered(name, False)
    attached = None
    if autoscale is not None:
        from velvetrope.sim.autoscale import attach

        assert scaled is not None
        attached = attach(autoscale, ctl, fleet, scrapes, pool_names, configured[scaled], seed)
    trace = SimDriver(
        machine, MemoryStore(clock), clock, fleet, scrapes, inputs, timeout=client_timeout_s,
        decisions=decisions, record=record_decisions, fast_forward=fast_forward,
        autoscaling=None if attached is None else attached.auto,
        until=0.0 if autoscale is None else autoscale.horizon_s,
    ).run()  # fmt: skip
    jobs = trace.jobs
    samples_t, samples_q, samples_f = trace.samples_t, trace.samples_q, trace.samples_f

    span = trace.span_s
    records = _records(jobs, tiers, prompts, outputs)
    info = RunInfo(
        label=label,
        requests=n,
        policy=policy_label(config),
        profile=profile.name,
        replicas=configured if scaled is None else {**configured, scaled: counts[scaled]},
        router=router,
        lengths=str(knowledge),
        client_timeout_s=client_timeout_s,
        load=load,
        capacity=capacity,
        seed=seed,
        engine_scheduling=engine_scheduling,
    )
    return SimResult(
        info=info,
        records=records,
        span_s=span,
        pools=fleet.stats(
            span,
            {k: v["preemptions"] or 0 for k, v in ctl.status()["pools"].items()},
        ),
        tiers=tuple(t.name for t in policy.tiers),
        slos={**config_slos(policy), **(slos or {})},
        samples=(
            np.asarray(samples_t, dtype=np.float64),
            np.asarray(samples_q, dtype=np.int64),
            np.asarray(samples_f, dtype=np.int64),
        ),
        decisions=tuple(decisions) if record_decisions else None,
        engines=scrapes.samples(),
        autoscale=None if attached is None else attached.finish(span),
        fast_forward=trace.runs,
    )


def _records(
    jobs: Sequence[Job | None], tiers: list[str], prompts: list[int], outputs: list[int]
) -> JobRecords:
    nan = math.nan
    arrival, dispatched, first, end, state, reason, tenant, pred = [], [], [], [], [], [], [], []
    pool: list[str] = []
    route: list[str] = []
    degraded: list[str] = []
    shadow: list[str] = []
    kind: list[str] = []
    generated = list(outputs)
    for i, job in enumerate(jobs):
        assert job is not None
        kind.append(job.kind)
        if job.kind in PROMPT_ONLY:  # the engine's prefill ends it: no output
            generated[i] = 0
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
        said = job.shadow
        shadow.append("" if said is None else f"{said} {job.shadow_reason}".rstrip())
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
        output=np.asarray(generated, dtype=np.int64),
        predicted=np.asarray(pred, dtype=np.int64),
        pool=np.asarray(pool, dtype=np.str_),
        route=np.asarray(route, dtype=np.str_),
        degraded=np.asarray(degraded, dtype=np.str_),
        shadow=np.asarray(shadow, dtype=np.str_) if any(shadow) else None,
        endpoint=np.asarray(kind, dtype=np.str_) if any(k != "chat" for k in kind) else None,
    )
