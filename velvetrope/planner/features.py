"""What speculative decoding and prefix caching do to service time: with and without.

A feature that cuts work does two things the planner should show: the mean service time
falls (each replica serves more), and the *spread* of service times changes, which moves the
p99 by more or less than the mean.  :func:`feature_effects` answers both for a plan sized
with features: for each feature on its own and, when both are on, for the two together, it
evaluates the model (:func:`velvetrope.planner.predict.predict`) on the plan's fleet at the
design rate on the service curve with the feature and on the curve without it, and sizes the
fleet again without it (:func:`velvetrope.planner.sizing.make_plan`).

Per request, the model's service time is ``S_i = w_i·τ`` (iterations times the iteration
time the request runs at; :mod:`velvetrope.planner.predict`, assumptions 5): with an
arrival pattern ``τ`` is the iteration time of the concurrency a request that did not wait
finds, and ``τ_w`` for one that waited.  :class:`ServiceStats` holds the mean, coefficient of
variation and p99 of that distribution (``Prediction.service_values`` and
``waited_service_values``, mixed by the probability of waiting); the mean is the
per-request mean, ``E[e2e] − E[W]``, which with bursty arrivals exceeds the time-average
``E[S]`` of Little's law (a burst's requests run in a fuller batch).  The planner sizes one
class (one tier), so there is one row per feature, not one per class.  Units: seconds, req/s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from velvetrope.engine.profile import EngineProfile
from velvetrope.engine.speculative import expected_tokens_per_step
from velvetrope.errors import PolicyError
from velvetrope.planner.engine_options import prefix_caching_profile
from velvetrope.planner.plan import Plan
from velvetrope.planner.predict import predict
from velvetrope.planner.prediction import Prediction
from velvetrope.planner.service import ServiceCurve
from velvetrope.planner.service_methods import analytic_service_curve, measure_service_curve

__all__ = [
    "FeatureEffect",
    "ServiceStats",
    "build_curve",
    "effects_of",
    "feature_effects",
    "feature_settings",
    "predicted_service",
    "service_stats",
]


def build_curve(
    profile: EngineProfile, prompt: Any, output: Any, method: str, prefix_hit_rate: float
) -> ServiceCurve:
    """The service curve by ``method`` (``closed-loop`` or ``analytic``)."""
    if method == "closed-loop":
        return measure_service_curve(profile, prompt, output, prefix_hit_rate=prefix_hit_rate)
    if method == "analytic":
        return analytic_service_curve(profile, prompt, output, prefix_hit_rate=prefix_hit_rate)
    raise PolicyError(f"--service-model must be closed-loop or analytic (got {method!r})")


@dataclass(frozen=True, slots=True)
class ServiceStats:
    """One configuration on one fleet at the design rate (see the module docstring).

    ``mean_s``, ``cv`` and ``p99_s`` describe the service time (``nan`` when the fleet is
    overloaded: ``mean_s`` is then ``inf``); ``e2e_p99_s`` is the predicted p99 end-to-end
    latency (``inf`` when overloaded); ``max_throughput_rps`` one replica's saturated
    throughput; ``replicas`` the fewest replicas meeting the SLO (``None``: not met at any).
    """

    mean_s: float
    cv: float
    p99_s: float
    e2e_p99_s: float
    max_throughput_rps: float
    replicas: int | None

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-safe (a non-finite number becomes ``None``)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in (
                ("service_mean_s", self.mean_s),
                ("service_cv", self.cv),
                ("service_p99_s", self.p99_s),
                ("e2e_p99_s", self.e2e_p99_s),
                ("max_throughput_rps", self.max_throughput_rps),
                ("replicas", self.replicas),
            )
        }


def _distribution(pred: Prediction) -> tuple[float, float, float]:
    """Mean, standard deviation and p99 of the model's service-time distribution: requests
    that did not wait (``service_values``) and, with an arrival pattern, those that did
    (``waited_service_values``, aligned with the same weights), mixed by ``p_wait``."""
    v = np.asarray(pred.service_values, dtype=np.float64)
    w = np.asarray(pred.service_weights, dtype=np.float64)
    w = w / float(w.sum())
    waited = np.asarray(pred.waited_service_values, dtype=np.float64)
    if waited.size:
        v = np.concatenate((v, waited))
        w = np.concatenate(((1.0 - pred.p_wait) * w, pred.p_wait * w))
    mean = float(np.dot(v, w))
    sd = math.sqrt(max(float(np.dot(w, (v - mean) ** 2)), 0.0))
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    p99 = float(v[order][min(int(np.searchsorted(cum, 0.99)), v.size - 1)])
    return mean, sd, p99


def predicted_service(pred: Prediction) -> tuple[float, float]:
    """The mean and CV of the service time under ``pred`` (``(inf, nan)`` when overloaded;
    see the module docstring)."""
    if not pred.stable:
        return math.inf, math.nan
    mean, sd, _ = _distribution(pred)
    return mean, sd / mean


def service_stats(pred: Prediction, curve: ServiceCurve, replicas: int | None) -> ServiceStats:
    """:class:`ServiceStats` of the prediction ``pred`` made on ``curve``."""
    x = curve.max_throughput_rps
    if not pred.stable:
        return ServiceStats(math.inf, math.nan, math.nan, math.inf, x, replicas)
    mean, sd, p99 = _distribution(pred)
    return ServiceStats(mean, sd / mean, p99, pred.p99("e2e"), x, replicas)


@dataclass(frozen=True, slots=True)
class FeatureEffect:
    """``feature`` (a label such as ``prefix cache 30%``) without and with, on the plan's
    fleet (``replicas`` × ``concurrency``) at the design rate."""

    feature: str
    replicas: int
    concurrency: int
    without: ServiceStats
    with_: ServiceStats

    def line(self) -> str:
        """``prefix cache 30%: mean service 1.84 s → 1.21 s (−34%), CV 0.92 → 0.71, …``."""
        a, b = self.without, self.with_
        if not math.isfinite(a.mean_s):
            mean = f"overloaded at {self.replicas} replicas without it → {b.mean_s:.3g} s"
            return (
                f"{self.feature}: mean service {mean}; replicas needed "
                f"{_r(a.replicas)} → {_r(b.replicas)}"
            )
        return (
            f"{self.feature}: mean service {a.mean_s:.3g} s → {b.mean_s:.3g} s "
            f"({_pct(a.mean_s, b.mean_s)}), CV {a.cv:.2f} → {b.cv:.2f}, p99 service "
            f"{a.p99_s:.3g} s → {b.p99_s:.3g} s ({_pct(a.p99_s, b.p99_s)}); at {self.replicas} "
            f"replicas × {self.concurrency} slots p99 end-to-end {a.e2e_p99_s:.3g} s → "
            f"{b.e2e_p99_s:.3g} s ({_pct(a.e2e_p99_s, b.e2e_p99_s)}); saturated throughput "
            f"{a.max_throughput_rps:.3g} → {b.max_throughput_rps:.3g} req/s per replica "
            f"({_pct(a.max_throughput_rps, b.max_throughput_rps)}); replicas needed "
            f"{_r(a.replicas)} → {_r(b.replicas)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``feature``, the fleet, and ``without``/``with`` stats."""
        return {
            "feature": self.feature,
            "replicas": self.replicas,
            "concurrency": self.concurrency,
            "without": self.without.to_dict(),
            "with": self.with_.to_dict(),
        }


