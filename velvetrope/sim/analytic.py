"""The analytic mode: Poisson arrivals, ``c`` servers, no batching, service times from a
distribution, every queueing decision made by the real admission core.

It exists to check the policy code against queueing theory.  :func:`run_analytic` builds a
:class:`~velvetrope.core.controller.AdmissionController` from a preset (``fifo``, ``sjf``,
...) with one pool whose ``max_in_flight`` is the number of servers ``c`` and an unbounded
queue, and drives it with a :class:`~velvetrope.clock.ManualClock`: each arrival goes to
``ctl.arrive``; an admitted job occupies a server for its service time; each completion goes
to ``ctl.complete`` and the jobs ``ctl.dispatchable()`` then releases take the free servers.
So the queue discipline (and its capacity gating) is exactly the core's, and the means can be
compared with the closed forms of :mod:`velvetrope.planner.queueing` and
:mod:`velvetrope.planner.queueing_general`:

* FCFS, one server: Pollaczek–Khinchine
  (:func:`~velvetrope.planner.queueing_general.mg1_response_mean`);
* non-preemptive SJF with known sizes, one server: Phipps
  (:func:`~velvetrope.planner.queueing_general.mg1_sjf_waits`);
* FCFS, ``c`` servers, exponential service: Erlang C
  (:func:`~velvetrope.planner.queueing.mmc_response_mean`).

Service distributions (:class:`ServiceDist`): :class:`ExponentialService` (continuous; its
jobs all declare size 1, so a size-based policy sees no difference between them) and
:class:`TokenService` (a job of ``k`` output tokens takes ``k × seconds_per_token``; sizes
drawn from an empirical distribution such as a trace's output lengths, and known to the core
as ``predicted_output`` by the chosen :mod:`~velvetrope.sim.lengths` knowledge: the oracle
gives SJF the exact size, as Phipps assumes; ties are served FCFS, as in the formula).

Ties in time: a completion at the instant of an arrival is processed first.  The first
``warmup`` jobs are left out of the means.  The cyclic garbage collector is paused during the
run.  Cost: about 10 µs per job (``bench/sim_validate.py`` runs 10⁶ jobs per case).
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, Dispatched, Job, PolicyConfig, Usage
from velvetrope.errors import PolicyError
from velvetrope.sim.lengths import LengthKnowledge, parse_lengths, predicted_outputs
from velvetrope.sim.seeds import Seed, as_generator

__all__ = [
    "AnalyticResult",
    "ExponentialService",
    "ServiceDist",
    "TokenService",
    "analytic_config",
    "run_analytic",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class ServiceDist(Protocol):
    """A service-time distribution with known moments."""

    @property
    def mean(self) -> float:
        """E[S], seconds."""
        ...

    @property
    def second_moment(self) -> float:
        """E[S²], seconds²."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> tuple[FloatArray, IntArray]:
        """``n`` service times (seconds) and the sizes (tokens, ``>= 1``) the core is told."""
        ...


