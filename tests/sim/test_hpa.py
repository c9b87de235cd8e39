"""The HPA model against replica counts computed by hand from the documented examples.

Every expected sequence below is worked out from the Kubernetes docs (*Horizontal Pod
Autoscaling*: "Algorithm details", "Scaling policies", "Stabilization window", "Default
Behavior", "Example: limit scale down rate") or, where the docs leave it to the code, from
the controller's rules as :mod:`velvetrope.sim.hpa` states them.
"""

from __future__ import annotations

import pytest

from velvetrope.errors import PolicyError
from velvetrope.sim.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    Behavior,
    Hpa,
    HpaSpec,
    ScalingPolicy,
    ScalingRules,
    milli,
)


def _run(hpa: Hpa, start: int, metric_for: object, until: float, period: float = 15.0) -> list[int]:
    """Sync every ``period`` seconds from 0 to ``until`` (inclusive); ``metric_for(t)`` is the
    external metric; returns the replica count after each sync."""
    assert callable(metric_for)
    counts = []
    current = start
    t = 0.0
    while t <= until:
        current = hpa.sync(t, current, metric_for(t)).desired
        counts.append(current)
        t += period
    return counts


def _changes(counts: list[int], start: int) -> list[int]:
    out = [start]
    for c in counts:
        if c != out[-1]:
            out.append(c)
    return out


class TestReplicaCalculator:
    def test_doubling_and_halving(self) -> None:
        # the docs: metric 200m against a target of 100m doubles; 50m halves.  AverageValue:
        # the external metric is the total, the target is per replica.
        hpa = Hpa(HpaSpec(1, 100, target=0.1))
        assert hpa.proposal(metric=4 * 0.2, replicas=4) == 8
        assert hpa.proposal(metric=4 * 0.05, replicas=4) == 2

    def test_tolerance_of_ten_percent(self) -> None:
        hpa = Hpa(HpaSpec(1, 100, target=1.0))
        assert hpa.proposal(10.9, 10) == 10  # ratio 1.09: within 0.1, no change
        assert hpa.proposal(9.1, 10) == 10
        assert hpa.proposal(11.1, 10) == 12  # ratio 1.11: ceil(11.1 / 1)
        assert hpa.proposal(8.9, 10) == 9
        strict = Hpa(HpaSpec(1, 100, target=1.0, tolerance=0.0))
        assert strict.proposal(10.9, 10) == 11

    def test_queue_depth_per_replica(self) -> None:
        # KEDA's AverageValue on the gateway's queue: desired = ceil(depth / threshold)
        hpa = Hpa(HpaSpec(2, 16, target=8))
        assert hpa.proposal(0, 2) == 0
        assert hpa.proposal(17, 2) == 2  # 17 / 16 = 1.06: within the tolerance
        assert hpa.proposal(18, 2) == 3
        assert hpa.proposal(100, 2) == 13

    def test_milli_quantities_make_ceil_exact(self) -> None:
        assert milli(0.1) == 100
        assert milli(24.0000001) == 24000
        hpa = Hpa(HpaSpec(1, 100, target=0.3, tolerance=0.0))
        # 0.9 / 0.3 is 3.0000000000000004 in floats; in milli-units it is exactly 3
        assert hpa.proposal(0.9, 1) == 3

    def test_value_metric_scales_ready_pods(self) -> None:
        hpa = Hpa(HpaSpec(1, 100, target=100, metric_type="Value"))
        # 4 replicas, 2 of them still starting: ratio 3 applies to the 2 ready ones
        assert hpa.proposal(300, replicas=4, ready=2) == 6
        assert hpa.proposal(105, replicas=4, ready=2) == 4  # within the tolerance
        average = Hpa(HpaSpec(1, 100, target=100))
        assert average.proposal(300, replicas=4, ready=2) == 3  # total / per replica


