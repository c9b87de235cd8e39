"""The simulator's event loop: same decisions as a naive ManualClock harness, determinism,
lifecycle conservation, timeouts, engine refusals, routing and load rescaling."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tests.core.helpers import arrive
from velvetrope.clock import ManualClock
from velvetrope.core import (
    AdmissionController,
    Dispatched,
    Job,
    JobState,
    Outcome,
    PolicyConfig,
    Queued,
    Usage,
)
from velvetrope.engine import Batcher, EngineProfile, Finished, FirstToken, load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.arrivals import Poisson
from velvetrope.sim.capacity import fleet_capacity
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.result import LogEntry
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import trace_stats

# A small engine: 3,200 tokens of KV cache, so a busy replica preempts.
SMALL = load_profile("llama3-8b-h100").with_overrides(
    num_gpu_blocks=200, max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=2048
)

STRESS_POLICY = PolicyConfig.model_validate(
    {
        "preset": "hybrid",
        "queue": {"max_queued": 40},
        "tiers": [{"name": "gold", "max_wait_s": 3.0}, {"name": "bronze", "max_wait_s": 6.0}],
        "tenants": [
            {"name": "a", "tier": "gold", "limits": {"tokens_per_minute": 400_000}},
            {"name": "b", "tier": "bronze", "max_queued": 25},
            {"name": "c", "tier": "bronze", "limits": {"requests_per_minute": 120}},
        ],
        "pools": [{"name": "default", "max_in_flight": 12, "max_tokens_in_flight": 20_000}],
        # the harness below re-implements the loop without engine readings; the saturation
        # rule in the simulator is checked in tests/sim/test_fleet_rules.py
        "saturation": {"enabled": False},
    }
)


def stress_workload(n: int = 400, rate: float = 30.0, seed: int = 3) -> list[TraceRequest]:
    """Requests that exercise every outcome: bursts, a too-long prompt, mixed sizes."""
    rng = np.random.default_rng(seed)
    times = Poisson(rate).times(seed, count=n)
    tenants = ["a", "b", "c"]
    out = []
    for i, t in enumerate(times.tolist()):
        prompt = int(rng.integers(20, 900))
        output = int(rng.integers(0, 300))
        if i == 1:
            prompt = 2040  # prompt + output > max_model_len: the engine refuses it
        out.append(TraceRequest(t, prompt, output, tenants[i % 3], None, max(output, 1) + 50))
    return out


# --------------------------------------------------------------------------- the harness


def harness(
    config: PolicyConfig,
    workload: list[TraceRequest],
    replicas: int,
    profile: EngineProfile,
    *,
    router: str,
    oracle: bool,
    timeout: float | None,
) -> list[LogEntry]:
    """A deliberately naive driver: every iteration scans all event sources for the earliest
    ``(time, class, index)`` (class 0 step end, 1 deadline, 2 client timeout, 3 arrival) and
    handles that one event.  It shares no code with :mod:`velvetrope.sim.loop`."""
    clock = ManualClock()
    log: list[LogEntry] = []

    def observe(o: Outcome) -> None:
        log.append((o.at, "end", o.job.id, f"{o.state.value}:{o.reason.code}"))

    ctl = AdmissionController(config, clock, observers=[observe])
    batchers = [Batcher(profile, token_events=False) for _ in range(replicas)]
    step_end: list[float | None] = [None] * replicas
    pending: list[list[Any]] = [[] for _ in range(replicas)]
    outstanding = [0] * replicas
    where: dict[str, int] = {}
    jobs: list[Job] = []
    rr = 0
    i = 0
    next_timeout = 0

    def size(r: TraceRequest) -> int:
        return max(1, r.output_tokens)

    def send(job: Job, now: float) -> bool:
        nonlocal rr
        r = workload[int(job.id)]
        if r.prompt_tokens + size(r) > profile.max_model_len:
            ctl.fail(job.id)
            return True
        if router == "round_robin":
            k = rr
            rr = (rr + 1) % replicas
        else:
            k = min(range(replicas), key=lambda j: (outstanding[j], j))
        batchers[k].add(job.id, r.prompt_tokens, size(r), now)
        outstanding[k] += 1
        where[job.id] = k
        log.append((now, "dispatch", job.id, str(k)))
        if step_end[k] is None:
            step_end[k] = now
            pending[k] = []
        return False

    def dispatch(now: float) -> None:
        again = True
        while again:
            again = False
            for job in ctl.dispatchable():
                again = send(job, now) or again

    while True:
        options: list[tuple[float, int, int]] = []
        for k in range(replicas):
            end = step_end[k]
            if end is not None:
                options.append((end, 0, k))
        d = ctl.next_deadline()
        if d is not None:
            options.append((d, 1, 0))
        if timeout is not None and next_timeout < i:
            options.append((workload[next_timeout].t + timeout, 2, next_timeout))
        if i < len(workload):
            options.append((workload[i].t, 3, i))
        if not options:
            break
        t, kind, idx = min(options)
        clock.set(max(t, clock.now()))
        if kind == 0:
            k = idx
            for e in pending[k]:
                if ctl.job(e.seq_id) is None:
                    continue
                if isinstance(e, FirstToken):
                    ctl.first_token(e.seq_id)
                elif isinstance(e, Finished):
                    ctl.complete(e.seq_id, Usage(e.prompt_tokens, e.output_tokens))
                    outstanding[k] -= 1
                    dispatch(t)  # as the gateway: each end, then what it lets go
            if batchers[k].has_work:
                res = batchers[k].step(t)
                step_end[k] = res.end
                pending[k] = list(res.events)
            else:
                step_end[k] = None
                pending[k] = []
        elif kind == 1:
            ctl.tick()
            dispatch(t)
        elif kind == 2:
            job = jobs[idx]
            next_timeout += 1
            if job.state is JobState.QUEUED:
                ctl.cancel(job.id)
            elif job.state is JobState.DISPATCHED:
                k = where[job.id]
                snap = batchers[k].seq_state(job.id)
                # None: it finished inside the step in progress, whose events the client
                # has not seen yet; like the simulator, count nothing generated
                batchers[k].abort(job.id)
                outstanding[k] -= 1
                gen = snap.generated_tokens if snap is not None else 0
                ctl.cancel(job.id, Usage(job.prompt_tokens, gen))
            dispatch(t)
        else:
            r = workload[idx]
            i += 1
            cap = r.max_tokens if r.max_tokens is not None else 1024
            job = Job(
                str(idx),
                r.tenant,
                ctl.resolve_tier(r.tenant),
                r.prompt_tokens,
                cap,
                predicted_output=min(size(r), cap) if oracle else None,
            )
            jobs.append(job)
            decision = arrive(ctl, job)
            if isinstance(decision, Dispatched):
                detail = "admitted"
            elif isinstance(decision, Queued):
                detail = "queued"
            else:
                detail = f"rejected:{decision.reason.code}"
            log.append((t, "arrive", job.id, detail))
            if isinstance(decision, Dispatched):
                if send(job, t):
                    dispatch(t)
            elif isinstance(decision, Queued):
                dispatch(t)
    return log


@pytest.mark.parametrize(
    ("router", "lengths", "timeout"),
    [("least_loaded", "oracle", 4.0), ("round_robin", "estimator", None)],
)
def test_simulator_and_harness_make_the_same_decisions(
    router: str, lengths: str, timeout: float | None
) -> None:
    work = stress_workload()
    res = run_simulation(
        STRESS_POLICY,
        work,
        2,
        SMALL,
        router=router,
        lengths=lengths,
        client_timeout_s=timeout,
        record_decisions=True,
    )
    expected = harness(
        STRESS_POLICY,
        work,
        2,
        SMALL,
        router=router,
        oracle=lengths == "oracle",
        timeout=timeout,
    )
    assert res.decisions is not None
    assert list(res.decisions) == expected
    # the scenario really exercises the policy: queueing, shedding, limits, engine refusal
    details = {d[3] for d in expected}
    assert {"queued", "admitted", "completed:completed", "failed:upstream_error"} <= details
    assert any(d.startswith("rejected:") for d in details)
    if timeout is not None:
        assert "cancelled:cancelled" in details
    assert sum(p.preemptions for p in res.pools) > 0


# --------------------------------------------------------------------------- properties


def test_every_request_ends_exactly_once_and_capacity_returns_to_zero() -> None:
    work = stress_workload(n=300, seed=5)
    res = run_simulation(STRESS_POLICY, work, 2, SMALL, client_timeout_s=3.0, record_decisions=True)
    assert res.decisions is not None
    ends = [d[2] for d in res.decisions if d[1] == "end"]
    assert sorted(ends, key=int) == [str(i) for i in range(len(work))]
    rec = res.records
    assert set(rec.state.tolist()) <= {"completed", "rejected", "expired", "cancelled", "failed"}
    done = rec.completed
    assert np.all(rec.first_token[done] >= rec.dispatched[done])
    assert np.all(rec.end[done] >= rec.first_token[done])
    assert np.all(rec.dispatched[done] >= rec.arrival[done])
    # nobody waited in the queue past the client's patience
    waited = rec.queue_wait()
    assert np.nanmax(waited) <= 3.0 + 1e-9


def test_same_inputs_give_identical_records() -> None:
    work = stress_workload(n=200, seed=9)
    a = run_simulation(STRESS_POLICY, work, 2, SMALL, lengths="noisy:0.5", seed=4)
    b = run_simulation(STRESS_POLICY, work, 2, SMALL, lengths="noisy:0.5", seed=4)
    c = run_simulation(STRESS_POLICY, work, 2, SMALL, lengths="noisy:0.5", seed=5)
    for field in ("arrival", "dispatched", "first_token", "end", "predicted"):
        np.testing.assert_array_equal(getattr(a.records, field), getattr(b.records, field))
    assert not np.array_equal(a.records.predicted, c.records.predicted)


def test_unloaded_request_latency_matches_the_engine_model() -> None:
    prof = load_profile("llama3-8b-h100")
    work = [TraceRequest(1.0, 500, 10, max_tokens=16)]
    res = run_simulation(PolicyConfig(), work, 1, prof)
    rec = res.records
    prefill = prof.step_time(500, 0, 500)
    assert rec.first_token[0] == pytest.approx(1.0 + prefill)
    decode = sum(prof.step_time(0, 1, 500 + j) for j in range(1, 10))
    assert rec.end[0] == pytest.approx(1.0 + prefill + decode)
    assert res.span_s == pytest.approx(rec.end[0])
    assert res.pools[0].busy_fraction == pytest.approx((prefill + decode) / rec.end[0])
    assert res.pools[0].steps == 10


def test_max_in_flight_gates_dispatch() -> None:
    cfg = PolicyConfig.model_validate({"pools": [{"name": "default", "max_in_flight": 1}]})
    work = [TraceRequest(0.0, 100, 20, max_tokens=20) for _ in range(3)]
    res = run_simulation(cfg, work, 2, load_profile("llama3-8b-h100"))
    rec = res.records
    # strictly one after the other, although two replicas were idle
    assert rec.dispatched[1] == rec.end[0]
    assert rec.dispatched[2] == rec.end[1]


def test_round_robin_and_least_loaded_spread_work() -> None:
    cfg = PolicyConfig.model_validate({"pools": [{"name": "default", "max_in_flight": 64}]})
    work = [TraceRequest(0.1 * i, 50, 400 if i == 0 else 5, max_tokens=400) for i in range(9)]
    prof = load_profile("llama3-8b-h100")
    rr = run_simulation(cfg, work, 3, prof, router="round_robin", record_decisions=True)
    ll = run_simulation(cfg, work, 3, prof, router="least_loaded", record_decisions=True)
    assert rr.decisions is not None and ll.decisions is not None
    rr_reps = [d[3] for d in rr.decisions if d[1] == "dispatch"]
    ll_reps = [d[3] for d in ll.decisions if d[1] == "dispatch"]
    assert rr_reps == ["0", "1", "2"] * 3
    # the long request holds replica 0; each short one finishes before the next arrives, so
    # the least-loaded router sends all of them to the lowest-numbered idle replica
    assert ll_reps == ["0"] + ["1"] * 8


def test_load_rescales_to_a_multiple_of_capacity() -> None:
    prof = load_profile("llama3-8b-h100")
    times = Poisson(2.0).times(1, count=300)
    work = [TraceRequest(t, 200, 50, max_tokens=64) for t in times.tolist()]
    cap = fleet_capacity(prof, work, 2)
    res = run_simulation(PolicyConfig(), work, 2, prof, load=0.5)
    arrivals = [TraceRequest(float(t), 1, 1) for t in res.records.arrival]
    assert trace_stats(arrivals).mean_rps == pytest.approx(0.5 * cap.rps, rel=1e-9)
    assert res.info.capacity == cap


def test_tiers_come_from_the_config_or_the_row() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "tiers": [{"name": "hi"}, {"name": "lo"}],
            "tenants": [{"name": "listed", "tier": "lo"}],
        }
    )
    work = [
        TraceRequest(0.0, 10, 2, "listed", "hi", 8),  # a listed tenant cannot pick its tier
        TraceRequest(0.1, 10, 2, "unlisted", "hi", 8),  # a trace tenant keeps its row's tier
        TraceRequest(0.2, 10, 2, "other", None, 8),  # unlisted, no tier: the lowest
    ]
    res = run_simulation(cfg, work, 1, load_profile("llama3-8b-h100"))
    assert res.records.tier.tolist() == ["lo", "hi", "lo"]


def test_routes_send_jobs_to_separate_pools() -> None:
    cfg = PolicyConfig.model_validate(
        {
            "pools": [{"name": "short", "max_in_flight": 4}, {"name": "long", "max_in_flight": 4}],
            "routes": [{"pool": "long", "min_predicted_output": 101}],
        }
    )
    work = [TraceRequest(0.1 * i, 50, 10 if i % 2 else 300, max_tokens=300) for i in range(6)]
    res = run_simulation(
        cfg,
        work,
        {"short": 1, "long": 2},
        load_profile("llama3-8b-h100"),
        lengths="oracle",
        record_decisions=True,
    )
    assert res.records.pool is not None
    assert res.records.pool.tolist() == ["long", "short"] * 3
    assert res.decisions is not None
    reps = {d[2]: d[3] for d in res.decisions if d[1] == "dispatch"}
    assert {reps[str(i)] for i in (1, 3, 5)} == {"0"}
    assert {reps[str(i)] for i in (0, 2, 4)} <= {"1", "2"}
    assert [p.replicas for p in res.pools] == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": {"nope": 1}}, "name every pool"),
        ({"router": "random"}, "unknown router"),
        ({"lengths": "psychic"}, "length knowledge"),
        ({"client_timeout_s": -1.0}, "client_timeout_s"),
        ({"load": 0.0}, "load"),
    ],
)
def test_bad_parameters_raise_policy_error(kwargs: dict[str, Any], match: str) -> None:
    work = [TraceRequest(0.0, 10, 2), TraceRequest(1.0, 10, 2)]
    args: dict[str, Any] = {"replicas": 1, **kwargs}
    replicas = args.pop("replicas")
    with pytest.raises(PolicyError, match=match):
        run_simulation(PolicyConfig(), work, replicas, load_profile("llama3-8b-h100"), **args)


def test_unsorted_workload_is_rejected() -> None:
    work = [TraceRequest(1.0, 10, 2), TraceRequest(0.5, 10, 2)]
    with pytest.raises(PolicyError, match="sorted"):
        run_simulation(PolicyConfig(), work, 1, load_profile("llama3-8b-h100"))


def test_zero_output_rows_generate_one_token() -> None:
    res = run_simulation(PolicyConfig(), [TraceRequest(0.0, 10, 0)], 1, SMALL)
    assert res.records.output.tolist() == [1]
    assert res.records.state.tolist() == ["completed"]
    assert math.isnan(res.records.tpot()[0])
