"""The lazy disconnect watches: no watcher for a short request, a disconnect noticed within
two sweeps for a long one, the proxying task cancelled, nothing noticed after ``done``.

The sweeps are timed by the event loop's clock (``loop.call_later``), so every test runs on
a :class:`~tests.support.virtual_time.VirtualTimeLoop`: its clock moves only from timer to
timer, so each sweep fires at its exact virtual instant and the bounds of the module's
contract are asserted exactly, with no wall time spent and nothing left to the machine's
load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.virtual_time import VirtualDeadlock, elapse, run
from velvetrope.gateway.api.disconnects import DisconnectWatches

EPS = 1e-9
"""Slack for the float sums of virtual time."""


class _Client:
    """An ASGI ``receive`` whose client hangs up when :meth:`hang_up` is called."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.receives = 0
        self.first_receive_at = float("nan")
        """The virtual instant of the first ``receive()`` (the watcher's start)."""

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.receives == 1:
            self.first_receive_at = _now()
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def hang_up(self) -> None:
        self.gone.set()


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _until(check: Callable[[], bool], within_s: float = 1.0) -> float:
    """The virtual time at which ``check`` first holds, polled every millisecond of virtual
    time; fails once ``within_s`` has passed without it."""
    end = _now() + within_s
    while not check():
        assert _now() < end, "timed out"
        await elapse(0.001)
    return _now()


def test_a_request_ended_before_the_first_sweep_never_gets_a_watcher() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        clients = [_Client() for _ in range(50)]
        watches = [ws.watch(c.receive) for c in clients]
        for w in watches:
            ws.done(w)
        assert ws._timer is not None  # a sweep is due...
        await elapse(5 * 0.02)  # ...and five sweeps' time passes: none may start a watcher
        assert ws.started == 0
        assert all(c.receives == 0 for c in clients)
        assert all(w.task is None for w in watches)
        assert ws._timer is None  # the first sweep found nothing left: the sweeps stopped
        ws.close()

    run(main())


def test_a_request_still_there_at_the_next_sweep_but_one_is_watched() -> None:
    """A watcher starts at the second sweep after its request arrived: never before
    ``after_s`` (a shorter request never gets one), never after ``2 * after_s``; on the
    sweeps' own grid when they were idle, between two instants of it when they were not."""

    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        a, b = _Client(), _Client()
        ws.watch(a.receive)  # at 0: the sweeps start, at 0.02, 0.04...
        await elapse(0.025)
        ws.watch(b.receive)  # at 0.025, between two sweeps
        await _until(lambda: b.receives == 1)
        assert a.first_receive_at == pytest.approx(0.04, abs=EPS)
        assert b.first_receive_at == pytest.approx(0.06, abs=EPS)  # 0.035 after it arrived
        assert ws.started == 2
        ws.close()

    run(main())


def test_a_long_request_is_watched_and_its_disconnect_cancels_the_target() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        client = _Client()
        w = ws.watch(client.receive)
        proxying = asyncio.Event()  # never set: the target runs until cancelled
        target = asyncio.get_running_loop().create_task(proxying.wait())
        w.target = target
        await _until(lambda: client.receives == 1)
        assert client.first_receive_at == pytest.approx(2 * 0.02, abs=EPS)
        assert ws.started == 1
        await elapse(10 * 0.02)  # a long request: still watched, nothing noticed yet
        assert not w.gone.done() and not target.done()
        t0 = _now()
        client.hang_up()
        await asyncio.wait_for(asyncio.shield(w.gone), 1.0)
        assert _now() - t0 < EPS  # a started watcher notices at once: no sweep in between
        with pytest.raises(asyncio.CancelledError):
            await target
        ws.done(w)
        ws.close()

    run(main())


def test_a_disconnect_before_the_watcher_started_is_noticed_within_two_sweeps() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.03)
        client = _Client()
        client.hang_up()  # before any sweep: the first receive() returns at once
        w = ws.watch(client.receive)
        t0 = _now()
        await asyncio.wait_for(asyncio.shield(w.gone), 1.0)
        took = _now() - t0
        assert 0.03 - EPS <= took <= 2 * 0.03 + EPS, took
        ws.done(w)
        ws.close()

    run(main())


def test_done_stops_a_started_watcher_and_the_sweeps_stop_when_idle() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.01)
        client = _Client()
        w = ws.watch(client.receive)
        await _until(lambda: w.task is not None)
        assert w.task is not None and not w.task.done()
        ws.done(w)
        await _until(lambda: w.task is not None and w.task.done())
        assert w.task.cancelled()
        assert ws._timer is None  # nothing left to watch: no timer keeps the loop busy
        client.hang_up()
        await elapse(10 * 0.01)  # ten sweeps' time after the hang-up: nothing notices it
        assert not w.gone.done()
        assert client.receives == 1 and ws.started == 1

    run(main())


def test_after_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DisconnectWatches(after_s=0)


# -- the virtual clock these tests stand on ---------------------------------------------------


def test_the_virtual_clock_jumps_to_each_timer_and_costs_no_wall_time() -> None:
    fired: list[float] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        for at in (3600.0, 0.5, 7200.0):
            loop.call_later(at, lambda: fired.append(loop.time()))
        await elapse(7200.0)
        return loop.time()

    t0 = time.monotonic()
    assert run(main()) == 7200.0
    assert fired == [0.5, 3600.0, 7200.0]  # each at its exact instant, in order
    assert time.monotonic() - t0 < 5.0  # two hours of timers, no two hours of waiting


def test_a_loop_that_would_wait_forever_says_so() -> None:
    async def main() -> None:
        await asyncio.Event().wait()  # nothing will ever set it

    with pytest.raises(VirtualDeadlock):
        run(main())


def test_elapse_refuses_a_real_clock() -> None:
    with pytest.raises(TypeError, match="VirtualTimeLoop"):
        asyncio.run(elapse(0.01))
