"""Routing: which pool a job goes to, what it gives up under pressure, which replica runs it.

Three rules, each written once and called by the gateway and by the simulator with the same
inputs (docs/design.md, "one rule, one implementation"):

**Pool** (:meth:`Router.match`).  ``PolicyConfig.routes`` is a list of
:class:`~velvetrope.core.policy.RouteRule`; each may name requested ``models``, ``tiers``
and bounds on the job's *predicted* output (``min_predicted_output``,
``max_predicted_output``).  Rules are evaluated once the job is sized, so the bounds see the
same prediction that orders and reserves it (the core's estimator, or a predictor the caller
supplies); the first rule whose every condition holds wins.  A job that matches none goes
to the first pool.  The reason code is the rule's ``name`` (``routes[i]`` if unnamed) or
``"default"``.

**Degradation** (:meth:`Router.degrade`).  A tier with a
:class:`~velvetrope.core.policy.DegradePolicy` gives something up before it is rejected.  Let
``wait`` be the predicted wait in the routed pool (its queued work ahead of the job's band
over the pool's measured drain rate: the same estimate that sheds at arrival):

1. ``wait > wait_s`` (default: the tier's ``max_wait_s``) and ``max_tokens`` is set: cap the
   job's ``max_tokens`` per completion (action ``"max_tokens"``).  A capped job's own wait
   is unchanged; the fleet does less work, so everyone behind it waits less.
2. ``wait > max_wait_s`` (the job would be rejected; ``wait_s`` when the tier has no
   ``max_wait_s``) and a fallback ``pool`` is set whose predicted wait is within that bound
   (or unknown: a pool with no measured drain rate yet): send the job there, asking for
   ``model`` if given (action ``"pool"``).
3. Otherwise the job stays where it is, and admission rejects it (``wait_exceeds_slo``) if
   its wait still exceeds ``max_wait_s``: rejection only when degrading was not enough.

Degradation is decided before the job's bucket claims are computed, so the buckets reserve
(and later settle) what the degraded job will use.

**Replica** (:func:`least_loaded`).  Inside a pool the job goes to the eligible replica
with the least prefill ahead of its first token (when the pool's saturation rule keeps the
engines' prefill backlog: :mod:`velvetrope.core.prefill_backlog`), then with the fewest
jobs outstanding (dispatched to it and not finished); ties go to the first in order from
``start``.  The gateway rotates ``start`` so that ties spread; the simulator
passes 0 (the lowest-numbered replica), which keeps its runs a pure function of its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from velvetrope.core.job import Job
from velvetrope.core.policy import PolicyConfig, RouteRule

__all__ = [
    "DEFAULT_ROUTE",
    "FALLBACK_POOL",
    "MAX_TOKENS",
    "Degradation",
    "Routed",
    "Router",
    "least_loaded",
]

DEFAULT_ROUTE = "default"
"""The reason code of a job that no rule matched (it goes to the first pool)."""

MAX_TOKENS = "max_tokens"
"""The degradation action that capped ``max_tokens``."""
FALLBACK_POOL = "pool"
"""The degradation action that sent a job to its tier's fallback pool."""


class Routed(NamedTuple):
    """Where a job was routed: its ``pool``, the ``rule`` that chose it (a reason code) and
    the degradation ``actions`` taken (empty when it was not degraded)."""

    pool: str
    rule: str
    actions: tuple[str, ...]


class Degradation(NamedTuple):
    """What to change in a job: its total ``max_tokens`` (``None``: unchanged), its
    ``pool`` and ``model`` (``None``: unchanged), and the ``actions`` that says so."""

    max_tokens: int | None
    pool: str | None
    model: str | None
    actions: tuple[str, ...]


