"""The outbox on its own: batches, retries after a timeout or a failure, exactly the calls
that did not land, and a late call left to finish rather than cancelled."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from typing import Any

import pytest

from velvetrope.store.outbox import Outbox


def test_calls_that_time_out_or_fail_are_sent_again_and_the_rest_once() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        sent: Counter[str] = Counter()
        hung: list[asyncio.Future[Any]] = []
        results: list[bool] = []

        def call(name: str) -> Any:
            def send() -> asyncio.Future[Any]:
                sent[name] += 1
                fut: asyncio.Future[Any] = loop.create_future()
                if name == "slow" and sent[name] == 1:
                    hung.append(fut)  # answered only after the batch's time is up
                elif name == "bad" and sent[name] == 1:
                    fut.set_exception(ConnectionError("refused"))
                else:
                    loop.call_soon(fut.set_result, 1)
                return fut

            return send

        box = Outbox(ready=lambda: True, on_result=results.append, timeout_s=lambda: 0.05)
        box.start()
        for name in ("a", "slow", "b", "bad", "c"):
            box.put(call(name))
        assert await box.flush(5.0)
        await box.stop()
        assert sent == Counter(a=1, b=1, c=1, slow=2, bad=2)
        assert results[0] is False and results[-1] is True
        assert (box.sent, box.retried) == (5, 2)
        (late,) = hung
        assert not late.cancelled()  # the outbox gave up waiting, not the call

    asyncio.run(main())


def test_items_of_a_group_leave_together_in_bounded_calls() -> None:
    """A round sends the queued items of each group as one call (at most ``group_items``
    items, ``group_size`` in size), plain calls alone, at most ``batch`` calls; a failed
    grouped call is sent again with all its items, ahead of newer entries."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls: list[tuple[str, list[int]]] = []
        fail_once = {"b"}

        def send_many(group: Any, items: list[int]) -> asyncio.Future[Any]:
            calls.append((group, list(items)))
            fut: asyncio.Future[Any] = loop.create_future()
            if group in fail_once:
                fail_once.discard(group)
                fut.set_exception(ConnectionError("refused"))
            else:
                fut.set_result(1)
            return fut

        def plain() -> asyncio.Future[Any]:
            calls.append(("plain", []))
            fut: asyncio.Future[Any] = loop.create_future()
            fut.set_result(1)
            return fut

        box = Outbox(
            ready=lambda: True, on_result=lambda ok: None, batch=4, group_items=3, group_size=5
        )
        for i in range(7):
            box.put_grouped("a", i, send_many)
            if i == 2:
                box.put(plain)
        box.put_grouped("b", 10, send_many, size=2)
        box.put_grouped("b", 11, send_many, size=4)  # 2 + 4 > 5: a call of its own
        box.put_grouped("a", 12, send_many, size=9)  # bigger than group_size: alone
        box.start()
        assert await box.flush(5.0)
        await box.stop()
        assert calls == [
            # round 1: four calls
            ("a", [0, 1, 2]),
            ("plain", []),
            ("a", [3, 4, 5]),
            ("a", [6]),
            # round 2: what did not fit; b's first call fails
            ("b", [10]),
            ("b", [11]),
            ("a", [12]),
            # round 3: the failed call again
            ("b", [10]),
        ]
        assert (box.sent, box.retried) == (11, 1)

    asyncio.run(main())


def test_a_call_that_raises_at_once_is_sent_again_and_the_outbox_lives_on() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        sent: Counter[str] = Counter()

        def call(name: str) -> Any:
            def send() -> asyncio.Future[Any]:
                sent[name] += 1
                if name == "raises" and sent[name] == 1:
                    raise ConnectionError("not even sent")
                fut: asyncio.Future[Any] = loop.create_future()
                fut.set_result(1)
                return fut

            return send

        box = Outbox(ready=lambda: True, on_result=lambda ok: None)
        box.start()
        box.put(call("raises"))
        box.put(call("next"))
        assert await box.flush(5.0)
        box.put(call("later"))
        assert await box.flush(5.0)
        await box.stop()
        assert sent == Counter(raises=2, next=1, later=1)

    asyncio.run(main())


