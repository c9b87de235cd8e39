"""Autoscaling in the simulator: a pool whose engines KEDA adds and removes while a run goes.

:class:`AutoscaleSpec` says what scales and how: a KEDA
:class:`~velvetrope.sim.keda.ScaledObject` (from the gateway config's ``autoscale`` section
or from a ScaledObject file such as ``deploy/keda/scaledobject.yaml``), the engines'
start-up delay, the pool, Prometheus' scrape interval.  Handed to
:func:`~velvetrope.sim.loop.run_simulation` (``autoscale=``), it makes that pool dynamic
(:mod:`velvetrope.sim.runner`): the run starts with ``max(1, minReplicaCount)`` replicas up
(the ``replicas`` argument is ignored for that pool), the signal is scraped every
``scrape_interval_s``, KEDA polls and the HPA syncs on their own schedules, and each change
of the replica count starts engines (serving after their start-up delay) or drains them.
The pool's in-flight limits follow its ready replicas (capacity per engine × live engines,
:class:`~velvetrope.core.capacity.PoolCapacity`): a pool configured per engine
(``max_in_flight_per_engine``) as it says; a pool given a fixed ``max_in_flight`` (and
``max_tokens_in_flight``) gets that divided by ``replicas`` per engine.

The signals (:data:`~velvetrope.sim.keda.SIGNALS`), read at each scrape, summed over the
pool's ready replicas where they are per engine:

* ``queue_depth``: requests queued at the gateway for the pool (all bands);
* ``num_requests_waiting``: sequences waiting in the engines' batchers, as vLLM's gauge
  counts them (as of each engine's last step: :mod:`velvetrope.sim.scrape`);
* ``kv_cache_usage``: the engines' KV-cache usage fractions;
* ``gpu_utilization``: per engine, 100 × the share of the time since the last scrape (or
  since it became ready) in which it had a batch running.

:class:`AutoscaleTrace` is what the run adds to its :class:`~velvetrope.sim.result.SimResult`:
the replica counts over time, every scale event, the signal's samples and the GPU time —
from the moment a replica is asked for until it is gone, start-up and draining included, up
to the end of the run or ``horizon_s``, whichever is later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from velvetrope.config_sections import AutoscaleSettings
from velvetrope.core import AdmissionController
from velvetrope.errors import PolicyError
from velvetrope.sim.drive_inputs import Autoscaling, Scaler
from velvetrope.sim.fleet import Fleet
from velvetrope.sim.keda import KedaAutoscaler, ScaledObject, ScaleEvent, load_scaled_object
from velvetrope.sim.replicas import ReplicaPool, StartupDelay
from velvetrope.sim.scrape import EngineScrapes

__all__ = [
    "AutoscaleSpec",
    "AutoscaleTrace",
    "ScriptedScaler",
    "attach",
]


class ScriptedScaler:
    """Sets the replica count to ``count`` at each ``(time, count)`` of ``steps`` (sorted):
    a scripted autoscaler for tests and what-ifs."""

    __slots__ = ("_i", "events", "steps")

    def __init__(self, steps: Sequence[tuple[float, int]]) -> None:
        self.steps = list(steps)
        if any(b[0] < a[0] for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise PolicyError("scripted scale steps must be sorted by time")
        self._i = 0
        self.events: list[ScaleEvent] = []

    def next_at(self) -> float:
        return self.steps[self._i][0] if self._i < len(self.steps) else math.inf

    def fire(self, now: float, current: int, ready: int) -> int:
        want = current
        while self._i < len(self.steps) and self.steps[self._i][0] <= now:
            want = self.steps[self._i][1]
            self._i += 1
        if want != current:
            self.events.append(ScaleEvent(now, "script", 0.0, current, want, "scripted"))
        return want


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    """What scales and how (see the module docstring).  ``scaler`` replaces the KEDA model
    (the ScaledObject then gives the start count, ``max(1, minReplicaCount)``, only)."""

    scaled_object: ScaledObject
    startup: StartupDelay = field(default_factory=lambda: StartupDelay("fixed", 120.0))
    pool: str | None = None
    scrape_interval_s: float = 15.0
    gpus_per_replica: int = 1
    horizon_s: float = 0.0
    scaler: Scaler | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scrape_interval_s) and self.scrape_interval_s > 0):
            raise PolicyError(f"scrape_interval_s must be > 0, got {self.scrape_interval_s!r}")
        if self.gpus_per_replica < 1:
            raise PolicyError(f"gpus_per_replica must be >= 1, got {self.gpus_per_replica}")

    @classmethod
    def from_settings(cls, settings: AutoscaleSettings, **kw: object) -> AutoscaleSpec:
        """From the gateway config's ``autoscale`` section."""
        return cls(
            ScaledObject.from_settings(settings),
            StartupDelay.parse(settings.startup),
            settings.pool,
            settings.scrape_interval_s,
            **kw,  # type: ignore[arg-type]
        )

    @classmethod
    def from_file(cls, path: str | Path, **kw: object) -> AutoscaleSpec:
        """From a ScaledObject YAML file (``deploy/keda/scaledobject.yaml``)."""
        return cls(load_scaled_object(path), **kw)  # type: ignore[arg-type]

    def describe(self) -> str:
        return (
            f"KEDA {self.scaled_object.describe()}; start-up {self.startup}; Prometheus "
            f"scrapes every {self.scrape_interval_s:g} s"
        )


