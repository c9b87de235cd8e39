"""A pool's settings: its capacity, how it sizes what it holds in flight, and how it picks
the engine of each job (least loaded, or prefix-aware).

Part of the policy models of :mod:`velvetrope.core.policy`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from velvetrope.core.limit_policy import AdaptiveLimitPolicy, SloLimitPolicy

__all__ = ["LimitMode", "PoolPolicy", "PrefixRoutingPolicy", "ReplicaRouting"]

LimitMode = Literal["slo", "adaptive", "fixed"]
"""How a pool sizes what it holds in flight (see :class:`PoolPolicy`)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
