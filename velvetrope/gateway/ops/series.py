"""The numbers behind the gateway's request-path metrics, and the updates one request makes.

:class:`CounterChild` and :class:`HistogramChild` hold one labelled series of a counter and
of a histogram; :mod:`velvetrope.gateway.ops.counters` names them, keeps them by label values
and exposes them at scrape time.  :class:`RequestCounting` makes every update a request
causes: the routing decision and its degradations (:meth:`RequestCounting.on_route`) and
the terminal outcome (:meth:`RequestCounting.on_outcome`: requests, queue wait, time to
first token, end-to-end latency, tokens reserved and settled).  Each finds every series it
updates with one dictionary lookup; the series are made on first use by the factories it
is given.

This module imports nothing outside the core, so ``setup.py`` compiles it with mypyc like
the core's modules: an outcome's updates run as one compiled call from the controller's
observer loop.  Not for use from several threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from velvetrope.core.job import Job, Outcome
from velvetrope.core.lifecycle import JobState, Reason

__all__ = ["CounterChild", "HistogramChild", "OutcomeSeries", "RequestCounting"]


class CounterChild:
    """One labelled series of a counter (``value`` may be added to directly)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    """One labelled series of a histogram: ``counts[i]`` observations in bucket ``i``
    (at most ``bounds[i]``; the last bucket is above every bound) and their ``sum``."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = 0
        for bound in self.bounds:  # a few dozen at most: a compiled scan beats a bisect call
            if value <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value


OutcomeSeries = tuple[
    CounterChild, HistogramChild, HistogramChild, HistogramChild, CounterChild, CounterChild
]
"""What one outcome updates: its requests counter; its tier's queue wait, time to first
token and end-to-end histograms; its tier's and endpoint's reserved and settled token
counters."""

_REJECTED: Final = JobState.REJECTED
_COMPLETED: Final = JobState.COMPLETED
_TOKENS: Final = "tokens"


class RequestCounting:
    """The per-request metric updates of one gateway (see the module docstring).

    ``outcome_series(tier, state, reason, tenant, endpoint)`` makes the series of an
    outcome (``tenant`` is ``""`` unless ``tenant_label``; ``endpoint`` is the job's
    :attr:`~velvetrope.core.Job.kind`); ``routed(pool, rule)`` the counter of a
    routing decision; ``degraded(tier, action)`` the counter of a degradation action.
    """

    __slots__ = (
        "_degraded",
        "_make_degraded",
        "_make_outcome",
        "_make_routed",
        "_outcomes",
        "_routed",
        "tenant_label",
    )

    def __init__(
        self,
        outcome_series: Callable[[str, JobState, Reason, str, str], OutcomeSeries],
        routed: Callable[[str, str], CounterChild],
        degraded: Callable[[str, str], CounterChild],
        tenant_label: bool = False,
    ) -> None:
        self.tenant_label = tenant_label
        self._make_outcome = outcome_series
        self._make_routed = routed
        self._make_degraded = degraded
        self._outcomes: dict[tuple[str, JobState, Reason, str, str], OutcomeSeries] = {}
        self._routed: dict[tuple[str, str | None], CounterChild] = {}
        self._degraded: dict[tuple[str, str], CounterChild] = {}

    def on_route(self, job: Job) -> None:
        """Count a routing decision and its degradation actions (after the controller's
        ``route``)."""
        pool = job.pool
        rule = job.route
        key = (pool, rule)
        routed = self._routed.get(key)
        if routed is None:
            routed = self._routed[key] = self._make_routed(pool, rule or "")
        routed.value += 1.0
        actions = job.degraded
        if actions:
            tier = job.tier
            for action in actions:
                dkey = (tier, action)
                child = self._degraded.get(dkey)
                if child is None:
                    child = self._degraded[dkey] = self._make_degraded(tier, action)
                child.value += 1.0

    def on_outcome(self, o: Outcome) -> None:
        """Count a terminal outcome (the controller's observer: once per job)."""
        job, state, reason, settlement, end = o  # ``end``: when it ended
        tier = job.tier
        tenant = job.tenant if self.tenant_label else ""
        kind = job.kind
        key = (tier, state, reason, tenant, kind)
        series = self._outcomes.get(key)
        if series is None:
            series = self._outcomes[key] = self._make_outcome(tier, state, reason, tenant, kind)
        requests, queue_wait, ttft, e2e, reserved, settled = series
        requests.value += 1.0
        arrival = job.arrival
        if state is not _REJECTED:  # Job.queue_s
            start = job.dispatched_at
            waited = (end if start is None else start) - arrival
            queue_wait.observe(waited if waited > 0.0 else 0.0)
        first = job.first_token_at
        if first is not None:
            ttft.observe(first - arrival)
        if state is _COMPLETED:
            e2e.observe(end - arrival)
        # one token line per job (its first token bucket), so tenant and tier do not double
        claims = job.claims
        if not claims:
            return
        lines = settlement.lines
        for i in range(min(len(claims), len(lines))):
            if claims[i].kind == _TOKENS:
                line = lines[i]
                reserved.value += line[1]
                settled.value += line[2]
                return
