"""The admission core's record of one request, and the moves of its lifecycle.

A :class:`Job` is one inference request as the admission core sees it.  Its state moves::

    ARRIVED ─► REJECTED(reason)
       ├─────► DISPATCHED  (admitted at once)
       └─────► QUEUED ─► EXPIRED | CANCELLED | REJECTED (removed by a reload)
                  └────► DISPATCHED ─► COMPLETED | FAILED | CANCELLED

Any other move raises :class:`~velvetrope.errors.LifecycleError`.  A terminal job's record
is an :class:`Outcome`.  The states, reasons, usage and settlement are
:mod:`velvetrope.core.lifecycle`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from velvetrope.core.bucket import Claim
from velvetrope.core.lifecycle import JobState, Reason, Settlement, Usage
from velvetrope.errors import LifecycleError

__all__ = ["Job", "Outcome"]

# keyed by the state's value (a str, whose hash is cached); successors compared by identity
_ALLOWED: dict[str, tuple[JobState, ...]] = {
    "arrived": (JobState.REJECTED, JobState.QUEUED, JobState.DISPATCHED),
    "queued": (JobState.EXPIRED, JobState.CANCELLED, JobState.DISPATCHED, JobState.REJECTED),
    # a dispatched job taken back before its first token is queued again, or rejected
    # (preempted) when it can no longer start in time
    "dispatched": (
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.QUEUED,
        JobState.REJECTED,
    ),
}


@dataclass(slots=True, eq=False, init=False)
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
    recorded at the end).  ``kind`` is the endpoint kind, a label only (``chat``,
    ``completions``, ``responses``, ``messages``, ``embeddings``, ``rerank``,
    ``passthrough``): metrics and reports group by it; no policy reads it.  ``deadline`` is
    an absolute time on the controller's clock after which a still-queued job expires.
    :meth:`AdmissionController.route
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
    pool: str
    model: str | None
    predicted_output: int | None
    arrival: float
    deadline: float | None
    n: int
    template: str | None
    expected_output: int | None
    streamed: bool
    kind: str
    # -- filled by the controller --
    route: str | None
    degraded: tuple[str, ...]
    state: JobState
    reason: Reason | None
    reserved_output: int
    cost: int
    seq: int
    band: int
    claims: tuple[Claim, ...]  # bucket claims reserved for this job
    dispatched_at: float | None
    first_token_at: float | None
    finished_at: float | None
    usage: Usage | None
    shadow: str | None  # shadow mode: "admitted", "queued" or "rejected", as if enforced
    shadow_reason: str  # why ("" admitted, "capacity" queued, a Reason's code rejected)
    preemptions: int  # times taken back from an engine before its first token

    def __init__(
        self,
        id: str,
        tenant: str,
        tier: str,
        prompt_tokens: int,
        max_tokens: int,
        pool: str = "default",
        model: str | None = None,
        predicted_output: int | None = None,
        arrival: float = math.nan,
        deadline: float | None = None,
        n: int = 1,
        template: str | None = None,
        expected_output: int | None = None,
        streamed: bool = True,
        kind: str = "chat",
    ) -> None:
        """The caller's fields; the controller's start empty (a new job has ``ARRIVED``).
        Written out, not generated: a compiled class builds it without Python code."""
        self.id = id
        self.tenant = tenant
        self.tier = tier
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.pool = pool
        self.model = model
        self.predicted_output = predicted_output
        self.arrival = arrival
        self.deadline = deadline
        self.n = n
        self.template = template
        self.expected_output = expected_output
        self.streamed = streamed
        self.kind = kind
        self.route = None
        self.degraded = ()
        self.state = JobState.ARRIVED
        self.reason = None
        self.reserved_output = 0
        self.cost = 0
        self.seq = 0
        self.band = 0
        self.claims = ()
        self.dispatched_at = None
        self.first_token_at = None
        self.finished_at = None
        self.usage = None
        self.shadow = None
        self.shadow_reason = ""
        self.preemptions = 0

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
