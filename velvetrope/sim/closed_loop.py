"""Closed-loop runs: a fixed number of clients, each sending its next request the moment
the previous one finishes, through the admission core onto modelled engines.

This is how an engine's throughput curve is measured (one point per concurrency, as
:func:`~velvetrope.sim.capacity.replica_capacity` does for one replica) and how an
adaptive in-flight limit is watched finding the knee of that curve: with more clients
than the knee the gateway always has a queue, so the limit alone decides how much runs.

:func:`run_closed_loop` drives a real :class:`~velvetrope.core.controller.AdmissionController`
in virtual time (a :class:`~velvetrope.clock.ManualClock`) over ``replicas`` real
:class:`~velvetrope.engine.Batcher` s of one pool, routing each dispatched job to the
least-loaded live replica.  ``changes`` resize the pool during the run: ``(t, n)`` makes
``n`` replicas live from ``t`` on; a replica taken out gets no new work and finishes what
it holds (a drained scale-down), one added starts empty.  With ``rescale=True`` the pool is
told its live engines (:meth:`~velvetrope.core.capacity.PoolCapacity.set_engines`, at the
start and at each change), as a gateway whose capacity follows the fleet tells it, and an
adaptive limit scales with them; without it the limit has to notice.

:func:`knee_sweep` measures the knee as the adaptive limit defines it
(:mod:`velvetrope.core.limit`): one closed-loop run per fixed concurrency, each giving its
throughput and the mean number of jobs waiting for their first token ``q``; the knee is
the concurrency at which the slope ``dq/dc`` between neighbouring points reaches
``gradient`` (by default half of each extra job in flight waits: an engine queue forms),
interpolated linearly between the midpoints of the steps around the crossing.

Requests are ``(prompt, output)`` pairs drawn with replacement from ``pairs`` (seeded).
The run samples, every ``sample_s`` seconds, the limit in force, the jobs in flight and the
completions so far.  Deterministic: the same inputs give the same result.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, Dispatched, Job, PolicyConfig, Usage
from velvetrope.engine import Batcher, EngineEvent, EngineProfile, Finished, FirstToken
from velvetrope.errors import PolicyError
from velvetrope.store.memory import MemoryStore

__all__ = ["ClosedLoopResult", "KneeSweep", "find_knee", "knee_sweep", "run_closed_loop"]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ClosedLoopResult:
    """Samples of a closed-loop run, one per ``sample_s`` seconds from ``sample_s`` on.

    ``limit`` is the in-flight limit in force at the sample (the adaptive limit's value, or
    the fixed ``max_in_flight``), ``base`` the adaptive limit's base (``nan`` when fixed);
    ``in_flight`` (dispatched, not finished) and ``awaiting`` (dispatched, no first token
    yet) are time averages over the interval ending at the sample; ``completed`` counts
    the jobs finished so far, ``tokens`` their output tokens.
    """

    times: FloatArray
    limit: FloatArray
    base: FloatArray
    in_flight: FloatArray
    awaiting: FloatArray
    completed: FloatArray
    tokens: FloatArray

    def throughput(self, start: float, end: float) -> float:
        """Completed jobs per second between the samples nearest ``start`` and ``end``."""
        i = int(np.searchsorted(self.times, start))
        j = int(np.searchsorted(self.times, end)) - 1
        if j <= i:
            raise PolicyError(f"no two samples between {start} and {end}")
        return float((self.completed[j] - self.completed[i]) / (self.times[j] - self.times[i]))

    def mean(self, name: str, start: float, end: float) -> float:
        """The mean of series ``name`` (``limit``, ``base``, ``in_flight``, ``awaiting``)
        over the samples in ``(start, end]``."""
        m = (self.times > start) & (self.times <= end)
        if not m.any():
            raise PolicyError(f"no sample between {start} and {end}")
        return float(getattr(self, name)[m].mean())


def run_closed_loop(
    config: PolicyConfig,
    profile: EngineProfile,
    pairs: Sequence[tuple[int, int]],
    *,
    replicas: int,
    clients: int,
    duration_s: float,
    changes: Sequence[tuple[float, int]] = (),
    rescale: bool = False,
    sample_s: float = 1.0,
    seed: int = 0,
) -> ClosedLoopResult:
    """Run ``clients`` closed-loop clients for ``duration_s`` seconds (module docstring).

    ``config`` must have one pool; its ``max_in_flight`` (or adaptive limit) is what is
    studied.  Every pair must fit ``profile.max_model_len``.
    """
    if len(config.pools) != 1:
        raise PolicyError("a closed-loop run takes a config with exactly one pool")
    if replicas < 1 or clients < 1 or not duration_s > 0 or not sample_s > 0:
        raise PolicyError("replicas and clients must be >= 1, duration_s and sample_s > 0")
    if not pairs:
        raise PolicyError("no (prompt, output) pairs to draw from")
    for p, o in pairs:
        if p < 1 or o < 1 or p + o > profile.max_model_len:
            raise PolicyError(f"pair ({p}, {o}) does not fit the engine")
    plan = sorted(changes)
    for t, n in plan:
        if n < 1 or not t >= 0:
            raise PolicyError(f"bad change ({t}, {n}): need t >= 0 and n >= 1")
    clock = ManualClock(0.0)
    store = MemoryStore(clock)  # the buckets, settled as the gateway settles them
    ctl = AdmissionController(config, clock, observers=[store.settle])
    pool = config.pools[0].name
    limit = ctl.pool_limit(pool)
    fixed = ctl.pool_capacity(pool).max_in_flight
    rng = np.random.default_rng(seed)
    prompts = [p for p, _ in pairs]
    outputs = [o for _, o in pairs]
    batchers: list[Batcher] = [Batcher(profile, token_events=False) for _ in range(replicas)]
    live = replicas
    load = [0] * replicas
    pend: list[list[EngineEvent]] = [[] for _ in range(replicas)]
    heap: list[tuple[float, int]] = []
    busy = [False] * replicas
    draws = rng.integers(0, len(pairs), size=clients * 64).tolist()
    if rescale:
        ctl.pool_capacity(pool).set_engines(replicas)
    counter = 0
    completed = 0
    tokens = 0
    awaiting = 0  # dispatched, no first token yet
    area_c = area_q = 0.0  # integrals of ctl.in_flight and awaiting since the last sample
    t_last = 0.0

    def submit(now: float) -> None:
        nonlocal counter, draws
        if counter >= len(draws):
            draws = draws + rng.integers(0, len(pairs), size=len(draws)).tolist()
        j = draws[counter]
        job = Job(str(counter), "client", "default", prompts[j], outputs[j], pool=pool)
        job.predicted_output = outputs[j]
        counter += 1
        d = store.arrive(ctl, job)
        if isinstance(d, Dispatched):
            launch(job, now)
        launch_ready(now)

    def launch(job: Job, now: float) -> None:
        nonlocal awaiting
        awaiting += 1
        k = min(range(live), key=lambda i: (load[i], i))
        batchers[k].add(job.id, job.prompt_tokens, job.max_tokens, now)
        load[k] += 1
        if not busy[k]:  # an idle replica starts a step at once
            busy[k] = True
            pend[k] = []
            heapq.heappush(heap, (now, k))

    def launch_ready(now: float) -> None:
        for job in ctl.dispatchable():
            launch(job, now)

    samples: list[tuple[float, ...]] = []
    next_sample = sample_s
    ci = 0
    for _ in range(clients):
        submit(0.0)
    while True:
        t_step = heap[0][0] if heap else math.inf
        t_change = plan[ci][0] if ci < len(plan) else math.inf
        t = min(t_step, t_change, next_sample)
        if t > duration_s:
            break
        clock.set(t)
        area_c += ctl.in_flight * (t - t_last)
        area_q += awaiting * (t - t_last)
        t_last = t
        if t == t_step:  # a step ends: deliver its events, start the next one
            k = heap[0][1]
            for e in pend[k]:
                if type(e) is FirstToken:
                    ctl.first_token(e.seq_id)
                    awaiting -= 1
                elif type(e) is Finished:
                    ctl.complete(e.seq_id, Usage(e.prompt_tokens, e.output_tokens))
                    load[k] -= 1
                    completed += 1
                    tokens += e.output_tokens
                    submit(t)
            b = batchers[k]
            if b.has_work:
                res = b.step(t)
                pend[k] = res.events
                heapq.heapreplace(heap, (t + res.duration, k))
            else:
                heapq.heappop(heap)
                busy[k] = False
        elif t == t_change:
            n = plan[ci][1]
            ci += 1
            while len(batchers) < n:
                batchers.append(Batcher(profile, token_events=False))
                load.append(0)
                busy.append(False)
                pend.append([])
            if rescale:
                ctl.pool_capacity(pool).set_engines(n)
            live = n
            launch_ready(t)
        else:
            val = float(limit.value) if limit is not None else float(fixed)
            base = limit.base if limit is not None else math.nan
            mean_c, mean_q = area_c / sample_s, area_q / sample_s
            samples.append((t, val, base, mean_c, mean_q, float(completed), float(tokens)))
            area_c = area_q = 0.0
            next_sample += sample_s
    cols = np.asarray(samples, dtype=np.float64).reshape(-1, 7).T
    return ClosedLoopResult(*(np.ascontiguousarray(c) for c in cols))


@dataclass(frozen=True, slots=True)
class KneeSweep:
    """A closed-loop sweep over fixed concurrencies (see :func:`knee_sweep`).

    Per point: the limit, the mean in flight, the mean waiting for a first token and the
    throughput (jobs/s); ``knee`` is the interpolated knee (``nan`` if no step of the sweep
    reaches ``gradient``), ``best`` the highest throughput of the sweep.
    """

    limits: tuple[int, ...]
    in_flight: tuple[float, ...]
    awaiting: tuple[float, ...]
    throughput: tuple[float, ...]
    gradient: float
    knee: float

    @property
    def best(self) -> float:
        return max(self.throughput)

    def throughput_at(self, concurrency: float) -> float:
        """Throughput interpolated linearly in the sweep's mean in flight."""
        return float(np.interp(concurrency, self.in_flight, self.throughput))


