"""Which token buckets a job claims, and how much of each: the static bucket specs of a
policy and the claims built from them.

A job claims the buckets its tenant's, its tier's and its model's ``limits`` name
(:class:`~velvetrope.core.bucket_limits.BucketLimits`), in that order: a token bucket
(``<owner>:<name>:tok``) for ``tokens_per_minute`` and a request bucket
(``<owner>:<name>:req``) for ``requests_per_minute``.  A claim takes the job's ``cost`` from
each token bucket and 1 from each request bucket (:class:`~velvetrope.core.bucket.Claim`).
The specs of a (tenant, tier, model) are built once and cached; they never change while the
policy does not.
"""

from __future__ import annotations

from collections.abc import Callable

from velvetrope.core.bucket import REQUESTS, TOKENS, BucketKind, BucketOwner, Claim
from velvetrope.core.bucket_limits import BucketLimits
from velvetrope.core.job import Job
from velvetrope.core.policy import PolicyConfig
from velvetrope.core.tuples import new_tuple

__all__ = ["ClaimSpecs", "Spec"]

Spec = tuple[str, BucketKind, BucketOwner, float, float, float | None]
"""A static bucket spec: ``(key, kind, owner, capacity, rate, floor)``."""


def _limit_specs(owner: BucketOwner, name: str, lim: BucketLimits | None) -> list[Spec]:
    """Static bucket specs ``(key, kind, owner, capacity, rate, floor)`` for ``lim``."""
    out: list[Spec] = []
    if lim is None:
        return out
    if lim.tokens_per_minute is not None:
        rate = lim.tokens_per_minute / 60.0
        cap = lim.token_capacity or lim.tokens_per_minute
        out.append((f"{owner}:{name}:tok", TOKENS, owner, cap, rate, lim.token_debt_floor))
    if lim.requests_per_minute is not None:
        rate = lim.requests_per_minute / 60.0
        cap = lim.request_capacity or lim.requests_per_minute
        out.append((f"{owner}:{name}:req", REQUESTS, owner, cap, rate, None))
    return out


class ClaimSpecs:
    """The bucket specs of one policy, per (tenant, tier, model); ``tenant_limits(name)``
    is a tenant's ``limits`` (its own, its default policy's or none)."""

    __slots__ = ("_entries", "_models", "_tenant_limits", "_tier_index", "_tiers")

    def __init__(
        self, config: PolicyConfig, tenant_limits: Callable[[str], BucketLimits | None]
    ) -> None:
        self._tenant_limits = tenant_limits
        self._tier_index = {t.name: i for i, t in enumerate(config.tiers)}
        self._tiers = [_limit_specs("tier", t.name, t.limits) for t in config.tiers]
        self._models = {m: _limit_specs("model", m, lim) for m, lim in config.models.items()}
        # per (tenant, tier, model): each spec with its claim when that does not depend on
        # the job (a request bucket's: 1), built once
        self._entries: dict[tuple[str, str, str | None], list[tuple[Spec, Claim | None]]] = {}

    def of(self, job: Job) -> list[Spec]:
        """The specs of ``job``'s (tenant, tier, model)."""
        return [spec for spec, _ in self._entries_of(job)]

    def _entries_of(self, job: Job) -> list[tuple[Spec, Claim | None]]:
        """The specs of ``job``'s (tenant, tier, model), each with its claim when that does
        not depend on the job; cached."""
        k = (job.tenant, job.tier, job.model)
        entries = self._entries.get(k)
        if entries is None:
            specs = _limit_specs("tenant", job.tenant, self._tenant_limits(job.tenant))
            tier = self._tier_index.get(job.tier)
            if tier is not None:
                specs = specs + self._tiers[tier]
            if job.model is not None and job.model in self._models:
                specs = specs + self._models[job.model]
            entries = self._entries[k] = [
                (spec, None if spec[1] is TOKENS else new_tuple(Claim, (*spec[:3], 1.0, *spec[3:])))
                for spec in specs
            ]
        return entries

    def claims_for(
        self, job: Job, tenant: str, tier: str, model: str | None, cost: int
    ) -> tuple[Claim, ...]:
        """The claims of ``job``, given its ``tenant``, ``tier``, ``model`` and ``cost``
        already read (each read of a Job field from compiled code is a generic attribute
        lookup): its cost from each token bucket, 1 from each request bucket."""
        entries = self._entries.get((tenant, tier, model))
        if entries is None:
            entries = self._entries_of(job)
        amount = float(cost)
        out: list[Claim] = []  # a loop, not a comprehension: cheaper for one or two specs
        for spec, ready in entries:
            if ready is None:  # a token bucket: the job's cost
                key, kind, owner, cap, rate, floor = spec
                ready = new_tuple(Claim, (key, kind, owner, amount, cap, rate, floor))
            out.append(ready)
        return tuple(out)
