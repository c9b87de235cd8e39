"""The configuration of budgets (quotas) and of the usage ledger: the ``quotas`` section
of the gateway's file.

A :class:`Budget` caps what one tenant (or each tenant, ``tenant: "*"``), optionally on one
model, may use over a window: a calendar ``day``, ``week`` (ISO: from Monday) or ``month``
in :attr:`QuotaSettings.time_zone`, or a ``rolling`` window of ``hours``.  It counts
either weighted tokens (``tokens``, with :class:`Weights` for input, cached input and
output) or dollars (``cost_usd``, from the :class:`Price` table).  How budgets are reserved
and settled is :mod:`velvetrope.core.quota`'s.
"""

from __future__ import annotations

from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ANY_TENANT",
    "Budget",
    "OnExceeded",
    "Price",
    "QuotaSettings",
    "Weights",
    "Window",
    "check_downgrades",
]

Window = Literal["day", "week", "month", "rolling"]
OnExceeded = Literal["refuse", "downgrade"]
ANY_TENANT = "*"
"""A budget's ``tenant`` that gives every tenant a budget of its own."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Model):
    """A model's prices, in dollars per million tokens."""

    input: float = Field(ge=0, description="$ per 1M input (prompt) tokens")
    cached_input: float | None = Field(
        None, ge=0, description="$ per 1M cached input tokens (absent: the input price)"
    )
    output: float = Field(ge=0, description="$ per 1M output (completion) tokens")

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        """Dollars for ``input_tokens`` of prompt (of which ``cached_tokens`` were cached)
        and ``output_tokens`` of output."""
        cached = self.input if self.cached_input is None else self.cached_input
        fresh = input_tokens - cached_tokens
        return (fresh * self.input + cached_tokens * cached + output_tokens * self.output) / 1e6


class Weights(_Model):
    """What one token of each kind counts against a ``tokens`` budget."""

    input: float = Field(1.0, ge=0, description="weight of an input (prompt) token")
    cached_input: float = Field(1.0, ge=0, description="weight of a cached input token")
    output: float = Field(1.0, ge=0, description="weight of an output (completion) token")


class Budget(_Model):
    """One budget: a tenant's (or each tenant's), on one model or all, over a window."""

    tenant: str = Field(
        min_length=1, description="the tenant it caps; '*': each tenant gets this budget"
    )
    model: str | None = Field(
        None, min_length=1, description="the model it caps (absent: every model together)"
    )
    window: Window = Field(
        description="day, week (ISO, from Monday) or month in quotas.time_zone; rolling: "
        "the last `hours`"
    )
    hours: float | None = Field(
        None, gt=0, description="the rolling window's length in hours (rolling only)"
    )
    tokens: float | None = Field(
        None, gt=0, description="the budget in weighted tokens (or give cost_usd)"
    )
    cost_usd: float | None = Field(
        None, gt=0, description="the budget in dollars from quotas.prices (or give tokens)"
    )
    weights: Weights = Field(default_factory=Weights, description="token weights (tokens only)")
    on_exceeded: OnExceeded = Field(
        "refuse",
        description="what a request that does not fit in the spent budget gets: refuse "
        "(default): 429 quota_exceeded until the window resets; downgrade: served all the "
        "same at downgrade_to_tier and/or in downgrade_to_pool, not charged to this budget "
        "(still to the tenant's other budgets and the ledger)",
    )
    downgrade_to_tier: str | None = Field(
        None,
        min_length=1,
        description="on_exceeded: downgrade: the tier (of policy.tiers) the request runs at "
        "instead of its own (absent: its own tier)",
    )
    downgrade_to_pool: str | None = Field(
        None,
        min_length=1,
        description="on_exceeded: downgrade: the pool (of policy.pools) the request is sent "
        "to instead of the one its route chose (absent: the route's pool, for the new tier)",
    )

    @model_validator(mode="after")
    def _check(self) -> Budget:
        if (self.tokens is None) == (self.cost_usd is None):
            raise ValueError("a budget gives exactly one of tokens and cost_usd")
        if (self.window == "rolling") != (self.hours is not None):
            raise ValueError("hours is given with window: rolling, and only then")
        to = (self.downgrade_to_tier, self.downgrade_to_pool)
        if self.on_exceeded == "downgrade" and to == (None, None):
            raise ValueError(
                "on_exceeded: downgrade needs downgrade_to_tier or downgrade_to_pool (or both)"
            )
        if self.on_exceeded == "refuse" and to != (None, None):
            raise ValueError(
                "downgrade_to_tier and downgrade_to_pool are given with on_exceeded: "
                "downgrade, and only then"
            )
        return self

    @property
    def unit(self) -> str:
        """``tok`` or ``usd``: what the budget counts (part of its bucket's key)."""
        return "tok" if self.tokens is not None else "usd"

    @property
    def amount(self) -> float:
        """The budget: weighted tokens or dollars."""
        return self.tokens if self.tokens is not None else float(self.cost_usd or 0.0)