@dataclass(frozen=True, slots=True, eq=False)
class AutoscaleTrace:
    """An autoscaled pool over a run: ``samples`` ``(t, asked, ready)`` after each change,
    ``events`` the autoscaler's changes, ``signal`` its scraped values ``(t, value)``,
    ``gpu_seconds`` over ``[0, end_s]``."""

    spec: AutoscaleSpec
    pool: str
    samples: tuple[tuple[float, int, int], ...]
    events: tuple[ScaleEvent, ...]
    signal_t: NDArray[np.float64]
    signal_v: NDArray[np.float64]
    gpu_seconds: float
    end_s: float

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds * self.spec.gpus_per_replica / 3600.0

    @property
    def peak_replicas(self) -> int:
        return max(a for _, a, _ in self.samples)

    def step_series(self, which: int = 1) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(t, count)`` as a step function to ``end_s`` (``which`` 1 asked, 2 ready)."""
        t = [s[0] for s in self.samples] + [self.end_s]
        v = [s[which] for s in self.samples]
        v.append(v[-1])
        return np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)


@dataclass(slots=True)
class _Signals:
    ctl: AdmissionController
    fleet: Fleet
    fresh: list[int]
    pool_name: str
    pool: int
    names: tuple[str, ...]
    seen: dict[int, tuple[float, float]] = field(default_factory=dict)

    def read(self, now: float) -> float:
        total = 0.0
        ready = self.fleet.members[self.pool]
        for name in self.names:
            if name == "queue_depth":
                if len(self.ctl.config.pools) == 1:
                    total += self.ctl.queued
                else:
                    total += self.ctl.status()["pools"][self.pool_name]["queued"]
            elif name == "num_requests_waiting":
                b, f = self.fleet.batchers, self.fresh  # vLLM's gauge: as of the last step
                total += sum(max(0, b[k].num_waiting - f[k]) for k in ready)
            elif name == "kv_cache_usage":
                total += sum(self.fleet.batchers[k].kv_usage for k in ready)
            else:
                total += self._utilization(now, ready)
        return total

    def _utilization(self, now: float, ready: list[int]) -> float:
        out = 0.0
        for k in ready:
            busy = self.fleet.busy_until(k, now)
            t0, b0 = self.seen.get(k, (now, busy))
            self.seen[k] = (now, busy)
            if now > t0:
                out += 100.0 * (busy - b0) / (now - t0)
        return out


@dataclass(slots=True)
class _Attached:
    spec: AutoscaleSpec
    pool_name: str
    auto: Autoscaling
    keda: KedaAutoscaler | None
    signal_t: list[float]
    signal_v: list[float]

    def finish(self, end_s: float) -> AutoscaleTrace:
        end = max(end_s, self.spec.horizon_s)
        events = self.keda.events if self.keda is not None else _events_of(self.auto.scaler)
        return AutoscaleTrace(
            spec=self.spec,
            pool=self.pool_name,
            samples=tuple(self.auto.replicas.samples),
            events=tuple(events),
            signal_t=np.asarray(self.signal_t, dtype=np.float64),
            signal_v=np.asarray(self.signal_v, dtype=np.float64),
            gpu_seconds=self.auto.replicas.gpu_seconds(end),
            end_s=end,
        )


def _events_of(scaler: Scaler) -> list[ScaleEvent]:
    events = getattr(scaler, "events", [])
    return list(events) if isinstance(events, list) else []


def attach(
    spec: AutoscaleSpec,
    ctl: AdmissionController,
    fleet: Fleet,
    scrapes: EngineScrapes,
    pool_names: Sequence[str],
    configured_replicas: int,
    seed: int,
) -> _Attached:
    """Make ``spec``'s pool of ``fleet`` dynamic (used by ``run_simulation``): adopt its
    engines as ready replicas, make its limits per engine (a pool that gives
    ``max_in_flight`` for ``configured_replicas`` engines gets that share per engine), wire
    the signal and the scaler."""
    name = spec.pool or pool_names[0]
    if name not in pool_names:
        raise PolicyError(f"autoscale pool {name!r} is not in the policy's pools")
    j = list(pool_names).index(name)
    cap = ctl.pool_capacity(name)
    if cap.per_engine_slots is None:
        cap.per_engine_slots = max(1, cap.max_in_flight // configured_replicas)
    if cap.per_engine_tokens is None and cap.max_tokens is not None:
        cap.per_engine_tokens = max(1, cap.max_tokens // configured_replicas)
    rng = np.random.default_rng([seed, 0x5CA1E])
    pool = ReplicaPool(spec.startup, rng, lambda: fleet.add(j))
    pool.adopt(0.0, list(fleet.members[j]))
    so = spec.scaled_object
    keda = None if spec.scaler is not None else KedaAutoscaler(so)
    scaler: Scaler = spec.scaler if spec.scaler is not None else keda  # type: ignore[assignment]
    signals = _Signals(ctl, fleet, scrapes.fresh, name, j, so.signals)
    sig_t: list[float] = []
    sig_v: list[float] = []

    def record(t: float, v: float) -> None:
        sig_t.append(t)
        sig_v.append(v)
        if keda is not None:
            keda.prometheus.record(t, v)

    auto = Autoscaling(
        pool=j,
        scaler=scaler,
        replicas=pool,
        scrape_interval_s=spec.scrape_interval_s,
        signal=signals.read,
        record=record,
    )
    return _Attached(spec, name, auto, keda, sig_t, sig_v)
