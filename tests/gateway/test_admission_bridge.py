"""The gateway's asyncio admission bridge, in process (no sockets): waiting, waking,
expiring, disconnecting — and every job ends exactly once."""

from __future__ import annotations

import asyncio

from tests.core.helpers import controller, make_job
from velvetrope.core import Admitted, JobState, Outcome, Reason, Usage
from velvetrope.gateway.admission import Admission

ONE_SLOT = {"pools": [{"name": "default", "max_in_flight": 1}]}


def test_a_queued_request_wakes_when_a_slot_frees() -> None:
    async def main() -> None:
        ctl, _ = controller(ONE_SLOT)
        adm = Admission(ctl)
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        assert isinstance(await adm.admit(a, loop.create_future()), Admitted)
        waiter = asyncio.ensure_future(adm.admit(b, loop.create_future()))
        await asyncio.sleep(0)
        assert b.state is JobState.QUEUED and adm.waiting == 1
        adm.complete(a.id, Usage(100, 10))
        assert await waiter == Admitted(b)
        assert adm.waiting == 0
        assert ctl.job(b.id) is b and ctl.in_flight == 1
        adm.complete(b.id, Usage(100, 10))
        assert ctl.in_flight == 0 and ctl.queued == 0

    asyncio.run(main())


def test_a_client_gone_in_the_tick_its_job_is_dispatched_is_not_proxied() -> None:
    """The race: the slot frees (dispatching the queued job) and its client hangs up before
    the waiter runs.  The job must come back as "disconnected", cancelled, its slot free."""

    async def main() -> None:
        ctl, _ = controller(ONE_SLOT)
        seen: list[Outcome] = []
        ctl.observers.append(seen.append)
        adm = Admission(ctl)
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        gone_b: asyncio.Future[None] = loop.create_future()
        await adm.admit(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.admit(b, gone_b))
        await asyncio.sleep(0)
        adm.complete(a.id, Usage(100, 10))  # dispatches b ...
        gone_b.set_result(None)  # ... and b's client leaves in the same tick
        assert await waiter == "disconnected"
        assert b.state is JobState.CANCELLED
        assert ctl.in_flight == 0 and ctl.queued == 0
        assert [o.reason for o in seen] == [Reason.COMPLETED, Reason.CANCELLED]
        assert seen[1].settlement.lines == ()  # nothing was charged: no claims

    asyncio.run(main())


def test_a_client_gone_while_queued_is_cancelled_at_once() -> None:
    async def main() -> None:
        ctl, _ = controller(ONE_SLOT)
        adm = Admission(ctl)
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        gone_b: asyncio.Future[None] = loop.create_future()
        await adm.admit(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.admit(b, gone_b))
        await asyncio.sleep(0)
        gone_b.set_result(None)
        assert await waiter == "disconnected"
        assert b.state is JobState.CANCELLED and ctl.queued == 0 and ctl.in_flight == 1

    asyncio.run(main())


def test_an_expired_wait_returns_its_outcome() -> None:
    async def main() -> None:
        ctl, clock = controller(
            {
                **ONE_SLOT,
                "tiers": [{"name": "default", "max_wait_s": 5}],
            }
        )
        adm = Admission(ctl)
        loop = asyncio.get_running_loop()
        a, b = make_job(), make_job()
        await adm.admit(a, loop.create_future())
        waiter = asyncio.ensure_future(adm.admit(b, loop.create_future()))
        await asyncio.sleep(0)
        clock.advance(6)
        adm.pump()  # a driver's tick after the deadline
        out = await waiter
        assert isinstance(out, Outcome) and out.reason is Reason.EXPIRED
        assert ctl.queued == 0

    asyncio.run(main())
