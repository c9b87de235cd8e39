"""The lazy disconnect watches: no watcher for a short request, a disconnect noticed within
two sweeps for a long one, the proxying task cancelled, nothing noticed after ``done``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from velvetrope.gateway.disconnects import DisconnectWatches


class _Client:
    """An ASGI ``receive`` whose client hangs up when :meth:`hang_up` is called."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def hang_up(self) -> None:
        self.gone.set()


def test_a_request_ended_before_the_first_sweep_never_gets_a_watcher() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        clients = [_Client() for _ in range(50)]
        watches = [ws.watch(c.receive) for c in clients]
        for w in watches:
            ws.done(w)
        await asyncio.sleep(0.1)
        assert ws.started == 0
        assert all(c.receives == 0 for c in clients)
        ws.close()

    asyncio.run(main())


def test_a_long_request_is_watched_and_its_disconnect_cancels_the_target() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        client = _Client()
        w = ws.watch(client.receive)
        target = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        w.target = target
        await asyncio.sleep(0.1)  # more than two sweeps
        assert ws.started == 1 and client.receives == 1
        assert not w.gone.done()
        t0 = asyncio.get_running_loop().time()
        client.hang_up()
        await asyncio.wait_for(asyncio.shield(w.gone), 1.0)
        assert asyncio.get_running_loop().time() - t0 < 0.5
        with pytest.raises(asyncio.CancelledError):
            await target
        ws.done(w)
        ws.close()

    asyncio.run(main())


def test_a_disconnect_before_the_watcher_started_is_noticed_within_two_sweeps() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.03)
        client = _Client()
        client.hang_up()  # before any sweep: the first receive() returns at once
        w = ws.watch(client.receive)
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(asyncio.shield(w.gone), 1.0)
        took = asyncio.get_running_loop().time() - t0
        assert 0.03 <= took < 0.5, took
        ws.done(w)
        ws.close()

    asyncio.run(main())


def test_done_stops_a_started_watcher_and_the_sweeps_stop_when_idle() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.01)
        client = _Client()
        w = ws.watch(client.receive)
        await asyncio.sleep(0.05)
        assert w.task is not None and not w.task.done()
        ws.done(w)
        await asyncio.sleep(0.03)
        assert w.task.cancelled()
        assert ws._timer is None  # nothing left to watch: no timer keeps the loop busy
        client.hang_up()
        assert not w.gone.done()

    asyncio.run(main())


def test_after_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DisconnectWatches(after_s=0)