def test_a_call_on_its_way_counts_until_it_lands() -> None:
    """A status reads ``len(outbox)``: 0 must mean nothing is left on its way to the store,
    not only that nothing waits for a round (the round in flight counts too)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        box = Outbox(ready=lambda: True, on_result=lambda ok: None, timeout_s=lambda: 5.0)
        box.start()
        box.put(lambda: answer)
        for _ in range(5):  # the round starts: the entry leaves the queue, still unanswered
            await asyncio.sleep(0)
        assert len(box) == 1
        answer.set_result(1)
        assert await box.flush(5.0)
        assert len(box) == 0 and box.sent == 1
        await box.stop()

    asyncio.run(main())


class Refusal(Exception):
    """What the store answers to a call it will never accept."""


def test_a_refused_group_goes_again_item_by_item_and_the_refused_item_is_dropped() -> None:
    """A grouped call the store refuses is no failure (``on_result`` hears True): its items
    go again one call each, the one refused alone is dropped and counted, a refused plain
    call too, and the others land once."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls: list[list[int]] = []
        results: list[bool] = []

        def send_many(group: Any, items: list[int]) -> asyncio.Future[Any]:
            calls.append(list(items))
            fut: asyncio.Future[Any] = loop.create_future()
            if 2 in items:
                fut.set_exception(Refusal("no"))
            else:
                fut.set_result(1)
            return fut

        def plain() -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            fut.set_exception(Refusal("never"))
            return fut

        box = Outbox(
            ready=lambda: True,
            on_result=results.append,
            refused=lambda e: isinstance(e, Refusal),
        )
        for item in (1, 2, 3):
            box.put_grouped("g", item, send_many)
        box.put(plain)
        box.start()
        assert await box.flush(5.0)
        box.put_grouped("g", 4, send_many)
        assert await box.flush(5.0)
        await box.stop()
        assert calls == [[1, 2, 3], [1], [2], [3], [4]]
        assert (box.sent, box.rejected, box.retried) == (3, 2, 0)
        assert all(results)

    asyncio.run(main())


def test_only_error_replies_that_name_no_passing_state_are_refusals() -> None:
    from redis.exceptions import (
        BusyLoadingError,
        OutOfMemoryError,
        ReadOnlyError,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from velvetrope.store.replies import refused

    script = "Error running script (call to f_1): @user_script:25: WRONGTYPE Operation"
    assert refused(ResponseError(script))
    assert refused(ResponseError("user_script:3: attempt to compare nil with number"))
    for passing in (
        ResponseError("BUSY Redis is busy running a script"),
        ResponseError("Error running script: -OOM command not allowed when used memory"),
        ResponseError("MASTERDOWN Link with MASTER is down"),
        OutOfMemoryError("command not allowed"),
        BusyLoadingError("Redis is loading the dataset in memory"),
        ReadOnlyError("You can't write against a read only replica."),
        RedisConnectionError("Connection refused"),
        RedisTimeoutError("Timeout reading from socket"),
        TimeoutError(),
    ):
        assert not refused(passing), passing


def test_refusals_are_logged_at_once_then_at_most_every_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        def plain() -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            fut.set_exception(Refusal("bad key"))
            return fut

        box = Outbox(ready=lambda: True, on_result=lambda ok: None, refused=lambda e: True)
        box.start()
        for _ in range(5):
            box.put(plain)
        assert await box.flush(5.0)
        await box.stop()
        assert box.rejected == 5

    with caplog.at_level(logging.ERROR, logger="velvetrope.store"):
        asyncio.run(main())
    (record,) = caplog.records
    assert "refused 1 settlement(s)" in record.getMessage() and "bad key" in record.getMessage()


@pytest.mark.parametrize("stop_first", [False, True])
def test_a_call_given_up_on_that_fails_later_logs_nothing(stop_first: bool) -> None:
    """A call the outbox stopped waiting for (its round timed out, or the outbox was
    stopped at shutdown) may fail later, e.g. when the connection to Redis is lost: its
    exception is consumed, not reported by asyncio as "Future exception was never
    retrieved"."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        reported: list[str] = []
        loop.set_exception_handler(lambda _, ctx: reported.append(str(ctx.get("message"))))
        hung: list[asyncio.Future[Any]] = []

        def send() -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = loop.create_future()
            hung.append(fut)
            return fut

        box = Outbox(ready=lambda: True, on_result=lambda ok: None, timeout_s=lambda: 0.02)
        box.start()
        box.put(send)
        while len(hung) < (1 if stop_first else 2):  # stopped mid-round, or timed out once
            await asyncio.sleep(0.005)
        await box.stop()
        for fut in hung:
            if not fut.done():
                fut.set_exception(ConnectionError("connection to Redis lost"))
        del fut
        hung.clear()
        gc.collect()
        await asyncio.sleep(0)
        return reported

    assert asyncio.run(main()) == []
