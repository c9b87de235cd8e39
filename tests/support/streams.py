"""One streamed completion through the official ``openai`` client, read to its end; the
preemption tests' round of three requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai

from tests.gateway.conftest import status_until

__all__ = ["stream_completion", "taken_back_round"]


async def stream_completion(
    client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int, **kw: Any
) -> tuple[str, Any]:
    """Stream a completion (``include_usage`` on; ``kw`` passed to ``create``): its text
    and its usage (``None`` if the stream carried none)."""
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **kw,
    )
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage is not None:
            usage = chunk.usage
    return text, usage


async def taken_back_round(
    c: httpx.AsyncClient,
    gateway: str,
    long: Awaitable[Any],
    victim: Callable[[], Awaitable[Any]],
    top: Callable[[], Awaitable[Any]],
) -> list[Any]:
    """The preemption tests' round on a gateway of two slots in front of an engine of one:
    ``long`` takes the engine's seat, ``victim()`` is dispatched and waits in the engine,
    ``top()`` waits in the gateway's queue until it takes the victim back (one preemption
    in ``/admin/status``).  Their outcomes, exceptions included, in that order."""
    running = asyncio.ensure_future(long)
    await status_until(c, gateway, lambda s: s["in_flight"] == 1)
    waiting = asyncio.ensure_future(victim())
    await status_until(c, gateway, lambda s: s["in_flight"] == 2)
    first = asyncio.ensure_future(top())
    st = await status_until(c, gateway, lambda s: s["pools"]["default"]["preemptions"])
    assert st["pools"]["default"]["preemptions"] == 1, st["pools"]
    return list(await asyncio.gather(running, waiting, first, return_exceptions=True))