def _matches(rule: RouteRule, job: Job) -> bool:
    if rule.models and job.model not in rule.models:
        return False
    if rule.tiers and job.tier not in rule.tiers:
        return False
    pred = job.predicted_output
    if rule.max_predicted_output is not None and (pred is None or pred > rule.max_predicted_output):
        return False
    return not (
        rule.min_predicted_output is not None and (pred is None or pred < rule.min_predicted_output)
    )


class Router:
    """The routing and degradation rules of one policy (see the module docstring)."""

    __slots__ = ("_default", "_degrade", "_max_wait", "_rules")

    def __init__(self, config: PolicyConfig) -> None:
        self._rules = [
            (r.name if r.name is not None else f"routes[{i}]", r)
            for i, r in enumerate(config.routes)
        ]
        self._default = config.pools[0].name
        self._degrade = [t.degrade for t in config.tiers]
        slo = config.queue.wait_from_slo
        self._max_wait = [t.wait_bound_s if slo else t.max_wait_s for t in config.tiers]

    def match(self, job: Job) -> tuple[str, str]:
        """``(pool, reason code)`` for a sized ``job``: the first rule it matches, else the
        first pool and ``"default"``."""
        for name, rule in self._rules:
            if _matches(rule, job):
                return rule.pool, name
        return self._default, DEFAULT_ROUTE

    def degrades(self, tier: int) -> bool:
        """Whether tier number ``tier`` has a degradation policy (else :meth:`degrade` is
        always ``None``)."""
        return self._degrade[tier] is not None

    def degrade(
        self, job: Job, tier: int, wait_in: Callable[[str, int], float | None]
    ) -> Degradation | None:
        """What ``job`` (routed, sized, in tier number ``tier``) gives up, or ``None``.

        ``wait_in(pool, tier)`` is the predicted wait of a job of tier number ``tier`` in
        ``pool`` (``None`` while the pool has no drain rate).  Pure: the caller applies the
        result.
        """
        d = self._degrade[tier]
        if d is None:
            return None
        max_wait = self._max_wait[tier]
        threshold = d.wait_s if d.wait_s is not None else max_wait
        wait = wait_in(job.pool, tier)
        if threshold is None or wait is None or wait <= threshold:
            return None
        actions: list[str] = []
        cap: int | None = None
        if d.max_tokens is not None and job.max_tokens > d.max_tokens * job.n:
            cap = d.max_tokens * job.n
            actions.append(MAX_TOKENS)
        pool = model = None
        limit = max_wait if max_wait is not None else threshold
        if d.pool is not None and d.pool != job.pool and wait > limit:
            there = wait_in(d.pool, tier)
            if there is None or there <= limit:
                pool, model = d.pool, d.model
                actions.append(FALLBACK_POOL)
        if not actions:
            return None
        return Degradation(cap, pool, model, tuple(actions))


def least_loaded(
    loads: Sequence[int],
    start: int = 0,
    eligible: Callable[[int], bool] | None = None,
    ahead: Sequence[int] | None = None,
) -> int:
    """Index of the eligible replica with the fewest outstanding jobs in ``loads``, or -1.

    With ``ahead`` (per replica, the prompt tokens it prefills before the job's first
    token: :meth:`~velvetrope.core.saturation.EngineSaturation.prefill_ahead`), the fewest
    of those wins first and the load breaks ties: a top-tier burst of long prompts spreads
    over the replicas instead of queueing behind itself on the one that happens to hold
    fewer requests.  Replicas are scanned cyclically from ``start``; the first with the
    smallest key wins, so ties go to the first in that order.  ``eligible(i)`` (default:
    all) excludes replicas that may not take work (unhealthy, breaker open).
    """
    n = len(loads)
    best = -1
    best_load = 0
    best_ahead = 0
    for j in range(n):
        i = (start + j) % n if start else j
        if eligible is not None and not eligible(i):
            continue
        load = loads[i]
        first = 0 if ahead is None else ahead[i]
        if best < 0 or first < best_ahead or (first == best_ahead and load < best_load):
            best = i
            best_load = load
            best_ahead = first
    return best
