"""Waiting on the engine's sequences for one HTTP request (``velvetrope engine``'s
handlers share these): the tokens as they arrive, aborting on a client's hang-up, and
:class:`EngineEndpoint`, the parts of the handlers beyond completions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable, Sequence

from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.realtime import EngineClosed, EngineRequest, RealtimeEngine
from velvetrope.errors import RequestError
from velvetrope.openai.tokenizer import Tokenizer
from velvetrope.serving.asgi import Receive

__all__ = ["EngineEndpoint", "progress", "unavailable", "until_done", "watch_disconnect"]


async def progress(rs: Sequence[EngineRequest]) -> AsyncGenerator[tuple[int, int], None]:
    """``(choice, new tokens)`` as the choices' tokens arrive, until every choice has
    delivered its last token; stops early (with nothing more) when one is aborted (the
    client is gone).  Raises :class:`EngineClosed` if the engine stops first."""
    if len(rs) == 1:  # the common case, without a task per read
        (r,) = rs
        while True:
            n = await r.next_tokens()
            if n == 0:
                return
            yield 0, n
            if r.finished and r.pending_tokens == 0:
                return
    reads = {asyncio.ensure_future(r.next_tokens()): i for i, r in enumerate(rs)}
    try:
        while reads:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = reads.pop(fut)
                n = fut.result()
                if n == 0:
                    return
                yield i, n
                r = rs[i]
                if not (r.finished and r.pending_tokens == 0):
                    reads[asyncio.ensure_future(r.next_tokens())] = i
    finally:
        for fut in reads:
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: the reason is already on its way up, or moot
            fut.cancel()


async def watch_disconnect(
    receive: Receive, engine: RealtimeEngine, rs: Sequence[EngineRequest]
) -> None:
    """Abort every sequence of ``rs`` as soon as the client disconnects (a no-op for those
    that have finished)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for r in rs:
                engine.abort(r)
            return


async def until_done(rs: Sequence[EngineRequest]) -> bool:
    """Wait until every sequence of ``rs`` delivered its last token; ``False`` if one was
    aborted first (the client left).  The engine stopping is a 503 ``engine_unavailable``."""
    try:
        async with contextlib.aclosing(progress(rs)) as tokens:
            async for _ in tokens:
                pass
    except EngineClosed as exc:
        raise RequestError(str(exc), status=503, code="engine_unavailable") from None
    return all(r.finished for r in rs)


def unavailable() -> RequestError:
    """The 503 of an engine that is shutting down."""
    return RequestError("The engine is shutting down.", status=503, code="engine_unavailable")


class EngineEndpoint:
    """What a handler of the engine serving ``model`` shares with the others: its
    ``tokenizer`` and ``max_model_len``, the real-time driver ``engine`` (``None`` in
    instant mode: answered at once), ``load`` (the requests held) and ``stopping`` (whether
    the server is shutting down: 503)."""

    def __init__(
        self,
        model: str,
        tokenizer: Tokenizer,
        max_model_len: int,
        engine: RealtimeEngine | None,
        load: RequestLoad,
        stopping: Callable[[], bool],
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.engine = engine
        self.load = load
        self.stopping = stopping
        self._ids = itertools.count()
        self._watchers: set[asyncio.Task[None]] = set()

    def watch(
        self, receive: Receive, engine: RealtimeEngine, rs: Sequence[EngineRequest]
    ) -> asyncio.Task[None]:
        """Abort ``rs`` when the client hangs up (:func:`watch_disconnect`); cancel the task
        returned when the request ends."""
        watcher = asyncio.create_task(watch_disconnect(receive, engine, rs))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return watcher
