"""Waiting on the engine's sequences for one HTTP request (``velvetrope engine``'s
handlers share these): the tokens as they arrive, aborting on a client's hang-up, and
:class:`EngineEndpoint`, the parts of the handlers beyond completions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Protocol

from velvetrope.engine.outputs import OutputPolicy
from velvetrope.engine.serve.engine_request import EngineClosed, EngineRequest
from velvetrope.engine.serve.journal import RequestLoad
from velvetrope.engine.serve.realtime import RealtimeEngine
from velvetrope.errors import PolicyError, RequestError
from velvetrope.openai.prefix import CHARS_PER_TOKEN, prefix_hashes
from velvetrope.openai.tokenizer import ApproxTokenizer, Tokenizer
from velvetrope.serving.asgi import Receive, Send

__all__ = ["EngineEndpoint", "progress", "unavailable", "until_done", "watch_disconnect"]

Chain = Sequence[int]
"""The chained hashes of a prompt's leading blocks, for the engine's prefix cache."""


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

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine model caches prompt prefixes (its usage then says how many
        prompt tokens it found cached)."""
        engine = self.engine
        return engine is not None and engine.batcher.profile.enable_prefix_caching

    def blocks(self, layout: Mapping[str, Any], prompt: int) -> tuple[int, ...]:
        """The chained hashes of the prompt's leading blocks for the engine's prefix cache
        (:func:`~velvetrope.openai.prefix.prefix_hashes` of ``layout``, a chat-shaped
        ``{"messages": [...]}`` of the request's prompt, ``prompt`` tokens); empty without
        prefix caching (or in instant mode)."""
        engine = self.engine
        if engine is None or not self.prefix_caching:
            return ()
        bs = engine.batcher.profile.block_size
        tok = self.tokenizer
        cpt = tok.chars_per_token if isinstance(tok, ApproxTokenizer) else CHARS_PER_TOKEN
        return prefix_hashes(layout, bs, prompt // bs, cpt)

    async def generate(
        self, rid: str, prompt: int, tokens: int, arrived: float, receive: Receive, head: Chain = ()
    ) -> int | None:
        """Run one sequence of ``prompt`` and ``tokens`` tokens (``head``: its leading blocks,
        :meth:`blocks`) to its end (instant mode: nothing to run); the prompt tokens it
        found in the prefix cache, or ``None`` if the client left first."""
        engine = self.engine
        if engine is None:
            return 0
        r = self.submit(engine, rid, prompt, tokens, arrived, head)
        watcher = self.watch(receive, engine, [r])
        try:
            return r.cached_tokens if await until_done([r]) else None
        finally:
            engine.abort(r)
            watcher.cancel()
            self.load.end(rid, prompt, [r])

    def submit(
        self,
        engine: RealtimeEngine,
        rid: str,
        prompt: int,
        tokens: int,
        arrived: float,
        head: Chain = (),
    ) -> EngineRequest:
        """Submit one sequence (counted as held: end it with ``load.end``) with its leading
        blocks ``head`` (:meth:`blocks`)."""
        bs = engine.batcher.profile.block_size if head else 0
        try:
            r = engine.submit(
                rid, prompt, tokens, arrived_at=arrived, block_ids=head, block_tokens=bs
            )
        except PolicyError as exc:
            raise RequestError(str(exc), param="input") from None
        except EngineClosed:
            raise unavailable() from None
        self.load.begin(rid, None, arrived, prompt, False)
        return r


_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class EventWriter(Protocol):
    """The events of one streamed answer, in an API's own shape."""

    def head(self) -> bytes:
        """What comes before the first token."""

    def delta(self, start: int, n: int) -> bytes:
        """Tokens ``start .. start+n-1`` of the text."""

    def tail(self, cached: int) -> bytes:
        """What ends the answer once every token was sent (``cached``: the prompt tokens
        found in the prefix cache, for its usage)."""

    def error(self, message: str) -> bytes:
        """The event that ends a stream cut by the engine stopping."""


class GeneratingEndpoint(EngineEndpoint):
    """An :class:`EngineEndpoint` that generates: ``outputs`` draws the output lengths, and
    :meth:`stream` writes a streamed answer in an API's events."""

    def __init__(
        self,
        model: str,
        tokenizer: Tokenizer,
        max_model_len: int,
        outputs: OutputPolicy,
        engine: RealtimeEngine | None,
        load: RequestLoad,
        stopping: Callable[[], bool],
    ) -> None:
        super().__init__(model, tokenizer, max_model_len, engine, load, stopping)
        self.outputs = outputs
        self.prefix = os.urandom(6).hex()
        """Makes the ids this process writes unique across engines."""

    async def stream(
        self,
        rid: str,
        prompt: int,
        tokens: int,
        arrived: float,
        receive: Receive,
        send: Send,
        events: EventWriter,
        head: Chain = (),
    ) -> None:
        """Run one sequence (``head``: its leading blocks, :meth:`blocks`) and stream it as
        ``events``: the head, a delta per batch of tokens the engine delivers (instant mode:
        one), the tail; nothing more once the client left, the error event if the engine
        stopped."""
        engine = self.engine
        r = None if engine is None else self.submit(engine, rid, prompt, tokens, arrived, head)
        watcher = None if engine is None or r is None else self.watch(receive, engine, [r])

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            await body(events.head())
            if r is None:  # instant mode: the whole text at once
                if tokens:
                    await body(events.delta(0, tokens))
            else:
                sent = 0
                try:
                    async for _, n in progress([r]):
                        await body(events.delta(sent, n))
                        sent += n
                except EngineClosed as exc:
                    await body(events.error(str(exc)), False)
                    return
                if not r.finished:
                    return  # the client left
            await body(events.tail(0 if r is None else r.cached_tokens), False)
        finally:
            if engine is not None and r is not None:
                engine.abort(r)
                self.load.end(rid, prompt, [r])
            if watcher is not None:
                watcher.cancel()
