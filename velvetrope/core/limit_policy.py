"""The settings of a pool's in-flight limits other than a fixed count: the adaptive limit
(:mod:`velvetrope.core.limit`) and the limits derived from the tiers' SLOs
(:mod:`velvetrope.core.tpot_limit`, :mod:`velvetrope.core.headroom`).  Part of a pool's
settings (:mod:`velvetrope.core.pool_policy`), among the policy models of
:mod:`velvetrope.core.policy`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["AdaptiveLimitPolicy", "SloLimitPolicy"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptiveLimitPolicy(_Model):
    """The adaptive in-flight limit of a pool without ``max_in_flight`` (see
    :mod:`velvetrope.core.limit`): it tracks the knee of the pool's throughput curve, the
    smallest concurrency that keeps ``target`` of the best throughput seen."""

    initial: float = Field(
        16.0,
        ge=1,
        description="First limit per live engine, before anything is measured (the pool "
        "starts at this × its engines when it knows them).",
    )
    floor: int = Field(1, ge=1, description="The limit never goes below this.")
    ceiling: int = Field(4096, ge=1, description="The limit never goes above this.")
    target: float = Field(
        0.98, gt=0, lt=1, description="Share of the best throughput seen that the knee keeps."
    )
    window_s: float = Field(3.0, gt=0, description="Shortest measurement window, seconds.")
    settle_s: float = Field(
        1.0, ge=0, description="Seconds after each change of the limit before measuring."
    )
    min_jobs: int = Field(20, ge=1, description="Jobs with samples needed to close a window.")
    ramp: float = Field(
        0.5, gt=0, le=4, description="Slots opened per job that ends while the limit rises."
    )
    probe_gain: float = Field(
        1.2, gt=1, le=4, description="Probe windows run at this multiple of the base limit."
    )
    gradient: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="The knee: where this share of each extra job in flight waits for its "
        "first token (an engine queue forms).",
    )
    pairs: int = Field(
        3, ge=1, description="Pairs of windows whose slopes are pooled near the knee."
    )
    history: int = Field(24, ge=2, description="Recent windows kept for inspection.")
    max_step: float = Field(1.5, gt=1, le=4, description="Largest change of one step (factor).")
    gain: float = Field(
        0.1,
        gt=0,
        le=1,
        description="How far one pair of windows moves the limit: this times the log of "
        "gradient over the measured slope.",
    )

    @model_validator(mode="after")
    def _check(self) -> AdaptiveLimitPolicy:
        if self.floor > self.ceiling:
            raise ValueError(f"floor {self.floor} is above ceiling {self.ceiling}")
        return self


class SloLimitPolicy(_Model):
    """The pool's limits in ``limit: slo`` mode, derived from the tiers' SLOs and what the
    engines are measured to do (:mod:`velvetrope.core.tpot_limit`,
    :mod:`velvetrope.core.headroom`).  The defaults are margins, not capacities: nothing
    here depends on the model, the GPU or the traffic."""

    tpot_margin_sd: float = Field(
        3.0,
        ge=0,
        description="In flight per engine up to where the measured TPOT, plus this many "
        "standard deviations of the requests' TPOT around the fit, reaches the tightest "
        "TPOT objective among the tiers running.",
    )
    half_life: float = Field(
        200.0,
        gt=0,
        description="TPOT samples (completed streamed responses) after which an old "
        "sample's weight in the fit has halved: how fast the limit follows a change.",
    )
    min_samples: int = Field(30, ge=2, description="Samples needed before the TPOT limit binds.")
    min_spread: float = Field(
        4.0,
        gt=0,
        description="Range of in-flight per engine the samples must span before the "
        "TPOT limit binds (a line through one point says nothing of its slope).",
    )
    headroom_share: float = Field(
        0.75,
        gt=0,
        le=1,
        description="A job of a tier with a TTFT objective passes the engines' saturation "
        "brake when the jobs an engine starts before it are started within this share of "
        "its remaining TTFT (the rest covers its prefill and measurement error).  A "
        "higher tier's first token counts as late past this share of its TTFT (a lower-"
        "tier ceiling is cut), lower tiers wait while every engine's prefill backlog "
        "takes longer than this share of the top tier's TTFT, and the engines have "
        "plain room while none queues and "
        "their KV caches and the jobs in flight are under this share of full and of the "
        "TPOT limit (a ceiling then relaxes a slot per first token in time).",
    )
    start_window_s: float = Field(
        5.0,
        gt=0,
        description="Window over which the engines' start rate and the pool's end rate are "
        "measured.",
    )
    preempt: bool = Field(
        True,
        description="Make room before the first token: when a job of a tier with a TTFT "
        "objective would start too late, take back a lower tier's job that an engine has "
        "not begun answering (cancelled at the engine, queued again at the head of its "
        "band, or 503 `preempted` when it can no longer start in time).  A job that has "
        "streamed a token is never taken back.",
    )
    first_token_quantile: float | None = Field(
        0.1,
        ge=0,
        lt=1,
        description="A queued job of a tier with a TTFT objective is expired (503 "
        "`expired`, as at its deadline) rather than dispatched when it would reach its "
        "first token past its objective by this quantile of the tier's recent leads (the "
        "time from dispatch to first token of its streamed jobs dispatched within the last "
        "`start_window_s`, at least 8 of them): 0.1 means nine in ten of them took "
        "longer.  An engine's prefill and tokens then go to requests that can still meet "
        "their objective.  null: a job is dispatched until its deadline.",
    )
    preempt_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A job asks for room when its predicted wait for a slot (one over the "
        "rate at which the pool's jobs end) exceeds this share of the TTFT it has left, or, "
        "before any end is measured, once it has waited this share of its TTFT.  A job of "
        "the top tier that has waited this share of its TTFT also passes the TPOT limit when "
        "the pool, at the rate its jobs end, would not fall under the limit within the TTFT "
        "it has left, while the top tier's own jobs in flight are under the limit (whether "
        "or not `preempt`).",
    )
