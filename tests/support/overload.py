"""A short open-loop overload of an OpenAI-compatible endpoint, and what the top tier got.

Used by ``tests/engines/`` and ``bench/real_engine_bench.py`` to compare the same traffic
sent straight to an engine and through the gateway.  :func:`measure_capacity` finds how
many requests a second the engine completes when saturated; :func:`overload` then sends
``factor`` times that rate for ``seconds`` (evenly spaced, every ``1/share``-th request
from the interactive tenant, the rest from the batch tenant), streams each answer and
records its time to first token.  Every request has a deadline, so a run is bounded:
``seconds + grace_s`` at most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import orjson

__all__ = ["OverloadResult", "measure_capacity", "overload"]


@dataclass(frozen=True)
class OverloadResult:
    """Per request: its tenant class (``interactive``), status and time to first token."""

    interactive: tuple[bool, ...]
    status: tuple[int, ...]
    ttft_s: tuple[float | None, ...]

    def top_tier_in_slo(self, slo_s: float) -> tuple[int, int]:
        """``(within, of)``: interactive requests whose first token came within ``slo_s``."""
        ttfts = [t for i, t in zip(self.interactive, self.ttft_s, strict=True) if i]
        return sum(1 for t in ttfts if t is not None and t <= slo_s), len(ttfts)


async def _one(
    c: httpx.AsyncClient, url: str, key: str, body: bytes, deadline_s: float
) -> tuple[int, float | None]:
    """Stream one completion; ``(status, ttft)`` (``None``: no token before the deadline)."""
    t0 = time.monotonic()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    try:
        async with asyncio.timeout(deadline_s):
            async with c.stream("POST", url, content=body, headers=headers) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r.status_code, None
                ttft = None
                async for line in r.aiter_lines():
                    text = '"text":"' in line and '"text":""' not in line
                    if ttft is None and text and line.startswith("data: {"):
                        ttft = time.monotonic() - t0
                    if line == "data: [DONE]":
                        break
                return 200, ttft
    except TimeoutError:
        return 0, None


def _body(model: str, max_tokens: int, i: int) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "prompt": f"request {i}: tell me a story about the sea",
            "max_tokens": max_tokens,
            "stream": True,
            "cache_prompt": False,
        }
    )


async def measure_capacity(
    base_url: str, key: str, model: str, max_tokens: int, concurrency: int, seconds: float
) -> float:
    """Requests a second ``base_url`` completes with ``concurrency`` always in flight."""
    url = base_url + "/v1/completions"
    done = 0
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:

        async def worker(w: int) -> None:
            nonlocal done
            i = 0
            while time.monotonic() < end:
                status, _ = await _one(c, url, key, _body(model, max_tokens, w * 10_000 + i), 60)
                i += 1
                if status == 200:
                    done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done / (time.monotonic() - t0)


async def overload(
    base_url: str,
    keys: Sequence[str],
    model: str,
    *,
    rate: float,
    seconds: float,
    share: float,
    max_tokens: int,
    grace_s: float,
) -> OverloadResult:
    """Send ``rate`` requests a second for ``seconds``; ``keys`` is ``(interactive, batch)``.

    Request ``i`` is interactive when ``floor((i+1)·share) > floor(i·share)`` (an even
    spread of ``share``).  Each request may take until ``seconds + grace_s`` after the
    start; what has no first token by then counts as missing its SLO."""
    url = base_url + "/v1/completions"
    n = max(1, round(rate * seconds))
    kinds = [int((i + 1) * share) > int(i * share) for i in range(n)]
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=seconds + grace_s, limits=limits) as c:

        async def fire(i: int) -> tuple[int, float | None]:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            left = t0 + seconds + grace_s - time.monotonic()
            key = keys[0] if kinds[i] else keys[1]
            return await _one(c, url, key, _body(model, max_tokens, i), max(0.1, left))

        results = await asyncio.gather(*(fire(i) for i in range(n)))
    return OverloadResult(tuple(kinds), tuple(s for s, _ in results), tuple(t for _, t in results))
