"""The gateway and the simulator drive one request machine alike, event for event.

One trace goes through the simulator (:func:`~velvetrope.sim.loop.run_simulation`), which
records every event its driver fed the machine and every effect the machine gave back.
The same events, at the same virtual times, are then fed to the gateway's driver
(:class:`~velvetrope.gateway.driver.admission.Admission`, on asyncio, with the in-memory store):
arrivals enter as the gateway's request handler enters them, the engine's reports (sent,
first token, completion, failure) go through the tickets the driver handed out, a client
that gives up sets its disconnect future (queued) or cancels its ticket (dispatched), a
job taken back waits again through ``again``, and the simulator's ticks stand in for the
gateway's timer.  The machine's record in the gateway must equal the simulator's, entry
for entry: the same decisions, reservations, settlements, dispatches, cancellations and
answers, in the same order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from tests.sim.golden import _stress
from tests.sim.test_loop import SMALL, STRESS_POLICY
from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, Job, PolicyConfig, Reason, Usage
from velvetrope.gateway.driver.admission import Admission, Ticket
from velvetrope.sim.loop import run_simulation
from velvetrope.sim.trace_request import TraceRequest
from velvetrope.store.memory import MemoryStore

Record = list[tuple[float, str, str, str]]
_LIMITED = STRESS_POLICY.model_dump()
_LIMITED["tenants"][2]["limits"] = {"requests_per_minute": 6}  # tenant c: some 429s
STRESS = PolicyConfig.model_validate(_LIMITED)
_REASONS = {r.code: r for r in Reason}


def _jobs(ctl: AdmissionController, workload: Sequence[TraceRequest]) -> list[Job]:
    """The jobs the simulator makes of ``workload`` (``lengths="oracle"``: each job's
    predicted output is its real one)."""
    out = []
    for i, r in enumerate(workload):
        output = r.output_tokens if r.output_tokens > 0 else 1
        cap = r.max_tokens if r.max_tokens is not None else max(1024, output)
        tier = ctl.resolve_tier(r.tenant, r.tier)
        out.append(Job(str(i), r.tenant, tier, r.prompt_tokens, cap, predicted_output=output))
    return out


def _usage(detail: str) -> Usage:
    prompt, output = detail.split("+")
    return Usage(int(prompt), int(output))


async def _replay(config: PolicyConfig, workload: Sequence[TraceRequest], sim: Record) -> Record:
    """Feed the events of ``sim`` to the gateway's driver; return its machine's record."""
    clock = ManualClock(0.0)
    record: Record = []
    ctl = AdmissionController(config, clock)
    for p in ctl.config.pools:
        ctl.engines_ordered(p.name, False)  # the simulator's engines run FCFS
    adm = Admission(ctl, MemoryStore(clock), timer=False)
    adm.machine.record = record
    jobs = _jobs(ctl, workload)
    loop = asyncio.get_running_loop()
    entries: dict[str, asyncio.Task[Ticket | object]] = {}
    gone: dict[str, asyncio.Future[None]] = {}
    tickets: dict[str, Ticket] = {}
    relays: list[asyncio.Task[object]] = []

    async def run_ready() -> None:
        """Let every task that can run, run; a job taken back waits again (``again``)."""
        for _ in range(6):
            await asyncio.sleep(0)
        for jid, t in list(tickets.items()):
            if t.preempted:
                del tickets[jid]
                entries[jid] = loop.create_task(adm.again(t, gone[jid]))
                for _ in range(6):
                    await asyncio.sleep(0)

    def ticket(jid: str) -> Ticket:
        t = tickets.get(jid)
        if t is None:
            entry = entries[jid]
            assert entry.done(), f"job {jid} has no ticket yet"
            got = entry.result()
            assert isinstance(got, Ticket), (jid, got)
            t = tickets[jid] = got
        return t

    try:
        for at, what, jid, detail in sim:
            if what not in _EVENTS:
                continue
            clock.set(at)
            if what == "arrived":
                job = jobs[int(jid)]
                gone[jid] = loop.create_future()
                entries[jid] = loop.create_task(adm.enter(job, gone[jid]))
            elif what == "sent":
                relay: asyncio.Task[object] = loop.create_task(asyncio.Event().wait())
                relays.append(relay)
                ticket(jid).sent(relay)  # type: ignore[arg-type]
            elif what == "first_token":
                ticket(jid).first_token()
            elif what == "completed":
                ticket(jid).complete(_usage(detail))
                del tickets[jid]
            elif what == "failed":
                ticket(jid).fail(_REASONS[detail])
                del tickets[jid]
            elif what == "client_gone":
                if detail:  # dispatched: the relay saw the hang-up
                    ticket(jid).cancel(_usage(detail))
                    del tickets[jid]
                else:  # queued: its waiter sees the disconnect
                    gone[jid].set_result(None)
            elif what == "tick":
                adm.pump()
            await run_ready()
    finally:
        for t in [*relays, *entries.values()]:
            t.cancel()
        await asyncio.gather(*relays, *entries.values(), return_exceptions=True)
    return record


_EVENTS = frozenset(
    {"arrived", "sent", "first_token", "completed", "failed", "client_gone", "tick"}
)
"""What the drivers feed the machine (``reserved`` and ``downgraded`` come from inside
the gateway's ``enter``, as its store answers)."""


@pytest.mark.parametrize(
    ("name", "timeout_s", "replicas"), [("stress", 4.0, 2), ("same-instant", 2.5, 3)]
)
def test_the_gateway_and_the_simulator_drive_the_machine_alike(
    name: str, timeout_s: float, replicas: int
) -> None:
    work = _stress(dup=name == "same-instant", rate=60.0 if name == "same-instant" else 30.0)
    sim: Record = []
    run_simulation(
        STRESS, work, replicas, SMALL, lengths="oracle", client_timeout_s=timeout_s,
        machine_record=sim,
    )  # fmt: skip
    kinds = {what for _, what, _, _ in sim}
    # the trace exercises every path: denials and sheds, queueing, engine refusals,
    # clients giving up queued and dispatched, expiries at the queue's deadline
    assert {"respond", "settle", "send", "tick", "client_gone", "failed"} <= kinds
    codes = {d for _, what, _, d in sim if what == "respond"}
    assert "rate_limited" in codes and codes & {"expired", "queue_full", "wait_exceeds_slo"}
    got = asyncio.run(_replay(STRESS, work, sim))
    for i, (a, b) in enumerate(zip(sim, got, strict=False)):
        assert a == b, f"entry {i} differs: simulator {a}, gateway {b}"
    assert len(got) == len(sim)


PREEMPTING = PolicyConfig.model_validate(
    {
        "tiers": [
            {"name": "interactive", "slo": {"ttft_s": 1.0}},
            {"name": "batch", "slo": {"e2e_s": 600}},
        ],
        "tenants": [{"name": "a", "tier": "interactive"}, {"name": "b", "tier": "batch"}],
        "queue": {"bands": "strict"},
        "saturation": {"enabled": False},
        "pools": [{"name": "default", "limit": "slo", "max_in_flight": 6}],
    }
)


def _preempting_workload(n: int = 300, rate: float = 5.0, seed: int = 5) -> list[TraceRequest]:
    """Long-prompt batch requests (their prefill keeps their first token back) and short
    interactive ones, one in four: an interactive job that finds the six slots full waits
    past half its TTFT and takes a batch job back."""
    rng = np.random.default_rng(seed)
    out = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(1 / rate))
        if i % 4 == 0:
            prompt, output, tenant, cap = (
                int(rng.integers(20, 200)),
                int(rng.integers(5, 60)),
                "a",
                200,
            )
        else:
            prompt, output, tenant, cap = (
                int(rng.integers(600, 1500)), int(rng.integers(50, 300)), "b", 400,
            )  # fmt: skip
        out.append(TraceRequest(t, prompt, output, tenant, None, cap))
    return out


def test_the_drivers_agree_on_preemption_before_the_first_token() -> None:
    """Jobs taken back before their first token (``Cancel`` requeued, dispatched again):
    the gateway's driver gives the same record as the simulator's."""
    work = _preempting_workload()
    sim: Record = []
    res = run_simulation(
        PREEMPTING, work, 2, SMALL, lengths="oracle", client_timeout_s=60.0, machine_record=sim
    )
    assert sum(p.taken_back for p in res.pools) > 0
    assert any(what == "cancel" for _, what, _, _ in sim)
    got = asyncio.run(_replay(PREEMPTING, work, sim))
    for i, (a, b) in enumerate(zip(sim, got, strict=False)):
        assert a == b, f"entry {i} differs: simulator {a}, gateway {b}"
    assert len(got) == len(sim)
