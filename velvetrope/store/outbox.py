"""An asynchronous outbox: calls that must reach the store eventually, off the request path.

Settlements and lease releases are idempotent, so the outbox retries them until they land
(with a backoff while the store is away) and a completion never waits on the store.  The
outbox is bounded: past ``max_items`` the oldest entry is dropped and counted.

An entry is a call of its own, or an item of a group (:meth:`Outbox.put_grouped`): the
items of one group queued when a round starts leave as one call (a bounded number per
call), e.g. the settlements of jobs whose keys share a Redis slot.  Nothing waits for a
group to fill: a round takes what is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

__all__ = ["Outbox"]

log = logging.getLogger("velvetrope.store")

_LOG_EVERY_S = 10.0

Send = Callable[[], Awaitable[object]]
SendMany = Callable[[Any, list[Any]], Awaitable[object]]
"""Sends the items of one group as one call: ``send_many(group, items)``."""
_Grouped = tuple[Hashable, Any, SendMany, int]  # group, item, send_many, size
_Entry = Send | _Grouped


class Outbox:
    """A FIFO of idempotent calls, sent by one background task, in rounds, with retries.

    ``ready`` says whether to try now (e.g. the breaker is closed); ``on_result`` hears of
    each round (``True`` when every call succeeded) so the caller can feed a breaker;
    ``timeout_s`` is how long a round may take.  A call is a function returning an
    awaitable; a future (an auto-pipelined call) costs no task.  A round is at most
    ``batch`` calls; a grouped call at most ``group_items`` items whose sizes add up to at
    most ``group_size`` (one bigger item goes alone).  A call that fails or does not answer
    in time is sent again with all its entries (in their order, ahead of newer ones).

    A call the store refused for what it carries (``refused(error)`` is true: e.g. a script
    error, which the same call would meet again) is not a store failure: its entries are
    sent again one call each (a grouped call's items one by one, so that one bad item does
    not hold back the others), and an entry refused on its own is dropped, logged and
    counted in ``rejected``.  ``dropped`` counts the entries lost to ``max_items``.
    """

    def __init__(
        self,
        *,
        ready: Callable[[], bool],
        on_result: Callable[[bool], None],
        max_items: int = 100_000,
        batch: int = 64,
        group_items: int = 64,
        group_size: int = 512,
        max_backoff_s: float = 1.0,
        timeout_s: Callable[[], float] = lambda: 1.0,
        refused: Callable[[BaseException], bool] = lambda e: False,
    ) -> None:
        self._items: deque[_Entry] = deque()
        self._ready = ready
        self._on_result = on_result
        self._max_items = max_items
        self._batch = batch
        self._group_items = group_items
        self._group_size = group_size
        self._max_backoff = max_backoff_s
        self._timeout = timeout_s
        self._refused = refused
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.retried = 0
        self.dropped = 0
        self.rejected = 0
        self._logged_at = -math.inf  # when a refusal was last logged
        self._unlogged = 0  # refusals since
        self._in_flight = 0  # entries of the round being sent

    def __len__(self) -> int:
        """Entries not yet known to have landed: those queued and those of the round in
        flight (a status that reads 0 here has nothing left on its way to the store)."""
        return len(self._items) + self._in_flight

    def put(self, send: Send) -> None:
        """Queue ``send`` (a coroutine factory); never blocks."""
        self._put(send)

    def put_grouped(self, group: Hashable, item: Any, send_many: SendMany, size: int = 1) -> None:
        """Queue ``item`` of ``group``: it leaves with the other items of ``group`` queued
        at that time, as ``send_many(group, items)`` (one ``send_many`` per group: whose
        item comes first sends); ``size`` counts against ``group_size``.  Never blocks."""
        self._put((group, item, send_many, size))

    def _put(self, entry: _Entry) -> None:
        items = self._items
        if len(items) >= self._max_items:
            items.popleft()
            self.dropped += 1
        items.append(entry)
        if len(items) == 1:  # the task waits for the event only while the queue is empty
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self, timeout_s: float) -> bool:
        """Wait until empty, the batch in flight landed too, at most ``timeout_s``; True if
        it emptied."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while len(self):
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
            entries, call_of, calls = self._round()
            self._in_flight = len(entries)
            futs = [_start(c) for c in calls]
            await _settled(futs, self._timeout())
            bad: set[int] = set()
            refused: set[int] = set()
            for i, f in enumerate(futs):
                if not f.done() or f.cancelled():
                    bad.add(i)  # not answered in time: sent again (the calls are idempotent)
                    continue
                e = f.exception()
                if e is None:
                    continue
                if self._refused(e):
                    refused.add(i)
                else:
                    log.debug("velvetrope: outbox call failed: %r", e)
                    bad.add(i)
            failed = [e for e, i in zip(entries, call_of, strict=True) if i in bad]
            unsent = self._refuse(entries, call_of, futs, refused) if refused else 0
            self.sent += len(entries) - len(failed) - unsent
            self._on_result(not failed)
            self._in_flight = 0
            if failed:
                self.retried += len(failed)
                self._items.extendleft(reversed(failed))
                await asyncio.sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)
            else:
                backoff = 0.01

    def _refuse(
        self,
        entries: list[_Entry],
        call_of: list[int],
        futs: list[asyncio.Future[Any]],
        refused: set[int],
    ) -> int:
        """The entries of the calls the store refused: those that went with others are
        queued again one call each (ahead of newer ones); one that went alone is dropped.
        Returns how many entries the refused calls carried."""
        count = [0] * len(futs)  # entries per call
        for i in call_of:
            count[i] += 1
        again: list[_Entry] = []
        for e, i in zip(entries, call_of, strict=True):
            if i not in refused:
                continue
            if count[i] > 1:
                again.append(_alone(e))
                continue
            self.rejected += 1
            self._log_refusal(futs[i].exception())
        self._items.extendleft(reversed(again))
        return sum(count[i] for i in refused)

    def _log_refusal(self, error: BaseException | None) -> None:
        """Log a dropped entry: the first at once, then at most one line per
        ``_LOG_EVERY_S`` with how many were dropped since (one bad key under load must not
        flood the log)."""
        now = time.monotonic()
        self._unlogged += 1
        if now - self._logged_at < _LOG_EVERY_S:
            return
        log.error(
            "velvetrope: shared state refused %d settlement(s) or release(s), dropped; "
            "the last: %s",
            self._unlogged,
            error,
        )
        self._logged_at, self._unlogged = now, 0

    def _round(self) -> tuple[list[_Entry], list[int], list[Send]]:
        """Take the entries of the next round from the queue: them, the index of the call
        each goes in, and the calls."""
        items = self._items
        entries: list[_Entry] = []
        call_of: list[int] = []
        calls: list[Send] = []
        groups: dict[Hashable, _Group] = {}  # the open call of each group
        while items:
            e = items[0]
            if type(e) is tuple:
                group, item, send_many, size = e
                g = groups.get(group)
                if (
                    g is None
                    or len(g.items) >= self._group_items
                    or g.size + size > self._group_size
                ):
                    if len(calls) >= self._batch:
                        break
                    g = groups[group] = _Group(group, send_many, len(calls))
                    calls.append(g.send)
                g.items.append(item)
                g.size += size
                call_of.append(g.index)
            else:
                if len(calls) >= self._batch:
                    break
                call_of.append(len(calls))
                calls.append(e)  # type: ignore[arg-type]  # not a tuple: a Send
            entries.append(items.popleft())
        return entries, call_of, calls


