"""How the admission controller places and sizes a job: its tenant's policy, its tier,
its predicted and reserved output, its bucket claims and its pool (routing and
degradation).

:class:`JobSizing` is a base of :class:`~velvetrope.core.controller.AdmissionController`,
between :class:`~velvetrope.core.job_ends.JobEnds` and it; the tables it reads are set by
the controller's constructor and configuration.
"""

from __future__ import annotations

from velvetrope.core.bucket import Claim
from velvetrope.core.claims import ClaimSpecs
from velvetrope.core.job import Job
from velvetrope.core.job_ends import JobEnds
from velvetrope.core.policy import PolicyConfig, TenantPolicy
from velvetrope.core.predictor import LengthPredictor
from velvetrope.core.routing import Routed, Router
from velvetrope.core.tuples import new_tuple
from velvetrope.errors import PolicyError

__all__ = ["JobSizing"]


class JobSizing(JobEnds):
    """A job's placement and size (see the module docstring)."""

    config: PolicyConfig
    router: Router
    _tenants: dict[str, TenantPolicy]
    _reserve_max: bool
    _specs: ClaimSpecs

    def tenant_policy(self, tenant: str) -> TenantPolicy:
        """The policy of ``tenant``: its own, the default one, or a synthesised one in the
        lowest tier with no limits."""
        p = self._tenants.get(tenant)
        if p is not None:
            return p
        d = self.config.default_tenant
        if d is not None:
            return d.model_copy(update={"name": tenant})
        return TenantPolicy(name=tenant, tier=self.config.tiers[-1].name)

    def resolve_tier(self, tenant: str, requested: str | None = None) -> str:
        """The tier a request runs in: the tenant's own, or ``requested`` if the tenant's
        config allows it.  Anything else asked for is ignored."""
        p = self.tenant_policy(tenant)
        if requested is not None and requested in p.allowed_tiers:
            return requested
        return p.tier

    def _weight(self, tenant: str) -> float:
        p = self._tenants.get(tenant)
        if p is not None:
            return p.weight
        d = self.config.default_tenant
        return d.weight if d is not None else 1.0

    def claims(self, job: Job) -> tuple[Claim, ...]:
        """The bucket claims ``job`` must reserve (tenant, tier, model), sized by its cost:
        its tokens from each token bucket, 1 from each request bucket
        (:mod:`velvetrope.core.claims`).

        Fills ``predicted_output``, ``reserved_output`` and ``cost`` if not done yet.
        """
        cost = job.cost
        if not cost:
            cost = self._size(job)
        return self._specs.claims_for(job, job.tenant, job.tier, job.model, cost)

    def _size(self, job: Job) -> int:
        """Fill ``predicted_output``, ``reserved_output`` and ``cost``, and return the cost;
        callers check that ``cost`` is not set yet (a sized job keeps its size)."""
        max_tokens = job.max_tokens
        prompt = job.prompt_tokens
        if max_tokens < 1 or prompt < 0:
            raise PolicyError(
                f"job {job.id!r}: max_tokens must be >= 1 and prompt_tokens >= 0 "
                f"(got {max_tokens}, {prompt})"
            )
        predicted = job.predicted_output
        if predicted is None:
            said = job.expected_output
            if said is not None and self.tenant_policy(job.tenant).trust_expected_output:
                predicted = max(1, min(max_tokens, said))
            else:
                est = self.estimator
                if isinstance(est, LengthPredictor):  # narrowed: a direct compiled call
                    predicted = est.predict(job)
                else:
                    predicted = est.predict(job)
            job.predicted_output = predicted
        reserved = max_tokens if self._reserve_max else predicted
        job.reserved_output = reserved
        cost = job.cost = prompt + reserved
        return cost

    def route(self, job: Job) -> Routed:
        """Choose ``job``'s pool by the policy's rules and degrade it if its tier says so
        (:mod:`velvetrope.core.routing`); call before :meth:`claims` and :meth:`arrive`.

        Sizes the job first (rules see its predicted output), then sets ``job.pool`` and
        ``job.route``; a degraded job gets ``degraded``, a capped ``max_tokens`` (and its
        prediction and cost re-sized to match, so its claims reserve what it will use) or
        a fallback ``pool`` and ``model``.  Raises PolicyError for an unknown tier.
        """
        if not job.cost:
            self._size(job)
        pool, rule = self.router.match(job)
        job.pool = pool
        job.route = rule
        tier = self._tier_index.get(job.tier)
        if tier is None:
            raise PolicyError(f"job {job.id!r}: unknown tier {job.tier!r}")
        router = self.router
        d = router.degrade(job, tier, self._wait_in) if router.degrades(tier) else None
        if d is not None:
            if d.max_tokens is not None:
                job.max_tokens = d.max_tokens
                if job.predicted_output is not None and job.predicted_output > d.max_tokens:
                    job.predicted_output = d.max_tokens
                job.cost = 0
                self._size(job)
            if d.pool is not None:
                job.pool = d.pool
                if d.model is not None:
                    job.model = d.model
            job.degraded = d.actions
        return new_tuple(Routed, (job.pool, rule, job.degraded))

    def _wait_in(self, pool: str, tier: int) -> float | None:
        """The predicted wait of a new job of tier number ``tier`` in ``pool``."""
        p = self._pools[pool]
        return p.drain.seconds_for(p.sched.ahead(p.sched.band_of(tier))[1])
