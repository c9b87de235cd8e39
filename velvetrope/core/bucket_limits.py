"""Edge limits: the token and request buckets of one key (a tenant, a tier or a model).

Part of the policy models of :mod:`velvetrope.core.policy`; the arithmetic of the buckets
is :mod:`velvetrope.core.bucket`'s.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_BURST_S", "SEED_BURST_S", "BucketLimits"]


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
