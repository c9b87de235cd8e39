"""An adaptive in-flight limit per pool: it finds and tracks the knee of the pool's
throughput curve from per-token latencies, in the core (sans-IO, time passed in).

Why not a fixed ``max_in_flight``: a continuously batching engine's throughput rises with
the number of requests in flight (a bigger batch amortises each step's fixed cost) until
its KV cache or its per-step token budget is full.  Past that **knee** more in flight only
queues inside the engine, where the gateway can no longer order it, and every sequence's
time per output token grows; below it, throughput is lost.  The knee moves with the
model, the GPU, the traffic's length mix and the number of engines, so no fixed number is
right for long.

Background, and what is taken from it
-------------------------------------
Netflix's *concurrency-limits* library treats a service's concurrency like a TCP
congestion window.  Its **Vegas** limit (after TCP Vegas, Brakmo & Peterson 1994) keeps
the lowest latency seen as the no-load latency, estimates the queue as ``limit × (1 −
rtt_noload / rtt)``, grows the limit while that estimate is under a small ``alpha`` and
shrinks it over ``beta``.  Its **Gradient2** limit compares a short-term latency with an
exponentially smoothed long-term one, ``gradient = clamp(long / short, 0.5, 1)``, and
sets ``limit ← limit × gradient + queue_size`` with smoothing: the limit creeps up while
latency holds and is cut in proportion when latency rises.  Both skip growth while the
service is "app limited" (far fewer requests in flight than the limit), and Vegas probes
now and then to refresh its reference.

Neither transfers as is.  Their premise is a server whose latency is flat until a queue
forms, so that any rise in latency is a queue.  A batching engine's time per output token
rises with the batch *before* anything queues, and that rise buys throughput: Vegas would
read it as a queue and stop at a few dozen sequences, far below the knee; Gradient2's
long-term average follows the rise and lets the limit creep past the knee.  What is kept:
an explicit estimate of the queue (Vegas), measured against a reference the limit takes
itself; multiplicative, clamped steps (Gradient2); probing above the current limit; and
no growth while app limited.

The signal: the engine's queue, from time to first token
--------------------------------------------------------
Latency is normalised per token so that the mix of request sizes cancels out.  Time per
output token is the batch's step time: it grows with the batch below the knee and stops
growing past it (the batch is full), so it cannot tell a bigger batch from a queue.  Time
to first token can: below the knee it is a prefill (a few steps, per prompt token about
constant), past it the job first waits for room in the batch.  By Little's law, the mean
number of jobs dispatched and still waiting for their first token, ``q``, is the rate of
first tokens times the mean time to first token; the limit integrates that count exactly
from the dispatch and first-token events.  Below the knee ``q`` is what prefill holds,
small and growing slowly with concurrency ``c``; past the knee every extra job in flight
waits, so ``dq/dc`` climbs to 1.  **The knee is where ``dq/dc`` reaches ``gradient``
(default 1/2: half of each extra job in flight waits).**  Throughput there is the
plateau's (the bench and the tests measure it with a sweep of fixed limits:
:func:`~velvetrope.sim.closed_loop.knee_sweep`).

The control loop
----------------
Windows alternate between the *base* limit and a *probe* at ``probe_gain ×`` base, so
every pair of windows measures the slope ``Δq / Δc`` at the pair's midpoint: a gradient
estimate with a deliberate perturbation (extremum seeking).  A rise of the limit is paced
(``ramp`` slots per job that ends, so the extra prefills trickle in), and each window is
measured only after the limit reached its value (risen, or drained after a fall) and the
move settled for as long as it took: what a move stirs up says nothing of the steady
state.  Each pair moves the estimate (see :meth:`AdaptiveLimit._step`): far below the
knee (no queue at all) by the largest step, ``max_step``; deep past it (the base window
alone holds more waiting jobs than the probe adds) by the largest step down, to where the
hinge puts the knee; near it by ``(gradient / slope)^gain``, a small step because the
slope is noisy (pooled over the last few pairs).  Base and probe then straddle the
estimate.  When engines join, the probe finds no queue and the limit grows; when they
leave, the queue shows in both windows and it shrinks: it re-converges without being
told, and :meth:`AdaptiveLimit.rescale` lets a driver that knows the fleet changed
(capacity per engine × live engines) jump there.

Windows during which the pool never reached its limit (app limited: demand below the
limit) are measured but never a reason to grow.  ``floor`` and ``ceiling`` bound the
limit at all times; the limit in force (``value``) is an integer and :meth:`allows_dispatch` lets
a job start while fewer than that many are in flight.  Responses that are not streamed
(a :class:`~velvetrope.core.job.Job` says whether it is ``streamed``: the gateway sees
their first token only at the end) count in flight but never as waiting.  With no streamed
response at all the limit sees no queue and grows to its ceiling; the engines' saturation
signal is then the brake.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final

from velvetrope.core.capacity import PoolCapacity
from velvetrope.core.job import Job
from velvetrope.core.lifecycle import JobState
from velvetrope.core.limit_policy import AdaptiveLimitPolicy

__all__ = ["AdaptiveLimit", "LimitPoint"]

_COMPLETED: Final = JobState.COMPLETED


@dataclass(frozen=True, slots=True)
class LimitPoint:
    """One closed window: the mean in flight, the mean number of jobs dispatched and
    waiting for their first token (by Little's law, the window's summed time to first
    token over its length), the limit in force, whether it was a probe and whether the
    limit bound (not app limited)."""

    at: float
    in_flight: float
    queue: float
    limit: int
    probe: bool
    limited: bool


class AdaptiveLimit:
    """A pool's in-flight limit that tracks the knee of its throughput curve.

    A :class:`~velvetrope.core.capacity.SaturationSignal` (:meth:`allows_dispatch`) fed with each
    dispatched job's lifecycle: :meth:`started` at dispatch, :meth:`first_token`,
    :meth:`ended` at its terminal state (any outcome).  Every call passes the time; the
    limit never reads a clock.  ``history`` keeps the recent windows.
    """

    __slots__ = (
        "_awaiting",
        "_base",
        "_c_area",
        "_credit",
        "_engines",
        "_goal",
        "_in_flight",
        "_limited_s",
        "_moved_at",
        "_pair",
        "_probe",
        "_q_area",
        "_slopes",
        "_t",
        "_w_jobs",
        "_w_start",
        "history",
        "knee",
        "settings",
        "value",
    )

    def __init__(self, settings: AdaptiveLimitPolicy | None = None, now: float = 0.0) -> None:
        s = settings if settings is not None else AdaptiveLimitPolicy()
        self.settings = s
        self._base = self._clamp(s.initial)
        self.knee = self._base * (1 + s.probe_gain) / 2
        """The current estimate of the knee (in flight), between base and probe limits."""
        self._probe = False
        self.value = self._goal = self._round(self._base)
        self._in_flight = 0
        self._awaiting = 0
        self._t = now
        self._moved_at = now
        self._credit = 0.0
        self._engines = 1
        self._pair: LimitPoint | None = None
        self._slopes: deque[tuple[float, float]] = deque(maxlen=s.pairs)
        self.history: deque[LimitPoint] = deque(maxlen=s.history)
        self._start_window(now)

    # -- the signal ------------------------------------------------------------------

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """Whether one more job may start with ``in_flight`` already running."""
        return in_flight < self.value

    @property
    def base(self) -> float:
        """The base limit (the limit in force outside probe windows), unrounded."""
        return self._base

    def attach(self, capacity: PoolCapacity) -> None:
        """Brake ``capacity``'s dispatch and hear of its live engines."""
        capacity.signals.append(self)
        capacity.listeners.append(self.engines_changed)

    def engines_changed(self, engines: int) -> None:
        """The pool now has ``engines`` live engines (its
        :class:`~velvetrope.core.capacity.PoolCapacity` tells it): the limit scales by the
        change since the last count above zero.  It starts for one engine, so ``initial``
        is per engine; with none live it is left alone."""
        if engines > 0 and engines != self._engines:
            self.rescale(engines / self._engines)
            self._engines = engines

    def rescale(self, factor: float) -> None:
        """Multiply the limit by ``factor`` at once (the pool's engines changed by that
        factor: capacity per engine × live engines) and start a fresh pair of windows."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        self._set_base(self._base * factor)
        self._pair = None
        self._slopes.clear()
        self._probe = False
        self.value = self._goal = self._round(self._base)
        self._start_window(self._t)

    # -- the feed --------------------------------------------------------------------

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched at ``now``."""
        self._advance(now)
        self._in_flight += 1
        if job.streamed:
            self._awaiting += 1

    def first_token(self, job: Job, now: float) -> None:
        """``job`` produced its first token at ``now`` (call once per job)."""
        if not job.streamed:
            return  # recorded at the end: the whole job, not a wait
        self._advance(now)
        self._awaiting = max(0, self._awaiting - 1)
        self._count(now)

    def _count(self, now: float) -> None:
        """One more job measured; close the window when it is long and full enough."""
        if now >= self._w_start:
            self._w_jobs += 1
            s = self.settings
            if now - self._w_start >= s.window_s and self._w_jobs >= s.min_jobs:
                self._close(now)

    def ended(self, job: Job, now: float) -> None:
        """``job``, dispatched earlier, reached its terminal state at ``now``."""
        self._advance(now)
        self._in_flight = max(0, self._in_flight - 1)
        if job.streamed and job.first_token_at is None:
            self._awaiting = max(0, self._awaiting - 1)
        elif not job.streamed and job.state is _COMPLETED:
            self._count(now)
        if self._w_start == math.inf:
            if self.value < self._goal:
                # a rise is paced: ``ramp`` more slots per job that ends, so the extra
                # prefills trickle in rather than arrive all at once
                if self._in_flight < self.value - 1:
                    self.value = self._goal
                else:
                    self._credit += self.settings.ramp
                    step = int(self._credit)
                    self._credit -= step
                    self.value = min(self._goal, self.value + step)
            if self.value == self._goal and self._in_flight <= self.value:
                # risen, or drained after a fall: what the move stirred up settles for as
                # long as the move took
                self._start_window(now, max(self.settings.settle_s, now - self._moved_at))

    # -- internals -------------------------------------------------------------------

    def _clamp(self, x: float) -> float:
        s = self.settings
        return min(float(s.ceiling), max(float(s.floor), x))

    def _round(self, x: float) -> int:
        s = self.settings
        return max(s.floor, min(s.ceiling, int(x + 0.5)))

    def _set_base(self, x: float) -> None:
        self._base = self._clamp(x)
        self.knee = self._base * (1 + self.settings.probe_gain) / 2

    def _start_window(self, now: float, settle: float | None = None) -> None:
        """Measure from ``settle`` (default ``settle_s``) after ``now``: a limit that just
        rose started extra prefills whose waits say nothing of the steady state."""
        self._w_start = now + (self.settings.settle_s if settle is None else settle)
        self._c_area = 0.0
        self._q_area = 0.0
        self._w_jobs = 0
        self._limited_s = 0.0

    def _advance(self, now: float) -> None:
        t = self._t if self._t > self._w_start else self._w_start
        dt = now - t
        if dt > 0:
            self._c_area += self._in_flight * dt
            self._q_area += self._awaiting * dt
            if self._in_flight >= self.value:
                self._limited_s += dt
        if now > self._t:
            self._t = now

    def _close(self, now: float) -> None:
        s = self.settings
        span = now - self._w_start
        c = self._c_area / span
        q = max(0.0, self._q_area) / span
        limited = self._limited_s >= 0.5 * span
        point = LimitPoint(now, c, q, self.value, self._probe, limited)
        self.history.append(point)
        self._start_window(now)
        if not self._probe:
            self._pair = point
            self._probe = True
            self._move(self._round(self._base * s.probe_gain), now)
            return
        low = self._pair
        self._pair = None
        self._probe = False
        if low is not None and limited:
            self._step(low, point)
        self._move(self._round(self._base), now)

    def _move(self, goal: int, now: float) -> None:
        """Set the limit to ``goal``: at once downward, paced upward (see :meth:`ended`);
        the next window is measured once it is reached."""
        self._goal = goal
        self._moved_at = now
        self._credit = 0.0
        if goal <= self.value:
            self.value = goal
        if self.value < goal or self._in_flight > goal:
            self._w_start = math.inf  # measure once risen (paced) or drained

    def _step(self, low: LimitPoint, high: LimitPoint) -> None:
        """One pair of windows measured: move the limit toward the knee.

        The pair's slope ``s = Δq / Δc`` is how many of the probe's extra jobs in flight
        waited for a first token; it is the curve's slope at the pair's midpoint ``m``.
        The knee is where the slope is ``gradient``: a slope under it puts the knee above
        ``m``, over it below.  Near the knee the estimate moves to ``m · (gradient /
        s)^gain``, a small step since the slope is noisy (``s`` pooled over the last
        ``pairs`` pairs near the knee: ``ΣΔq / ΣΔc``).  Far from it the step is the
        largest allowed, ``max_step``: up when the probe found no queue at all (a slope
        under a tenth of ``gradient``: the engines have room, as after engines joined),
        and down toward ``c − (q − q0)`` when the base window alone already held more
        waiting jobs than the probe adds (``q0``, the fewest waiting in recent windows, is
        what prefill alone keeps waiting; past the knee each extra job waits, as after
        engines left).  The base then goes where base and probe straddle the estimate."""
        st = self.settings
        dc = high.in_flight - low.in_flight
        if dc < 0.25 * (st.probe_gain - 1) * low.in_flight:
            return  # the probe did not raise what ran: nothing learnt
        dq = high.queue - low.queue
        slope = dq / dc
        mid = (low.in_flight + high.in_flight) / 2
        q0 = min(p.queue for p in self.history)
        excess = low.queue - q0
        if slope < st.gradient / 10:
            knee = mid * st.max_step
            self._slopes.clear()
        elif excess > (st.probe_gain - 1) * low.in_flight:
            knee = low.in_flight - excess
            self._slopes.clear()
        else:
            self._slopes.append((dq, dc))
            pooled = sum((a for a, _ in self._slopes), 0.0) / sum((b for _, b in self._slopes), 0.0)
            pooled = max(pooled, st.gradient / 10)
            knee = mid * math.exp(st.gain * math.log(st.gradient / pooled))
        knee = min(mid * st.max_step, max(mid / st.max_step, knee))
        self._set_base(knee * 2 / (1 + st.probe_gain))
