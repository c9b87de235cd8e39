"""KEDA's Prometheus scaler driving an HPA, as a model: what the ``deploy/keda`` ScaledObject
does to the engine replica count, poll by poll and sync by sync.

The parts, each as documented (KEDA docs: *ScaledObject specification*, *Scaling
Deployments* — "Activating and Scaling thresholds", "Caching Metrics" —, the *Prometheus*
scaler page; Prometheus docs on range vectors and ``avg_over_time``):

* **Prometheus** (:class:`Prometheus`) scrapes the simulated signal every
  ``scrape_interval_s`` (the loop records the samples).  The trigger's query is either an
  instant value (the latest sample no older than the 5-minute lookback) or
  ``avg_over_time(...[w])``: the mean of the samples in ``(now − w, now]`` (left-open, as
  Prometheus 3 selects ranges).  An empty result reads as 0, KEDA's ``ignoreNullValues``
  default.
* **KEDA's operator loop** (every ``pollingInterval``, :meth:`KedaAutoscaler.poll`): the
  *activation phase*, 0 ↔ 1 only.  The trigger is active when the value is *greater than*
  ``activationThreshold`` ("not greater than or equal to"); "if the minimum replicas is
  >= 1, the scaler is always active".  Active at 0 replicas: scale to ``max(1,
  minReplicaCount)``.  Inactive with ``minReplicaCount`` 0: back to 0 once the last active
  poll is more than ``cooldownPeriod`` old ("the period to wait after the last trigger
  reported active before scaling the resource back to 0"), and not before
  ``initialCooldownPeriod`` after creation (t = 0).  Below ``minReplicaCount``: up to it.
  ``cooldownPeriod`` does nothing else: "scaling from 1 to N replicas is handled by the
  Kubernetes Horizontal Pod Autoscaler".
* **The HPA** KEDA creates (:class:`~velvetrope.sim.hpa.Hpa`, every ``sync_period_s``, 15 s):
  ``minReplicas = max(1, minReplicaCount)``, ``maxReplicas = maxReplicaCount``, the trigger's
  ``threshold`` as an ``AverageValue`` (per replica, the default) or ``Value`` target, the
  ScaledObject's ``advanced.horizontalPodAutoscalerConfig.behavior``.  The HPA's request for
  the metric reaches KEDA's metrics server, which runs the query then — or, with the
  trigger's ``useCachedMetrics``, answers with the value read at the last poll.

Signals (:data:`SIGNALS`) are what the simulation exposes, each summed over the fleet, as
``sum(...)`` over the series of every replica would: ``queue_depth`` (requests in the
gateway's queue for the pool, ``velvetrope_queue_depth``), ``num_requests_waiting`` (waiting
sequences in the engines, ``vllm:num_requests_waiting``), ``kv_cache_usage`` (the engines'
KV-cache usage fractions, ``vllm:kv_cache_usage_perc``) and ``gpu_utilization`` (per engine,
the percentage of the last scrape interval it had a batch running, as DCGM's
``DCGM_FI_DEV_GPU_UTIL`` reports "the fraction of time over the past sample period during
which one or more kernels was executing").  A query naming several metrics sums them.

Not modelled: ``fallback`` (the simulated Prometheus always answers) and
``scalingModifiers``; one trigger per ScaledObject.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from velvetrope.config_sections import AutoscaleSettings
from velvetrope.errors import PolicyError
from velvetrope.sim.hpa import Behavior, Hpa, HpaDecision, HpaSpec, MetricType

__all__ = [
    "SIGNALS",
    "KedaAutoscaler",
    "Prometheus",
    "ScaleEvent",
    "ScaledObject",
    "load_scaled_object",
    "signals_in_query",
]

SIGNALS: Mapping[str, tuple[str, ...]] = {
    "queue_depth": ("velvetrope_queue_depth",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "gpu_utilization": ("DCGM_FI_DEV_GPU_UTIL",),
}
"""Signal name → the Prometheus metric names that stand for it in a query."""

LOOKBACK_S = 300.0
"""Prometheus' lookback for an instant vector: a sample older than this is stale."""

