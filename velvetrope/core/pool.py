"""One pool of the admission controller: its queue, capacity, drain meter, adaptive limit
and saturation rule, built from its :class:`~velvetrope.core.pool_policy.PoolPolicy` and kept
across reloads (:meth:`Pool.retake`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from velvetrope.core.capacity import PoolCapacity
from velvetrope.core.estimate import DrainMeter
from velvetrope.core.first_token_lead import FirstTokenLead
from velvetrope.core.headroom import LowerTierCeiling, TierHeadroom
from velvetrope.core.job import Job
from velvetrope.core.lifecycle import Reason
from velvetrope.core.limit import AdaptiveLimit
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.pool_policy import PoolPolicy
from velvetrope.core.preemption import Preemption
from velvetrope.core.prefill_backlog import PrefillBacklog
from velvetrope.core.saturation import EngineSaturation
from velvetrope.core.scheduler import Scheduler
from velvetrope.core.tpot_limit import TpotLimit

__all__ = ["Pool"]

_DEFAULT_RETRY_S: Final = 1.0


class Pool:
    """A pool's state; ``limit`` is the adaptive in-flight limit (``None`` with a fixed
    one), fed with every dispatched job; ``saturation`` the engines' rule, if enabled."""

    __slots__ = (
        "capacity",
        "ceiling",
        "drain",
        "lead",
        "limit",
        "name",
        "preemption",
        "saturation",
        "sched",
        "tpot_limit",
    )

    def __init__(
        self, p: PoolPolicy, config: PolicyConfig, weight: Callable[[str], float], now: float
    ) -> None:
        self.name = p.name
        self.sched = Scheduler(config, weight)
        self.capacity = PoolCapacity(
            p.name,
            p.in_flight_ceiling,
            p.max_tokens_in_flight,
            per_engine_slots=p.max_in_flight_per_engine,
            per_engine_tokens=p.max_tokens_in_flight_per_engine,
        )
        self.drain = DrainMeter(
            config.drain_ewma_alpha, config.drain_window_s, p.initial_drain_tokens_per_s
        )
        mode = p.limit_mode
        self.limit: AdaptiveLimit | None = None
        if mode == "adaptive":
            self.limit = AdaptiveLimit(p.adaptive, now)
            self.limit.attach(self.capacity)
        self.tpot_limit: TpotLimit | None = None
        if mode == "slo":
            s = p.slo_limit
            tl = self.tpot_limit = TpotLimit(
                _objectives(config, "tpot_s"),
                z=s.tpot_margin_sd,
                half_life=s.half_life,
                min_samples=s.min_samples,
                min_spread=s.min_spread,
                ttft_by_tier=_objectives(config, "ttft_s"),
                share=s.preempt_share,
                window_s=s.start_window_s,
            )
            self.capacity.signals.append(tl)
            self.capacity.listeners.append(tl.engines_changed)
            tl.engines_changed(self.capacity.engines)
        ttft = _objectives(config, "ttft_s")
        self.ceiling: LowerTierCeiling | None = None
        if mode == "slo":
            ce = self.ceiling = LowerTierCeiling(ttft, share=p.slo_limit.headroom_share)
            self.capacity.signals.append(ce)
        self.lead: FirstTokenLead | None = None
        q = p.slo_limit.first_token_quantile
        if mode == "slo" and q is not None:
            self.lead = FirstTokenLead(ttft, quantile=q, window_s=p.slo_limit.start_window_s)
        self.preemption: Preemption | None = None
        if mode == "slo" and p.slo_limit.preempt:
            self.preemption = Preemption(
                ttft, share=p.slo_limit.preempt_share, window_s=p.slo_limit.start_window_s
            )
        self.saturation: EngineSaturation | None = None
        if config.saturation.enabled:
            rule = self.saturation = EngineSaturation.from_policy(p.name, config.saturation)
            self.capacity.signals.append(rule)
            self.capacity.trackers.append(rule)
            rule.backlog = PrefillBacklog(
                ordered=p.engine_priority,
                timed=(t for t, v in ttft.items() if v is not None),
                window_s=p.slo_limit.start_window_s,
            )
            if mode == "slo":
                rule.headroom = TierHeadroom(
                    ttft,
                    ordered=p.engine_priority,
                    share=p.slo_limit.headroom_share,
                    window_s=p.slo_limit.start_window_s,
                )

    def retake(self, p: PoolPolicy, config: PolicyConfig) -> None:
        """Take a reloaded policy's limits and tiers; the queue, counters, drain rate,
        adaptive limit and saturation rule are kept (the reload checked that their
        settings did not change: :func:`~velvetrope.core.reload.restart_needed`)."""
        self.capacity.reshape(
            p.in_flight_ceiling,
            p.max_tokens_in_flight,
            p.max_in_flight_per_engine,
            p.max_tokens_in_flight_per_engine,
        )
        self.sched.retier(config)
        ttft = _objectives(config, "ttft_s")
        if self.tpot_limit is not None:
            self.tpot_limit.retarget(_objectives(config, "tpot_s"), ttft)
        if self.ceiling is not None:
            self.ceiling.retarget(ttft)
        if self.preemption is not None:
            self.preemption.retarget(ttft)
        if self.lead is not None:
            self.lead.retarget(ttft)
        sat = self.saturation
        if sat is not None and sat.headroom is not None:
            sat.headroom.retarget(ttft)

    def acquire(self, job: Job, now: float) -> None:
        """``job`` was dispatched from this pool at ``now``: its slot and tokens are taken,
        and every limit and tracker counts it."""
        cap = self.capacity
        self.drain.busy(now, cap.in_flight)
        cap.in_flight += 1
        cap.tokens += job.cost
        if cap.trackers:
            for t in cap.trackers:
                if isinstance(t, EngineSaturation):  # narrowed: a direct compiled call
                    t.started(job, now)
                else:
                    t.started(job, now)
        self.started(job, now)

    def release(self, job: Job, now: float, tokens: int, output: int, completed: bool) -> None:
        """``job``, dispatched from this pool, left its engine at ``now`` having used
        ``tokens`` (``output`` of them generated; ``completed`` if it ran to its end): its
        slot and tokens are given back, every limit and tracker lets it go."""
        cap = self.capacity
        self.drain.finish(now, cap.in_flight, tokens)
        cap.in_flight -= 1
        cap.tokens -= job.cost
        if cap.trackers:
            for t in cap.trackers:
                if isinstance(t, EngineSaturation):  # narrowed: a direct compiled call
                    t.ended(job, now)
                else:
                    t.ended(job, now)
        self.ended(job, now, output, completed)

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from this pool at ``now`` (its limits count it)."""
        if self.limit is not None:
            self.limit.started(job, now)
        if self.tpot_limit is not None:
            self.tpot_limit.started(job, now)

    def ended(self, job: Job, now: float, output_tokens: int, completed: bool) -> None:
        """``job``, dispatched from this pool, ended at ``now`` (any outcome; ``completed``
        with ``output_tokens``): its limits let it go and take it as a sample."""
        if self.limit is not None:
            self.limit.ended(job, now)
        if self.tpot_limit is not None:
            self.tpot_limit.ended(job, now, output_tokens, completed)
        if self.preemption is not None:
            self.preemption.ended(job, now)

    def first_token(self, job: Job, now: float) -> None:
        """``job``, dispatched from this pool, produced its first token at ``now``: the
        limits that measure it hear of it (the TPOT limit only of streamed responses,
        whose first token is the engine's)."""
        if self.limit is not None:
            self.limit.first_token(job, now)
        if self.lead is not None and job.streamed:
            self.lead.first_token(job, now)
        if self.saturation is not None:
            self.saturation.first_token(job, now)
        if self.tpot_limit is not None and job.streamed:
            self.tpot_limit.first_token(job, now)
        ce = self.ceiling
        if ce is not None:
            n = self.capacity.in_flight
            room = ce.active() and self._engines_have_room(n, ce.share, now)
            ce.first_token(job, now, n, room)
        if self.preemption is not None:
            self.preemption.first_token(job)

    def _engines_have_room(self, in_flight: int, share: float, now: float) -> bool:
        """Whether the engines' readings and the TPOT limit both leave plain room for more:
        no engine queueing, every KV cache under ``share`` of full, and the jobs in flight
        under ``share`` of the TPOT limit (``slo_limit.headroom_share``: the lower-tier
        ceiling then relaxes fast, :class:`~velvetrope.core.headroom.LowerTierCeiling`).
        False without readings."""
        sat = self.saturation
        if sat is None or not sat.slack(now, share):
            return False
        return self.tpot_limit is None or self.tpot_limit.under(in_flight, share)

    def ask_at(self, job: Job) -> float | None:
        """When ``job``, queued, may ask for room (:mod:`velvetrope.core.preemption`) or pass
        the TPOT limit (:mod:`velvetrope.core.tpot_limit`), the earlier; ``None``: never.
        The driver wakes then even if nothing else happens."""
        pre = None if self.preemption is None else self.preemption.ask_at(job)
        tl = None if self.tpot_limit is None else self.tpot_limit.ask_at(job)
        if pre is None:
            return tl
        return pre if tl is None else min(pre, tl)

    def retry_s(self, tokens: float) -> float:
        """``Retry-After`` for a job shed behind ``tokens`` of work: their predicted drain,
        at least one second."""
        s = self.drain.seconds_for(tokens)
        return _DEFAULT_RETRY_S if s is None else max(_DEFAULT_RETRY_S, s)

    def starts_by(self, job: Job, deadline: float | None, now: float) -> float | None:
        """``None`` when ``job``, queued again at the head of its band, is predicted to
        start before ``deadline`` (or has none, or no drain rate is known yet); otherwise
        the ``Retry-After`` it is turned away with."""
        if deadline is None:
            return None
        ahead = self.sched.ahead(job.band)[1]
        eta = self.drain.seconds_for(ahead)
        if now < deadline and (eta is None or now + eta <= deadline):
            return None
        return self.retry_s(ahead)

    def shed(
        self,
        job: Job,
        band: int,
        max_wait: float | None,
        tenant_queued: int,
        tenant_bound: int | None,
        queued: int,
        max_queued: int,
    ) -> tuple[Reason, float | None, str] | None:
        """Why ``job``, which cannot start at once, may not queue in band ``band``: its
        tenant's bound (429), the band's and the global one (503), the predicted wait
        against its tier's ``max_wait`` (503; not while the engines are in slow start, nor
        while the drain rate cannot yet predict a wait that long
        (:meth:`~velvetrope.core.estimate.DrainMeter.trusted_for`), when the rate measured
        so far understates them: the job's deadline still expires it); as ``(reason,
        retry_after_s, message)``, or ``None``: it may queue."""
        sched = self.sched
        if tenant_bound is not None and tenant_queued >= tenant_bound:
            msg = (
                f"tenant {job.tenant!r} already has {tenant_queued} requests queued "
                f"(limit {tenant_bound})"
            )
            return Reason.TENANT_QUEUE_FULL, self.retry_s(sched.tokens), msg
        if sched.band_full(band):
            msg = f"the {sched.bands[band].name!r} band is full"
            return Reason.QUEUE_FULL, self.retry_s(sched.tokens), msg
        if queued >= max_queued:
            return Reason.QUEUE_FULL, self.retry_s(sched.tokens), "the queue is full"
        ahead = sched.ahead(band)[1]
        eta = self.drain.seconds_for(ahead)
        if max_wait is not None and max_wait <= 0.0:
            msg = "the request may not wait (do-not-queue, or its deadline passed) and cannot start"
            return Reason.WAIT_EXCEEDS_SLO, self.retry_s(ahead), msg
        sat = self.saturation
        if max_wait is not None and eta is not None and eta > max_wait:
            if not self.drain.trusted_for(max_wait):  # the first jobs' rate understates
                return None
            if sat is not None and sat.warming(job.arrival):  # asked as the job arrives
                return None  # a rate measured in slow start understates the engines
            msg = (
                f"predicted wait {eta:.2f}s exceeds the {job.tier!r} tier's max_wait {max_wait:g}s"
            )
            return Reason.WAIT_EXCEEDS_SLO, max(_DEFAULT_RETRY_S, eta - max_wait), msg
        return None

    def in_flight_limit(self) -> int:
        """The most this pool lets be in flight now: the adaptive limit, else the TPOT
        limit where it is known (within the ceiling), else the fixed count or ceiling."""
        if self.limit is not None:
            return self.limit.value
        cap = self.capacity
        tl = self.tpot_limit
        if tl is not None:
            per = tl.per_engine()
            if per != float("inf"):
                return min(cap.max_in_flight, int(per * cap.engines))
        return cap.max_in_flight

    def status(self, now: float) -> dict[str, Any]:
        """Its queue by band, work in flight against its limits, engines, drain rate; in
        ``limit: slo`` mode the TPOT limit's fit, the headroom's passes and overtakes and
        the tiers' leads to their first token at ``now``."""
        cap = self.capacity
        return {
            "queued": self.sched.queued,
            "queued_tokens": self.sched.tokens,
            "bands": {b.name: {"queued": len(b), "tokens": b.tokens} for b in self.sched.bands},
            "in_flight": cap.in_flight,
            "tokens_in_flight": cap.tokens,
            "max_in_flight": self.in_flight_limit(),
            "max_tokens_in_flight": cap.max_tokens,
            "engines": cap.engines,
            "drain_tokens_per_s": self.drain.rate,
            "tpot_limit": None if self.tpot_limit is None else self.tpot_limit.status(),
            "lower_tier_ceilings": None
            if self.ceiling is None
            else {str(b): c for b, c in self.ceiling.ceilings().items()},
            "lower_tier_ceiling_quick_relaxes": None
            if self.ceiling is None
            else self.ceiling.quick_relaxes,
            "preemptions": None if self.preemption is None else self.preemption.count,
            "first_token_leads": None if self.lead is None else self.lead.status(now),
            "headroom_passes": None
            if self.saturation is None or self.saturation.headroom is None
            else self.saturation.headroom.passes,
            "headroom_overtakes": None
            if self.saturation is None or self.saturation.headroom is None
            else self.saturation.headroom.overtakes_count,
            "top_reserve_holds": None
            if self.saturation is None or self.saturation.headroom is None
            else self.saturation.reserve_holds,
            "prefill_holds": None
            if self.saturation is None or self.saturation.headroom is None
            else self.saturation.prefill_holds,
        }


def _objectives(config: PolicyConfig, field: str) -> dict[str, float | None]:
    """Each tier's ``slo.<field>`` (``None`` where the tier states none)."""
    return {t.name: None if t.slo is None else getattr(t.slo, field) for t in config.tiers}
