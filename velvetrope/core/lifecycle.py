"""What a job's record is made of: its lifecycle states, the reasons a job ends, what it
consumed and what it owes its buckets.

The :class:`~velvetrope.core.job.Job` record and the moves between states are
:mod:`velvetrope.core.job`'s.  Every terminal state carries a :class:`Reason`; each reason
maps to the HTTP status the gateway answers with.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["QUOTA_PREFIX", "TERMINAL_STATES", "JobState", "Reason", "Settlement", "Usage", "denied"]

QUOTA_PREFIX = "quota:"
"""The key prefix of a budget's bucket (:mod:`velvetrope.core.quota`)."""


class JobState(enum.Enum):
    """Where a job is in its lifecycle."""

    ARRIVED = "arrived"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"

    # members are singletons compared by identity: hash them the same way, in C (Enum's
    # own __hash__ is Python code, and states key the gateway's per-request metrics)
    __hash__ = object.__hash__


TERMINAL_STATES = frozenset(
    {JobState.REJECTED, JobState.EXPIRED, JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED}
)


class Reason(enum.Enum):
    """Why a job ended where it did.  ``status`` is the HTTP status the gateway returns."""

    COMPLETED = ("completed", 200)
    RATE_LIMITED = ("rate_limited", 429)
    REQUEST_TOO_LARGE = ("request_too_large", 429)
    TENANT_QUEUE_FULL = ("tenant_queue_full", 429)
    QUEUE_FULL = ("queue_full", 503)
    WAIT_EXCEEDS_SLO = ("wait_exceeds_slo", 503)
    EXPIRED = ("expired", 503)
    DRAINING = ("draining", 503)
    CANCELLED = ("cancelled", 499)
    UPSTREAM_ERROR = ("upstream_error", 502)
    UPSTREAM_TIMEOUT = ("upstream_timeout", 504)
    NO_HEALTHY_UPSTREAM = ("no_healthy_upstream", 503)
    STATE_UNAVAILABLE = ("state_unavailable", 503)  # shared state unreachable, fail_closed
    UPSTREAM_REJECTED = ("upstream_rejected", 400)  # the engine refused the request as sent
    REMOVED_BY_RELOAD = ("removed_by_reload", 503)  # queued; its tenant, tier or pool went
    PREEMPTED = ("preempted", 503)  # taken back before its first token; too late to requeue
    QUOTA_EXCEEDED = ("quota_exceeded", 429)  # a budget over a day, week, month or N hours

    __hash__ = object.__hash__  # as JobState's

    def __init__(self, code: str, status: int) -> None:
        self.code = code
        self.status = status

    @property
    def is_tenant_limit(self) -> bool:
        """True when the tenant's own limit caused it (HTTP 429), not fleet overload."""
        return self.status == 429


class Usage(NamedTuple):
    """Tokens a job actually consumed, as reported by the upstream.

    ``cached_tokens`` are the prompt tokens the engine found in its prefix cache, a part of
    ``prompt_tokens`` (``0 <= cached_tokens <= prompt_tokens``; 0 when the engine does not
    report them).  Only budgets and the ledger tell them apart
    (:mod:`velvetrope.core.quota`); the rate buckets and the capacity count every prompt
    token alike."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Settlement(NamedTuple):
    """What a terminal job owes its buckets: per bucket key, ``(reserved, actual)``.

    Applying it refunds ``reserved - actual`` when positive and charges the overrun when
    negative.  A job rejected or shed before any work was done settles with actual 0.
    """

    lines: tuple[tuple[str, float, float], ...]

    @property
    def empty(self) -> bool:
        return not self.lines


def denied(key: str, retry_after_s: float) -> tuple[Reason, str]:
    """Why a reservation that bucket ``key`` denied (a wait of ``retry_after_s``, finite)
    is refused, and the message: ``quota_exceeded`` for a budget's bucket, else
    ``rate_limited``."""
    if key.startswith(QUOTA_PREFIX):
        return Reason.QUOTA_EXCEEDED, f"budget {key!r} is spent; it resets in {retry_after_s:.0f}s"
    msg = f"rate limit of bucket {key!r} reached; retry in {retry_after_s:.2f}s"
    return Reason.RATE_LIMITED, msg
