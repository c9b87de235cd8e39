"""A mixed trace through the gateway (issue 40): an embedding backfill of a batch tenant lands
on a chat pool while the interactive tenant chats.  Real processes on loopback: one
``velvetrope engine`` in real time (its deterministic engine model sets every duration),
``velvetrope serve`` in front, bounded load from ``httpx`` and ``openai`` clients.

Through the gateway the top tier's streamed chats meet their TTFT objective while the
backfill runs, and the backfill is served (every call answered 200, settled as prompt-only
work).  The same load sent straight to the engine puts the chats behind the backfill, past
the objective: what the gateway's tiers are worth, so the test can fail.  When the chats are
done the backfill's clients hang up (the gateway cancels what they left queued)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import charged, metered_config, metric, start_engine, start_gateway, wait_idle

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
TTFT_S = 2.0
"""The interactive tier's TTFT objective (the only time bound the test asserts)."""
WORKERS = 40
"""Backfill clients, each with one embeddings call in flight at a time."""
INPUTS = ["a backfilled document, " * 120] * 6
"""One backfill call: 6 inputs of some 700 tokens each."""


@pytest.fixture(scope="module")
def engine_rt() -> Iterator[str]:
    p = start_engine(1.0)  # real time: the backfill saturates it
    yield p.url
    p.stop()


async def _backfill(base: str, key: str, stop: asyncio.Event, codes: list[int]) -> None:
    async with httpx.AsyncClient(timeout=120) as c:

        async def worker() -> None:
            while not stop.is_set():
                r = await c.post(
                    base + "/v1/embeddings",
                    json={"model": MODEL, "input": INPUTS},
                    headers={"Authorization": f"Bearer {key}"},
                )
                codes.append(r.status_code)

        await asyncio.gather(*(worker() for _ in range(WORKERS)))


async def _chat_ttfts(base: str, n: int) -> list[float]:
    """``n`` streamed chats in a row from the top tier: each one's time to its first token."""
    out = []
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-gold-0000") as c:
        for i in range(n):
            t0 = time.monotonic()
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"question {i}, short"}],
                max_tokens=8,
                stream=True,
            )
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - t0
            assert first is not None
            out.append(first)
    return out


async def _mixed(base: str, warmup_s: float, chats: int) -> tuple[list[float], list[int]]:
    stop, codes = asyncio.Event(), list[int]()
    backfill = asyncio.create_task(_backfill(base, "sk-bronze-0000", stop, codes))
    await asyncio.sleep(warmup_s)  # the backfill fills the engine first
    ttfts = await _chat_ttfts(base, chats)
    stop.set()
    backfill.cancel()  # the calls still queued hang up (the gateway cancels them)
    with contextlib.suppress(asyncio.CancelledError):
        await backfill
    return ttfts, codes


def test_the_top_tier_keeps_its_ttft_through_an_embedding_backfill(
    engine_rt: str, tmp_path: Path
) -> None:
    cfg = metered_config([engine_rt])
    cfg["policy"]["tiers"] = [
        {"name": "interactive", "slo": {"ttft_s": TTFT_S}},
        {"name": "standard"},
        {"name": "batch", "slo": {"e2e_s": 600}},
    ]
    gw = start_gateway(tmp_path, cfg)
    try:
        ttfts, codes = asyncio.run(_mixed(gw.url, 1.5, 6))
        wait_idle(gw.url)
        done = metric(
            gw.url, "velvetrope_requests_total", endpoint="embeddings", outcome="completed"
        )
        settled = metric(gw.url, "velvetrope_tokens_settled_total", endpoint="embeddings")
        chats = metric(gw.url, "velvetrope_requests_total", endpoint="chat", tier="interactive")
        bronze = charged(gw.url, "bronze")
    finally:
        gw.stop()
    assert max(ttfts) <= TTFT_S, ttfts
    assert len(codes) >= 20 and set(codes) == {200}, codes  # the backfill was served
    # (a call answered as its client hung up counts as done, not among the codes)
    assert done >= len(codes)
    # the bucket and the counter agree: each call settled its input tokens, nothing more
    assert settled == pytest.approx(bronze, abs=1.0)
    assert settled >= len(codes) * len(INPUTS) * 100
    print("ttft through the gateway:", [round(t, 3) for t in ttfts])
    assert chats == 6

    # the same load straight at the engine: the chats wait behind the backfill
    direct, _ = asyncio.run(_mixed(engine_rt, 1.5, 1))
    print("ttft straight at the engine:", [round(t, 3) for t in direct])
    assert max(direct) > TTFT_S, direct