@dataclass(frozen=True, slots=True)
class ExponentialService:
    """Exponential service with mean ``mean_s``; every job has size 1."""

    mean_s: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_s) and self.mean_s > 0):
            raise PolicyError(f"mean_s must be finite and > 0, got {self.mean_s!r}")

    @property
    def mean(self) -> float:
        return self.mean_s

    @property
    def second_moment(self) -> float:
        return 2.0 * self.mean_s**2

    def sample(self, rng: np.random.Generator, n: int) -> tuple[FloatArray, IntArray]:
        return rng.exponential(self.mean_s, n), np.ones(n, dtype=np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class TokenService:
    """Service ``k × seconds_per_token`` for a size ``k`` drawn uniformly from ``sizes``.

    ``sizes``: token counts ``>= 1`` (e.g. a trace's output lengths); the distribution is
    their empirical one, so its moments are exact: ``mean = u·mean(k)``, ``E[S²] = u²·mean(k²)``.
    """

    sizes: IntArray = field(repr=False)
    seconds_per_token: float

    def __init__(self, sizes: Sequence[int] | IntArray, seconds_per_token: float) -> None:
        arr = np.asarray(sizes, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0 or bool(np.any(arr < 1)):
            raise PolicyError("sizes must be a non-empty 1-D array of integers >= 1")
        if not (math.isfinite(seconds_per_token) and seconds_per_token > 0):
            raise PolicyError(f"seconds_per_token must be > 0, got {seconds_per_token!r}")
        object.__setattr__(self, "sizes", arr)
        object.__setattr__(self, "seconds_per_token", float(seconds_per_token))

    @classmethod
    def with_mean(cls, sizes: Sequence[int] | IntArray, mean_s: float = 1.0) -> TokenService:
        """Scaled so that the mean service time is ``mean_s``."""
        arr = np.asarray(sizes, dtype=np.int64)
        return cls(arr, mean_s / float(arr.mean()))

    @property
    def mean(self) -> float:
        return self.seconds_per_token * float(self.sizes.mean())

    @property
    def second_moment(self) -> float:
        k = self.sizes.astype(np.float64)
        return self.seconds_per_token**2 * float(np.dot(k, k)) / k.size

    def service_times(self) -> FloatArray:
        """The support, one service time per entry of ``sizes`` (for Phipps's formula)."""
        return self.sizes.astype(np.float64) * self.seconds_per_token

    def sample(self, rng: np.random.Generator, n: int) -> tuple[FloatArray, IntArray]:
        k = self.sizes[rng.integers(0, self.sizes.size, size=n)]
        return k.astype(np.float64) * self.seconds_per_token, k


@dataclass(frozen=True, slots=True, eq=False)
class AnalyticResult:
    """Per-job times of an analytic run (arrival order) and their means after warm-up.

    ``response = end − arrival``, ``wait = start − arrival``, ``sizes`` as told to the core.
    """

    lam: float
    servers: int
    rho: float
    warmup: int
    arrival: FloatArray
    start: FloatArray
    end: FloatArray
    sizes: IntArray

    @property
    def response(self) -> FloatArray:
        return self.end - self.arrival

    @property
    def wait(self) -> FloatArray:
        return self.start - self.arrival

    @property
    def mean_response(self) -> float:
        return float(self.response[self.warmup :].mean())

    @property
    def mean_wait(self) -> float:
        return float(self.wait[self.warmup :].mean())

    def response_stderr(self, batches: int = 20) -> float:
        """Standard error of :attr:`mean_response` by the method of batch means: the jobs
        after warm-up cut into ``batches`` consecutive batches, whose means are nearly
        independent when each batch is much longer than the queue's relaxation time."""
        r = self.response[self.warmup :]
        if batches < 2 or r.size < batches:
            raise PolicyError(f"need 2 <= batches <= jobs, got {batches} for {r.size} jobs")
        means = np.array([b.mean() for b in np.array_split(r, batches)])
        return float(means.std(ddof=1) / math.sqrt(batches))


def analytic_config(
    policy: str, servers: int, queue: Mapping[str, Any] | None = None
) -> PolicyConfig:
    """Preset ``policy`` with one pool of ``servers`` slots, an unbounded queue, no buckets."""
    return PolicyConfig.model_validate(
        {
            "preset": policy,
            "queue": {"max_queued": 1 << 62, **(queue or {})},
            "pools": [{"name": "default", "max_in_flight": servers}],
        }
    )


def run_analytic(
    policy: str,
    service: ServiceDist,
    *,
    rho: float,
    n_jobs: int,
    servers: int = 1,
    seed: Seed = 0,
    lengths: str | LengthKnowledge = "oracle",
    warmup: int = 0,
    queue: Mapping[str, Any] | None = None,
) -> AnalyticResult:
    """Run ``n_jobs`` Poisson arrivals at utilisation ``rho`` (``λ = rho·c / E[S]``) through
    preset ``policy`` on ``servers`` servers; see the module docstring.

    ``queue`` adds :class:`~velvetrope.core.policy.QueuePolicy` fields (e.g. ``aging_s``).
    The same seed gives the same result.
    """
    if not (0 < rho < 1):
        raise PolicyError(f"rho must be in (0, 1), got {rho!r}")
    if n_jobs < 1 or not (0 <= warmup < n_jobs):
        raise PolicyError("n_jobs must be >= 1 and 0 <= warmup < n_jobs")
    if isinstance(servers, bool) or servers < 1:
        raise PolicyError(f"servers must be >= 1, got {servers!r}")
    rng = as_generator(seed)
    lam = rho * servers / service.mean
    arrival = np.cumsum(rng.exponential(1.0 / lam, n_jobs))
    svc, sizes = service.sample(rng, n_jobs)
    cap = int(sizes.max())
    preds = predicted_outputs(parse_lengths(lengths), sizes, np.full(n_jobs, cap), rng)
    clock = ManualClock(0.0)
    ctl = AdmissionController(analytic_config(policy, servers, queue), clock)
    arr = arrival.tolist()
    svc_l = svc.tolist()
    size_l = sizes.tolist()
    start = [math.nan] * n_jobs
    end = [math.nan] * n_jobs
    heap: list[tuple[float, int]] = []
    set_clock = clock.set
    arrive = ctl.arrive
    complete = ctl.complete
    dispatchable = ctl.dispatchable
    heappush = heapq.heappush
    heappop = heapq.heappop

    def finish_until(t: float) -> None:
        while heap and heap[0][0] <= t:
            td, j = heappop(heap)
            set_clock(td)
            complete(str(j), Usage(0, size_l[j]))
            end[j] = td
            for job in dispatchable():
                k = int(job.id)
                start[k] = td
                heappush(heap, (td + svc_l[k], k))

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for idx in range(n_jobs):
            ta = arr[idx]
            if heap and heap[0][0] <= ta:
                finish_until(ta)
            set_clock(ta)
            d = arrive(Job(str(idx), "t", "default", 0, cap, predicted_output=preds[idx]))
            if d.__class__ is Dispatched:
                start[idx] = ta
                heappush(heap, (ta + svc_l[idx], idx))
        finish_until(math.inf)
    finally:
        if was_enabled:
            gc.enable()
    return AnalyticResult(
        lam=lam,
        servers=servers,
        rho=rho,
        warmup=warmup,
        arrival=arrival,
        start=np.asarray(start, dtype=np.float64),
        end=np.asarray(end, dtype=np.float64),
        sizes=sizes,
    )