_DURATION = re.compile(r"\[(\d+(?:\.\d+)?)(ms|s|m|h)\]")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def signals_in_query(query: str) -> tuple[tuple[str, ...], float]:
    """The signals a PromQL query reads (in :data:`SIGNALS` order) and its ``avg_over_time``
    window in seconds (0 for an instant query).  A query naming no known metric, mixing
    windows, or using a range without ``avg_over_time`` raises :class:`PolicyError`."""
    found = tuple(
        name
        for name, metrics in SIGNALS.items()
        if any(re.search(re.escape(m) + r"(?![\w:])", query) for m in metrics)
    )
    if not found:
        known = ", ".join(m for ms in SIGNALS.values() for m in ms)
        raise PolicyError(f"the query {query!r} names no simulated metric (known: {known})")
    windows = {float(v) * _UNIT_S[u] for v, u in _DURATION.findall(query)}
    if len(windows) > 1:
        raise PolicyError(f"the query {query!r} mixes range windows {sorted(windows)}")
    if windows and "avg_over_time" not in query:
        raise PolicyError(f"the query {query!r}: only avg_over_time ranges are modelled")
    return found, windows.pop() if windows else 0.0


class Prometheus:
    """Samples of one signal at scrape times, and the two query forms the model reads."""

    __slots__ = ("_t", "_v")

    def __init__(self) -> None:
        self._t: list[float] = []
        self._v: list[float] = []

    def record(self, t: float, value: float) -> None:
        """A scrape at ``t`` (non-decreasing) read ``value``."""
        if self._t and t < self._t[-1]:
            raise PolicyError(f"scrapes must come in time order ({t} after {self._t[-1]})")
        self._t.append(t)
        self._v.append(value)

    def query(self, now: float, window_s: float) -> float:
        """``avg_over_time`` over ``(now − window_s, now]``, or the latest sample at or before
        ``now`` (within :data:`LOOKBACK_S`) for ``window_s == 0``; 0 when nothing matches."""
        ts, vs = self._t, self._v
        i = len(ts)
        while i and ts[i - 1] > now:
            i -= 1
        if window_s <= 0:
            return vs[i - 1] if i and ts[i - 1] >= now - LOOKBACK_S else 0.0
        lo = now - window_s
        total = 0.0
        n = 0
        j = i
        while j and ts[j - 1] > lo:
            j -= 1
            total += vs[j]
            n += 1
        return total / n if n else 0.0


