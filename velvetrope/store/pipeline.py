"""Automatic pipelining: Redis script calls issued in one event-loop tick share one round trip.

Under load many requests reach the store in the same tick (a reservation here, a lease
there, a batch of settlements from the outbox).  :class:`AutoPipeline` queues each call,
and once per tick sends everything queued as one non-transactional pipeline of EVALSHAs —
one write, one read, one parse pass — then resolves each caller's future with its own reply
or error.  Calls stay independent: one failing script fails only its caller.  A script the
server does not know (NOSCRIPT, e.g. after a restart) is loaded and those calls are re-run.

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

__all__ = ["AutoPipeline"]

_Call = tuple[AsyncScript, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]


class AutoPipeline:
    """Coalesces script calls per event-loop tick into pipelines on ``client``."""

    def __init__(
        self,
        client: Any,
        max_batch: int = 512,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.client = client
        self.observe = observe  # hears each pipeline's round trip, seconds
        self.max_batch = max_batch
        self._queue: list[_Call] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.last_reply = -1e18  # time.monotonic() of the last pipeline answered

    def run(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Queue one script call; returns an awaitable of its reply (or its error)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.append((script, keys, args, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        queue = self._queue
        self._queue = []
        for i in range(0, len(queue), self.max_batch):
            task = asyncio.get_running_loop().create_task(self._send(queue[i : i + self.max_batch]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            results = await self._execute(batch)
        except BaseException as e:  # the connection failed: every caller hears of it
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else ConnectionError(str(e)))
            if not isinstance(e, Exception):
                raise
            return
        for (*_, fut), r in zip(batch, results, strict=True):
            if fut.done():
                continue  # the caller gave up (its budget ran out)
            if isinstance(r, Exception):
                fut.set_exception(r)
            else:
                fut.set_result(r)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args, _ in batch:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        t0 = time.perf_counter()
        results: list[Any] = await pipe.execute(raise_on_error=False)
        self.last_reply = time.monotonic()
        if self.observe is not None:
            self.observe(time.perf_counter() - t0)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for script in {id(batch[i][0]): batch[i][0] for i in missing}.values():
                script.sha = await self.client.script_load(script.script)
            retry = self.client.pipeline(transaction=False)
            for i in missing:
                script, keys, args, _ = batch[i]
                retry.evalsha(script.sha, len(keys), *keys, *args)
            for i, r in zip(missing, await retry.execute(raise_on_error=False), strict=True):
                results[i] = r
        return results

    async def close(self) -> None:
        """Wait for batches in flight."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
