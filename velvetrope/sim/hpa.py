"""Kubernetes' HorizontalPodAutoscaler (``autoscaling/v2``) as a model: the replica count it
sets, sync by sync, for an external metric.

This is the controller that KEDA's ScaledObject drives (:mod:`velvetrope.sim.keda`): KEDA
serves the metric, the HPA decides the replica count for 1 ↔ N.  The model follows the
documented algorithm (Kubernetes docs, *Horizontal Pod Autoscaling*: "Algorithm details",
"Configurable scaling behavior", "Default Behavior") and, where the docs leave a detail to
the code, the controller's source (``pkg/controller/podautoscaler/horizontal.go`` and
``replica_calculator.go``); each step below names the function it models.

One sync (:meth:`Hpa.sync`, every ``sync_period_s``, 15 s by default: the
``--horizontal-pod-autoscaler-sync-period`` flag):

1. **Guards** (``reconcileAutoscaler``): a target at 0 replicas with ``min_replicas > 0`` is
   left alone (scaling is disabled until something else, KEDA's activation, scales it up);
   a count above ``max_replicas`` goes to the max, below ``min_replicas`` to the min, with no
   metric read and no recommendation recorded.
2. **Proposal** from the metric (``GetExternalPerPodMetricReplicas`` for ``AverageValue``,
   ``GetExternalMetricReplicas`` for ``Value``).  Values are milli-quantities, as KEDA sends
   them (the metric rounded to 1/1000, the target too), so ``ceil`` is exact:

   * ``AverageValue``: ``ratio = usage / (target × replicas)``; if ``|1 − ratio| >
     tolerance`` the proposal is ``ceil(usage / target)``, else the current count.
     ``replicas`` is the target's *status* replicas (every pod not being deleted: starting
     ones count, draining ones do not).
   * ``Value``: ``ratio = usage / target``; within the tolerance the current count, else
     ``ceil(ratio × ready)`` with ``ready`` the pods that are Ready (starting ones do not
     count).
   The tolerance is 0.1 (the docs: "within a globally-configurable tolerance, 0.1 by
   default").
3. **Stabilisation** (``stabilizeRecommendationWithBehaviors``): the proposals of the past
   ``scale_up.stabilization_window_s`` bound a scale-up from above by their *minimum*, those
   of the past ``scale_down.stabilization_window_s`` bound a scale-down from below by their
   *maximum* ("uses the highest value from the specified interval"); a proposal counts while
   it is strictly younger than the window.  The raw proposal is then recorded.
4. **Rate limits** (``convertDesiredReplicasWithBehaviorRate``): each policy limits the
   change relative to the count at the start of its period (the current count minus the
   changes made in the last ``period_s``): ``Pods`` adds or removes ``value`` replicas,
   ``Percent`` multiplies by ``1 ± value/100`` (``ceil`` up, truncation down).  ``select``
   ``Max`` (default) takes the policy allowing the biggest change, ``Min`` the smallest,
   ``Disabled`` forbids that direction.  Then ``[min_replicas, max_replicas]``.
5. The new count is applied (and the change recorded for the rate limits) when it differs.

``behavior=None`` models an HPA whose spec has no ``behavior`` field (KEDA creates one when
the ScaledObject has no ``advanced.horizontalPodAutoscalerConfig.behavior``): the
controller's older path (``normalizeDesiredReplicas``): the highest proposal of the last
``downscale_stabilization_s`` (300 s: ``--horizontal-pod-autoscaler-downscale-stabilization``;
a proposal exactly that old still counts), a scale-up limit of ``max(2 × current, 4)``, then
the bounds.  A ``Behavior`` with fields left out takes the documented defaults for them
(:data:`DEFAULT_SCALE_UP`, :data:`DEFAULT_SCALE_DOWN`).

Not modelled: per-pod resource metrics (CPU: the not-yet-ready and missing-metric
corrections); several metrics at once; the alpha per-direction tolerance.  Times are
seconds of the simulation's clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from velvetrope import checks
from velvetrope.errors import PolicyError

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "Behavior",
    "Hpa",
    "HpaDecision",
    "HpaSpec",
    "MetricType",
    "ScalingPolicy",
    "ScalingRules",
    "milli",
]

MetricType = Literal["AverageValue", "Value"]
_SELECTS = ("Max", "Min", "Disabled")


def milli(value: float) -> int:
    """``value`` as an integer count of thousandths, rounded (KEDA's ``GenerateMetricInMili``
    and Kubernetes' ``Quantity.MilliValue``)."""
    return math.floor(value * 1000.0 + 0.5)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """One ``HPAScalingPolicy``: ``kind`` ``Pods`` or ``Percent``, ``value > 0``, over the
    last ``period_s`` seconds (1 to 1800, as the API validates)."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: int

    def __post_init__(self) -> None:
        if self.kind not in ("Pods", "Percent"):
            raise PolicyError(f"scaling policy type must be Pods or Percent, got {self.kind!r}")
        checks.count("policy value", self.value, 1)
        p = checks.count("periodSeconds", self.period_s, 1)
        if p > 1800:
            raise PolicyError(f"periodSeconds must be <= 1800, got {p}")


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction's ``HPAScalingRules``: a stabilisation window (0 to 3600 s), the
    policies, and how to choose between them."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"

    def __post_init__(self) -> None:
        w = checks.count("stabilizationWindowSeconds", self.stabilization_window_s, 0)
        if w > 3600:
            raise PolicyError(f"stabilizationWindowSeconds must be <= 3600, got {w}")
        if self.select not in _SELECTS:
            raise PolicyError(f"selectPolicy must be one of {_SELECTS}, got {self.select!r}")
        if not self.policies and self.select != "Disabled":
            raise PolicyError("scaling rules need at least one policy")

    @property
    def longest_period_s(self) -> int:
        return max((p.period_s for p in self.policies), default=0)


DEFAULT_SCALE_UP = ScalingRules(
    0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)), "Max"
)
"""The documented default for scaling up: no window; 100 % or 4 pods per 15 s, the larger."""
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),), "Max")
"""The documented default for scaling down: a 300 s window; down to the minimum at once."""


def _rules(spec: Any, default: ScalingRules, where: str) -> ScalingRules:
    """``HPAScalingRules`` from its YAML form, fields left out taking ``default``'s
    (``GenerateHPAScaleUpRules`` / ``GenerateHPAScaleDownRules``)."""
    if spec is None:
        return default
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{where} must be a mapping")
    unknown = set(spec) - {"stabilizationWindowSeconds", "policies", "selectPolicy", "tolerance"}
    if unknown:
        raise PolicyError(f"{where}: unknown fields {sorted(unknown)}")
    if "tolerance" in spec:
        raise PolicyError(f"{where}.tolerance (alpha in Kubernetes 1.33) is not modelled")
    policies = default.policies
    if spec.get("policies"):
        items = spec["policies"]
        if not isinstance(items, list):
            raise PolicyError(f"{where}.policies must be a list")
        out = []
        for i, p in enumerate(items):
            if not isinstance(p, Mapping) or set(p) != {"type", "value", "periodSeconds"}:
                raise PolicyError(f"{where}.policies[{i}] needs exactly type, value, periodSeconds")
            out.append(ScalingPolicy(p["type"], p["value"], p["periodSeconds"]))
        policies = tuple(out)
    return ScalingRules(
        spec.get("stabilizationWindowSeconds", default.stabilization_window_s),
        policies,
        spec.get("selectPolicy", default.select),
    )


@dataclass(frozen=True, slots=True)
class Behavior:
    """The HPA's ``behavior``: rules for each direction (documented defaults by default)."""

    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    @classmethod
    def from_spec(cls, spec: Any, where: str = "behavior") -> Behavior:
        """From the YAML mapping (``scaleUp``/``scaleDown``), defaults filling what is left
        out, as the API server does."""
        if not isinstance(spec, Mapping):
            raise PolicyError(f"{where} must be a mapping")
        unknown = set(spec) - {"scaleUp", "scaleDown"}
        if unknown:
            raise PolicyError(f"{where}: unknown fields {sorted(unknown)}")
        return cls(
            _rules(spec.get("scaleUp"), DEFAULT_SCALE_UP, f"{where}.scaleUp"),
            _rules(spec.get("scaleDown"), DEFAULT_SCALE_DOWN, f"{where}.scaleDown"),
        )


@dataclass(frozen=True, slots=True)
class HpaSpec:
    """What the HPA is told: bounds, the metric's target and type, and its behaviour."""

    min_replicas: int
    max_replicas: int
    target: float
    metric_type: MetricType = "AverageValue"
    behavior: Behavior | None = field(default_factory=Behavior)
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    downscale_stabilization_s: float = 300.0

    def __post_init__(self) -> None:
        lo = checks.count("min_replicas", self.min_replicas, 1)
        hi = checks.count("max_replicas", self.max_replicas, 1)
        if hi < lo:
            raise PolicyError(f"max_replicas ({hi}) must be >= min_replicas ({lo})")
        if milli(checks.number("target", self.target)) < 1:
            raise PolicyError(f"target must be at least 0.001, got {self.target!r}")
        if self.metric_type not in ("AverageValue", "Value"):
            raise PolicyError(f"metric type must be AverageValue or Value: {self.metric_type!r}")
        checks.number("tolerance", self.tolerance, strict=False)
        checks.number("sync_period_s", self.sync_period_s)
        checks.number("downscale_stabilization_s", self.downscale_stabilization_s, strict=False)


@dataclass(frozen=True, slots=True)
class HpaDecision:
    """One sync: the metric read, the proposal, the stabilised and final counts, and why."""

    at: float
    current: int
    metric: float | None
    proposal: int | None
    stabilized: int | None
    desired: int
    reason: str


class Hpa:
    """The controller's state for one HPA: past proposals and past scale events."""

    __slots__ = ("_down_events", "_recommendations", "_up_events", "spec")

    def __init__(self, spec: HpaSpec) -> None:
        self.spec = spec
        self._recommendations: list[tuple[float, int]] = []
        self._up_events: list[tuple[float, int]] = []
        self._down_events: list[tuple[float, int]] = []

    def proposal(self, metric: float, replicas: int, ready: int | None = None) -> int:
        """The replica calculator's count for ``metric`` (step 2 of the module docstring):
        ``replicas`` is the target's status count, ``ready`` its Ready pods (default: all)."""
        s = self.spec
        usage = milli(metric)
        target = milli(s.target)
        if s.metric_type == "AverageValue":
            if replicas > 0 and abs(1.0 - usage / (target * replicas)) <= s.tolerance:
                return replicas
            return -(-usage // target)
        ratio = usage / target
        if replicas == 0:
            return math.ceil(ratio)
        if abs(1.0 - ratio) <= s.tolerance:
            return replicas
        return math.ceil(ratio * (replicas if ready is None else ready))

    def sync(
        self, now: float, current: int, metric: float | None, ready: int | None = None
    ) -> HpaDecision:
        """One reconcile at ``now`` with the target at ``current`` replicas (its spec and
        status count) of which ``ready`` are Ready; ``metric`` is the external metric's value
        (``None``: it could not be read, and the count is left alone).  The decision's
        ``desired`` is the count the target is set to."""
        s = self.spec
        if current == 0 and s.min_replicas != 0:
            return HpaDecision(now, 0, metric, None, None, 0, "ScalingDisabled")
        if current > s.max_replicas:
            return self._apply(now, current, metric, None, None, s.max_replicas, "AboveMax")
        if current < s.min_replicas:
            return self._apply(now, current, metric, None, None, s.min_replicas, "BelowMin")
        if metric is None:
            return HpaDecision(now, current, None, None, None, current, "FailedGetExternalMetric")
        prop = self.proposal(metric, current, ready)
        if s.behavior is None:
            stab = self._stabilize_legacy(now, prop)
            limit = max(2 * current, 4)
            hi = min(s.max_replicas, limit)
            desired = min(max(stab, s.min_replicas), hi)
            if stab < s.min_replicas:
                reason = "TooFewReplicas"
            elif stab > hi:
                reason = "ScaleUpLimit" if hi == limit else "TooManyReplicas"
            else:
                reason = "DesiredWithinRange"
        else:
            stab = self._stabilize(now, current, prop, s.behavior)
            desired, reason = self._rate_limit(now, current, stab, s.behavior)
        return self._apply(now, current, metric, prop, stab, desired, reason)

    # -- steps ------------------------------------------------------------------------------

    def _apply(
        self,
        now: float,
        current: int,
        metric: float | None,
        prop: int | None,
        stab: int | None,
        desired: int,
        reason: str,
    ) -> HpaDecision:
        if desired != current and self.spec.behavior is not None:
            b = self.spec.behavior
            if desired > current:
                _store(self._up_events, now, desired - current, b.scale_up.longest_period_s)
            else:
                _store(self._down_events, now, current - desired, b.scale_down.longest_period_s)
        return HpaDecision(now, current, metric, prop, stab, desired, reason)

    def _stabilize(self, now: float, current: int, prop: int, b: Behavior) -> int:
        up_cut = now - b.scale_up.stabilization_window_s
        down_cut = now - b.scale_down.stabilization_window_s
        up = down = prop
        for t, rec in self._recommendations:
            if t > up_cut:
                up = min(up, rec)
            if t > down_cut:
                down = max(down, rec)
        stabilized = min(max(current, up), down)
        oldest = min(up_cut, down_cut)
        self._recommendations = [r for r in self._recommendations if r[0] >= oldest]
        self._recommendations.append((now, prop))
        return stabilized

    def _stabilize_legacy(self, now: float, prop: int) -> int:
        cut = now - self.spec.downscale_stabilization_s
        kept = [r for r in self._recommendations if not r[0] < cut]
        best = max([prop, *(rec for _, rec in kept)])
        kept.append((now, prop))
        self._recommendations = kept
        return best

    def _rate_limit(self, now: float, current: int, desired: int, b: Behavior) -> tuple[int, str]:
        s = self.spec
        up, down = self._up_events, self._down_events
        if desired > current:
            limit = max(_limit(now, current, up, down, b.scale_up, 1), current)
            if s.max_replicas > limit:
                cap, why = limit, "ScaleUpLimit"
            else:
                cap, why = s.max_replicas, "TooManyReplicas"
            return (cap, why) if desired > cap else (desired, "DesiredWithinRange")
        if desired < current:
            limit = min(_limit(now, current, up, down, b.scale_down, -1), current)
            if s.min_replicas < limit:
                floor, why = limit, "ScaleDownLimit"
            else:
                floor, why = s.min_replicas, "TooFewReplicas"
            return (floor, why) if desired < floor else (desired, "DesiredWithinRange")
        return desired, "DesiredWithinRange"


def _store(events: list[tuple[float, int]], now: float, change: int, longest: int) -> None:
    """Record a scale event (``storeScaleEvent``); events older than the longest policy
    period can no longer count and are dropped."""
    cut = now - longest
    events[:] = [e for e in events if not e[0] < cut]
    events.append((now, change))


def _changed(now: float, period_s: int, events: list[tuple[float, int]]) -> int:
    """Replicas changed in the last ``period_s`` (``getReplicasChangePerPeriod``: an event
    counts while strictly younger than the period)."""
    cut = now - period_s
    return sum(c for t, c in events if t > cut)


def _limit(
    now: float,
    current: int,
    up: list[tuple[float, int]],
    down: list[tuple[float, int]],
    rules: ScalingRules,
    sign: int,
) -> int:
    """The farthest the count may move in one direction (``sign`` +1 up, -1 down):
    ``calculateScaleUpLimitWithScalingRules`` and ``calculateScaleDownLimitWithBehaviors``."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for p in rules.policies:
        start = current - _changed(now, p.period_s, up) + _changed(now, p.period_s, down)
        if p.kind == "Pods":
            proposals.append(start + sign * p.value)
        elif sign > 0:  # rounded up, or a small count could never grow
            proposals.append(math.ceil(start * (1.0 + p.value / 100.0)))
        else:
            proposals.append(int(start * (1.0 - p.value / 100.0)))
    biggest_change = rules.select == "Max"
    return max(proposals) if biggest_change == (sign > 0) else min(proposals)
