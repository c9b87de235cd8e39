"""The admission policy: tiers, tenants, pools, limits and queue discipline.

These pydantic models are what the core consumes.  The gateway's YAML config embeds them
(see :mod:`velvetrope.config`), and the simulator reads the same file, so one policy
drives both.  Every model forbids unknown keys, and every field is documented.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from velvetrope.core.limit_policy import AdaptiveLimitPolicy, SloLimitPolicy

__all__ = [
    "DEFAULT_BURST_S",
    "SEED_BURST_S",
    "AdaptiveLimitPolicy",
    "BandMode",
    "BucketLimits",
    "DegradePolicy",
    "EstimatorPolicy",
    "LimitMode",
    "PolicyConfig",
    "PoolPolicy",
    "PrefixRoutingPolicy",
    "QueuePolicy",
    "ReplicaRouting",
    "RouteRule",
    "SaturationPolicy",
    "SloLimitPolicy",
    "SloPolicy",
    "TenantPolicy",
    "TierPolicy",
    "bucket_report",
]

BandMode = Literal["single", "strict", "weighted"]
LimitMode = Literal["slo", "adaptive", "fixed"]
"""How a pool sizes what it holds in flight (see :class:`PoolPolicy`)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_BURST_S = 60.0
"""A bucket's capacity when no burst is set: this many seconds of refill (one minute).

Kept at a minute, not the seed's four seconds, on purpose: a limit named per minute then
holds a minute's worth (what OpenAI's ``x-ratelimit-limit-*`` headers report), and a
per-tenant refill can be far below a fleet's, where four seconds of it may not fit one
long request (``request_too_large``, which no retry cures).  The seed's four seconds
sizes a bucket whose refill is the fleet's sustainable rate; set ``token_burst`` to
follow it (``velvetrope plan`` prints that size, ``velvetrope config check`` the one in
force)."""


SEED_BURST_S = 4.0
"""The seed's bucket capacity, in seconds of refill (printed for comparison)."""


class BucketLimits(_Model):
    """Edge limits for one key (a tenant, a tier or a model).  Each is optional."""

    tokens_per_minute: float | None = Field(
        None, gt=0, description="Token refill rate, per minute (prompt + expected output)."
    )
    token_burst: float | None = Field(
        None,
        gt=0,
        description="Token bucket capacity; defaults to one minute of refill (DEFAULT_BURST_S).",
    )
    token_debt_floor: float | None = Field(
        None,
        le=0,
        description="Lowest balance an overrun may leave (<= 0); defaults to -token_burst.",
    )
    requests_per_minute: float | None = Field(None, gt=0, description="Request refill rate.")
    request_burst: float | None = Field(
        None, gt=0, description="Request bucket capacity; defaults to one minute of refill."
    )

    @property
    def token_capacity(self) -> float | None:
        """The token bucket's capacity in force: ``token_burst``, else
        :data:`DEFAULT_BURST_S` of refill; ``None`` without a token limit."""
        if self.tokens_per_minute is None:
            return None
        if self.token_burst is not None:
            return self.token_burst
        return self.tokens_per_minute * DEFAULT_BURST_S / 60.0

    @property
    def request_capacity(self) -> float | None:
        """The request bucket's capacity in force, like :attr:`token_capacity`."""
        if self.requests_per_minute is None:
            return None
        if self.request_burst is not None:
            return self.request_burst
        return self.requests_per_minute * DEFAULT_BURST_S / 60.0


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


ReplicaRouting = Literal["least_loaded", "prefix_affinity", "prefix_hash"]
"""How a pool picks the engine of each job (see :mod:`velvetrope.core.prefix_routing`)."""


class PrefixRoutingPolicy(_Model):
    """The prefix-aware replica choice of a pool (``routing: prefix_affinity`` or
    ``prefix_hash``; ignored under ``least_loaded``).  See
    :mod:`velvetrope.core.prefix_routing` for the rules these numbers feed."""

    block_tokens: int = Field(
        128, ge=1, le=65_536, description="Tokens per prefix block the gateway hashes."
    )
    max_blocks: int = Field(
        64, ge=1, le=4096, description="Leading blocks of a prompt hashed and matched, at most."
    )
    index_blocks: int = Field(
        65_536,
        ge=16,
        description="prefix_affinity: block entries the index keeps (least recently used go); "
        "about the pool's prefix-cache capacity in blocks, so that it forgets what the "
        "engines evicted.",
    )
    index_ways: int = Field(
        16,
        ge=1,
        le=256,
        description="prefix_affinity: engines remembered per block, at most (keep it at or "
        "above the pool's engines: a block every engine holds must list them all).",
    )
    balance_abs: int = Field(
        4,
        ge=0,
        description="prefix_affinity: the matched engine is passed over when its jobs in "
        "flight exceed the pool's least-loaded by more than this ...",
    )
    balance_rel: float = Field(
        1.5, ge=1, description="prefix_affinity: ... and exceed this × the least-loaded's."
    )
    hash_tokens: int = Field(
        1024,
        ge=1,
        description="prefix_hash: leading tokens (whole blocks, at least one) that key a job.",
    )
    load_factor: float = Field(
        1.25,
        gt=1,
        description="prefix_hash: an engine takes a job while its load stays within this × "
        "the pool's mean (consistent hashing with bounded loads).",
    )


