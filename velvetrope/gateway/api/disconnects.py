"""Noticing that a client hung up, without a task per request.

ASGI reports a disconnect only through ``receive()``, so noticing one takes a task blocked
in ``receive()`` for as long as the request lasts.  Most requests are answered within
milliseconds, and for them that task (created, scheduled, cancelled with an exception
thrown through ``receive()``) was the single largest per-request cost of the admission
path after the core itself.  :class:`DisconnectWatches` therefore starts a request's
watcher only once the request has lasted ``after_s``: one timer for the whole process
sweeps the requests every ``after_s`` and starts watchers for those that were already
there at the previous sweep.  A request answered sooner never gets one.

Contract: a disconnect is noticed at most ``2 * after_s`` (plus one receive) after it
happened, or after the request started, whichever is later; then ``Watch.gone`` resolves
and ``Watch.target`` (the task proxying the request, if set) is cancelled, so the upstream
request is closed.  Nothing is noticed after :meth:`DisconnectWatches.done`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from velvetrope.serving.asgi import Receive

__all__ = ["DisconnectWatches", "Watch"]


class Watch:
    """One request's disconnect watch.

    ``gone`` resolves when the client hangs up; ``target``, while set, is the task to
    cancel at that moment.
    """

    __slots__ = ("gone", "loop", "receive", "target", "task")

    def __init__(self, gone: asyncio.Future[None], receive: Receive) -> None:
        self.gone = gone
        self.loop = gone.get_loop()
        """The event loop the request is served on."""
        self.receive = receive
        self.target: asyncio.Task[Any] | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Wait in ``receive()`` until the client hangs up (or the response ended)."""
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                if not self.gone.done():
                    self.gone.set_result(None)
                if self.target is not None:
                    self.target.cancel()
                return


class DisconnectWatches:
    """The requests of one event loop whose disconnects are watched (see the module)."""

    def __init__(self, after_s: float = 0.05) -> None:
        if after_s <= 0:
            raise ValueError("after_s must be positive")
        self.after_s = after_s
        self._young: dict[Watch, None] = {}  # added since the last sweep
        self._old: dict[Watch, None] = {}  # there at the last sweep: started at the next
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = 0
        """Watchers started so far (requests that lasted long enough to need one)."""

    def watch(self, receive: Receive) -> Watch:
        """Watch the client behind ``receive`` (its request body already read) until
        :meth:`done`."""
        loop = self._loop
        if loop is None or not loop.is_running():
            # kept between calls: asking for the running loop makes a getpid() system call
            # on CPython 3.11
            loop = self._loop = asyncio.get_running_loop()
        w = Watch(loop.create_future(), receive)
        self._young[w] = None
        if self._timer is None:
            self._timer = loop.call_later(self.after_s, self._sweep)
        return w

    def done(self, w: Watch) -> None:
        """The request ended: stop watching it."""
        if w.task is not None:
            w.task.cancel()
        elif self._young.pop(w, False) is False:  # not young (values are None): old
            self._old.pop(w, None)

    def _sweep(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        for w in self._old:
            w.task = loop.create_task(w.run())
        self.started += len(self._old)
        self._old = self._young
        self._young = {}
        if self._old:
            self._timer = loop.call_later(self.after_s, self._sweep)

    def close(self) -> None:
        """Stop the sweeps (watchers already started end with their requests)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
