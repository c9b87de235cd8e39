"""Closed-loop runs on the engine model, the knee sweep, and the adaptive limit against it:
it converges to within 10% of the knee a sweep finds, for two engine profiles; it
re-converges after the pool doubles or halves; it never exceeds its ceiling.

Everything runs in virtual time (ManualClock), so each case takes seconds."""

from __future__ import annotations

import math

import pytest

from velvetrope.core import PolicyConfig
from velvetrope.engine import EngineProfile, load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.closed_loop import KneeSweep, find_knee, knee_sweep, run_closed_loop
from velvetrope.sim.traces import load_trace

RUN_S = 900.0
SETTLED = 300.0  # the mean limit is taken over (SETTLED, end]

CASES = {
    # prefill-bound: the knee is the per-step token budget
    "h100-code": ("llama3-8b-h100", "azure_code", range(48, 177, 16)),
    # KV-bound: the knee is the KV cache
    "a100-conv": ("llama3-8b-a100", "azure_conv", range(224, 449, 32)),
}


def pairs_of(trace: str, profile: EngineProfile) -> list[tuple[int, int]]:
    out = []
    for r in load_trace(trace):
        o = max(1, r.output_tokens)
        if r.prompt_tokens + o <= profile.max_model_len:
            out.append((r.prompt_tokens, o))
    return out


def policy(**pool: object) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {"preset": "fifo", "queue": {"max_queued": 1 << 40}, "pools": [{"name": "p", **pool}]}
    )


@pytest.fixture(scope="module")
def sweeps() -> dict[str, tuple[EngineProfile, list[tuple[int, int]], KneeSweep]]:
    out = {}
    for name, (prof_name, trace, grid) in CASES.items():
        prof = load_profile(prof_name)
        pairs = pairs_of(trace, prof)
        out[name] = (prof, pairs, knee_sweep(prof, pairs, list(grid), duration_s=300.0))
    return out


def test_find_knee_interpolates_the_crossing() -> None:
    # q = 2 until 100, then every extra job waits: slopes 0, 0, 1 at midpoints 70, 90, 110
    cs = [60.0, 80.0, 100.0, 120.0]
    qs = [2.0, 2.0, 2.0, 22.0]
    assert find_knee(cs, qs, 0.5) == pytest.approx(100.0)
    assert find_knee(cs, qs, 0.25) == pytest.approx(95.0)
    assert find_knee(list(reversed(cs)), list(reversed(qs)), 0.5) == pytest.approx(100.0)
    assert math.isnan(find_knee(cs, [2.0] * 4, 0.5))
    assert find_knee([10.0, 20.0], [0.0, 10.0], 0.5) == 15.0  # the first step already crosses


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_sweep_finds_a_knee_where_throughput_stops_rising(
    case: str, sweeps: dict[str, tuple[EngineProfile, list[tuple[int, int]], KneeSweep]]
) -> None:
    _, _, sw = sweeps[case]
    assert sw.limits[0] < sw.knee < sw.limits[-1]
    assert sw.throughput_at(sw.knee) >= 0.99 * sw.best
    # past the knee the engines queue: the waiting count climbs steeply
    assert sw.awaiting[-1] - sw.awaiting[-2] > 0.5 * (sw.in_flight[-1] - sw.in_flight[-2])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_adaptive_limit_converges_to_the_knee(
    case: str, sweeps: dict[str, tuple[EngineProfile, list[tuple[int, int]], KneeSweep]]
) -> None:
    prof, pairs, sw = sweeps[case]
    clients = int(2 * sw.knee)
    res = run_closed_loop(
        policy(limit="adaptive"), prof, pairs, replicas=1, clients=clients, duration_s=RUN_S
    )
    assert res.mean("limit", SETTLED, RUN_S) == pytest.approx(sw.knee, rel=0.10)
    assert res.limit[0] < 0.5 * sw.knee  # it started far below and found it
    best = int(sw.limits[max(range(len(sw.limits)), key=lambda i: sw.throughput[i])])
    fixed = run_closed_loop(
        policy(max_in_flight=best), prof, pairs, replicas=1, clients=clients, duration_s=RUN_S
    )
    assert res.throughput(SETTLED, RUN_S) >= 0.98 * fixed.throughput(SETTLED, RUN_S)


def test_the_adaptive_limit_follows_the_pool_when_it_doubles_and_halves(
    sweeps: dict[str, tuple[EngineProfile, list[tuple[int, int]], KneeSweep]],
) -> None:
    prof, pairs, sw = sweeps["h100-code"]
    res = run_closed_loop(
        policy(limit="adaptive"),
        prof,
        pairs,
        replicas=1,
        clients=int(5 * sw.knee),
        duration_s=1500.0,
        changes=[(500.0, 2), (1000.0, 1)],
    )
    # the limit is told nothing: it finds 2 engines' knee, then 1 engine's again
    assert res.mean("limit", 200.0, 500.0) == pytest.approx(sw.knee, rel=0.10)
    assert res.mean("limit", 700.0, 1000.0) == pytest.approx(2 * sw.knee, rel=0.10)
    assert res.mean("limit", 1200.0, 1500.0) == pytest.approx(sw.knee, rel=0.10)


def test_told_of_a_fleet_change_it_jumps_there() -> None:
    prof = load_profile("llama3-8b-h100")
    pairs = pairs_of("azure_code", prof)
    res = run_closed_loop(
        policy(adaptive={"initial": 100, "window_s": 60}),  # no window closes: only the jump
        prof,
        pairs,
        replicas=1,
        clients=400,
        duration_s=40.0,
        changes=[(20.0, 2)],
        rescale=True,
    )
    before = res.base[res.times < 20.0]
    after = res.base[res.times >= 20.0]
    assert after[0] == pytest.approx(2 * before[-1])


def test_the_adaptive_limit_never_exceeds_its_ceiling(
    sweeps: dict[str, tuple[EngineProfile, list[tuple[int, int]], KneeSweep]],
) -> None:
    prof, pairs, sw = sweeps["h100-code"]
    ceiling = int(0.6 * sw.knee)
    res = run_closed_loop(
        policy(adaptive={"ceiling": ceiling}),
        prof,
        pairs,
        replicas=1,
        clients=int(2 * sw.knee),
        duration_s=600.0,
    )
    assert res.limit.max() == ceiling
    assert res.in_flight.max() <= ceiling
    assert res.mean("limit", SETTLED, 600.0) > 0.95 * ceiling  # pressed against it


def test_closed_loop_checks_its_inputs() -> None:
    prof = load_profile("llama3-8b-h100")
    two = PolicyConfig.model_validate({"pools": [{"name": "a"}, {"name": "b"}]})
    with pytest.raises(PolicyError, match="one pool"):
        run_closed_loop(two, prof, [(10, 10)], replicas=1, clients=1, duration_s=1.0)
    with pytest.raises(PolicyError, match="does not fit"):
        run_closed_loop(policy(), prof, [(8000, 800)], replicas=1, clients=1, duration_s=1.0)
    with pytest.raises(PolicyError, match="bad change"):
        run_closed_loop(
            policy(), prof, [(10, 10)], replicas=1, clients=1, duration_s=1.0, changes=[(1, 0)]
        )
    res = run_closed_loop(
        policy(max_in_flight=4), prof, [(100, 20)], replicas=1, clients=8, duration_s=10.0
    )
    assert (res.limit == 4).all()
    assert math.isnan(res.base[0])
    assert res.throughput(2.0, 10.0) > 0
    with pytest.raises(PolicyError):
        res.mean("limit", 20.0, 30.0)
