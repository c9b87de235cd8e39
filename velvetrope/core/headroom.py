"""Headroom for tiers with a TTFT objective: a higher tier never waits for capacity the
engines could give it now (:class:`TierHeadroom`), and lower tiers dispatch under ceilings
that tighten while a higher tier's first tokens come late (:class:`LowerTierCeiling`).

The saturation rule (:mod:`velvetrope.core.saturation`) holds every dispatch while the
engines queue more than ``max_waiting`` requests of their own: the gateway keeps the backlog
where it can order, shed and cancel it.  For a job whose tier has a TTFT objective that brake
can cost the objective: the engines would start it within its TTFT, but the gateway waits for
a reading that shows room.  :class:`TierHeadroom` is the exception, asked only when the rule
holds (:meth:`~velvetrope.core.saturation.EngineSaturation.allows_dispatch`):

* it counts, per band, the jobs dispatched from the pool that have not produced their first
  token yet (they wait in an engine or are in prefill), and measures the rate at which the
  pool's jobs reach their first token (the engines' *start rate*, over ``window_s``);
* a job may go now when the jobs an engine will start before it, plus itself, are started
  within ``share`` of the TTFT it has left: ``bias × (ahead + 1) / start_rate ≤ share ×
  (arrival + ttft − now)``, where ``bias`` is the measured time to first token of the jobs
  let through over what was predicted for them (smoothed; 1 at first): a prediction that
  proves optimistic, for prompts whose prefill takes long in a full batch, corrects itself.
  When the engines order their own queue by the tier (``ordered``: the
  tier is forwarded as the engine's ``priority``, :mod:`velvetrope.core.engine_priority`)
  only jobs of the same or a higher band are ahead of it; otherwise every job not yet
  started is.  ``share`` (default ½) leaves the rest of the budget to prefill and to
  measurement error.

The top band has one more way past the brake when the engines order their queue by the
tier (:meth:`TierHeadroom.overtakes`): while the engines' readings show more requests
waiting than this pool's top-band jobs not yet begun, the rest are lower-band work that an
engine starts after a top-band job it is sent now.  Holding the job in the gateway would
only make it wait for them too (the brake opens when the engines' queues shrink), so it
goes, one job per lower-band request waiting: the top tier never waits for capacity the
engines would give it now.  That holds whatever the engines' KV caches hold: an engine
whose cache is full starts nothing until running sequences end, and then starts its
highest-priority waiting request first; a top-band job held in the gateway would let the
lower-band requests already waiting there take that room (the start-time rule above, by
contrast, sends nothing to engines whose caches are full, counting the requests sent
since their last reading, and those dispatched and not sent anywhere yet, at what a
running request holds on average: no start time can be
predicted for them, and a burst into a nearly full cache fills it with decodes that a
later top-tier prompt then waits for).  Not a job that would start late even so (the top-band jobs
not yet begun and itself, at the measured start rate, past its TTFT): the gateway keeps
that one, to expire it cleanly or make room for it, rather than spend an engine's prefill
on it.  Only the top band: a middle band's job sent past the brake takes a seat before a
later top-tier arrival could (measured: it cost the top tier).

A tier without a TTFT objective never passes the brake (its objective, if any, is end to end
and waiting in the gateway's queue costs it nothing the engines' queue would not).  Before a
first token has been seen the start rate is unknown and nothing passes: the saturation
rule's slow start decides.  Everything is counted from the controller's events (started,
first token, ended: exactly once each), so nothing can leak.

An engine full of lower-tier work starts a top-tier job only when a running sequence ends
(vLLM's priority scheduler displaces running sequences only when its KV cache runs out), and
a long prefill shares each step with every running decode.  :class:`LowerTierCeiling` keeps
room for the higher tier by measuring what it needs: each higher-tier first token that
comes late (past ``share`` of its TTFT objective) cuts a ceiling on the lower tiers' jobs in
flight; each one in time relaxes it (additive increase, multiplicative decrease, as TCP's
congestion window).  The increase is one slot per ceiling's worth of in-time first tokens
while the engines are busy, and one slot per in-time first token while the pool says they
have room (the caller's ``room``: no engine queueing, every KV cache and the TPOT limit well
short of full): a ceiling cut by one burst then does not hold the lower tiers back for the
rest of a run while the engines sit half empty.  The ceilings and the headroom are the
tiers' objectives at work: a deployment whose higher tiers meet their TTFT never sees a
ceiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from velvetrope.core.event_rate import EventRate
from velvetrope.core.job import Job

__all__ = ["LowerTierCeiling", "TierHeadroom"]

_INF: Final = float("inf")
_DEFAULT_SHARE: Final = 0.5
_DEFAULT_WINDOW_S: Final = 5.0
_BIAS_GAIN: Final = 0.1  # smoothing of the prediction's measured error
_MIN_BIAS: Final = 0.25
_MAX_BIAS: Final = 20.0


class TierHeadroom:
    """The headroom rule of one pool; see the module docstring."""

    __slots__ = (
        "_firsts",
        "_passed",
        "_top_starts",
        "_top_ttft",
        "_waiting",
        "_where",
        "bias",
        "ordered",
        "overtakes_count",
        "passes",
        "share",
        "ttft",
        "window_s",
    )

    def __init__(
        self,
        ttft_by_tier: Mapping[str, float | None],
        *,
        ordered: bool,
        share: float = _DEFAULT_SHARE,
        window_s: float = _DEFAULT_WINDOW_S,
    ) -> None:
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}
        self.ordered = ordered
        self.share = share
        self.window_s = window_s
        self.passes = 0
        """Dispatches let past the saturation brake by the start-time rule (cumulative)."""
        self.overtakes_count = 0
        """Top-band dispatches let past the brake ahead of lower-band requests waiting in
        ordered engines (:meth:`overtakes`; cumulative)."""
        self._waiting: dict[int, int] = {}
        self._where: dict[str, int] = {}
        self._firsts = EventRate(window_s)
        self._top_starts = EventRate(window_s)
        self._top_ttft = _INF  # the tightest TTFT objective of a top-band job seen
        self._passed: dict[str, tuple[float, float]] = {}  # job id -> (passed at, predicted)
        self.bias = 1.0
        """Measured over predicted time to first token of the jobs let through (smoothed):
        the prediction's error, which later predictions are corrected by."""

    def retarget(self, ttft_by_tier: Mapping[str, float | None]) -> None:
        """Take the tiers' TTFT objectives of a reloaded policy (counts are kept)."""
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}
        self._top_ttft = _INF

    # -- events ------------------------------------------------------------------------

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched: it waits for its first token in its band."""
        band = job.band
        self._where[job.id] = band
        self._waiting[band] = self._waiting.get(band, 0) + 1
        if band == 0:
            ttft = self.ttft.get(job.tier)
            if ttft is not None:
                self._top_starts.add(now)
                self._top_ttft = min(self._top_ttft, ttft)

    def first_token(self, job: Job, now: float) -> None:
        """``job`` produced its first token: it has started; one more start measured (and,
        for a job this rule let through, how long its start took against the prediction)."""
        band = self._where.pop(job.id, None)
        if band is not None:
            self._waiting[band] -= 1
        self._firsts.add(now)
        passed = self._passed.pop(job.id, None)
        if passed is not None:
            ratio = (now - passed[0]) / passed[1]
            self.bias = min(_MAX_BIAS, max(_MIN_BIAS, self.bias + _BIAS_GAIN * (ratio - self.bias)))

    def ended(self, job: Job, now: float) -> None:
        """``job`` ended (any outcome); if it never produced a token it stops waiting."""
        band = self._where.pop(job.id, None)
        if band is not None:
            self._waiting[band] -= 1
        self._passed.pop(job.id, None)

    # -- the rule ----------------------------------------------------------------------

    def start_rate(self, now: float) -> float:
        """First tokens per second over the last ``window_s`` (0 before any)."""
        return self._firsts.rate(now)

    def top_reserve(self, now: float) -> float:
        """The top-band jobs (a tier with a TTFT objective) expected to arrive within
        ``share`` of their TTFT objective at the rate they were dispatched over the last
        ``window_s``: what the engines' KV caches keep room for, as requests, while lower
        bands dispatch (:meth:`~velvetrope.core.saturation.EngineSaturation.allows_dispatch`).
        0 before any."""
        rate = self._top_starts.rate(now)
        return 0.0 if rate <= 0.0 else rate * self.share * self._top_ttft

    def top_budget_s(self, now: float) -> float:
        """``share`` of the top band's TTFT objective (the tightest of a top-band job seen)
        while top-band jobs were dispatched over the last ``window_s``: how long a top-tier
        arrival may wait for the prefill ahead of it; ``inf`` without top-tier traffic.
        Lower bands hold while every engine's prefill backlog takes longer
        (:meth:`~velvetrope.core.saturation.EngineSaturation.allows_dispatch`)."""
        if self._top_starts.rate(now) <= 0.0:
            return _INF
        return self.share * self._top_ttft

    def ahead(self, band: int) -> int:
        """Dispatched jobs not yet started that an engine starts before a new job of
        ``band``."""
        if not self.ordered:
            return sum(self._waiting.values())
        return sum(n for b, n in self._waiting.items() if b <= band)

    def overtakes(self, job: Job, engines_waiting: float, now: float) -> bool:
        """Whether ``job`` of the top band (band 0, a tier with a TTFT objective) may pass
        the saturation brake ahead of lower-band work: the engines order their queue by the
        tier, their readings show ``engines_waiting`` requests waiting, at least one more
        than this pool's top-band jobs not yet begun, and at the measured start rate those
        jobs and ``job`` start within the TTFT it has left (an optimistic test: no share, no
        bias; before a start is measured it is not made).  Counts it in
        ``overtakes_count``."""
        if not self.ordered or job.band != 0 or job.tier not in self.ttft:
            return False
        ahead = self.ahead(0)
        if engines_waiting - ahead < 1.0:
            return False
        rate = self.start_rate(now)
        if rate > 0.0 and (ahead + 1) / rate > job.arrival + self.ttft[job.tier] - now:
            return False  # late even so: the gateway keeps it (to expire, or to make room)
        self.overtakes_count += 1
        return True

    def allows_dispatch(self, job: Job, now: float) -> bool:
        """Whether ``job`` may pass the saturation brake (counts it in ``passes``)."""
        ttft = self.ttft.get(job.tier)
        if ttft is None:
            return False
        rate = self.start_rate(now)
        if rate <= 0.0:
            return False
        left = job.arrival + ttft - now
        predicted = (self.ahead(job.band) + 1) / rate
        if predicted * self.bias > self.share * left:
            return False
        self.passes += 1
        self._passed[job.id] = (now, predicted)
        return True


class LowerTierCeiling:
    """Ceilings on lower tiers' dispatches that tighten while a higher tier's first tokens
    come late, and relax while they come in time: the headroom a higher tier needs when the
    engines are full of lower-tier work (module docstring of :mod:`velvetrope.core.headroom`).

    For each band ``b`` whose tier has a TTFT objective, a ceiling ``L_b`` on the pool's
    jobs in flight applies to every job of a lower band (a larger index).  Each first token
    of a band-``b`` job is a sample: late (its TTFT above ``share`` × the objective) cuts
    ``L_b`` to ``(1 − cut)`` × the jobs then in flight; in time raises it by ``1 / L_b``
    (additive increase, multiplicative decrease: about one slot per ``L_b`` first tokens in
    time), or, when the caller says the engines have room, to one more than the larger of
    ``L_b`` and the jobs then in flight (counted in ``quick_relaxes``).  No ceiling before
    the first late sample, and a ceiling that grows past twice the jobs in flight is
    dropped (nothing holds it any more)."""

    __slots__ = ("_ceiling", "cut", "holds", "quick_relaxes", "share", "ttft")

    def __init__(
        self, ttft_by_tier: Mapping[str, float | None], *, share: float, cut: float = 0.1
    ) -> None:
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}
        self.share = share
        self.cut = cut
        self.holds = 0
        self.quick_relaxes = 0
        self._ceiling: dict[int, float] = {}

    def retarget(self, ttft_by_tier: Mapping[str, float | None]) -> None:
        """Take the tiers' TTFT objectives of a reloaded policy (ceilings are kept)."""
        self.ttft = {k: v for k, v in ttft_by_tier.items() if v is not None}

    def active(self) -> bool:
        """Whether some band's ceiling holds the bands below it."""
        return bool(self._ceiling)

    def first_token(self, job: Job, now: float, in_flight: int, room: bool = False) -> None:
        """A first token of ``job``, with ``in_flight`` jobs in the pool: a sample of its
        band's TTFT.  ``room``: the engines have room for more (an in-time sample then
        relaxes the ceiling by a whole slot)."""
        ttft = self.ttft.get(job.tier)
        if ttft is None:
            return
        band = job.band
        ceiling = self._ceiling.get(band)
        if now - job.arrival > self.share * ttft:
            cut = (1.0 - self.cut) * in_flight
            self._ceiling[band] = max(1.0, cut if ceiling is None else min(ceiling, cut))
        elif ceiling is not None:
            if room:
                ceiling = max(ceiling, float(in_flight)) + 1.0
                self.quick_relaxes += 1
            else:
                ceiling += 1.0 / ceiling
            if ceiling > 2.0 * max(1, in_flight):
                del self._ceiling[band]
            else:
                self._ceiling[band] = ceiling

    def ceilings(self) -> dict[int, float]:
        """The ceiling each band's lateness sets on the bands below it."""
        return dict(self._ceiling)

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """Whether ``job`` fits under every ceiling a higher band set (a hold counts in
        ``holds``)."""
        band = job.band
        for b, ceiling in self._ceiling.items():
            if b < band and in_flight + 1 > ceiling:
                self.holds += 1
                return False
        return True