class TestBehavior:
    def test_default_scale_up_is_4_pods_or_100_percent_per_15s(self) -> None:
        # "4 pods or a 100% of the currently running replicas will be added every 15 seconds"
        hpa = Hpa(HpaSpec(1, 100, target=1.0))
        counts = _run(hpa, 1, lambda t: 50.0, until=75)
        assert counts == [5, 10, 20, 40, 50, 50]

    def test_doc_example_scale_down_pods_and_percent(self) -> None:
        # "if there are 80 replicas and the target has to be scaled down to 10 replicas then
        # during the first step 8 replicas will be reduced. In the next iteration when the
        # number of replicas is 72, 10% of the pods is 7.2 but the number is rounded up to 8
        # ... When the number of replicas falls below 40 the first policy (Pods) is applied
        # and 4 replicas will be reduced at a time."  Each policy holds over 60 s.
        rules = ScalingRules(300, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)))
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=Behavior(scale_down=rules)))
        counts = _run(hpa, 80, lambda t: 10.0, until=900)
        assert _changes(counts, 80) == [
            80, 72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10
        ]  # fmt: skip
        # one step per 60 s period: 80 -> 72 at 0 s, 72 -> 64 at 60 s, ...
        assert counts[:5] == [72, 72, 72, 72, 64]

    def test_select_min_limits_to_the_smaller_change(self) -> None:
        # "no more than 5 Pods are removed per minute": Percent 10 and Pods 5, selectPolicy Min
        rules = ScalingRules(
            0, (ScalingPolicy("Percent", 10, 60), ScalingPolicy("Pods", 5, 60)), "Min"
        )
        b = Behavior(scale_down=rules)
        hpa = Hpa(HpaSpec(1, 200, target=1.0, behavior=b))
        assert hpa.sync(0, 100, 10.0).desired == 95  # 10 % would remove 10
        hpa = Hpa(HpaSpec(1, 200, target=1.0, behavior=b))
        assert hpa.sync(0, 40, 10.0).desired == 36  # 10 % = 4 < 5

    def test_disabled_direction(self) -> None:
        off = ScalingRules(0, (), "Disabled")
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=Behavior(scale_down=off)))
        assert hpa.sync(0, 10, 1.0).desired == 10
        assert hpa.sync(15, 10, 30.0).desired == 20
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=Behavior(scale_up=off)))
        assert hpa.sync(0, 10, 30.0).desired == 10

    def test_scale_down_stabilisation_keeps_the_highest_recent_proposal(self) -> None:
        # "uses the highest value from the specified interval": 300 s by default
        hpa = Hpa(HpaSpec(1, 100, target=1.0))
        counts = _run(hpa, 10, lambda t: 10.0 if t == 0 else 2.0, until=330)
        assert counts[:20] == [10] * 20  # t = 0 .. 285: the proposal of 10 at t=0 holds
        assert counts[20] == 2  # t = 300: the t=0 proposal is exactly 300 s old, out

    def test_scale_up_stabilisation_takes_the_lowest_recent_proposal(self) -> None:
        up = ScalingRules(60, DEFAULT_SCALE_UP.policies)
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=Behavior(scale_up=up)))
        counts = _run(hpa, 2, lambda t: 2.0 if t == 0 else 6.0, until=75)
        # proposals: 2 at t=0, then 6; the window's minimum is 2 until t=60
        assert counts == [2, 2, 2, 2, 6, 6]

    def test_period_start_adds_back_what_was_removed(self) -> None:
        # scale-down 10 -> 6 at t=0 (Pods 4/60 s); at t=15 the metric asks for 20 and the
        # scale-up policy is Pods 2/60 s: the period started at 6 + 4 = 10, so 12
        b = Behavior(
            scale_up=ScalingRules(0, (ScalingPolicy("Pods", 2, 60),)),
            scale_down=ScalingRules(0, (ScalingPolicy("Pods", 4, 60),)),
        )
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=b))
        assert hpa.sync(0, 10, 1.0).desired == 6
        d = hpa.sync(15, 6, 20.0)
        assert (d.proposal, d.desired, d.reason) == (20, 12, "ScaleUpLimit")

    def test_legacy_path_without_behavior(self) -> None:
        # no behaviour field: scale up by at most max(2 x current, 4); a proposal exactly
        # 300 s old still counts for the downscale stabilisation
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=None))
        assert _changes(_run(hpa, 1, lambda t: 50.0, until=75), 1) == [1, 4, 8, 16, 32, 50]
        hpa = Hpa(HpaSpec(1, 100, target=1.0, behavior=None))
        counts = _run(hpa, 10, lambda t: 10.0 if t == 0 else 2.0, until=330)
        assert counts[20] == 10  # t = 300: still counted
        assert counts[21] == 2


class TestGuards:
    def test_bounds_and_disabled_at_zero(self) -> None:
        hpa = Hpa(HpaSpec(2, 8, target=1.0))
        assert hpa.sync(0, 12, 0.0).reason == "AboveMax"
        assert hpa.sync(0, 12, 0.0).desired == 8
        assert hpa.sync(0, 1, 100.0).desired == 2
        d = hpa.sync(0, 0, 100.0)
        assert (d.desired, d.reason) == (0, "ScalingDisabled")
        assert hpa.sync(0, 4, None).desired == 4

    def test_max_and_min_clamp_a_proposal(self) -> None:
        hpa = Hpa(HpaSpec(2, 8, target=1.0))
        d = hpa.sync(0, 4, 100.0)
        assert (d.proposal, d.desired, d.reason) == (100, 8, "TooManyReplicas")
        hpa = Hpa(HpaSpec(2, 8, target=1.0))
        d = hpa.sync(0, 4, 0.0)
        assert (d.proposal, d.desired, d.reason) == (0, 2, "TooFewReplicas")

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"min_replicas": 0, "max_replicas": 2, "target": 1.0},
            {"min_replicas": 3, "max_replicas": 2, "target": 1.0},
            {"min_replicas": 1, "max_replicas": 2, "target": 0.0},
            {"min_replicas": 1, "max_replicas": 2, "target": 1.0, "metric_type": "Utilization"},
        ],
    )
    def test_bad_specs(self, kwargs: dict[str, object]) -> None:
        with pytest.raises(PolicyError):
            HpaSpec(**kwargs)  # type: ignore[arg-type]


class TestFromSpec:
    def test_defaults_fill_what_is_left_out(self) -> None:
        b = Behavior.from_spec({"scaleDown": {"stabilizationWindowSeconds": 600}})
        assert b.scale_up == DEFAULT_SCALE_UP
        assert b.scale_down.stabilization_window_s == 600
        assert b.scale_down.policies == DEFAULT_SCALE_DOWN.policies
        b = Behavior.from_spec(
            {"scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]}}
        )
        assert b.scale_up.policies == (ScalingPolicy("Pods", 2, 60),)
        assert b.scale_up.stabilization_window_s == 0

    @pytest.mark.parametrize(
        "spec",
        [
            {"scaleSideways": {}},
            {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 60}]}},
            {"scaleUp": {"policies": [{"type": "Pod", "value": 1, "periodSeconds": 60}]}},
            {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 4000}]}},
            {"scaleDown": {"stabilizationWindowSeconds": 4000}},
            {"scaleDown": {"selectPolicy": "Maybe"}},
            {"scaleDown": {"tolerance": 0.05}},
        ],
    )
    def test_bad_behaviour_is_refused(self, spec: dict[str, object]) -> None:
        with pytest.raises(PolicyError):
            Behavior.from_spec(spec)
