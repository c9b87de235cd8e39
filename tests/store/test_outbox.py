"""The outbox on its own: batches, retries after a timeout or a failure, exactly the calls
that did not land, and a late call left to finish rather than cancelled."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

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
