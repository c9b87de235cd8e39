"""What a replay of :mod:`velvetrope.demo.loadgen` records: how each request ended
(:class:`ReplayOutcome`), its times, status and tokens (:class:`RequestResult`), the run's
progress while it goes (:class:`LiveCounters`) and the whole run (:class:`ReplayResult`).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["LiveCounters", "ReplayOutcome", "ReplayResult", "RequestResult"]


class ReplayOutcome(enum.Enum):
    """How one replayed request ended (exactly one per request)."""

    COMPLETED = "completed"
    """200 and the whole stream, ``data: [DONE]`` included."""
    REJECTED = "rejected"
    """429 or 503: the server turned it away (``error_code`` says why)."""
    ERROR = "error"
    """Any other HTTP status, or a stream that carried an error or ended early."""
    TIMEOUT = "timeout"
    """Still open at its per-request timeout or the run's deadline; cut by the client."""
    FAILED = "failed"
    """No HTTP answer: the connection could not be made or broke before the headers."""
    HUNG_UP = "hung_up"
    """The client hung up on purpose, as its :class:`ClientPlan` said, before the end."""


@dataclass(slots=True)
class RequestResult:
    """One request of a replay.  Times are seconds; ``None`` when the moment never came.

    ``scheduled_s`` is the arrival time in the workload, ``sent_s`` when it was really sent
    (both from the start of the run).  ``ttft_s`` (first chunk with text) and ``e2e_s``
    (end of the stream or of a rejection's body) are measured from ``sent_s``.  ``elapsed_s``
    is how long the client waited in all, whatever the outcome (for a timeout: until it was
    cut).  ``tokens`` counts the streamed chunks with text; ``usage_tokens`` is the
    ``completion_tokens`` the server reported, if it did.
    """

    index: int
    tenant: str
    tier: str | None
    url: str
    prompt_tokens: int
    max_tokens: int
    scheduled_s: float
    sent_s: float = math.nan
    outcome: ReplayOutcome = ReplayOutcome.FAILED
    status: int = 0
    error_code: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    elapsed_s: float = 0.0
    queue_ms: float | None = None
    retry_after_s: float | None = None
    tokens: int = 0
    usage_tokens: int | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, ``(e2e − ttft) / (tokens − 1)``; ``None``
        without both times or for an answer of fewer than two tokens."""
        if self.tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)


@dataclass(slots=True)
class LiveCounters:
    """Progress of a running replay, for a live view (updated in place by :func:`replay`).

    ``total``: requests handed to :func:`replay` (summed over the replays that share these
    counters); ``open``: sent and not ended; ``accepted``: answered 200 (behind a gateway:
    dispatched); ``first_token``: got their first token; ``rejected``: by error code;
    ``hung_up``: clients that hung up on purpose (:class:`ClientPlan`).
    """

    total: int = 0
    sent: int = 0
    open: int = 0
    accepted: int = 0
    first_token: int = 0
    completed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    timeouts: int = 0
    failed: int = 0
    hung_up: int = 0
    tokens: int = 0
    max_send_lag_s: float = 0.0

    @property
    def finished(self) -> int:
        """Requests that reached an outcome."""
        return (
            self.completed
            + sum(self.rejected.values())
            + self.errors
            + self.timeouts
            + self.failed
            + self.hung_up
        )


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """All requests of a replay (in workload order) and the run's wall duration."""

    results: list[RequestResult]
    duration_s: float
    max_send_lag_s: float

    def by_outcome(self) -> Counter[ReplayOutcome]:
        """How many requests ended each way."""
        return Counter(r.outcome for r in self.results)

    def tokens_wasted(self) -> int:
        """Tokens streamed for requests that never completed (cut at the deadline, hung up,
        failed): work the engines did for nothing."""
        return sum(r.tokens for r in self.results if r.outcome is not ReplayOutcome.COMPLETED)
