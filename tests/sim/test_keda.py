"""KEDA's Prometheus scaler driving the HPA: the shipped ScaledObject's numbers, Prometheus'
query forms, and exact event logs of scripted scale-ups and scale-downs (worked by hand)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from velvetrope.errors import PolicyError
from velvetrope.sim.hpa import Behavior, ScalingPolicy, ScalingRules
from velvetrope.sim.keda import (
    KedaAutoscaler,
    Prometheus,
    ScaledObject,
    ScaleEvent,
    load_scaled_object,
    signals_in_query,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "keda" / "scaledobject.yaml"


def _drive(
    auto: KedaAutoscaler, start: int, signal: Callable[[float], float], until: float
) -> list[ScaleEvent]:
    """Scrape the signal every 15 s and run the autoscaler at its own times, up to ``until``;
    every replica is Ready at once.  Scrapes at an instant come before the autoscaler."""
    current = start
    scrape = 0.0
    while True:
        nxt = min(scrape, auto.next_at())
        if nxt > until:
            return auto.events
        if scrape <= nxt:
            auto.prometheus.record(scrape, signal(scrape))
            scrape += 15.0
            continue
        current = auto.fire(nxt, current, current)


class TestTheShippedScaledObject:
    def test_numbers_are_read(self) -> None:
        so = load_scaled_object(DEPLOY)
        assert (so.min_replicas, so.max_replicas) == (2, 8)
        assert (so.polling_interval_s, so.cooldown_s) == (15.0, 300.0)
        assert so.threshold == 16.0
        assert so.activation_threshold == 0.0
        assert so.metric_type == "AverageValue"
        assert so.signals == ("queue_depth",)
        assert so.window_s == 60.0
        assert so.behavior == Behavior(
            scale_up=ScalingRules(0, (ScalingPolicy("Pods", 2, 60),)),
            scale_down=ScalingRules(600, (ScalingPolicy("Pods", 1, 300),)),
        )
        assert any("fallback" in n for n in so.notes)
        assert so.hpa_spec().min_replicas == 2

    def test_scripted_spike_exact_event_log(self) -> None:
        # queue depth 0, then 200 from t=60 to t<300, then 0 again; avg over 60 s
        so = load_scaled_object(DEPLOY)
        auto = KedaAutoscaler(so)
        events = _drive(auto, 2, lambda t: 200.0 if 60 <= t < 300 else 0.0, until=2500)
        assert events == [
            # avg(0, 0, 0, 200) = 50 -> ceil(50/16) = 4, within Pods 2 per 60 s
            ScaleEvent(60.0, "hpa", 50.0, 2, 4, "DesiredWithinRange"),
            # the 60 s period has passed: 2 more (13 wanted)
            ScaleEvent(120.0, "hpa", 200.0, 4, 6, "ScaleUpLimit"),
            ScaleEvent(180.0, "hpa", 200.0, 6, 8, "TooManyReplicas"),
            # 600 s window: the last proposal >= 8 was 10 at t=300; at t=900 the highest
            # left is 7 (t=315); one pod per 300 s from there
            ScaleEvent(900.0, "hpa", 0.0, 8, 7, "DesiredWithinRange"),
            ScaleEvent(1200.0, "hpa", 0.0, 7, 6, "ScaleDownLimit"),
            ScaleEvent(1500.0, "hpa", 0.0, 6, 5, "ScaleDownLimit"),
            ScaleEvent(1800.0, "hpa", 0.0, 5, 4, "ScaleDownLimit"),
            ScaleEvent(2100.0, "hpa", 0.0, 4, 3, "ScaleDownLimit"),
            ScaleEvent(2400.0, "hpa", 0.0, 3, 2, "TooFewReplicas"),
        ]


class TestActivation:
    def _so(self, **kw: object) -> ScaledObject:
        base: dict[str, object] = {
            "threshold": 4.0,
            "signals": ("num_requests_waiting",),
            "min_replicas": 0,
            "max_replicas": 10,
            "polling_interval_s": 30.0,
            "cooldown_s": 300.0,
            "activation_threshold": 5.0,
        }
        base.update(kw)
        return ScaledObject(**base)  # type: ignore[arg-type]

    def test_scale_from_and_to_zero_exact_event_log(self) -> None:
        auto = KedaAutoscaler(self._so())
        events = _drive(auto, 1, lambda t: 10.0 if 100 <= t < 400 else 0.0, until=800)
        assert events == [
            # first poll: inactive, never active before: straight to zero
            ScaleEvent(0.0, "keda", 0.0, 1, 0, "cooldown over: scaled to zero"),
            # poll at 120 sees 10 > 5: activation to 1, then the HPA's sync: ceil(10/4) = 3
            ScaleEvent(120.0, "keda", 10.0, 0, 1, "activated"),
            ScaleEvent(120.0, "hpa", 10.0, 1, 3, "DesiredWithinRange"),
            # no behaviour: the HPA's older path, where the last proposal of 3 (t=390) still
            # counts at exactly 300 s (t=690) and is gone at 705; the HPA's floor is 1
            ScaleEvent(705.0, "hpa", 0.0, 3, 1, "TooFewReplicas"),
            # last active poll 390; 390 + 300 < 720 (strictly): KEDA takes it to zero
            ScaleEvent(720.0, "keda", 0.0, 1, 0, "cooldown over: scaled to zero"),
        ]

    def test_activation_is_strictly_greater(self) -> None:
        auto = KedaAutoscaler(self._so())
        events = _drive(auto, 0, lambda t: 5.0, until=300)
        assert events == []
        auto = KedaAutoscaler(self._so(activation_threshold=4.9))
        assert _drive(auto, 0, lambda t: 5.0, until=0)[0].reason == "activated"

    def test_initial_cooldown_delays_the_first_scale_to_zero(self) -> None:
        auto = KedaAutoscaler(self._so(initial_cooldown_s=100.0))
        events = _drive(auto, 1, lambda t: 0.0, until=200)
        assert [(e.at, e.after) for e in events] == [(120.0, 0)]

    def test_min_replicas_one_is_always_active(self) -> None:
        auto = KedaAutoscaler(self._so(min_replicas=1))
        events = _drive(auto, 0, lambda t: 0.0, until=30)
        assert events[0] == ScaleEvent(0.0, "keda", 0.0, 0, 1, "activated")
        assert len(events) == 1

    def test_cached_metrics_are_the_last_polls(self) -> None:
        # useCachedMetrics: the HPA at t=15 sees the poll of t=0 (0), not the scrape of 15
        def signal(t: float) -> float:
            return 40.0 if t >= 15 else 0.0

        cached = KedaAutoscaler(self._so(min_replicas=1, use_cached_metrics=True))
        fresh = KedaAutoscaler(self._so(min_replicas=1))
        first_cached = next(e.at for e in _drive(cached, 1, signal, 30) if e.source == "hpa")
        first_fresh = next(e.at for e in _drive(fresh, 1, signal, 30) if e.source == "hpa")
        assert (first_cached, first_fresh) == (30.0, 15.0)


class TestPrometheus:
    def test_avg_over_time_is_left_open(self) -> None:
        p = Prometheus()
        for t, v in ((0, 100.0), (15, 1.0), (30, 2.0), (45, 3.0), (60, 4.0)):
            p.record(float(t), v)
        assert p.query(60.0, 60.0) == 2.5  # (0, 60]: the sample at 0 is out
        assert p.query(59.0, 60.0) == (100 + 1 + 2 + 3) / 4
        assert p.query(60.0, 0.0) == 4.0
        assert p.query(50.0, 0.0) == 3.0
        assert p.query(60.0 + 300.0, 0.0) == 4.0
        assert p.query(60.5 + 300.0, 0.0) == 0.0  # stale past the 5-minute lookback
        assert Prometheus().query(10.0, 60.0) == 0.0
        with pytest.raises(PolicyError):
            p.record(10.0, 1.0)

    def test_queries_name_their_signals(self) -> None:
        q = (
            'sum(avg_over_time(velvetrope_queue_depth{pool="default"}[1m])) '
            "+ sum(avg_over_time(vllm:num_requests_waiting[1m]))"
        )
        assert signals_in_query(q) == (("queue_depth", "num_requests_waiting"), 60.0)
        assert signals_in_query("sum(vllm:num_requests_waiting)") == (
            ("num_requests_waiting",),
            0.0,
        )
        assert signals_in_query("avg_over_time(DCGM_FI_DEV_GPU_UTIL[30s])") == (
            ("gpu_utilization",),
            30.0,
        )
        assert signals_in_query("sum(vllm:gpu_cache_usage_perc)")[0] == ("kv_cache_usage",)

    @pytest.mark.parametrize(
        "query",
        [
            "sum(http_requests_total)",
            "sum(vllm:num_requests_waiting_total)",
            "sum(rate(velvetrope_queue_depth[1m]))",
            "avg_over_time(velvetrope_queue_depth[1m]) + avg_over_time(DCGM_FI_DEV_GPU_UTIL[2m])",
        ],
    )
    def test_queries_outside_the_model_are_refused(self, query: str) -> None:
        with pytest.raises(PolicyError):
            signals_in_query(query)


class TestManifests:
    def _doc(self, **spec: object) -> dict[str, object]:
        trigger = {
            "type": "prometheus",
            "metadata": {"query": "sum(velvetrope_queue_depth)", "threshold": "8"},
        }
        return {"kind": "ScaledObject", "spec": {"triggers": [trigger], **spec}}

    def test_keda_defaults(self) -> None:
        so = ScaledObject.from_manifest(self._doc())
        assert (so.min_replicas, so.max_replicas) == (0, 100)
        assert (so.polling_interval_s, so.cooldown_s) == (30.0, 300.0)
        assert so.behavior is None
        assert so.hpa_spec().min_replicas == 1
        assert so.window_s == 0.0

    @pytest.mark.parametrize(
        "spec",
        [
            {"triggers": []},
            {"minReplicaCount": 5, "maxReplicaCount": 2},
            {"advanced": {"scalingModifiers": {"formula": "x"}}},
            {"pollingInterval": 0},
        ],
    )
    def test_bad_manifests(self, spec: dict[str, object]) -> None:
        with pytest.raises(PolicyError):
            ScaledObject.from_manifest(self._doc(**spec))

    def test_not_a_scaled_object(self, tmp_path: Path) -> None:
        with pytest.raises(PolicyError):
            ScaledObject.from_manifest({"kind": "Deployment"})
        f = tmp_path / "x.yaml"
        f.write_text("kind: Service\n", encoding="utf-8")
        with pytest.raises(PolicyError, match="no ScaledObject"):
            load_scaled_object(f)


def test_the_config_section_matches_the_deploy_file() -> None:
    from velvetrope.config import parse_config

    # the deploy file's query is scoped to one release (namespace, job); the simulator reads
    # the same metric whatever the scope
    query = yaml.safe_load(DEPLOY.read_text())["spec"]["triggers"][0]["metadata"]["query"]
    cfg = parse_config(
        {
            "autoscale": {
                "query": query,
                "threshold": 16,
                "min_replicas": 2,
                "max_replicas": 8,
                "polling_interval_s": 15,
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                    },
                    "scaleDown": {
                        "stabilizationWindowSeconds": 600,
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
                    },
                },
            }
        }
    )
    assert cfg.autoscale is not None
    so = ScaledObject.from_settings(cfg.autoscale)
    deployed = load_scaled_object(DEPLOY)
    assert so == deployed  # notes and the query text aside (compare=False / same default)
    bad = cfg.autoscale.model_copy(update={"query": "sum(up)"})
    with pytest.raises(PolicyError, match="autoscale"):
        ScaledObject.from_settings(bad)
