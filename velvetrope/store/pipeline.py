"""Automatic pipelining: Redis script calls issued in one event-loop tick share one write.

Under load many requests reach the store in the same tick (a reservation here, a lease
there, a batch of settlements from the outbox).  :class:`AutoPipeline` queues each call,
and once per tick writes everything queued as EVALSHAs on one pipelined connection
(:class:`~velvetrope.store.wire.Wire`); replies resolve each caller's future in order as
they arrive.  Calls stay independent: one failing script fails only its caller.  A script
the server does not know (NOSCRIPT, e.g. after a restart) is loaded and that call re-sent.
A call is packed when it is queued: by :meth:`AutoPipeline.run` from its keys and arguments,
or already by the caller (:meth:`AutoPipeline.send`; see :mod:`velvetrope.store.resp`).

This is what ioredis calls auto-pipelining; it trades nothing for correctness (each script
is atomic on its own, and no caller assumed ordering between independent calls).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from velvetrope.store.wire import Wire, pack

__all__ = ["AutoPipeline"]


class _Call:
    """One queued script call and the future its caller awaits."""

    __slots__ = ("fut", "packed", "pipe", "script", "t0")

    def __init__(
        self, pipe: AutoPipeline, script: AsyncScript, packed: bytes, fut: asyncio.Future[Any]
    ) -> None:
        self.pipe = pipe
        self.script = script
        self.packed = packed  # the EVALSHA, as RESP
        self.fut = fut
        self.t0 = 0.0  # set on the last call of a write: when that write left

    def reply(self, r: Any) -> None:
        pipe = self.pipe
        pipe.last_reply = time.monotonic()
        if self.t0 and pipe.observe is not None:
            pipe.observe(time.perf_counter() - self.t0)
        fut = self.fut
        if fut.done():
            return  # the caller gave up (its budget ran out): not even re-sent after NOSCRIPT
        if not isinstance(r, Exception):
            fut.set_result(r)
        elif isinstance(r, NoScriptError):
            pipe.reload(self)
        else:
            fut.set_exception(r)

    def fail(self, e: Exception) -> None:
        if not self.fut.done():
            self.fut.set_exception(e)


class _Loaded:
    """The reply to SCRIPT LOAD before a call is sent again: an error fails that call."""

    __slots__ = ("call",)

    def __init__(self, call: _Call) -> None:
        self.call = call

    def reply(self, r: Any) -> None:
        if isinstance(r, Exception):
            self.call.fail(r)

    def fail(self, e: Exception) -> None:
        self.call.fail(e)


class AutoPipeline:
    """Coalesces script calls per event-loop tick into one write on ``client``'s server
    (a ``redis.asyncio.Redis``, not a cluster client)."""

    def __init__(
        self,
        client: Any,
        observe: Callable[[float], None] | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        self.observe = observe  # hears each write's round trip (to its last reply), seconds
        self.wire = Wire(client, connect_timeout)
        self._queue: list[_Call] = []
        self._scheduled = False
        self.last_reply = -1e18  # time.monotonic() of the last reply

    def run(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Queue one script call; returns an awaitable of its reply (or its error)."""
        return self.send(script, pack(b"EVALSHA", script.sha, len(keys), *keys, *args))

    def send(self, script: AsyncScript, packed: bytes) -> Any:
        """:meth:`run` with the call already packed (``EVALSHA`` of ``script``, as RESP)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(self, script, packed, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        queue = self._queue
        self._queue = []
        payload = b"".join([c.packed for c in queue])
        queue[-1].t0 = time.perf_counter()
        self.wire.send(payload, queue)

    def reload(self, call: _Call) -> None:
        """Load ``call``'s script (the server lost it) and send the call again, in one
        write (the connection keeps their order)."""
        call.t0 = 0.0
        payload = pack(b"SCRIPT", b"LOAD", call.script.script) + call.packed
        self.wire.send(payload, (_Loaded(call), call))

    async def close(self) -> None:
        """Wait for calls in flight (at most 2 s), then close the connection."""
        waiting = [c.fut for c in (*self._queue, *self.wire.pending()) if isinstance(c, _Call)]
        if waiting:
            await asyncio.wait(waiting, timeout=2.0)
        await self.wire.close()
