"""The lazy disconnect watches: no watcher for a short request, a disconnect noticed within
two sweeps for a long one, the proxying task cancelled, nothing noticed after ``done``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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


async def _until(check: Callable[[], bool], within_s: float = 2.0) -> None:
    """Poll ``check`` until it holds (the sweeps run on the loop's clock), at most
    ``within_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not check():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)


def test_a_request_ended_before_the_first_sweep_never_gets_a_watcher() -> None:
    async def main() -> None:
        ws = DisconnectWatches(after_s=0.02)
        clients = [_Client() for _ in range(50)]
        watches = [ws.watch(c.receive) for c in clients]
        for w in watches:
            ws.done(w)
        await asyncio.sleep(0.1)  # five sweeps: none may start a watcher
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
        await _until(lambda: client.receives == 1)  # started within two sweeps
        assert ws.started == 1
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
        await _until(lambda: w.task is not None)
        assert w.task is not None and not w.task.done()
        ws.done(w)
        await _until(lambda: w.task is not None and w.task.done())
        assert w.task.cancelled()
        assert ws._timer is None  # nothing left to watch: no timer keeps the loop busy
        client.hang_up()
        assert not w.gone.done()

    asyncio.run(main())


def test_after_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DisconnectWatches(after_s=0)
