"""The admission policy: tiers, tenants, pools, routes, limits and queue discipline.

These pydantic models are what the core consumes.  The gateway's YAML config embeds them
(see :mod:`velvetrope.config`), and the simulator reads the same file, so one policy
drives both.  Every model forbids unknown keys, and every field is documented.  A pool's
settings are :mod:`velvetrope.core.pool_policy`'s, the edge buckets
:mod:`velvetrope.core.bucket_limits`'s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from velvetrope.core.bucket_limits import DEFAULT_BURST_S, SEED_BURST_S, BucketLimits
from velvetrope.core.pool_policy import PoolPolicy

__all__ = [
    "BandMode",
    "DegradePolicy",
    "EstimatorPolicy",
    "PolicyConfig",
    "QueuePolicy",
    "RouteRule",
    "SaturationPolicy",
    "SloPolicy",
    "TenantPolicy",
    "TierPolicy",
    "bucket_report",
]

BandMode = Literal["single", "strict", "weighted"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloPolicy(_Model):
    """A tier's latency objective (seconds); unset bounds are not checked.  Reports and
    goodput use it; admission itself uses ``max_wait_s``."""

    ttft_s: float | None = Field(None, gt=0, description="Time to first token.")
    tpot_s: float | None = Field(None, gt=0, description="Time per output token after the first.")
    e2e_s: float | None = Field(None, gt=0, description="End-to-end latency.")


class DegradePolicy(_Model):
    """What a tier gives up, before being rejected, when its pool is backed up.

    When the predicted wait in the routed pool exceeds ``wait_s``: cap ``max_tokens`` (a
    shorter answer: less work for the fleet, so everyone's wait shrinks); and when it also
    exceeds the tier's ``max_wait_s`` (the job would be rejected), send it to ``pool``
    (asking for ``model``) if the predicted wait there is within ``max_wait_s``.  Only a
    job still over ``max_wait_s`` after that is rejected.  See :mod:`velvetrope.core.routing`.
    """

    wait_s: float | None = Field(
        None,
        gt=0,
        description="Degrade when the predicted wait exceeds this (default: max_wait_s). "
        "Capping max_tokens does not shorten this job's own wait, so set it below "
        "max_wait_s to degrade before rejections start.",
    )
    max_tokens: int | None = Field(
        None, ge=1, description="Cap each completion's max_tokens at this when degrading."
    )
    pool: str | None = Field(
        None, min_length=1, description="Fallback pool for jobs that would be rejected."
    )
    model: str | None = Field(
        None, min_length=1, description="Model to ask the fallback pool for (rewrites 'model')."
    )

    @model_validator(mode="after")
    def _check(self) -> DegradePolicy:
        if self.max_tokens is None and self.pool is None:
            raise ValueError("degrade needs 'max_tokens', 'pool' or both")
        if self.model is not None and self.pool is None:
            raise ValueError("degrade 'model' needs a fallback 'pool'")
        return self


class TierPolicy(_Model):
    """A priority tier.  Tiers are listed highest priority first; each is a queue band."""

    name: str = Field(min_length=1, description="Tier name, referenced by tenants.")
    weight: float = Field(1.0, gt=0, description="Share weight when bands are 'weighted'.")
    min_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Guaranteed fraction of dispatches while backlogged ('strict' bands): "
        "a lower band waits at most ceil(1/min_share) dispatches.",
    )
    max_queued: int | None = Field(None, ge=0, description="Bound on this band's queue, per pool.")
    max_wait_s: float | None = Field(
        None,
        gt=0,
        description="Shed at arrival when the predicted wait exceeds it; expire queued jobs "
        "that waited this long.  Unset: the tier's SLO says it (slo.ttft_s, else "
        "slo.e2e_s): a request waits only while it can still meet its objective.",
    )
    limits: BucketLimits | None = Field(None, description="A bucket shared by the whole tier.")
    slo: SloPolicy | None = Field(None, description="Latency objective, for reports and goodput.")
    degrade: DegradePolicy | None = Field(
        None, description="Degrade (cap max_tokens, fall back to a pool) before rejecting."
    )
    enforce: bool = Field(
        True,
        description="false: shadow mode for this tier (decisions computed and counted, "
        "every request passed through)",
    )

    @property
    def wait_bound_s(self) -> float | None:
        """How long a job of this tier may wait in the queue: ``max_wait_s``, else the
        SLO's ``ttft_s`` (a job that has waited that long has missed it), else its
        ``e2e_s``; ``None`` when the tier states none of them (no bound in time)."""
        if self.max_wait_s is not None:
            return self.max_wait_s
        slo = self.slo
        if slo is None:
            return None
        return slo.ttft_s if slo.ttft_s is not None else slo.e2e_s


class TenantPolicy(_Model):
    """A tenant: who they are, which tier they sit in and what they may use."""

    name: str = Field(min_length=1, description="Tenant name, named by api_keys[].tenant.")
    tier: str = Field(description="The tenant's tier (its band).")
    weight: float = Field(1.0, gt=0, description="Fair-share weight inside its band.")
    limits: BucketLimits | None = Field(None, description="The tenant's own edge buckets.")
    max_queued: int | None = Field(None, ge=0, description="Bound on this tenant's queued jobs.")
    allowed_tiers: tuple[str, ...] = Field(
        (), description="Other tiers this tenant may ask for per request (header/body)."
    )
    enforce: bool = Field(
        True,
        description="false: shadow mode for this tenant (decisions computed and counted, "
        "every request passed through)",
    )
    trust_expected_output: bool = Field(
        False,
        description="Take this tenant's own expected output length (a request header) as "
        "the prediction, capped by max_tokens.",
    )
    queue_progress: bool = Field(
        False,
        description="Gateway: a streaming request of this tenant that waits in the queue "
        "gets SSE comments with its standing (commits the response to 200 early).",
    )


class RouteRule(_Model):
    """A routing rule: a job matching every condition given goes to ``pool``.

    Rules are tried in order once the job is sized (its predicted output is known, so
    "predicted output under 200 tokens → pool short" works); the first match wins, and a job
    no rule matches goes to the first pool.  See :mod:`velvetrope.core.routing`.
    """

    name: str | None = Field(
        None,
        min_length=1,
        description="Label in metrics and the x-velvetrope-route header (default routes[i]).",
    )
    pool: str = Field(min_length=1, description="Where matching jobs go.")
    models: tuple[str, ...] = Field((), description="Requested models matched (empty: any).")
    tiers: tuple[str, ...] = Field((), description="Tiers matched (empty: any).")
    max_predicted_output: int | None = Field(
        None, ge=0, description="Matches jobs predicted to produce at most this many tokens."
    )
    min_predicted_output: int | None = Field(
        None, ge=0, description="Matches jobs predicted to produce at least this many tokens."
    )


class SaturationPolicy(_Model):
    """Hold dispatch while a pool's engines queue work of their own.

    The rule (:mod:`velvetrope.core.saturation`) reads each engine's requests running,
    requests waiting and KV-cache usage, taken every ``scrape_interval_s`` by the gateway
    (from ``/metrics``, in the engine's dialect: :mod:`velvetrope.dialects`) or the
    simulator (from its engine models).
    """

    enabled: bool = Field(True, description="Apply the rule (the gateway scrapes /metrics).")
    max_waiting: int = Field(
        2, ge=0, description="Requests each engine may queue beyond what it can run."
    )
    max_kv_usage: float = Field(
        0.97, gt=0, le=1, description="An engine at this KV-cache usage counts as full."
    )
    scrape_interval_s: float = Field(1.0, gt=0, description="Seconds between readings.")
    stale_after_s: float | None = Field(
        None,
        gt=0,
        description="A reading older than this is not used: the engine is served without "
        "saturation (its in-flight limit still holds) until readings return "
        "(default: 3 intervals).",
    )
    initial_capacity: int = Field(
        1,
        ge=1,
        description="Requests an engine is trusted to run at once before a reading has shown "
        "it queueing; doubled by each reading that shows it running all it was given.",
    )

    @property
    def stale_s(self) -> float:
        """``stale_after_s``, or three scrape intervals."""
        return self.stale_after_s if self.stale_after_s is not None else 3 * self.scrape_interval_s


class QueuePolicy(_Model):
    """How the queue orders work: band → fairness → ordering."""

    bands: BandMode = Field(
        "strict",
        description="'single': tiers ignored; 'strict': priority by tier with min_share; "
        "'weighted': bands share dispatched tokens by tier weight.",
    )
    fairness: str = Field("none", description="Between tenants in a band: vtc, round_robin, none.")
    ordering: str = Field(
        "fcfs",
        description="Inside a tenant: fcfs, sjf, sjf_aging, edf (deadline: arrival + the "
        "tier's max_wait_s, else slo.ttft_s, else slo.e2e_s).",
    )
    max_queued: int = Field(10_000, ge=0, description="Global bound on queued jobs.")
    wait_from_slo: bool = Field(
        True,
        description="A tier without max_wait_s waits at most its SLO's ttft_s, else its "
        "e2e_s (false: such a tier's queue has no bound in time).",
    )
    vtc_input_weight: float = Field(1.0, ge=0, description="VTC weight of a prompt token.")
    vtc_output_weight: float = Field(2.0, ge=0, description="VTC weight of an output token.")
    aging_s: float = Field(
        15.0,
        gt=0,
        description="sjf_aging: a job that has waited this long is ahead of any fresh job.",
    )
    aging_ref_tokens: int = Field(
        1000, ge=1, description="sjf_aging: cost at which a job's size penalty saturates."
    )
    short_output_tokens: int | None = Field(
        None, ge=1, description="Jobs predicted to produce fewer output tokens count as short."
    )
    short_boost: float = Field(1.0, ge=1, description="Short jobs' cost is divided by this.")
    sjf_prompt_weight: float = Field(
        0.0, ge=0, description="Weight of prompt tokens in the SJF cost (output tokens weigh 1)."
    )


class EstimatorPolicy(_Model):
    """Output-length estimation and what the buckets reserve.

    ``kind: predictor`` (the default) conditions on tenant, prompt template, model,
    ``max_tokens`` and prompt length (:mod:`velvetrope.core.predictor`); ``kind: tenant``
    is one running quantile per tenant (``sketch`` chooses its kind)."""

    kind: Literal["predictor", "tenant"] = Field(
        "predictor", description="'predictor': conditional quantiles; 'tenant': per tenant only."
    )
    quantile: float = Field(0.9, gt=0, lt=1, description="Quantile of observed outputs predicted.")
    default_output_tokens: int = Field(
        256, ge=1, description="Estimate before anything comparable has been observed."
    )
    min_observations: int = Field(
        5, ge=5, description="Observations a group needs before it predicts."
    )
    window: int = Field(
        64, ge=8, description="predictor: outputs kept per group (the tenant level keeps 4x)."
    )
    max_keys: int = Field(
        4096, ge=16, description="predictor: groups kept at most (least recently used dropped)."
    )
    prompt_feature: bool = Field(
        True, description="predictor: condition on the prompt's length (powers of two)."
    )
    sketch: Literal["window", "p2"] = Field(
        "window",
        description="'window': the quantile of each tenant's last 256 outputs (follows "
        "drift); 'p2': an all-time running quantile (P², Jain & Chlamtac).",
    )
    reserve: Literal["estimate", "max_tokens"] = Field(
        "estimate", description="Reserve the estimate or the declared max_tokens at admission."
    )


class PolicyConfig(_Model):
    """Everything the admission core needs to decide."""

    preset: str | None = Field(None, description="A named preset applied to 'queue' (see presets).")
    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    tiers: tuple[TierPolicy, ...] = Field(
        (TierPolicy(name="default"),), min_length=1, description="Highest priority first."
    )
    tenants: tuple[TenantPolicy, ...] = ()
    default_tenant: TenantPolicy | None = Field(
        None, description="Policy for tenants not listed (tier: the lowest tier)."
    )
    pools: tuple[PoolPolicy, ...] = Field((PoolPolicy(name="default"),), min_length=1)
    routes: tuple[RouteRule, ...] = Field(
        (), description="Routing rules, first match wins; no match: the first pool."
    )
    saturation: SaturationPolicy = Field(default_factory=SaturationPolicy)
    models: dict[str, BucketLimits] = Field(
        default_factory=dict, description="Per-model buckets shared by every tenant."
    )
    estimator: EstimatorPolicy = Field(default_factory=EstimatorPolicy)
    drain_ewma_alpha: float = Field(0.3, gt=0, le=1, description="Smoothing of the drain rate.")
    drain_window_s: float = Field(1.0, gt=0, description="Busy seconds per drain-rate sample.")
    enforce: bool = Field(
        True,
        description="false: shadow mode everywhere: every admission decision is computed "
        "and counted as if enforced, and every request passes straight through",
    )

    @model_validator(mode="after")
    def _check_refs(self) -> PolicyConfig:
        tier_names = [t.name for t in self.tiers]
        if len(set(tier_names)) != len(tier_names):
            raise ValueError(f"tier names must be unique: {tier_names}")
        pool_names = [p.name for p in self.pools]
        if len(set(pool_names)) != len(pool_names):
            raise ValueError(f"pool names must be unique: {pool_names}")
        seen: set[str] = set()
        for t in self.tenants:
            if t.name in seen:
                raise ValueError(f"tenant {t.name!r} is listed twice")
            seen.add(t.name)
            for tier in (t.tier, *t.allowed_tiers):
                if tier not in tier_names:
                    raise ValueError(f"tenant {t.name!r} names unknown tier {tier!r}")
        if self.default_tenant is not None and self.default_tenant.tier not in tier_names:
            raise ValueError(f"default_tenant names unknown tier {self.default_tenant.tier!r}")
        for i, r in enumerate(self.routes):
            if r.pool not in pool_names:
                raise ValueError(f"routes[{i}] names unknown pool {r.pool!r}")
            for tier in r.tiers:
                if tier not in tier_names:
                    raise ValueError(f"routes[{i}] names unknown tier {tier!r}")
        route_names = [r.name for r in self.routes if r.name is not None]
        if len(set(route_names)) != len(route_names) or "default" in route_names:
            raise ValueError(f"route names must be unique and not 'default': {route_names}")
        for tp in self.tiers:
            fallback = tp.degrade.pool if tp.degrade is not None else None
            if fallback is not None and fallback not in pool_names:
                raise ValueError(f"tier {tp.name!r}: degrade names unknown pool {fallback!r}")
        return self

    def tier_index(self, name: str) -> int:
        """Position of tier ``name`` (0 = highest priority); KeyError if unknown."""
        for i, t in enumerate(self.tiers):
            if t.name == name:
                return i
        raise KeyError(name)


def bucket_report(config: PolicyConfig) -> list[str]:
    """One line per token bucket of ``config`` (tenants, default tenant, tiers, models): the
    refill and the capacity in force, with where the capacity came from and, when it is
    the default, the seed's four-second size beside it (see :data:`DEFAULT_BURST_S`)."""
    scopes: list[tuple[str, BucketLimits | None]] = [
        *((f"tenant {t.name!r}", t.limits) for t in config.tenants),
        *((f"tier {t.name!r}", t.limits) for t in config.tiers),
        *((f"model {m!r}", lim) for m, lim in config.models.items()),
    ]
    if config.default_tenant is not None:
        scopes.append(("default tenant", config.default_tenant.limits))
    out = []
    for scope, lim in scopes:
        if lim is None or lim.tokens_per_minute is None or lim.token_capacity is None:
            continue
        tpm, cap = lim.tokens_per_minute, lim.token_capacity
        if lim.token_burst is not None:
            why = f"token_burst, {cap / tpm * 60:.3g} s of refill"
        else:
            seed = tpm * SEED_BURST_S / 60.0
            why = (
                f"token_burst unset: {DEFAULT_BURST_S:g} s of refill, so a per-minute limit holds "
                f"a minute; the common rule of thumb is {SEED_BURST_S:g} s = {seed:,.0f} "
                "tokens (token_burst), sized for a fleet-wide refill"
            )
        out.append(f"bucket {scope}: {tpm:,.0f} tokens/min, capacity {cap:,.0f} — {why}")
    return out
