"""Output-length estimation and drain-rate measurement.

:class:`WindowQuantile` is the quantile of a sliding window of recent observations (cheap
and adaptive); :class:`P2Quantile` is the P² algorithm of Jain & Chlamtac (CACM 1985), a
running all-time quantile in five markers.  Both use O(1) memory.
Two estimators predict a job's output tokens, both ``min(max_tokens, quantile)`` of what
was observed, and any object with the :class:`OutputEstimator` shape can replace them (a
learned model, an oracle):

* :class:`QuantileEstimator` keeps one window per tenant: every request of a tenant gets
  nearly the same guess (EstimatorPolicy ``kind: tenant``);
* :class:`LengthPredictor` (:mod:`velvetrope.core.predictor`) conditions on what a gateway
  sees of the request: tenant, prompt template, model, ``max_tokens`` and prompt length
  (``kind: predictor``).

:class:`DrainMeter` measures how fast a pool drains work: tokens finished per *busy* second,
smoothed by an EWMA, so that idle gaps do not make a busy pool look slow.
"""

from __future__ import annotations

import math
from typing import Protocol

from velvetrope.core.job import Job

__all__ = ["DrainMeter", "OutputEstimator", "P2Quantile", "QuantileEstimator", "WindowQuantile"]


class P2Quantile:
    """Running estimate of the ``p``-quantile (Jain & Chlamtac's P², five markers).

    Exact for the first five observations; afterwards the middle marker tracks the
    quantile with piecewise-parabolic adjustment.
    """

    __slots__ = ("_dn", "_n", "_np", "_q", "count", "p")

    def __init__(self, p: float) -> None:
        if not 0 < p < 1:
            raise ValueError(f"quantile must be in (0, 1), got {p}")
        self.p = p
        self.count = 0
        self._q: list[float] = []
        self._n = [0, 1, 2, 3, 4]
        self._np = [0.0, 2 * p, 4 * p, 2 + 2 * p, 4.0]
        self._dn = [0.0, p / 2, p, (1 + p) / 2, 1.0]

    def add(self, x: float) -> None:
        """Observe one value."""
        self.count += 1
        q = self._q
        if self.count <= 5:
            q.append(float(x))
            if self.count == 5:
                q.sort()
            return
        n = self._n
        if x < q[0]:
            q[0] = float(x)
            k = 1
        elif x >= q[4]:
            q[4] = float(x)
            k = 4
        elif x < q[2]:
            k = 1 if x < q[1] else 2
        else:
            k = 3 if x < q[3] else 4
        # markers above the cell that received x move up by one
        if k <= 1:
            n[1] += 1
        if k <= 2:
            n[2] += 1
        if k <= 3:
            n[3] += 1
        n[4] += 1
        np_ = self._np
        dn = self._dn
        np_[1] += dn[1]
        np_[2] += dn[2]
        np_[3] += dn[3]
        np_[4] += 1.0
        for i in (1, 2, 3):
            d = np_[i] - n[i]
            ni = n[i]
            if (d >= 1 and n[i + 1] - ni > 1) or (d <= -1 and n[i - 1] - ni < -1):
                s = 1 if d > 0 else -1
                qi = q[i]
                qp = qi + s / (n[i + 1] - n[i - 1]) * (
                    (ni - n[i - 1] + s) * (q[i + 1] - qi) / (n[i + 1] - ni)
                    + (n[i + 1] - ni - s) * (qi - q[i - 1]) / (ni - n[i - 1])
                )
                if q[i - 1] < qp < q[i + 1]:
                    q[i] = qp
                else:
                    q[i] = qi + s * (q[i + s] - qi) / (n[i + s] - ni)
                n[i] = ni + s

    def value(self) -> float:
        """The current estimate; ``nan`` before any observation."""
        if self.count == 0:
            return math.nan
        if self.count < 5:
            s = sorted(self._q)
            return s[min(len(s) - 1, int(self.p * len(s)))]
        return self._q[2]


class OutputEstimator(Protocol):
    """Predicts a job's output tokens from what was seen of jobs like it."""

    def predict(self, job: Job) -> int:
        """Predicted output tokens of ``job``, in ``[1, job.max_tokens]``."""
        ...

    def observe(self, job: Job, output_tokens: int) -> None:
        """Record a finished job's real output length."""
        ...


class WindowQuantile:
    """The ``p``-quantile of the last ``window`` observations.

    The estimate is the quantile of the window as it stood at the last *refresh point*:
    each of the first ``refresh`` observations, then every ``refresh``-th.  So it lags by
    fewer than ``refresh`` observations and follows drift within one window.

    Observations are appended to a history list that is cut back to the last ``window``
    at each refresh point (a move of ``window`` pointers every ``refresh`` observations;
    memory below ``window + refresh``); the sort that turns the window into an
    estimate is done lazily, by the first :meth:`value` after a refresh point, from the
    history as it stood there (the observations since are simply left off).  An estimator
    that observes many windows and reads few sorts only the ones it reads, and never more
    than once per refresh point.
    """

    __slots__ = ("_at", "_hist", "_next", "_p", "_refresh", "_stale", "_value", "count", "window")

    def __init__(self, p: float, window: int = 256, refresh: int = 16) -> None:
        if not 0 < p < 1:
            raise ValueError(f"quantile must be in (0, 1), got {p}")
        self._p = p
        self.window = window
        self._refresh = refresh
        self._hist: list[float] = []
        self._at = 0  # observations at the last refresh point
        self._next = 1  # ... and at the next one
        self._stale = False  # _value is not yet the estimate of the last refresh point
        self._value = math.nan
        self.count = 0

    def add(self, x: float) -> None:
        """Observe one value."""
        self._hist.append(x)
        n = self.count = self.count + 1
        if n < self._next:
            return
        self._at = n  # a refresh point
        self._next = n + 1 if n < self._refresh else n + self._refresh
        self._stale = True
        hist = self._hist
        if len(hist) > self.window:
            del hist[: -self.window]

    def _pick(self, s: list[float]) -> float:
        """The estimate from the window, sorted: its ``⌊p·n⌋``-th value (from 0)."""
        return s[min(len(s) - 1, int(self._p * len(s)))]

    def value(self) -> float:
        """The current estimate; ``nan`` before any observation."""
        if self._stale:
            self._stale = False
            hist = self._hist
            end = len(hist) - (self.count - self._at)
            self._value = self._pick(sorted(hist[max(0, end - self.window) : end]))
        return self._value