class QuotaSettings(_Model):
    """Budgets over days, weeks, months or rolling hours, and the usage ledger."""

    time_zone: str = Field("UTC", description="IANA time zone of day, week and month windows")
    soft_threshold: float = Field(
        0.8,
        gt=0,
        le=1,
        description="share of a budget used past which responses carry "
        "x-velvetrope-quota-warning and velvetrope_quota_warnings_total counts",
    )
    enforce: bool = Field(
        True,
        description="false: shadow mode for budgets: usage is counted, nothing is refused, "
        "and what would have been is said in a header and a metric",
    )
    ledger: bool = Field(
        False,
        description="keep the usage ledger: per tenant, model and day, requests and "
        "tokens, written by each request's settlement (GET /admin/usage)",
    )
    prices: dict[str, Price] = Field(
        default_factory=dict,
        description="per model, $ per 1M tokens; '*' prices every model not listed",
    )
    budgets: tuple[Budget, ...] = Field((), description="the budgets")

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(f"unknown time zone {v!r}") from e
        return v

    @model_validator(mode="after")
    def _check(self) -> QuotaSettings:
        seen: set[tuple[str, str | None, str, float | None, str]] = set()
        for b in self.budgets:
            k = (b.tenant, b.model, b.window, b.hours, b.unit)
            if k in seen:
                raise ValueError(
                    f"two budgets of tenant {b.tenant!r}, model {b.model!r} count "
                    f"{b.unit} over the same window {b.window}"
                )
            seen.add(k)
        return self

    def price(self, model: str | None) -> Price | None:
        """``model``'s prices (else the ``'*'`` entry's, else ``None``: it costs nothing)."""
        p = self.prices.get(model) if model is not None else None
        return p if p is not None else self.prices.get("*")

    @property
    def active(self) -> bool:
        """Whether anything is to be reserved or counted."""
        return bool(self.budgets) or self.ledger


def check_downgrades(settings: QuotaSettings, tiers: set[str], pools: set[str]) -> None:
    """Raise ``ValueError`` for a budget that downgrades to a tier not in ``tiers`` or a
    pool not in ``pools`` (the policy's names; an empty set is not checked: the preset's)."""
    for b in settings.budgets:
        if tiers and b.downgrade_to_tier is not None and b.downgrade_to_tier not in tiers:
            raise ValueError(
                f"quotas.budgets: downgrade_to_tier {b.downgrade_to_tier!r} of tenant "
                f"{b.tenant!r} is not in policy.tiers {sorted(tiers)}"
            )
        if pools and b.downgrade_to_pool is not None and b.downgrade_to_pool not in pools:
            raise ValueError(
                f"quotas.budgets: downgrade_to_pool {b.downgrade_to_pool!r} of tenant "
                f"{b.tenant!r} is not in policy.pools {sorted(pools)}"
            )
