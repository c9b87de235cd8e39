"""Ordering inside a tenant's queue: each policy maps a job to a fixed sort key.

Registered policies (:data:`ORDERINGS`):

``fcfs``
    arrival time.
``sjf``
    predicted cost: ``predicted_output + sjf_prompt_weight * prompt_tokens``, divided by
    ``short_boost`` for jobs predicted under ``short_output_tokens``.
``sjf_aging``
    ``arrival + aging_s * min(1, cost / aging_ref_tokens)``.  Aging with a linear boost,
    effective priority ``size − wait/A``, orders exactly like this fixed key, so no
    re-sorting is ever needed.  A job that has waited ``aging_s`` is ahead of every job
    that arrives after that, which bounds starvation.
``edf``
    earliest deadline first.  A job's deadline is the earlier of its own ``deadline`` (set
    by a caller) and its arrival plus its tier's *deadline budget*
    (:func:`deadline_budgets`): the tier's ``max_wait_s`` if set — the deadline at which
    the controller expires the job, so EDF serves first the job that would expire first —
    else its ``slo.ttft_s`` (the first token is due then, so the job must start by then),
    else its ``slo.e2e_s``.  Jobs with no deadline go last, in arrival order.  Inside one
    tier every job gets the same budget, so EDF orders like FCFS there; it differs where
    tiers with different budgets share a queue (``bands: single``, or a tenant allowed
    several tiers) and for jobs given their own deadline.

Keys never change after a job is queued, so every queue operation stays O(log n).  Each
policy is an :class:`Ordering`, a compiled class whose :meth:`Ordering.key` the scheduler
calls directly (a plain callable would go through Python's generic call on every push).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from velvetrope.core.job import Job
from velvetrope.core.policy import PolicyConfig, QueuePolicy
from velvetrope.errors import PolicyError

__all__ = [
    "ORDERINGS",
    "KeyFn",
    "Ordering",
    "deadline_budgets",
    "job_cost",
    "make_key",
    "make_ordering",
]

KeyFn = Callable[[Job], float]


def job_cost(job: Job, policy: QueuePolicy) -> float:
    """The SJF size of ``job`` under ``policy`` (see the module docstring)."""
    out = job.predicted_output if job.predicted_output is not None else job.max_tokens
    cost = out + policy.sjf_prompt_weight * job.prompt_tokens
    short = policy.short_output_tokens
    if short is not None and out < short:
        cost /= policy.short_boost
    return cost


Budgets = Mapping[str, float]


class Ordering:
    """One ordering policy: a job's fixed sort key (smaller goes first)."""

    def key(self, job: Job) -> float:
        """The sort key of ``job``; it must not change while the job is queued."""
        raise NotImplementedError


class _Fcfs(Ordering):
    def __init__(self, policy: QueuePolicy, budgets: Budgets) -> None:
        pass

    def key(self, job: Job) -> float:
        return job.arrival


class _Sjf(Ordering):
    """:func:`job_cost` with the policy's parameters bound (the hot path)."""

    __slots__ = ("_boost", "_short", "_w")

    def __init__(self, policy: QueuePolicy, budgets: Budgets) -> None:
        self._w = policy.sjf_prompt_weight
        self._short = policy.short_output_tokens if policy.short_output_tokens is not None else 0
        self._boost = policy.short_boost

    def cost(self, job: Job) -> float:
        out = job.predicted_output
        if out is None:
            out = job.max_tokens
        w = self._w
        c = out + w * job.prompt_tokens if w else float(out)
        return c / self._boost if out < self._short else c

    def key(self, job: Job) -> float:
        return self.cost(job)


class _SjfAging(_Sjf):
    __slots__ = ("_aging", "_scale")

    def __init__(self, policy: QueuePolicy, budgets: Budgets) -> None:
        super().__init__(policy, budgets)
        self._aging = policy.aging_s
        self._scale = policy.aging_s / policy.aging_ref_tokens

    def key(self, job: Job) -> float:
        c = self.cost(job) * self._scale
        aging = self._aging
        return job.arrival + (c if c < aging else aging)


def deadline_budgets(config: PolicyConfig) -> dict[str, float]:
    """Seconds from arrival to each tier's EDF deadline, its
    :attr:`~velvetrope.core.policy.TierPolicy.wait_bound_s`; tiers with none are left out
    (see the module docstring)."""
    return {t.name: b for t in config.tiers if (b := t.wait_bound_s) is not None}


_INF: Final = float("inf")


class _Edf(Ordering):
    __slots__ = ("_budgets",)

    def __init__(self, policy: QueuePolicy, budgets: Budgets) -> None:
        self._budgets = dict(budgets)

    def key(self, job: Job) -> float:
        b = self._budgets.get(job.tier)
        d = job.arrival + b if b is not None else _INF
        own = job.deadline
        return own if own is not None and own < d else d


ORDERINGS: dict[str, Callable[[QueuePolicy, Budgets], Ordering]] = {
    "fcfs": _Fcfs,
    "sjf": _Sjf,
    "sjf_aging": _SjfAging,
    "edf": _Edf,
}


def make_ordering(policy: QueuePolicy, budgets: Mapping[str, float] | None = None) -> Ordering:
    """The :class:`Ordering` of ``policy.ordering``; :class:`PolicyError` if unknown.

    ``budgets`` (tier name → seconds, :func:`deadline_budgets`) gives ``edf`` the deadlines
    of jobs that carry none; the other orderings ignore it.
    """
    try:
        factory = ORDERINGS[policy.ordering]
    except KeyError:
        raise PolicyError(
            f"unknown ordering {policy.ordering!r}; known: {', '.join(sorted(ORDERINGS))}"
        ) from None
    return factory(policy, budgets if budgets is not None else {})


def make_key(policy: QueuePolicy, budgets: Mapping[str, float] | None = None) -> KeyFn:
    """The key function of ``policy.ordering``: :func:`make_ordering`'s ``key``."""
    return make_ordering(policy, budgets).key
