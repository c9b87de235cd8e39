"""An in-flight limit from the tiers' TPOT objectives and the engines' measured decode speed.

A continuously batching engine decodes every running sequence once per step, and a step
takes longer the more sequences it holds and the more prefill it shares: time per output
token grows with the batch.  The most a pool may hold in flight, as far as per-token latency
goes, is therefore the batch at which the measured TPOT reaches the tightest TPOT objective
among the requests it runs.  :class:`TpotLimit` learns that batch from what the gateway sees
of every streamed response, with no profile of the engine:

* each completed job with at least two output tokens gives a sample ``(n, p, tpot)``: its
  TPOT ``(end − first token) / (output − 1)``; ``n``, the pool's mean number of jobs in
  flight per live engine while it decoded (an exact time integral of the in-flight count,
  kept from the controller's start and end events); and ``p``, the prompt tokens the pool's
  engines prefilled per engine meanwhile (those of the jobs whose first token came in that
  span, or, for a response not streamed, that were dispatched in it), per decode step of the
  job;
* the samples are fitted as ``tpot ≈ a + b·n + c·p`` by weighted least squares
  (:mod:`velvetrope.core.tpot_fit`): a sample weighs its decode steps, up to 32, and its
  weight decays by half every ``half_life`` samples, so the fit follows a change of model,
  hardware or traffic mix;
* the limit per engine is the largest ``n`` at which the TPOT predicted for it, with the
  prefill growing with the batch up to the most seen, plus ``z`` (default 3) standard
  deviations of the samples around the prediction (the prefill's share of them growing with
  the batch: :mod:`velvetrope.core.tpot_fit`), reaches ``τ``, the tightest TPOT
  objective among the tiers with work in flight and the job's own tier: requests of one
  batch do not all see the same TPOT (a prefill in the batch slows the steps it shares), so
  the margin is the measured spread, not a constant.

The top tier does not wait on the limit for its first token.  Early in a run the fit has
few samples and the limit can fall well below what the pool already holds (on a slow
engine, to half of it), and then nothing goes until the lower tiers' jobs in flight end:
seconds in which every top-tier arrival would miss its TTFT objective waiting for a limit
that guards its TPOT.  So a job of the top band (band 0) whose
tier has a TTFT objective, once it has waited ``share`` of that objective (the moment it
asks for room, :meth:`TpotLimit.ask_at`; :mod:`velvetrope.core.preemption` uses the same),
passes the limit when waiting would cost it the objective, that is when the pool, at the
rate its jobs end (measured over ``window_s``), would not fall under the limit within the
TTFT the job has left, and while the top band's own jobs in flight are under the limit.
The lower bands still wait for the pool to fall under the limit, so it gets there as their
jobs end, and the top tier meanwhile decodes in a batch somewhat above its objective rather
than miss its first token.  When the fit predicts the objective missed even at a batch of
one per engine with the samples' own spread (early in a run whose prompts fill the
engines' steps, the spread of the first samples alone can exceed the objective; the limit
then stands where the spread that narrows below the samples' batch puts it, at least 1 per
engine: :mod:`velvetrope.core.tpot_fit`), the top band's own count does not hold its
pass: holding it would cost it its first token for certain, on a prediction that rests on
batches smaller than any seen.  A pool just over the limit, whose jobs
end fast enough, keeps the job for the next slot.  Counted in ``top_passes``.

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

from velvetrope.core.event_rate import EventRate
from velvetrope.core.job import Job
from velvetrope.core.tpot_fit import TpotFit, TpotSamples

__all__ = ["TpotLimit"]

_INF: Final = math.inf
_MAX_WEIGHT_STEPS: Final = 32.0
"""A sample's weight is its decode steps up to this many: a longer decode's TPOT and prefill
are means over more steps, but steps close together share their batch and prefill, so
beyond a few dozen more steps say little more."""


class TpotLimit:
    """The TPOT-derived in-flight limit of one pool; see the module docstring."""

    __slots__ = (
        "_area",
        "_at",
        "_ends",
        "_fit",
        "_marks",
        "_n",
        "_prefilled",
        "_running",
        "_samples",
        "_top",
        "engines",
        "holds",
        "share",
        "top_passes",
        "tpot",
        "ttft",
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
        ttft_by_tier: Mapping[str, float | None] | None = None,
        share: float = 0.5,
        window_s: float = 5.0,
    ) -> None:
        self.tpot = {k: v for k, v in tpot_by_tier.items() if v is not None}
        self.ttft = {k: v for k, v in (ttft_by_tier or {}).items() if v is not None}
        """The TTFT objectives, for the top band's pass (none: no pass)."""
        self.share = share
        self.top_passes = 0
        """Top-band dispatches let past the limit after waiting ``share`` of their TTFT."""
        self._top = 0  # top-band (band 0) jobs in flight
        self._ends = EventRate(window_s)
        self.z = z
        self.engines = 1
        """Live engines in the pool, at least 1 (:meth:`engines_changed`)."""
        self.holds = 0
        """Dispatches held by this limit (cumulative)."""
        self._n = 0  # jobs in flight in the pool
        self._at = 0.0  # time of the last change of _n
        self._area = 0.0  # integral of _n / engines over time
        self._marks: dict[str, tuple[float, float]] = {}
        """Job id -> ``(_area, _prefilled)`` at its first token (its own prefill included)."""
        self._prefilled = 0.0  # prompt tokens prefilled per engine (cumulative)
        self._running: dict[str, int] = {}  # tier -> jobs in flight
        self._samples = TpotSamples(
            half_life=half_life, min_samples=min_samples, min_spread=min_spread
        )
        self._fit: TpotFit | None = None

    @property
    def samples(self) -> int:
        """Samples taken (completed streamed responses of two tokens or more)."""
        return self._samples.count

    # -- the in-flight integral --------------------------------------------------------

    def _advance(self, now: float) -> float:
        if now > self._at:
            self._area += (now - self._at) * self._n / self.engines
            self._at = now
        return self._area

    def retarget(
        self,
        tpot_by_tier: Mapping[str, float | None],
        ttft_by_tier: Mapping[str, float | None] | None = None,
    ) -> None:
        """Take the tiers' TPOT (and TTFT) objectives of a reloaded policy (the fit is
        kept)."""
        self.tpot = {k: v for k, v in tpot_by_tier.items() if v is not None}
        if ttft_by_tier is not None:
            self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}

    def status(self) -> dict[str, float | int | None]:
        """The fit, the limit per engine now (``out_of_reach``: the fit predicts the
        objective missed even at one per engine, :meth:`out_of_reach`) and the counters,
        for ``/admin/status``."""
        fit = self.fit()
        per = self.per_engine()
        return {
            "tpot_base_s": None if fit is None else fit.base_s,
            "tpot_per_seq_s": None if fit is None else fit.per_seq_s,
            "tpot_per_prefill_token_s": None if fit is None else fit.per_prefill_token_s,
            "prefill_per_seq": None if fit is None else fit.prefill_per_seq,
            "prefill_max_per_step": None if fit is None else fit.prefill_max,
            "tpot_sd_s": None if fit is None else fit.sd_s,
            "tpot_line_sd_s": None if fit is None else fit.line_sd_s,
            "prefill_var_per_seq": None if fit is None else fit.prefill_var_per_seq,
            "per_engine": None if per == _INF else per,
            "target_tpot_s": self.target_s(),
            "out_of_reach": self.out_of_reach(),
            "samples": self.samples,
            "holds": self.holds,
            "top_passes": self.top_passes,
        }

    def engines_changed(self, engines: int) -> None:
        """The pool has ``engines`` live engines now (in-flight counts per engine follow)."""
        self._advance(self._at)
        self.engines = max(1, engines)

    # -- events ------------------------------------------------------------------------

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from the pool (a response not streamed counts as
        prefilled now: no first token will say when)."""
        self._advance(now)
        self._n += 1
        if job.band == 0:
            self._top += 1
        tier = job.tier
        self._running[tier] = self._running.get(tier, 0) + 1
        if not job.streamed:
            self._prefilled += job.prompt_tokens / self.engines

    def first_token(self, job: Job, now: float) -> None:
        """``job`` produced its first token: its prompt is prefilled, its decode starts."""
        area = self._advance(now)
        self._prefilled += job.prompt_tokens / self.engines  # before its decode
        self._marks[job.id] = (area, self._prefilled)

    def ended(self, job: Job, now: float, output_tokens: int, completed: bool) -> None:
        """``job`` ended; a completed streamed job of two tokens or more is a sample."""
        area = self._advance(now)
        self._n -= 1
        self._ends.add(now)
        if job.band == 0:
            self._top -= 1
        tier = job.tier
        self._running[tier] -= 1
        mark = self._marks.pop(job.id, None)
        first = job.first_token_at
        if not completed or mark is None or first is None:
            return
        at_area, prefilled = mark
        span = now - first
        if output_tokens < 2 or span <= 0.0:
            return
        steps = output_tokens - 1
        self._samples.add(
            (area - at_area) / span,
            (self._prefilled - prefilled) / steps,
            span / steps,
            min(float(steps), _MAX_WEIGHT_STEPS),
        )
        self._fit = self._samples.solve()

    # -- the rule ----------------------------------------------------------------------

    def fit(self) -> TpotFit | None:
        """The fit of the samples (:mod:`velvetrope.core.tpot_fit`); ``None`` while unknown
        (solved once per sample, not per dispatch)."""
        return self._fit

    def target_s(self, tier: str | None = None) -> float | None:
        """The tightest TPOT objective among tiers with work in flight (and ``tier``)."""
        best = _INF
        for name, t in self.tpot.items():
            if t < best and (name == tier or self._running.get(name, 0) > 0):
                best = t
        return None if best == _INF else best

    def _reach(self, tier: str | None, uniform: bool = False) -> float:
        """The fit's :meth:`~velvetrope.core.tpot_fit.TpotFit.reach` (``uniform``: its
        :meth:`~velvetrope.core.tpot_fit.TpotFit.reach_uniform`) for the objective
        (:meth:`target_s` with ``tier``), not floored (``inf``: not known, or no TPOT
        objective)."""
        target = self.target_s(tier)
        fit = self._fit
        if target is None or fit is None:
            return _INF
        if uniform:
            return fit.reach_uniform(target, self.z)
        return fit.reach(target, self.z)

    def per_engine(self, tier: str | None = None) -> float:
        """The limit per live engine now (``inf``: not known, or no TPOT objective)."""
        return max(1.0, self._reach(tier))

    def under(self, in_flight: int, share: float) -> bool:
        """Whether ``in_flight`` jobs are under ``share`` of the pool's limit now (true while
        the limit is not known)."""
        return in_flight < share * self.per_engine() * self.engines

    def out_of_reach(self, tier: str | None = None) -> bool:
        """Whether the fit predicts the objective (:meth:`target_s` with ``tier``) missed
        even at a batch of one per engine with the samples' own spread
        (:meth:`~velvetrope.core.tpot_fit.TpotFit.reach_uniform`: no narrower spread
        extrapolated below their batch)."""
        return self._reach(tier, uniform=True) < 1.0

    def ask_at(self, job: Job) -> float | None:
        """When ``job``, queued, may pass the limit (``None``: never, it is not of the top
        band or its tier has no TTFT objective): the driver wakes then."""
        ttft = self.ttft.get(job.tier)
        if ttft is None or job.band != 0:
            return None
        return job.arrival + self.share * ttft

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """Whether one more job (``job``) keeps the pool within the limit, or is a top-band
        job that has waited its share of its TTFT and would miss it waiting for the pool
        to fall under the limit, with the top band's own jobs under it or the objective
        out of the fit's reach at any batch (module docstring)."""
        limit = self.per_engine(job.tier) * self.engines
        if in_flight + 1 <= limit:
            return True
        ask = self.ask_at(job)
        if (
            ask is not None
            and now >= ask
            and (self._top + 1 <= limit or self.out_of_reach(job.tier))
        ):
            rate = self._ends.rate(now)
            left = job.arrival + self.ttft[job.tier] - now
            if rate <= 0.0 or (in_flight + 1 - limit) / rate > left:
                self.top_passes += 1
                return True
        self.holds += 1
        return False
