"""The dynamic fleet in the event loop: scripted and KEDA-driven scale-ups and scale-downs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.test_loop import SMALL
from velvetrope.core import PolicyConfig
from velvetrope.sim.autoscale import AutoscaleSpec, ScriptedScaler
from velvetrope.sim.keda import ScaledObject
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.replicas import StartupDelay
from velvetrope.sim.trace_request import TraceRequest

POLICY = PolicyConfig.model_validate(
    {
        "preset": "fifo",
        "pools": [{"name": "default", "max_in_flight": 8}],  # 4 per replica at 2 replicas
    }
)


def steady(n: int, gap: float, prompt: int = 200, output: int = 60) -> list[TraceRequest]:
    return [TraceRequest(i * gap, prompt, output) for i in range(n)]


def _scripted(steps: list[tuple[float, int]], startup: float = 1.5) -> AutoscaleSpec:
    return AutoscaleSpec(
        ScaledObject(threshold=1.0, min_replicas=2, max_replicas=4),
        startup=StartupDelay("fixed", startup),
        scaler=ScriptedScaler(steps),
    )


def test_scripted_scale_up_and_down_exact_event_log() -> None:
    spec = _scripted([(2.0, 3), (6.0, 1)])
    res = run_simulation(POLICY, steady(60, 0.15), 2, SMALL, autoscale=spec, record_decisions=True)
    log = res.decisions
    assert log is not None
    fleet_log = [e for e in log if e[1] in ("scale", "ready", "drain", "gone")]
    ends = {e[2]: e[0] for e in log if e[1] == "end"}
    sent: dict[str, list[tuple[float, str]]] = {}
    for t, kind, job, detail in log:
        if kind == "dispatch":
            sent.setdefault(detail, []).append((t, job))
    # replica 2 is asked for at 2.0 and serves from 3.5; at 6.0 the pool goes to 1: the two
    # most recently ready replicas (2, then 1: the newer of two ready at 0) drain; 2 is idle
    # and leaves at once, 1 when its last job ends
    gone_1 = max(ends[j] for _, j in sent["1"])
    assert max(ends[j] for _, j in sent["2"]) < 6.0 < gone_1
    assert fleet_log == [
        (2.0, "scale", "", "2->3"),
        (3.5, "ready", "", "2"),
        (6.0, "scale", "", "3->1"),
        (6.0, "drain", "", "2"),
        (6.0, "drain", "", "1"),
        (6.0, "gone", "", "2"),
        (gone_1, "gone", "", "1"),
    ]
    gone_2 = 6.0
    assert min(t for t, _ in sent["2"]) >= 3.5  # nothing before its start-up ended
    assert max(t for t, _ in sent["2"]) <= 6.0 and max(t for t, _ in sent["1"]) <= 6.0
    assert all(t > 6.0 for t, _ in sent["0"][-5:])  # the survivor takes the rest
    tr = res.autoscale
    assert tr is not None
    assert tr.samples[:4] == ((0.0, 2, 2), (2.0, 3, 2), (3.5, 3, 3), (6.0, 1, 1))
    assert [(e.at, e.before, e.after) for e in tr.events] == [(2.0, 2, 3), (6.0, 3, 1)]
    # GPU time: replica 0 throughout, 1 until it left, 2 from its ask (2.0) until it left
    assert tr.gpu_seconds == pytest.approx(tr.end_s + gone_1 + (gone_2 - 2.0))
    assert res.overall().completed == 60


def test_starting_replicas_scaled_away_never_serve() -> None:
    spec = _scripted([(1.0, 4), (1.5, 2)], startup=5.0)
    res = run_simulation(POLICY, steady(40, 0.2), 2, SMALL, autoscale=spec, record_decisions=True)
    assert res.decisions is not None
    assert not any(e[1] == "ready" for e in res.decisions)
    assert {e[3] for e in res.decisions if e[1] == "dispatch"} == {"0", "1"}
    tr = res.autoscale
    assert tr is not None
    assert tr.gpu_seconds == pytest.approx(2 * tr.end_s + 2 * 0.5)  # two asked for 0.5 s


def test_capacity_follows_ready_replicas() -> None:
    # 4 slots per replica: with one replica up no more than 4 run at once, with 3 up 12
    spec = _scripted([(0.0, 1), (5.0, 3)], startup=2.0)
    burst = [TraceRequest(0.01 * i, 300, 400) for i in range(60)]
    res = run_simulation(POLICY, burst, 2, SMALL, autoscale=spec)
    rec = res.records
    t = np.linspace(0.5, 6.9, 50)
    running = [int(np.sum((rec.dispatched <= x) & (rec.end > x))) for x in t]
    assert max(running) <= 4
    later = np.linspace(7.1, 9.0, 20)
    running = [int(np.sum((rec.dispatched <= x) & (rec.end > x))) for x in later]
    assert 4 < max(running) <= 12


def test_keda_scales_on_queue_depth_and_back() -> None:
    so = ScaledObject(
        threshold=4.0, signals=("queue_depth",), window_s=30.0, min_replicas=1,
        max_replicas=6, polling_interval_s=15.0,
    )  # fmt: skip
    spec = AutoscaleSpec(so, startup=StartupDelay("fixed", 30.0), horizon_s=900.0)
    quiet = steady(20, 3.0)
    busy = [TraceRequest(60.0 + 0.05 * i, 400, 150) for i in range(2400)]
    work = sorted(quiet + busy, key=lambda r: r.t)
    res = run_simulation(POLICY, work, 2, SMALL, autoscale=spec)
    tr = res.autoscale
    assert tr is not None
    assert tr.peak_replicas > 1
    ups = [e for e in tr.events if e.after > e.before]
    assert ups and ups[0].at >= 60.0 and ups[0].source == "hpa"
    ready_times = [t for t, _, r in tr.samples if r > 1]
    assert min(ready_times) >= ups[0].at + 30.0  # start-up delay
    assert tr.samples[-1][1] == 1  # back to the minimum after the default 300 s window
    assert tr.end_s == pytest.approx(max(900.0, res.span_s))
    assert len(tr.signal_t) > 10 and tr.signal_v.max() > 4.0
    assert 1.0 < tr.gpu_seconds / tr.end_s < tr.peak_replicas


def test_scale_to_zero_and_back_with_activation() -> None:
    # minReplicaCount 0: KEDA takes the pool to zero while nothing is queued and brings one
    # replica back when the queue shows work; the core holds what arrives meanwhile
    so = ScaledObject(
        threshold=10.0, signals=("queue_depth",), min_replicas=0, max_replicas=3,
        polling_interval_s=15.0, cooldown_s=60.0,
    )  # fmt: skip
    spec = AutoscaleSpec(so, startup=StartupDelay("fixed", 10.0))
    work = [TraceRequest(1.0 + 0.5 * i, 200, 40) for i in range(10)]
    work += [TraceRequest(400.0 + 0.5 * i, 200, 40) for i in range(10)]
    res = run_simulation(POLICY, work, 2, SMALL, autoscale=spec, record_decisions=True)
    assert res.decisions is not None
    fleet_log = [(t, kind, d) for t, kind, _, d in res.decisions if kind in ("scale", "ready")]
    # zero at the first poll (never active); the scrape at 15 s sees the queue: one replica,
    # serving 10 s later; idle again, zero once the last active poll is 60 s old
    assert fleet_log[:3] == [(0.0, "scale", "1->0"), (15.0, "scale", "0->1"), (25.0, "ready", "1")]
    downs = [t for t, kind, d in fleet_log if d == "1->0"]
    assert len(downs) == 2 and 60.0 < downs[1] - 25.0 < 400.0 - 25.0
    assert [t for t, kind, d in fleet_log if d == "0->1"][1] >= 400.0
    assert res.overall().completed == 20  # every request waited for an engine, none failed
    assert float(np.nanmin(res.records.dispatched)) >= 25.0