def _pct(a: float, b: float) -> str:
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return "—"
    return f"{(b - a) / a:+.0%}".replace("-", "−")


def _r(n: int | None) -> str:
    return "none meets the SLO" if n is None else str(n)


def feature_effects(
    plan: Plan,
    variants: list[tuple[str, ServiceCurve]],
    baseline: ServiceCurve,
    replan: Callable[[ServiceCurve], Plan],
) -> list[FeatureEffect]:
    """One :class:`FeatureEffect` per ``(label, curve with the feature)`` in ``variants``,
    against ``baseline`` (the curve with no feature), on ``plan``'s fleet at its design
    rate.  ``replan(curve)`` sizes the workload on ``curve`` (raising
    :class:`~velvetrope.errors.PolicyError` when the SLO cannot be met)."""
    w = plan.workload
    n, k = plan.replicas, plan.concurrency

    def stats(curve: ServiceCurve) -> ServiceStats:
        pred = predict(
            curve, w.design_rps, n, k, arrival_scv=w.arrival_scv,
            arrival_pattern=w.arrival_pattern,
        )  # fmt: skip
        try:
            needed: int | None = replan(curve).replicas
        except PolicyError:
            needed = None
        return service_stats(pred, curve, needed)

    without = stats(baseline)
    return [FeatureEffect(label, n, k, without, stats(c)) for label, c in variants]


def feature_settings(prof: EngineProfile, hit_rate: float) -> dict[str, float | int]:
    """The speculative decoding and prefix caching ``prof`` and ``hit_rate`` stand for, as
    the plan's ``--json`` gives them."""

    out: dict[str, float | int] = {"prefix_hit_rate": hit_rate}
    if prof.spec_tokens:
        k, a = prof.spec_tokens, prof.spec_acceptance
        out |= {
            "spec_tokens": k,
            "spec_acceptance": a,
            "spec_tokens_per_step": expected_tokens_per_step(k, a),
            "spec_draft_ms": prof.spec_draft_step_s * 1e3,
        }
    return out


def effects_of(
    plan: Plan,
    base: EngineProfile,
    spec_only: EngineProfile,
    hit_rate: float,
    method: str,
    replan: Callable[[ServiceCurve], Plan],
) -> list[FeatureEffect]:
    """:func:`feature_effects` for ``plan``, sized on ``base`` with speculation as in
    ``spec_only`` and prefix hit rate ``hit_rate``: each feature on its own and, when both
    are on, both, against neither (each curve by ``method``)."""

    w = plan.workload
    variants: list[tuple[str, ServiceCurve]] = []
    spec_label = prefix_label = ""
    if spec_only.spec_tokens:
        k, a = spec_only.spec_tokens, spec_only.spec_acceptance
        spec_label = (
            f"speculative decoding k={k} ({expected_tokens_per_step(k, a):.2f} tokens/step)"
        )
    if hit_rate > 0:
        prefix_label = f"prefix cache {hit_rate:.0%}"
    if spec_label and prefix_label:
        pc = prefix_caching_profile(base, hit_rate)
        variants.append((spec_label, build_curve(spec_only, w.prompt, w.output, method, 0.0)))
        variants.append((prefix_label, build_curve(pc, w.prompt, w.output, method, hit_rate)))
        variants.append((f"{spec_label} + {prefix_label}", plan.curve))
    else:
        variants.append((spec_label or prefix_label, plan.curve))
    baseline = build_curve(base, w.prompt, w.output, method, 0.0)
    return feature_effects(plan, variants, baseline, replan)
