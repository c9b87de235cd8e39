"""A request's admission in process (no sockets): the ticket, from arrival to settlement,
against a real controller and the memory store.  Every job ends exactly once and its
reservation is settled exactly once, whatever ended it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.core.helpers import make_job
from velvetrope.clock import ManualClock
from velvetrope.core import AdmissionController, JobState, Outcome, PolicyConfig, Reason, Usage
from velvetrope.gateway.driver.admission import Admission, Refusal, Ticket
from velvetrope.store.memory import MemoryStore

LIMITED = {
    "pools": [{"name": "default", "max_in_flight": 1}],
    "tenants": [{"name": "t", "tier": "default", "limits": {"tokens_per_minute": 6000}}],
}


def admission(
    extra: dict[str, Any] | None = None,
) -> tuple[Admission, AdmissionController, MemoryStore, ManualClock, list[Outcome]]:
    clock = ManualClock()
    ctl = AdmissionController(PolicyConfig.model_validate({**LIMITED, **(extra or {})}), clock)
    seen: list[Outcome] = []
    ctl.observers.append(seen.append)
    store = MemoryStore(clock)
    return Admission(ctl, store), ctl, store, clock, seen


def level(store: MemoryStore) -> float:
    """The tenant's token bucket now (6000 when full; the clock stands still)."""
    return store.levels()["tenant:t:tok"][0]


def test_a_ticket_settles_what_was_used_and_wakes_the_next_request() -> None:
    async def main() -> None:
        adm, ctl, store, _, seen = admission()
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        ta = await adm.enter(a, loop.create_future())
        assert isinstance(ta, Ticket) and ta.job is a
        assert level(store) == 6000 - 200  # prompt 100 + max_tokens 100 reserved
        waiter = asyncio.ensure_future(adm.enter(b, loop.create_future()))
        await asyncio.sleep(0)
        assert b.state is JobState.QUEUED and adm.waiting == 1
        ta.first_token()
        ta.complete(Usage(100, 10))
        ta.complete(Usage(100, 10))  # a ticket ends once: the second call does nothing
        tb = await waiter
        assert isinstance(tb, Ticket) and b.state in (JobState.DISPATCHED,)
        assert level(store) == 6000 - 110 - 200
        tb.fail(Reason.UPSTREAM_ERROR)  # nothing charged
        assert level(store) == 6000 - 110
        assert (ctl.in_flight, ctl.queued, adm.waiting) == (0, 0, 0)
        assert [o.reason for o in seen] == [Reason.COMPLETED, Reason.UPSTREAM_ERROR]
        assert a.first_token_at is not None

    asyncio.run(main())


def test_a_client_gone_in_the_tick_its_job_is_dispatched_is_refunded_and_not_proxied() -> None:
    """The race: the slot frees (dispatching the queued job) and its client hangs up before
    the waiter runs.  No ticket; the job is cancelled, its slot free, nothing charged."""

    async def main() -> None:
        adm, ctl, store, _, seen = admission()
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        gone_b: asyncio.Future[None] = loop.create_future()
        ta = await adm.enter(a, loop.create_future())
        assert isinstance(ta, Ticket)
        waiter = asyncio.ensure_future(adm.enter(b, gone_b))
        await asyncio.sleep(0)
        ta.complete(Usage(100, 10))  # dispatches b ...
        gone_b.set_result(None)  # ... and b's client leaves in the same tick
        assert await waiter is None
        assert b.state is JobState.CANCELLED
        assert (ctl.in_flight, ctl.queued) == (0, 0)
        assert [o.reason for o in seen] == [Reason.COMPLETED, Reason.CANCELLED]
        assert level(store) == 6000 - 110

    asyncio.run(main())


def test_a_client_gone_while_queued_is_cancelled_at_once_and_refunded() -> None:
    async def main() -> None:
        adm, ctl, store, _, _ = admission()
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        gone_b: asyncio.Future[None] = loop.create_future()
        ta = await adm.enter(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.enter(b, gone_b))
        await asyncio.sleep(0)
        assert level(store) == 6000 - 400
        gone_b.set_result(None)
        assert await waiter is None
        assert b.state is JobState.CANCELLED and ctl.queued == 0 and ctl.in_flight == 1
        assert level(store) == 6000 - 200
        assert isinstance(ta, Ticket)
        ta.cancel()  # the client left mid-answer: its prompt is charged
        assert level(store) == 6000 - 100 and ctl.in_flight == 0

    asyncio.run(main())


def test_an_expired_wait_is_refused_and_refunded() -> None:
    async def main() -> None:
        adm, ctl, store, clock, _ = admission({"tiers": [{"name": "default", "max_wait_s": 0.5}]})
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        ta = await adm.enter(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.enter(b, loop.create_future()))
        await asyncio.sleep(0)
        clock.advance(1)
        adm.pump()  # a driver's tick after the deadline
        out = await waiter
        assert out == Refusal(
            503, "expired", "the request waited past its deadline in the queue", 1.0
        )
        assert b.state is JobState.EXPIRED and ctl.queued == 0
        assert isinstance(ta, Ticket)
        ta.complete(Usage(100, 100))
        # a and b took 200 each, 1 s refilled 100, b's 200 came back, a used its 200
        assert level(store) == pytest.approx(6000 - 400 + 100 + 200)

    asyncio.run(main())


def test_a_draining_gateway_refuses_before_reserving_anything() -> None:
    async def main() -> None:
        adm, _, store, _, seen = admission()
        loop = asyncio.get_running_loop()
        adm.start_draining()
        job = make_job()
        out = await adm.enter(job, loop.create_future())
        assert isinstance(out, Refusal) and (out.status, out.code) == (503, "draining")
        assert store.levels() == {}  # no bucket was even touched
        assert [o.reason for o in seen] == [Reason.DRAINING]

    asyncio.run(main())


def test_a_rejection_after_the_store_granted_refunds_the_reservation() -> None:
    """The tenant's queue bound rejects the second waiter after its buckets granted it: the
    reservation comes back in full."""

    async def main() -> None:
        adm, ctl, store, _, _ = admission(
            {
                "tenants": [
                    {
                        "name": "t",
                        "tier": "default",
                        "max_queued": 1,
                        "limits": {"tokens_per_minute": 6000},
                    }
                ]
            }
        )
        loop = asyncio.get_running_loop()
        a, b, c = make_job(), make_job(), make_job()
        ta = await adm.enter(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.enter(b, loop.create_future()))
        await asyncio.sleep(0)
        out = await adm.enter(c, loop.create_future())
        assert isinstance(out, Refusal) and (out.status, out.code) == (429, "tenant_queue_full")
        assert level(store) == 6000 - 400  # a and b hold theirs; c's came back
        assert isinstance(ta, Ticket)
        ta.complete(Usage(100, 100))
        tb = await waiter
        assert isinstance(tb, Ticket)
        tb.complete(Usage(100, 100))
        assert level(store) == 6000 - 400 and ctl.in_flight == 0

    asyncio.run(main())
