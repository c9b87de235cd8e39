"""Capacity measurement (closed loop on the batcher) and the fleet's router."""

from __future__ import annotations

import pytest

from velvetrope.engine import load_profile
from velvetrope.errors import PolicyError
from velvetrope.sim.capacity import fleet_capacity, replica_capacity
from velvetrope.sim.fleet import Fleet, pool_replicas
from velvetrope.sim.trace_request import TraceRequest

# Every iteration takes exactly 10 ms whatever the batch: a request of k output tokens
# occupies its slot for k iterations, so c slots complete c/k requests per 10 ms.
FLAT = load_profile("llama3-8b-h100").with_overrides(
    step_base_s=0.01,
    per_prefill_token_s=0.0,
    per_decode_seq_s=0.0,
    per_context_token_s=0.0,
)


def test_closed_loop_throughput_matches_hand_computation() -> None:
    work = [TraceRequest(0.0, 20, 10)]
    rate = replica_capacity(FLAT, work, concurrency=4, completions=400)
    assert rate == pytest.approx(4 / (10 * 0.01), rel=1e-9)


def test_capacity_is_the_rate_of_the_mix_not_of_the_batch() -> None:
    # half the requests take 1 iteration, half 19: mean 10 iterations per request
    work = [TraceRequest(0.0, 20, 1), TraceRequest(0.0, 20, 19)]
    rate = replica_capacity(FLAT, work, concurrency=8, completions=20_000, seed=1)
    assert rate == pytest.approx(8 / (10 * 0.01), rel=0.03)


def test_fleet_capacity_scales_with_replicas_and_skips_oversize_rows() -> None:
    work = [TraceRequest(0.0, 20, 10), TraceRequest(0.0, 9000, 10)]
    one = replica_capacity(FLAT, [work[0]], concurrency=4, completions=100)
    cap = fleet_capacity(FLAT.with_overrides(max_num_seqs=4), work, 3)
    assert cap.rps == pytest.approx(3 * one)
    with pytest.raises(PolicyError, match="max_model_len"):
        replica_capacity(FLAT, [work[1]])


def test_round_robin_cycles_within_each_pool() -> None:
    fleet = Fleet(FLAT, pool_replicas(["a", "b"], {"a": 2, "b": 3}), "round_robin")
    assert [fleet.route(1) for _ in range(4)] == [2, 3, 4, 2]
    assert [fleet.route(0) for _ in range(3)] == [0, 1, 0]


def test_least_loaded_picks_fewest_outstanding_lowest_index() -> None:
    fleet = Fleet(FLAT, pool_replicas(["p"], 3), "least_loaded")
    fleet.load[:] = [2, 1, 1]
    assert fleet.route(0) == 1
    fleet.load[1] = 5
    assert fleet.route(0) == 2


def test_busy_accounting() -> None:
    fleet = Fleet(FLAT, pool_replicas(["p"], 2))
    fleet.start_busy(0, 1.0)
    fleet.stop_busy(0, 3.0)
    fleet.start_busy(1, 9.0)  # still busy at the end of the run
    (stats,) = fleet.stats(10.0)
    assert stats.busy_fraction == pytest.approx((0.2 + 0.1) / 2)


def test_pool_replicas_validates() -> None:
    assert pool_replicas(["a"], 2) == {"a": 2}
    for bad in (0, {"a": 1, "b": 1}, {"b": 1}):
        with pytest.raises(PolicyError):
            pool_replicas(["a"], bad)
    with pytest.raises(PolicyError, match="router"):
        Fleet(FLAT, {"a": 1}, "random")