@dataclass(frozen=True, slots=True)
class ScaledObject:
    """The numbers of a KEDA ScaledObject with one Prometheus trigger.

    ``signals``/``window_s`` come from the trigger's query (:func:`signals_in_query`);
    ``behavior`` ``None`` leaves the HPA's ``behavior`` unset (its older path, see
    :mod:`velvetrope.sim.hpa`).  Defaults are KEDA's and the HPA controller's.
    """

    threshold: float
    signals: tuple[str, ...] = ("queue_depth",)
    window_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 100
    polling_interval_s: float = 30.0
    cooldown_s: float = 300.0
    initial_cooldown_s: float = 0.0
    activation_threshold: float = 0.0
    metric_type: MetricType = "AverageValue"
    use_cached_metrics: bool = False
    behavior: Behavior | None = None
    sync_period_s: float = 15.0
    tolerance: float = 0.1
    query: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in self.signals:
            if name not in SIGNALS:
                raise PolicyError(f"unknown signal {name!r}; known: {', '.join(SIGNALS)}")
        if not self.signals:
            raise PolicyError("a ScaledObject needs a signal")
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise PolicyError(
                f"need 0 <= minReplicaCount <= maxReplicaCount and maxReplicaCount >= 1 "
                f"(got {self.min_replicas}, {self.max_replicas})"
            )
        for name in ("polling_interval_s", "sync_period_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise PolicyError(f"{name} must be > 0, got {v!r}")
        for name in ("window_s", "cooldown_s", "initial_cooldown_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise PolicyError(f"{name} must be >= 0, got {v!r}")
        self.hpa_spec()  # validates threshold, metric type, tolerance

    def hpa_spec(self) -> HpaSpec:
        """The HPA KEDA creates for this ScaledObject."""
        return HpaSpec(
            min_replicas=max(1, self.min_replicas),
            max_replicas=self.max_replicas,
            target=self.threshold,
            metric_type=self.metric_type,
            behavior=self.behavior,
            tolerance=self.tolerance,
            sync_period_s=self.sync_period_s,
        )

    @classmethod
    def from_manifest(cls, doc: Any, source: str = "<ScaledObject>") -> ScaledObject:
        """From a ScaledObject manifest (the ``deploy/keda`` file's YAML, parsed)."""
        if not isinstance(doc, Mapping) or doc.get("kind") != "ScaledObject":
            raise PolicyError(f"{source}: not a ScaledObject manifest")
        spec = doc.get("spec")
        if not isinstance(spec, Mapping):
            raise PolicyError(f"{source}: spec missing")
        triggers = spec.get("triggers")
        if not isinstance(triggers, Sequence) or len(triggers) != 1:
            raise PolicyError(f"{source}: exactly one trigger is modelled")
        trig = triggers[0]
        if not isinstance(trig, Mapping) or trig.get("type") != "prometheus":
            raise PolicyError(f"{source}: the trigger must be of type prometheus")
        meta = trig.get("metadata") or {}
        query = str(meta.get("query", ""))
        try:
            signals, window = signals_in_query(query)
            threshold = float(meta["threshold"])
            activation = float(meta.get("activationThreshold", 0))
        except KeyError:
            raise PolicyError(f"{source}: the trigger needs metadata.threshold") from None
        except (TypeError, ValueError):
            raise PolicyError(f"{source}: threshold values must be numbers") from None
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc}") from None
        adv = spec.get("advanced") or {}
        hpa_cfg = adv.get("horizontalPodAutoscalerConfig") or {}
        raw = hpa_cfg.get("behavior")
        notes = []
        if "fallback" in spec:
            notes.append("fallback: not modelled (the simulated Prometheus always answers)")
        if "scalingModifiers" in adv:
            raise PolicyError(f"{source}: advanced.scalingModifiers is not modelled")
        try:
            return cls(
                threshold=threshold,
                signals=signals,
                window_s=window,
                min_replicas=int(spec.get("minReplicaCount", 0)),
                max_replicas=int(spec.get("maxReplicaCount", 100)),
                polling_interval_s=float(spec.get("pollingInterval", 30)),
                cooldown_s=float(spec.get("cooldownPeriod", 300)),
                initial_cooldown_s=float(spec.get("initialCooldownPeriod", 0)),
                activation_threshold=activation,
                metric_type=trig.get("metricType", "AverageValue"),
                use_cached_metrics=bool(trig.get("useCachedMetrics", False)),
                behavior=None if raw is None else Behavior.from_spec(raw, "behavior"),
                query=query,
                notes=tuple(notes),
            )
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc}") from None

    @classmethod
    def from_settings(cls, settings: AutoscaleSettings, source: str = "autoscale") -> ScaledObject:
        """From the gateway config's ``autoscale`` section (the same numbers, snake case)."""
        try:
            signals, window = signals_in_query(settings.query)
            return cls(
                threshold=settings.threshold,
                signals=signals,
                window_s=window,
                min_replicas=settings.min_replicas,
                max_replicas=settings.max_replicas,
                polling_interval_s=settings.polling_interval_s,
                cooldown_s=settings.cooldown_s,
                activation_threshold=settings.activation_threshold,
                metric_type=settings.metric_type,
                use_cached_metrics=settings.use_cached_metrics,
                behavior=None
                if settings.behavior is None
                else Behavior.from_spec(settings.behavior, "behavior"),
                sync_period_s=settings.sync_period_s,
                query=settings.query,
            )
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc}") from None

    def describe(self) -> str:
        """One line: the numbers that matter."""
        sig = " + ".join(self.signals)
        win = f"avg over {self.window_s:g} s" if self.window_s else "instant"
        return (
            f"{sig} ({win}), threshold {self.threshold:g} {self.metric_type}, replicas "
            f"{self.min_replicas}..{self.max_replicas}, polling {self.polling_interval_s:g} s, "
            f"HPA sync {self.sync_period_s:g} s, cooldown {self.cooldown_s:g} s"
        )


