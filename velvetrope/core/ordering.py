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
    deadline (jobs without one last, in arrival order).

Keys never change after a job is queued, so every queue operation stays O(log n).
"""

from __future__ import annotations

from collections.abc import Callable

from velvetrope.core.policy import QueuePolicy
from velvetrope.core.request import Job
from velvetrope.errors import PolicyError

__all__ = ["ORDERINGS", "KeyFn", "job_cost", "make_key"]

KeyFn = Callable[[Job], float]


def job_cost(job: Job, policy: QueuePolicy) -> float:
    """The SJF size of ``job`` under ``policy`` (see the module docstring)."""
    out = job.predicted_output if job.predicted_output is not None else job.max_tokens
    cost = out + policy.sjf_prompt_weight * job.prompt_tokens
    short = policy.short_output_tokens
    if short is not None and out < short:
        cost /= policy.short_boost
    return cost


def _fcfs(policy: QueuePolicy) -> KeyFn:
    def key(job: Job) -> float:
        return job.arrival

    return key


def _cost_fn(policy: QueuePolicy) -> KeyFn:
    """:func:`job_cost` with the policy's parameters bound (the hot path)."""
    w = policy.sjf_prompt_weight
    short = policy.short_output_tokens if policy.short_output_tokens is not None else 0
    boost = policy.short_boost

    def cost(job: Job) -> float:
        out = job.predicted_output if job.predicted_output is not None else job.max_tokens
        c = out + w * job.prompt_tokens if w else float(out)
        return c / boost if out < short else c

    return cost


def _sjf(policy: QueuePolicy) -> KeyFn:
    return _cost_fn(policy)


def _sjf_aging(policy: QueuePolicy) -> KeyFn:
    aging = policy.aging_s
    scale = aging / policy.aging_ref_tokens
    cost = _cost_fn(policy)

    def key(job: Job) -> float:
        c = cost(job) * scale
        return job.arrival + (c if c < aging else aging)

    return key


def _edf(policy: QueuePolicy) -> KeyFn:
    def key(job: Job) -> float:
        return job.deadline if job.deadline is not None else float("inf")

    return key


ORDERINGS: dict[str, Callable[[QueuePolicy], KeyFn]] = {
    "fcfs": _fcfs,
    "sjf": _sjf,
    "sjf_aging": _sjf_aging,
    "edf": _edf,
}


def make_key(policy: QueuePolicy) -> KeyFn:
    """The key function of ``policy.ordering``; :class:`PolicyError` if unknown."""
    try:
        factory = ORDERINGS[policy.ordering]
    except KeyError:
        raise PolicyError(
            f"unknown ordering {policy.ordering!r}; known: {', '.join(sorted(ORDERINGS))}"
        ) from None
    return factory(policy)