def find_knee(in_flight: Sequence[float], awaiting: Sequence[float], gradient: float) -> float:
    """The concurrency where ``d awaiting / d in_flight`` reaches ``gradient``: slopes are
    taken between neighbouring points (sorted by ``in_flight``) and placed at their
    midpoints; the crossing is interpolated between the last midpoint below ``gradient``
    and the first at or above it (``nan`` if none is)."""
    pts = sorted(zip(in_flight, awaiting, strict=True))
    mids: list[float] = []
    slopes: list[float] = []
    for (c0, q0), (c1, q1) in itertools.pairwise(pts):
        if c1 - c0 > 1e-9:
            mids.append((c0 + c1) / 2)
            slopes.append((q1 - q0) / (c1 - c0))
    for i, (m, g) in enumerate(zip(mids, slopes, strict=True)):
        if g >= gradient:
            if i == 0:
                return m
            m0, g0 = mids[i - 1], slopes[i - 1]
            return m0 + (m - m0) * (gradient - g0) / (g - g0)
    return math.nan


def knee_sweep(
    profile: EngineProfile,
    pairs: Sequence[tuple[int, int]],
    limits: Sequence[int],
    *,
    replicas: int = 1,
    duration_s: float = 300.0,
    warmup_s: float = 60.0,
    gradient: float = 0.5,
    seed: int = 0,
) -> KneeSweep:
    """Closed-loop runs at each fixed pool limit of ``limits`` (FIFO, more clients than the
    limit so that the gateway always holds a queue); measured over ``(warmup_s,
    duration_s]``.  See the module docstring for the knee."""
    if not 0 <= warmup_s < duration_s:
        raise PolicyError("need 0 <= warmup_s < duration_s")
    cs, qs, xs = [], [], []
    for lim in limits:
        cfg = PolicyConfig.model_validate(
            {
                "preset": "fifo",
                "queue": {"max_queued": 1 << 40},
                "pools": [{"name": "default", "max_in_flight": lim}],
            }
        )
        res = run_closed_loop(
            cfg,
            profile,
            pairs,
            replicas=replicas,
            clients=lim + max(8, lim // 4),
            duration_s=duration_s,
            seed=seed,
        )
        cs.append(res.mean("in_flight", warmup_s, duration_s))
        qs.append(res.mean("awaiting", warmup_s, duration_s))
        xs.append(res.throughput(warmup_s, duration_s))
    return KneeSweep(
        tuple(limits), tuple(cs), tuple(qs), tuple(xs), gradient, find_knee(cs, qs, gradient)
    )