def load_scaled_object(path: str | Path) -> ScaledObject:
    """Read a ScaledObject YAML file (the first document of kind ScaledObject)."""
    p = Path(path)
    try:
        docs = list(yaml.safe_load_all(p.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read {p}: {exc}") from None
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == "ScaledObject":
            return ScaledObject.from_manifest(doc, str(p))
    raise PolicyError(f"{p}: no ScaledObject in the file")


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """One autoscaler action: at ``at``, ``source`` (``keda`` or ``hpa``) read ``metric`` and
    moved the target from ``before`` to ``after`` replicas, for ``reason``."""

    at: float
    source: str
    metric: float
    before: int
    after: int
    reason: str


class KedaAutoscaler:
    """One ScaledObject at work: KEDA's polls and the HPA's syncs on fixed schedules.

    Polls fall at ``poll_phase_s + k × pollingInterval``, syncs at ``sync_phase_s + k ×
    sync_period_s`` (k = 0, 1, ...); when both fall at once the poll goes first.  The caller
    records the signal's scrapes in :attr:`prometheus` and calls :meth:`fire` at
    :meth:`next_at`; :attr:`events` keeps every change of the replica count.
    """

    __slots__ = (
        "_last_active",
        "_next_poll",
        "_next_sync",
        "cached",
        "decisions",
        "events",
        "hpa",
        "prometheus",
        "spec",
    )

    def __init__(
        self, spec: ScaledObject, *, poll_phase_s: float = 0.0, sync_phase_s: float = 0.0
    ) -> None:
        self.spec = spec
        self.hpa = Hpa(spec.hpa_spec())
        self.prometheus = Prometheus()
        self._next_poll = poll_phase_s
        self._next_sync = sync_phase_s
        self._last_active: float | None = None
        self.cached: float | None = None
        self.events: list[ScaleEvent] = []
        self.decisions: list[HpaDecision] = []

    def next_at(self) -> float:
        """When the next poll or sync falls."""
        return min(self._next_poll, self._next_sync)

    def query(self, now: float) -> float:
        """The trigger's query at ``now``."""
        return self.prometheus.query(now, self.spec.window_s)

    def fire(self, now: float, current: int, ready: int) -> int:
        """Run the poll and/or sync due at ``now`` with the target at ``current`` replicas
        (``ready`` of them Ready); returns the replica count the target is set to."""
        if now >= self._next_poll:
            current = self.poll(now, current)
            self._next_poll += self.spec.polling_interval_s
        if now >= self._next_sync:
            current = self.sync(now, current, ready)
            self._next_sync += self.spec.sync_period_s
        return current

    def poll(self, now: float, current: int) -> int:
        """KEDA's operator loop: activation and scaling to or from zero."""
        s = self.spec
        value = self.query(now)
        if s.use_cached_metrics:
            self.cached = value
        active = s.min_replicas >= 1 or value > s.activation_threshold
        target = current
        reason = ""
        if active:
            self._last_active = now
            if current == 0:
                target, reason = max(1, s.min_replicas), "activated"
        elif current > 0 and s.min_replicas == 0:
            idle = self._last_active is None or self._last_active + s.cooldown_s < now
            grace_over = s.initial_cooldown_s == 0 or now > s.initial_cooldown_s
            if idle and grace_over:
                target, reason = 0, "cooldown over: scaled to zero"
        elif current < s.min_replicas:
            target, reason = s.min_replicas, "below minReplicaCount"
        if target != current:
            self.events.append(ScaleEvent(now, "keda", value, current, target, reason))
        return target

    def sync(self, now: float, current: int, ready: int) -> int:
        """The HPA's reconcile, the metric read through KEDA's metrics server."""
        value = self.cached if self.spec.use_cached_metrics else self.query(now)
        d = self.hpa.sync(now, current, value, ready)
        self.decisions.append(d)
        if d.desired != current:
            self.events.append(ScaleEvent(now, "hpa", value or 0.0, current, d.desired, d.reason))
        return d.desired
