"""Jobs, their lifecycle, and the reasons a job ends.

A :class:`Job` is one inference request as the admission core sees it.  Its state moves::

    ARRIVED ─► REJECTED(reason)
       ├─────► DISPATCHED  (admitted at once)
       └─────► QUEUED ─► EXPIRED | CANCELLED
                  └────► DISPATCHED ─► COMPLETED | FAILED | CANCELLED

Any other move raises :class:`~velvetrope.errors.LifecycleError`.  Every terminal state
carries a :class:`Reason`; each reason maps to the HTTP status the gateway answers with.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from velvetrope.core.bucket import Claim
from velvetrope.errors import LifecycleError

__all__ = [
    "TERMINAL_STATES",
    "Job",
    "JobState",
    "Outcome",
    "Reason",
    "Settlement",
    "Usage",
]


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

# keyed by the state's value (a str, whose hash is cached); successors compared by identity
_ALLOWED: dict[str, tuple[JobState, ...]] = {
    "arrived": (JobState.REJECTED, JobState.QUEUED, JobState.DISPATCHED),
    "queued": (JobState.EXPIRED, JobState.CANCELLED, JobState.DISPATCHED),
    "dispatched": (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED),
}


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

    __hash__ = object.__hash__  # as JobState's

    def __init__(self, code: str, status: int) -> None:
        self.code = code
        self.status = status

    @property
    def is_tenant_limit(self) -> bool:
        """True when the tenant's own limit caused it (HTTP 429), not fleet overload."""
        return self.status == 429


class Usage(NamedTuple):
    """Tokens a job actually consumed, as reported by the upstream."""

    prompt_tokens: int
    completion_tokens: int

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


@dataclass(slots=True, eq=False)
class Job:
    """One request as the admission core sees it.

    The caller fills the identity and size fields; the controller fills the rest.
    ``max_tokens`` is the declared completion limit (defaults already resolved), summed over
    the ``n`` completions the request asks for.
    ``predicted_output`` may be given (an oracle, a learned predictor); when ``None`` the
    controller's estimator fills it: from ``expected_output`` (the length the client says
    it expects) if the tenant's policy trusts it, else from its estimator.  ``template`` is
    a fingerprint of the prompt's template (its system prompt or first message's prefix),
    which the estimator may condition on.  ``streamed`` says whether the first token is
    seen when it is produced (``False``: a response delivered whole, whose first token is
    recorded at the end).  ``deadline`` is an absolute time on the controller's clock after
    which a still-queued job expires.  :meth:`AdmissionController.route
    <velvetrope.core.controller.AdmissionController.route>` sets ``pool``, ``route`` (the rule
    that chose it, or ``"default"``) and, when the job was degraded, ``degraded`` (the
    actions taken: ``"max_tokens"``, ``"pool"``) with the capped ``max_tokens`` and the
    fallback ``pool`` and ``model``.
    """

    id: str
    tenant: str
    tier: str
    prompt_tokens: int
    max_tokens: int
    pool: str = "default"
    model: str | None = None
    predicted_output: int | None = None
    arrival: float = math.nan
    deadline: float | None = None
    n: int = 1
    template: str | None = None
    expected_output: int | None = None
    streamed: bool = True
    # -- filled by the controller --
    route: str | None = None
    degraded: tuple[str, ...] = ()
    state: JobState = JobState.ARRIVED
    reason: Reason | None = None
    reserved_output: int = 0
    cost: int = 0
    seq: int = 0
    band: int = 0
    claims: tuple[Claim, ...] = ()  # bucket claims reserved for this job
    dispatched_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    usage: Usage | None = field(default=None)

    def move(self, new: JobState) -> None:
        """Move to ``new``; raise :class:`LifecycleError` if the move is not allowed."""
        allowed = _ALLOWED.get(self.state._value_)
        if allowed is None or new not in allowed:
            raise LifecycleError(
                f"job {self.id!r}: illegal transition {self.state.value} -> {new.value}"
            )
        self.state = new

    @property
    def terminal(self) -> bool:
        return self.state._value_ not in _ALLOWED

    @property
    def queue_s(self) -> float:
        """Seconds spent waiting before dispatch (or before the end, if never dispatched)."""
        end = self.dispatched_at if self.dispatched_at is not None else self.finished_at
        return 0.0 if end is None else max(0.0, end - self.arrival)


class Outcome(NamedTuple):
    """A job's terminal record, produced exactly once per job."""

    job: Job
    state: JobState
    reason: Reason
    settlement: Settlement
    at: float
