"""An asynchronous outbox: calls that must reach the store eventually, off the request path.

Settlements and lease releases are idempotent, so the outbox retries them until they land
(with a backoff while the store is away) and a completion never waits on the store.  The
outbox is bounded: past ``max_items`` the oldest entry is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["Outbox"]

log = logging.getLogger("velvetrope.store")

Send = Callable[[], Awaitable[object]]


class Outbox:
    """A FIFO of idempotent calls, sent by one background task, in batches, with retries.

    ``ready`` says whether to try now (e.g. the breaker is closed); ``on_result`` hears of
    each batch (``True`` when every call succeeded) so the caller can feed a breaker;
    ``timeout_s`` is how long a batch may take.  A call is a function returning an
    awaitable; a future (an auto-pipelined call) costs no task.
    """

    def __init__(
        self,
        *,
        ready: Callable[[], bool],
        on_result: Callable[[bool], None],
        max_items: int = 100_000,
        batch: int = 64,
        max_backoff_s: float = 1.0,
        timeout_s: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self._items: deque[Send] = deque()
        self._ready = ready
        self._on_result = on_result
        self._max_items = max_items
        self._batch = batch
        self._max_backoff = max_backoff_s
        self._timeout = timeout_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.retried = 0
        self.dropped = 0
        self._in_flight = 0  # calls of the batch being sent

    def __len__(self) -> int:
        return len(self._items)

    def put(self, send: Send) -> None:
        """Queue ``send`` (a coroutine factory); never blocks."""
        if len(self._items) >= self._max_items:
            self._items.popleft()
            self.dropped += 1
        self._items.append(send)
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self, timeout_s: float) -> bool:
        """Wait until empty, the batch in flight landed too, at most ``timeout_s``; True if
        it emptied."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self._items or self._in_flight:
            if loop.time() >= end:
                return False
            self._wake.set()
            await asyncio.sleep(0.01)
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = 0.01
        while True:
            if not self._items:
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._ready():
                await asyncio.sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)
                continue
            batch = [self._items.popleft() for _ in range(min(self._batch, len(self._items)))]
            self._in_flight = len(batch)
            futs = [asyncio.ensure_future(s()) for s in batch]  # futures stay futures
            await _settled(futs, self._timeout())
            failed = []
            for s, f in zip(batch, futs, strict=True):
                if not f.done() or f.cancelled() or f.exception() is not None:
                    # not answered in time or failed: sent again (the calls are idempotent)
                    log.debug("velvetrope: outbox call failed: %r", f)
                    failed.append(s)
            self.sent += len(batch) - len(failed)
            self._on_result(not failed)
            self._in_flight = 0
            if failed:
                self.retried += len(failed)
                self._items.extendleft(reversed(failed))
                await asyncio.sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)
            else:
                backoff = 0.01


async def _settled(futs: Sequence[asyncio.Future[Any]], timeout_s: float) -> None:
    """Wait until every one of ``futs`` is done (whatever its outcome), at most
    ``timeout_s``; a timeout leaves them as they are.  Replies arrive in order, so after the
    first most are done already: this awaits them one by one (no callback on every future,
    as ``asyncio.wait`` adds)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            for f in futs:
                if f.done():
                    continue
                try:
                    await asyncio.shield(f)  # our timeout must not cancel the call itself
                except asyncio.CancelledError:
                    if not f.cancelled():
                        raise  # the timeout, or this task was cancelled
                except Exception:  # its outcome is read by the caller
                    continue