class PoolPolicy(_Model):
    """A pool of upstreams and its capacity as the admission core sees it.

    ``limit`` says how the pool sizes what it holds in flight.  ``slo`` (the default when
    no fixed capacity is given): from the tiers' SLOs and the engines' measurements, with
    ``max_in_flight`` (or ``*_per_engine``), when given, as a ceiling (``slo_limit``).
    ``fixed``: exactly ``max_in_flight`` (the default when it is given, as before ``slo``
    existed).  ``adaptive``: the knee of the throughput curve (``adaptive``; the default
    when ``adaptive`` is configured and no fixed capacity is given).  A fixed capacity is
    either for the pool (``max_in_flight``, ``max_tokens_in_flight``) or per engine
    (``*_per_engine``): then it is that × the live engines (healthy, breaker closed), so
    it follows the fleet as engines join and leave.
    """

    name: str = Field(min_length=1, description="Pool name, named by routes and upstreams.")
    limit: LimitMode | None = Field(
        None,
        description="slo | fixed | adaptive; unset: fixed when max_in_flight or "
        "max_in_flight_per_engine is given, adaptive when 'adaptive' is, else slo.",
    )
    slo_limit: SloLimitPolicy = Field(
        default_factory=SloLimitPolicy,
        description="The limits of 'limit: slo' (TPOT-derived in-flight, TTFT headroom).",
    )
    max_in_flight: int | None = Field(
        None,
        ge=1,
        description="Jobs dispatched and not yet finished: the limit with 'limit: fixed', a "
        "ceiling with 'slo'; unset with 'slo': no ceiling but the engines' own.",
    )
    adaptive: AdaptiveLimitPolicy = Field(
        default_factory=AdaptiveLimitPolicy,
        description="The adaptive limit, used when max_in_flight is unset.",
    )
    max_tokens_in_flight: int | None = Field(
        None,
        ge=1,
        description="Budget of prompt + reserved output tokens in flight (a KV-cache proxy).",
    )
    max_in_flight_per_engine: int | None = Field(
        None, ge=1, description="Slots per live engine (replaces max_in_flight)."
    )
    max_tokens_in_flight_per_engine: int | None = Field(
        None, ge=1, description="Token budget per live engine (replaces max_tokens_in_flight)."
    )
    initial_drain_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="Prior for the drain rate before one is measured; without it, "
        "wait-based shedding starts once a rate has been measured.",
    )
    routing: ReplicaRouting = Field(
        "least_loaded",
        description="The engine of each job: least_loaded, prefix_affinity (an index of "
        "which engine served which prompt blocks, bounded load) or prefix_hash (rendezvous "
        "hashing of the leading blocks, bounded load; replicas agree without sharing state).",
    )
    prefix: PrefixRoutingPolicy = Field(
        default_factory=PrefixRoutingPolicy,
        description="Settings of the prefix-aware routing modes.",
    )
    engine_priority: bool = Field(
        True,
        description="Forward each job's tier band (its index in tiers, 0 = top) to the "
        "engines as their request 'priority', so that whatever an engine queues is ordered "
        "by tier too (vLLM run with --scheduling-policy priority, SGLang with "
        "--enable-priority-scheduling; the gateway's upstreams[].priority says how each "
        "engine reads it).  On by default: an engine that does not order by priority "
        "refuses the field, the gateway learns that on the first refusal and stops "
        "sending it there, and the pool's headroom rule stops counting on that order.",
    )

    @model_validator(mode="after")
    def _one_capacity(self) -> PoolPolicy:
        given = self.model_fields_set
        if self.max_in_flight_per_engine is not None and "max_in_flight" in given:
            raise ValueError(
                f"pool {self.name!r}: give max_in_flight or max_in_flight_per_engine, not both"
            )
        if (
            self.max_tokens_in_flight_per_engine is not None
            and self.max_tokens_in_flight is not None
        ):
            raise ValueError(
                f"pool {self.name!r}: give max_tokens_in_flight or "
                "max_tokens_in_flight_per_engine, not both"
            )
        fixed = self.max_in_flight is not None or self.max_in_flight_per_engine is not None
        if self.limit == "fixed" and not fixed:
            raise ValueError(
                f"pool {self.name!r}: limit 'fixed' needs max_in_flight or max_in_flight_per_engine"
            )
        if self.limit == "adaptive" and fixed:
            raise ValueError(
                f"pool {self.name!r}: limit 'adaptive' replaces max_in_flight; leave it out "
                "(adaptive.ceiling bounds it)"
            )
        return self

    @property
    def limit_mode(self) -> LimitMode:
        """``limit``, or its default (see the class docstring)."""
        if self.limit is not None:
            return self.limit
        if self.max_in_flight is not None or self.max_in_flight_per_engine is not None:
            return "fixed"
        return "adaptive" if "adaptive" in self.model_fields_set else "slo"

    @property
    def in_flight_ceiling(self) -> int:
        """The most this pool ever has in flight: ``max_in_flight``, else the adaptive
        limit's ceiling (per-engine capacity, when given, replaces it as engines are seen)."""
        return self.max_in_flight if self.max_in_flight is not None else self.adaptive.ceiling


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
