"""The soak's load: the demo's workload at a steady rate, looped, with impatient clients.

:func:`soak_workload` takes the demo's requests (:func:`velvetrope.demo.workload.build_workload`:
the ``azure_conv`` trace from 600 s on, the demo's three tenants, compressed to the demo
engines' derived capacity) over the longest of :data:`WINDOWS_S` the trace can fill, and
rescales their arrival times to ``rate`` requests per second.  The loop's period is the
number of requests over ``rate`` (so the rate holds across loop boundaries too).

:func:`client_plans` draws, per request (seeded, so every run is the same), how its client
behaves: a share ``stream_share`` streams (the rest asks for one JSON answer), and a share
``disconnect_share`` hangs up on purpose, half of those while waiting (after a time drawn
uniformly in :data:`EARLY_HANG_UP_S`: before the answer's head that is a place in the
gateway's queue, else a generation in flight) and half mid-stream (after a number of tokens
drawn uniformly below the request's output).  A request with fewer than 2 output tokens, or
a non-streaming client, that draws a mid-stream hang-up hangs up while waiting instead.

:func:`drive` replays the loop open-loop (:func:`velvetrope.demo.loadgen.replay`) until
``seconds`` have passed, and :class:`Tally` sorts the outcomes: a rejection for an admission
reason (:data:`ADMISSION_CODES`) or a hang-up the plan asked for is the load doing what it
should; any other error answer, a failed connection or a client timeout is an error.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from velvetrope.core.lifecycle import Reason
from velvetrope.demo.loadgen import replay
from velvetrope.demo.replay_config import ClientPlan, ReplayConfig
from velvetrope.demo.replay_results import LiveCounters, ReplayOutcome, ReplayResult
from velvetrope.demo.settings import DemoSettings
from velvetrope.demo.workload import build_workload
from velvetrope.errors import PolicyError
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.sim.workload import scale_to_rate

__all__ = [
    "ADMISSION_CODES",
    "EARLY_HANG_UP_S",
    "WINDOWS_S",
    "SoakWorkload",
    "Tally",
    "client_plans",
    "drive",
    "soak_workload",
]

WINDOWS_S: Final = (120.0, 60.0, 30.0)
"""Trace windows tried, longest first (a faster engine needs more requests per second)."""
EARLY_HANG_UP_S: Final = (0.1, 1.0)
"""Bounds of a waiting client's patience, in seconds after sending."""

ADMISSION_CODES: Final = frozenset(
    r.code
    for r in (
        Reason.RATE_LIMITED,
        Reason.REQUEST_TOO_LARGE,
        Reason.TENANT_QUEUE_FULL,
        Reason.QUEUE_FULL,
        Reason.WAIT_EXCEEDS_SLO,
        Reason.EXPIRED,
    )
)
"""Rejections (429, 503) that are admission at work, not errors."""


@dataclass(frozen=True, slots=True)
class SoakWorkload:
    """One loop of the soak: requests (``t`` from 0), their clients, and the loop's period."""

    requests: list[TraceRequest]
    plans: list[ClientPlan]
    period_s: float
    rate: float

    def loop(self, k: int, seconds: float) -> tuple[list[TraceRequest], list[ClientPlan]]:
        """The requests of loop ``k`` (which starts at ``k × period_s``) that arrive before
        ``seconds`` from the start of the soak, with their plans."""
        left = seconds - k * self.period_s
        n = sum(1 for r in self.requests if r.t < left)
        return self.requests[:n], self.plans[:n]


def client_plans(
    requests: Sequence[TraceRequest],
    seed: int,
    stream_share: float = 0.7,
    disconnect_share: float = 0.2,
) -> list[ClientPlan]:
    """One :class:`ClientPlan` per request, drawn as the module docstring says."""
    for name, share in (("stream_share", stream_share), ("disconnect_share", disconnect_share)):
        if not 0.0 <= share <= 1.0:
            raise PolicyError(f"{name} must be within [0, 1], got {share}")
    rng = random.Random(seed)
    plans: list[ClientPlan] = []
    for r in requests:
        stream = rng.random() < stream_share
        if rng.random() >= disconnect_share:
            plans.append(ClientPlan(stream=stream))
            continue
        mid_stream = rng.random() < 0.5
        if mid_stream and stream and r.output_tokens >= 2:
            after = rng.randint(1, r.output_tokens - 1)
            plans.append(ClientPlan(stream=True, hang_up_after_tokens=after))
        else:
            plans.append(ClientPlan(stream=stream, hang_up_after_s=rng.uniform(*EARLY_HANG_UP_S)))
    return plans