class QuantileEstimator:
    """``min(max_tokens, per-tenant running quantile)``; a default before enough data.

    The per-tenant sketch is a :class:`WindowQuantile` over the last 256 outputs (bounded
    memory, follows drift) or, with ``sketch="p2"``, a :class:`P2Quantile` (a stationary
    all-time quantile).
    """

    __slots__ = ("_make", "_min_obs", "_sketches", "default", "quantile")

    def __init__(
        self,
        quantile: float = 0.9,
        default: int = 256,
        min_observations: int = 5,
        sketch: str = "window",
    ):
        if sketch not in ("window", "p2"):
            raise ValueError(f"unknown sketch {sketch!r}; known: window, p2")
        self.quantile = quantile
        self.default = default
        self._min_obs = min_observations
        self._make: type[WindowQuantile] | type[P2Quantile] = (
            WindowQuantile if sketch == "window" else P2Quantile
        )
        self._sketches: dict[str, WindowQuantile | P2Quantile] = {}

    def predict(self, job: Job) -> int:
        sk = self._sketches.get(job.tenant)
        few = sk is None or sk.count < self._min_obs
        guess = self.default if few or sk is None else math.ceil(sk.value())
        return max(1, min(job.max_tokens, guess))

    def observe(self, job: Job, output_tokens: int) -> None:
        sk = self._sketches.get(job.tenant)
        if sk is None:
            sk = self._sketches[job.tenant] = self._make(self.quantile)
        sk.add(output_tokens)


class DrainMeter:
    """Tokens finished per busy second, EWMA-smoothed over windows of ``window_s`` busy time.

    Call :meth:`busy` whenever the number of jobs in flight may change (before the change)
    and :meth:`finished` when a job ends.  ``rate`` is ``None`` until a first window closes,
    unless a prior was given.

    **Turnover.**  Work is counted when it finishes, so while the first jobs sent are still
    running the rate understates the engines: the jobs that finished early are only the
    shortest (Little's law holds over a residence time, not less).  The rate has
    :attr:`turned_over` once as many jobs have ended as were ever in flight at once (a
    prior counts as turned over).  Before that, :meth:`trusted_for` a wait only as long as
    the busy time it was measured over: a rate from a few seconds of short jobs does not
    predict a two-minute wait.
    """

    __slots__ = (
        "_acc",
        "_alpha",
        "_busy",
        "_ended",
        "_last",
        "_peak",
        "_seen",
        "_window",
        "rate",
    )

    def __init__(self, alpha: float = 0.3, window_s: float = 1.0, prior: float | None = None):
        self._alpha = alpha
        self._window = window_s
        self._acc = 0.0
        self._busy = 0.0
        self._last: float | None = None
        self.rate: float | None = prior
        self._peak = 0 if prior is None else -1  # -1: turned over (a prior)
        self._ended = 0
        self._seen = 0.0  # busy seconds measured, all told

    @property
    def turned_over(self) -> bool:
        """Whether as many jobs have ended as were ever in flight at once (see above)."""
        return self._peak < 0

    def trusted_for(self, wait_s: float) -> bool:
        """Whether the rate may predict a wait of ``wait_s`` seconds: it has turned over,
        or it was measured over at least that much busy time."""
        return self._peak < 0 or wait_s <= self._seen

    def busy(self, now: float, in_flight: int) -> None:
        """Account the time since the last call as busy if ``in_flight > 0`` during it."""
        last = self._last
        if last is not None and in_flight > 0 and now > last:
            self._busy += now - last
            self._seen += now - last
        self._last = now
        if in_flight > self._peak >= 0:
            self._peak = in_flight

    def finished(self, tokens: int) -> None:
        """Count ``tokens`` of work completed (one job); close a window when enough busy
        time passed."""
        self._acc += tokens
        peak = self._peak
        if peak >= 0:
            self._ended += 1
            if self._ended >= peak:
                self._peak = -1
        if self._busy >= self._window:
            sample = self._acc / self._busy
            r = self.rate
            self.rate = sample if r is None else r + self._alpha * (sample - r)
            self._acc = 0.0
            self._busy = 0.0

    def finish(self, now: float, in_flight: int, tokens: int) -> None:
        """:meth:`busy` then :meth:`finished`, for a job ending at ``now``."""
        self.busy(now, in_flight)
        self.finished(tokens)

    def seconds_for(self, tokens: float) -> float | None:
        """Predicted seconds to drain ``tokens`` of work, or ``None`` with no rate yet."""
        r = self.rate
        if r is None or r <= 0:
            return None
        return tokens / r
