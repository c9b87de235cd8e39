"""An in-flight limit from the tiers' TPOT objectives and the engines' measured decode speed.

A continuously batching engine decodes every running sequence once per step, and a step
takes longer the more sequences it holds: time per output token grows with the batch.  The
most a pool may hold in flight, as far as per-token latency goes, is therefore the batch at
which the measured TPOT reaches the tightest TPOT objective among the requests it runs.
:class:`TpotLimit` learns that batch from what the gateway sees of every streamed response,
with no profile of the engine:

* each completed job with at least two output tokens gives a sample ``(n, tpot)``: its TPOT
  ``(end − first token) / (output − 1)`` and ``n``, the pool's mean number of jobs in flight
  per live engine while it decoded (an exact time integral of the in-flight count, kept
  from the controller's start and end events);
* an exponentially weighted least-squares line ``tpot ≈ a + b·n`` is fitted to the samples
  (each sample's weight decays by half every ``half_life`` samples, so the fit follows a
  change of model, hardware or traffic mix);
* the limit per engine is ``n* = (τ − z·σ − a) / b``, where ``τ`` is the tightest TPOT
  objective among the tiers with work in flight and the job's own tier, and ``σ`` the
  weighted standard deviation of the samples around the line: requests of one batch do
  not all see the same TPOT (a prefill in the batch slows the steps it shares), so the line
  is held ``z`` (default 3) of those deviations below the objective, a margin that the
  measured spread sets, not a constant.

The limit binds only when it is known: until ``min_samples`` samples spanning at least
``min_spread`` sequences per engine have been seen, or while the fitted slope is not
positive (decode time grows with the batch by less than 0.1% of its mean over the range
seen), or when no tier has a TPOT objective, :meth:`TpotLimit.allows_dispatch` lets everything
through and the engines' saturation readings (:mod:`velvetrope.core.saturation`) are the
brake.  How fast it is known: after start, once ``min_samples`` streamed responses have
completed across that spread; after a load step, within about ``half_life`` completions
(the old samples' weight halves).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from velvetrope.core.job import Job

__all__ = ["TpotLimit"]

_INF: Final = math.inf


class TpotLimit:
    """The TPOT-derived in-flight limit of one pool; see the module docstring."""

    __slots__ = (
        "_area",
        "_at",
        "_fit",
        "_marks",
        "_n",
        "_running",
        "_sw",
        "_swx",
        "_swxx",
        "_swxy",
        "_swy",
        "_swyy",
        "_xmax",
        "_xmin",
        "decay",
        "engines",
        "holds",
        "min_samples",
        "min_spread",
        "samples",
        "tpot",
        "z",
    )

    def __init__(
        self,
        tpot_by_tier: Mapping[str, float | None],
        *,
        z: float = 3.0,
        half_life: float = 200.0,
        min_samples: int = 30,
        min_spread: float = 4.0,
    ) -> None:
        self.tpot = {k: v for k, v in tpot_by_tier.items() if v is not None}
        self.z = z
        self.decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self.min_spread = min_spread
        self.engines = 1
        self.samples = 0
        self.holds = 0
        """Dispatches held by this limit (cumulative)."""
        self._n = 0  # jobs in flight in the pool
        self._at = 0.0  # time of the last change of _n
        self._area = 0.0  # integral of _n / engines over time
        self._marks: dict[str, float] = {}  # job id -> _area at its first token
        self._running: dict[str, int] = {}  # tier -> jobs in flight
        self._sw = self._swx = self._swy = self._swxx = self._swxy = self._swyy = 0.0
        self._xmin = _INF
        self._xmax = -_INF
        self._fit: tuple[float, float, float] | None = None

    # -- the in-flight integral --------------------------------------------------------

    def _advance(self, now: float) -> float:
        if now > self._at:
            self._area += (now - self._at) * self._n / max(1, self.engines)
            self._at = now
        return self._area

    def retarget(self, tpot_by_tier: Mapping[str, float | None]) -> None:
        """Take the tiers' TPOT objectives of a reloaded policy (the fit is kept)."""
        self.tpot = {k: v for k, v in tpot_by_tier.items() if v is not None}

    def status(self) -> dict[str, float | int | None]:
        """The fit, the limit per engine now and the counters, for ``/admin/status``."""
        fit = self.fit()
        per = self.per_engine()
        return {
            "tpot_base_s": None if fit is None else fit[0],
            "tpot_per_seq_s": None if fit is None else fit[1],
            "tpot_sd_s": None if fit is None else fit[2],
            "per_engine": None if per == _INF else per,
            "target_tpot_s": self.target_s(),
            "samples": self.samples,
            "holds": self.holds,
        }

    def engines_changed(self, engines: int) -> None:
        """The pool has ``engines`` live engines now (in-flight counts per engine follow)."""
        self._advance(self._at)
        self.engines = max(1, engines)

    # -- events ------------------------------------------------------------------------

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from the pool."""
        self._advance(now)
        self._n += 1
        tier = job.tier
        self._running[tier] = self._running.get(tier, 0) + 1

    def first_token(self, job: Job, now: float) -> None:
        """``job`` produced its first token: its decode starts now."""
        self._marks[job.id] = self._advance(now)

    def ended(self, job: Job, now: float, output_tokens: int, completed: bool) -> None:
        """``job`` ended; a completed streamed job of two tokens or more is a sample."""
        area = self._advance(now)
        self._n -= 1
        tier = job.tier
        self._running[tier] -= 1
        mark = self._marks.pop(job.id, None)
        first = job.first_token_at
        if not completed or mark is None or first is None or output_tokens < 2:
            return
        span = now - first
        if span <= 0.0:
            return
        self._observe((area - mark) / span, span / (output_tokens - 1))

    def _observe(self, x: float, y: float) -> None:
        d = self.decay
        self._sw = self._sw * d + 1.0
        self._swx = self._swx * d + x
        self._swy = self._swy * d + y
        self._swxx = self._swxx * d + x * x
        self._swxy = self._swxy * d + x * y
        self._swyy = self._swyy * d + y * y
        self.samples += 1
        self._xmin = min(self._xmin, x)
        self._xmax = max(self._xmax, x)
        self._fit = self._solve()

    # -- the rule ----------------------------------------------------------------------

    def fit(self) -> tuple[float, float, float] | None:
        """``(a, b, σ)``: ``tpot ≈ a + b·n`` (``n`` per engine) and the samples' standard
        deviation around it; ``None`` while unknown (solved once per sample, not per
        dispatch)."""
        return self._fit

    def _solve(self) -> tuple[float, float, float] | None:
        if self.samples < self.min_samples or self._xmax - self._xmin < self.min_spread:
            return None
        sw = self._sw
        mx = self._swx / sw
        my = self._swy / sw
        var = self._swxx / sw - mx * mx
        if var <= 1e-12:
            return None
        cov = self._swxy / sw - mx * my
        b = cov / var
        if b * (self._xmax - self._xmin) <= 1e-3 * my:  # flat (or falling) over the range
            return None
        resid = max(0.0, self._swyy / sw - my * my - b * cov)
        return my - b * mx, b, math.sqrt(resid)

    def target_s(self, tier: str | None = None) -> float | None:
        """The tightest TPOT objective among tiers with work in flight (and ``tier``)."""
        best = _INF
        for name, t in self.tpot.items():
            if t < best and (name == tier or self._running.get(name, 0) > 0):
                best = t
        return None if best == _INF else best

    def per_engine(self, tier: str | None = None) -> float:
        """The limit per live engine now (``inf``: not known, or no TPOT objective)."""
        target = self.target_s(tier)
        if target is None:
            return _INF
        fit = self.fit()
        if fit is None:
            return _INF
        a, b, sd = fit
        return max(1.0, (target - self.z * sd - a) / b)

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """Whether one more job (``job``) keeps the pool within the limit."""
        if in_flight + 1 <= self.per_engine(job.tier) * self.engines:
            return True
        self.holds += 1
        return False