class _Group:
    """The items of one group going as one call."""

    __slots__ = ("group", "index", "items", "send_many", "size")

    def __init__(self, group: Hashable, send_many: SendMany, index: int) -> None:
        self.group = group
        self.send_many = send_many
        self.index = index  # of its call in the round
        self.items: list[Any] = []
        self.size = 0

    def send(self) -> Awaitable[object]:
        return self.send_many(self.group, self.items)


def _alone(entry: _Entry) -> Send:
    """``entry`` as a call of its own (a grouped item as a group of one)."""
    if type(entry) is not tuple:
        return entry  # type: ignore[return-value]  # not a tuple: a Send
    group, item, send_many, _ = entry
    return functools.partial(send_many, group, [item])


def _start(call: Send) -> asyncio.Future[Any]:
    """``call``'s awaitable as a future (a future stays itself: no task); what ``call``
    raises at once comes back as a failed future, so that the call is sent again and the
    outbox's task lives on."""
    try:
        return asyncio.ensure_future(call())
    except Exception as e:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_exception(e)
        return fut


async def _settled(futs: Sequence[asyncio.Future[Any]], timeout_s: float) -> None:
    """Wait until every one of ``futs`` is done (whatever its outcome), at most
    ``timeout_s``; a timeout leaves them as they are.  Replies arrive in order, so after the
    first most are done already: this awaits them one by one (no callback on every future,
    as ``asyncio.wait`` adds)."""
    try:
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
    finally:
        for f in futs:
            if not f.done():  # given up on: a later failure is nobody's to hear
                f.add_done_callback(_consume)


def _consume(f: asyncio.Future[Any]) -> None:
    """Mark ``f``'s outcome as heard (asyncio reports an exception nobody retrieved)."""
    if not f.cancelled():
        f.exception()
