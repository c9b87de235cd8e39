"""One pool of the admission controller: its queue, capacity, drain meter, adaptive limit
and saturation rule, built from its :class:`~velvetrope.core.policy.PoolPolicy` and kept
across reloads (:meth:`Pool.retake`)."""

from __future__ import annotations

from collections.abc import Callable

from velvetrope.core.capacity import PoolCapacity
from velvetrope.core.estimate import DrainMeter
from velvetrope.core.limit import AdaptiveLimit
from velvetrope.core.policy import PolicyConfig, PoolPolicy
from velvetrope.core.saturation import EngineSaturation
from velvetrope.core.scheduler import Scheduler

__all__ = ["Pool"]


class Pool:
    """A pool's state; ``limit`` is the adaptive in-flight limit (``None`` with a fixed
    one), fed with every dispatched job; ``saturation`` the engines' rule, if enabled."""

    __slots__ = ("capacity", "drain", "limit", "name", "saturation", "sched")

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
        fixed = p.max_in_flight is not None or p.max_in_flight_per_engine is not None
        self.limit: AdaptiveLimit | None = None if fixed else AdaptiveLimit(p.adaptive, now)
        if self.limit is not None:
            self.limit.attach(self.capacity)
        self.saturation: EngineSaturation | None = None
        if config.saturation.enabled:
            rule = self.saturation = EngineSaturation.from_policy(p.name, config.saturation)
            self.capacity.signals.append(rule)
            self.capacity.trackers.append(rule)

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
