"""Builders shared by the core tests."""

from __future__ import annotations

import itertools
from typing import Any

from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, Decision, Job, Outcome, PolicyConfig
from velvetrope.core.tpot_limit import TpotLimit
from velvetrope.store.memory import MemoryStore

_ids = itertools.count()


def make_job(
    tenant: str = "t",
    tier: str = "default",
    prompt: int = 100,
    max_tokens: int = 100,
    predicted: int | None = None,
    **kw: Any,
) -> Job:
    """A job with a fresh id."""
    return Job(
        id=f"j{next(_ids)}",
        tenant=tenant,
        tier=tier,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        predicted_output=predicted,
        **kw,
    )


def controller(config: dict[str, Any] | None = None) -> tuple[AdmissionController, ManualClock]:
    clock = ManualClock()
    return AdmissionController(PolicyConfig.model_validate(config or {}), clock), clock


def run_fleet(
    ctl: AdmissionController,
    clock: ManualClock,
    arrivals: list[tuple[float, Job]],
    service_s: Any,
    until: float = float("inf"),
) -> list[Job]:
    """Drive ``ctl`` in virtual time: jobs arrive at their times, each dispatched job runs
    for ``service_s(job)`` seconds and completes with its predicted output.  Returns the
    jobs in dispatch order.  Capacity comes from the controller's pool config."""
    import heapq

    from velvetrope.core import Usage

    arrivals = sorted(arrivals, key=lambda a: a[0])
    running: list[tuple[float, int, Job]] = []
    order: list[Job] = []
    i = 0
    seq = 0

    def start(jobs: list[Job]) -> None:
        nonlocal seq
        for j in jobs:
            order.append(j)
            seq += 1
            heapq.heappush(running, (clock.now() + service_s(j), seq, j))

    while i < len(arrivals) or running:
        t_arr = arrivals[i][0] if i < len(arrivals) else float("inf")
        t_done = running[0][0] if running else float("inf")
        t = min(t_arr, t_done)
        if t > until:
            break
        clock.set(max(t, clock.now()))
        if t_done <= t_arr:
            _, _, j = heapq.heappop(running)
            out = j.predicted_output or 1
            ctl.complete(j.id, Usage(j.prompt_tokens, out))
        else:
            j = arrivals[i][1]
            i += 1
            d = ctl.arrive(j)
            from velvetrope.core import Dispatched

            if isinstance(d, Dispatched):
                start([j])
        start(ctl.dispatchable())
    return order


class _Settles:
    """An observer that settles every outcome in ``store`` (as a driver does)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def __call__(self, o: Outcome) -> None:
        self.store.settle(o)


def store_of(ctl: AdmissionController) -> MemoryStore:
    """The in-memory store that holds ``ctl``'s buckets in these tests (made on first use;
    it settles every outcome of ``ctl``)."""
    for obs in ctl.observers:
        if isinstance(obs, _Settles):
            return obs.store
    settles = _Settles(MemoryStore(ctl.clock))
    ctl.observers.append(settles)
    return settles.store


def arrive(ctl: AdmissionController, job: Job) -> Decision:
    """``job`` arrives in the gateway's order: its claims reserved in the store, then the
    controller's decision on that reservation."""
    return store_of(ctl).arrive(ctl, job)


def decode_one(
    limit: TpotLimit,
    in_flight: int,
    tpot: float,
    out: int,
    now: float,
    prompts_meanwhile: int = 0,
    prompt_tokens: int = 2000,
) -> float:
    """One interactive job decodes ``out`` tokens at ``tpot`` through ``limit``'s events while
    the pool holds ``in_flight`` jobs (``in_flight - 1`` batch jobs held open around it) and
    ``prompts_meanwhile`` prompts of ``prompt_tokens`` reach their first token during its
    decode; returns the time it ends."""
    others = [make_job(tier="batch") for _ in range(in_flight - 1)]
    for o in others:
        limit.started(o, now)
    job = make_job(tier="interactive")
    limit.started(job, now)
    job.first_token_at = now
    limit.first_token(job, now)
    for _ in range(prompts_meanwhile):
        burst = make_job(tier="batch", prompt=prompt_tokens)
        limit.started(burst, now)
        limit.first_token(burst, now)
        limit.ended(burst, now, 1, False)  # one token: no sample
    now += tpot * (out - 1)
    limit.ended(job, now, out, True)
    for o in others:
        limit.ended(o, now, 1, False)
    return now