def soak_workload(
    rate: float,
    speed: float = 3.0,
    seed: int = 7,
    stream_share: float = 0.7,
    disconnect_share: float = 0.2,
) -> SoakWorkload:
    """The soak's loop at ``rate`` req/s for the demo's engines at ``speed`` (module
    docstring).  PolicyError when even the shortest window is more than the trace holds."""
    if not rate > 0:
        raise PolicyError(f"rate must be > 0, got {rate}")
    last: PolicyError | None = None
    for window in WINDOWS_S:
        try:
            wl = build_workload(DemoSettings(window_s=window, overload=1.0, speed=speed, seed=seed))
        except PolicyError as e:
            last = e
            continue
        reqs = scale_to_rate(wl.requests, rate)
        period = max(len(reqs) / rate, reqs[-1].t + 1.0 / rate)
        plans = client_plans(reqs, seed, stream_share, disconnect_share)
        return SoakWorkload(reqs, plans, period, rate)
    assert last is not None
    raise last


@dataclass(slots=True)
class Tally:
    """Outcomes of every request the soak sent, sorted into load and errors.

    ``outcomes``: requests by :class:`ReplayOutcome` value; ``rejected``: admission
    rejections by code; ``errors``: everything else that went wrong, by a short description
    (``HTTP 502 upstream_error``, ``failed ClientOSError``, ``timeout client_timeout``);
    ``answered``: requests that got a status line (the server read them, whatever came
    next); the others failed to connect or hung up before any answer.
    """

    outcomes: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def sent(self) -> int:
        """Requests sent (a request the deadline kept from being sent is an error)."""
        return sum(self.outcomes.values())

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def add(self, result: ReplayResult) -> None:
        """Count one replay's requests."""
        for r in result.results:
            self.outcomes[r.outcome.value] += 1
            self.answered += r.status != 0
            code = r.error_code or ""
            if r.outcome is ReplayOutcome.REJECTED and code in ADMISSION_CODES:
                self.rejected[code] += 1
            elif r.outcome in (ReplayOutcome.REJECTED, ReplayOutcome.ERROR):
                self.errors[f"HTTP {r.status or '-'} {code}".rstrip()] += 1
            elif r.outcome in (ReplayOutcome.FAILED, ReplayOutcome.TIMEOUT):
                self.errors[f"{r.outcome.value} {code}".rstrip()] += 1


async def drive(
    workload: SoakWorkload,
    config: ReplayConfig,
    seconds: float,
    live: LiveCounters,
    tally: Tally,
) -> None:
    """Replay ``workload`` looped for ``seconds``, counting into ``live`` and ``tally``.

    Loop ``k`` is one :func:`replay` of its own (its own connection pool), started at
    ``k × period_s`` while the previous loop's last requests still run; its deadline leaves
    every request its ``config.request_timeout_s``, so none is cut by the deadline rather
    than its timeout.  Returns when every request sent has its outcome.  Cancelled, it
    cancels the loops (their open requests are cut).
    """
    t0 = time.monotonic()
    loops: list[asyncio.Task[None]] = []

    async def one(k: int) -> None:
        reqs, plans = workload.loop(k, seconds)
        deadline = workload.period_s + config.request_timeout_s
        tally.add(await replay(reqs, replace(config, deadline_s=deadline), live, plans))

    try:
        k = 0
        while k * workload.period_s < seconds:
            delay = t0 + k * workload.period_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            loops.append(asyncio.create_task(one(k)))
            k += 1
        await asyncio.gather(*loops)
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
