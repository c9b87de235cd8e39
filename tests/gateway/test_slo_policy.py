"""The SLO-derived policy through real processes: ``velvetrope serve`` in front of
``velvetrope engine`` on loopback, with the official ``openai`` client and ``httpx``.

* A request's own TTFT objective and "do not queue" (``x-slo-ttft-ms``,
  ``x-velvetrope-do-not-queue``): malformed values are a 400 naming the header; a request
  that may not wait is refused at once while the pool is full, and one whose deadline
  passes in the queue is expired, each a 503 with ``Retry-After``.
* Headroom: an engine that queues work holds the batch tier in the gateway's queue, while
  an interactive request is let past the brake into the engine's priority queue: ahead of
  the batch request the engine queues, or, when what it queues is interactive too, because
  the engine starts it within its TTFT; with ``limit: fixed`` it waits in the gateway's
  queue like the batch request.
* The TPOT limit learns ``tpot ≈ a + b·n + c·p`` from the relayed streams and reports it,
  with long prompts prefilled while short answers decode charged to the prefill.

Tests wait on ``/admin/status``, never a fixed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .conftest import gateway_config, start_engine, start_gateway, status_until, stream_to_end

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
BRONZE = {"Authorization": "Bearer sk-bronze-0000"}
TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 3.0, "tpot_s": 0.5}},
    {"name": "standard", "slo": {"ttft_s": 10.0}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]


def _body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "velvetrope-sim",
        "prompt": "hello there",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def test_the_request_slo_headers(tmp_path: Path) -> None:
    eng = start_engine(2.0, "--set", "max_num_seqs=1")
    cfg = gateway_config(
        [eng.url],
        tiers=TIERS,
        pools=[{"name": "default", "max_in_flight": 1}],
        saturation={"enabled": False},
    )
    gw = start_gateway(tmp_path, cfg)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-gold-0000", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(
                model="velvetrope-sim",
                prompt="hi",
                max_tokens=2,
                extra_headers={"x-slo-ttft-ms": "soon"},
            )
        client.close()
        err = bad.value.body
        assert isinstance(err, dict) and err["param"] == "x-slo-ttft-ms", err
        assert err["code"] == "invalid_header", err
        r = httpx.post(
            gw.url + "/v1/completions",
            json=_body(2),
            headers={**GOLD, "x-velvetrope-do-not-queue": "maybe"},
        )
        assert r.status_code == 400 and "x-velvetrope-do-not-queue" in r.text, r.text

        async def go() -> None:
            async with httpx.AsyncClient(timeout=120) as c:
                long = asyncio.create_task(
                    c.post(gw.url + "/v1/completions", json=_body(1500), headers=BRONZE)
                )
                st = await status_until(c, gw.url, lambda s: s["in_flight"] == 1)
                assert st["in_flight"] == 1, st
                now = await c.post(
                    gw.url + "/v1/completions",
                    json=_body(2),
                    headers={**GOLD, "x-velvetrope-do-not-queue": "1"},
                )
                assert now.status_code == 503, now.text
                assert now.json()["error"]["code"] == "wait_exceeds_slo", now.text
                assert int(now.headers["retry-after"]) >= 1
                soon = await c.post(
                    gw.url + "/v1/completions",
                    json=_body(2),
                    headers={**GOLD, "x-slo-ttft-ms": "300"},
                )
                assert soon.status_code == 503, soon.text
                assert soon.json()["error"]["code"] in ("expired", "wait_exceeds_slo"), soon.text
                assert "retry-after" in soon.headers
                later = asyncio.create_task(  # no header: the tier's 3 s TTFT is its bound
                    c.post(gw.url + "/v1/completions", json=_body(2), headers=GOLD)
                )
                st = await status_until(c, gw.url, lambda s: s["queued"] == 1)
                assert st["queued"] == 1, st
                long.cancel()  # the client hangs up: the slot frees, the queued one goes
                ok = await later
                assert ok.status_code == 200, ok.text

        asyncio.run(go())
    finally:
        gw.stop()
        eng.stop()


def _headroom(tmp: Path, limit: str, long_headers: dict[str, str] = BRONZE) -> dict[str, Any]:
    """Three long batch streams on an engine of two seats (one waits in the engine: the
    saturation rule learns it is full), a fourth batch request and then an interactive one;
    the status once both have arrived."""
    tmp.mkdir()
    eng = start_engine(2.0, "--scheduling", "priority", "--set", "max_num_seqs=2")
    pool: dict[str, Any] = {"name": "default", "engine_priority": True, "limit": limit}
    if limit == "fixed":
        pool["max_in_flight"] = 64
    cfg = gateway_config(
        [eng.url],
        tiers=TIERS,
        queue={"bands": "strict"},
        pools=[pool],
        saturation={"max_waiting": 0, "scrape_interval_s": 0.1, "initial_capacity": 2},
    )
    gw = start_gateway(tmp, cfg)

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=120) as c:
            url = gw.url + "/v1/completions"
            for _ in range(6):  # first tokens: the engines' start rate
                r = await c.post(url, json=_body(2), headers=BRONZE)
                assert r.status_code == 200, r.text
            longs = [
                asyncio.create_task(
                    c.post(url, json=_body(1500, stream=long_headers is GOLD), headers=long_headers)
                )
                for _ in range(3)
            ]
            st = await status_until(c, gw.url, lambda s: s["in_flight"] == 3)
            assert st["in_flight"] == 3, st
            st = await status_until(  # a scrape that shows the engine queueing one
                c,
                gw.url,
                lambda s: any(
                    e["capacity_learned"] and (e["waiting"] or 0) >= 1
                    for e in s["engine_load"].values()
                ),
            )
            assert any(e["capacity_learned"] for e in st["engine_load"].values()), st
            batch = asyncio.create_task(c.post(url, json=_body(2), headers=BRONZE))
            st = await status_until(c, gw.url, lambda s: s["queued"] == 1)
            assert st["queued"] == 1, st  # held in the gateway's queue
            top = asyncio.create_task(c.post(url, json=_body(2), headers=GOLD))
            st = await status_until(
                c, gw.url, lambda s: s["in_flight"] == 4 or s["queued"] == 2, timeout_s=10
            )
            for t in (*longs, batch, top):
                t.cancel()
            await asyncio.gather(*longs, batch, top, return_exceptions=True)
            return st

    try:
        return asyncio.run(go())
    finally:
        gw.stop()
        eng.stop()


def test_the_top_tier_passes_the_saturation_brake_that_holds_the_batch_tier(
    tmp_path: Path,
) -> None:
    slo = _headroom(tmp_path / "slo", "slo")
    assert slo["in_flight"] == 4 and slo["queued"] == 1, slo  # the interactive one went
    # ahead of the batch request the engine queues (it orders by the tier's priority)
    assert slo["pools"]["default"]["headroom_overtakes"] >= 1, slo["pools"]
    fixed = _headroom(tmp_path / "fixed", "fixed")
    assert fixed["in_flight"] == 3 and fixed["queued"] == 2, fixed  # both held
    assert fixed["pools"]["default"]["headroom_passes"] is None
    assert fixed["pools"]["default"]["headroom_overtakes"] is None


def test_the_top_tier_passes_behind_its_own_queued_requests_when_they_start_in_time(
    tmp_path: Path,
) -> None:
    """The three long requests are interactive (streamed, so the gateway sees which two
    the engine has begun): what the engine queues is the top tier's own, so there is
    nothing lower to go ahead of; the interactive request still goes past the brake, by the
    start-time rule (the engine starts it within its TTFT)."""
    slo = _headroom(tmp_path / "slo", "slo", long_headers=GOLD)
    assert slo["in_flight"] == 4 and slo["queued"] == 1, slo  # the interactive one went
    assert slo["pools"]["default"]["headroom_passes"] >= 1, slo["pools"]
    assert slo["pools"]["default"]["headroom_overtakes"] == 0, slo["pools"]


Stream = Callable[[str, int, float], Awaitable[None]]


def _learn_tpot(
    tmp_path: Path,
    speed: float,
    round_of_waves: Callable[[Stream], Awaitable[None]],
    learned: Callable[[dict[str, Any]], bool],
    *engine_args: str,
) -> dict[str, Any]:
    """A gateway (``min_samples: 20``) in front of one ``velvetrope engine`` at ``speed``
    (64 seats, ``engine_args`` added to its command line): rounds of streamed waves
    (``round_of_waves``, given a function that streams one request of a prompt and
    ``max_tokens`` after a delay) until the TPOT limit's status is ``learned``, four rounds
    at most (a busy machine's TPOTs are noisy); returns it."""
    eng = start_engine(speed, "--set", "max_num_seqs=64", *engine_args)
    cfg = gateway_config(
        [eng.url],
        tiers=TIERS,
        pools=[{"name": "default", "slo_limit": {"min_samples": 20}}],
    )
    gw = start_gateway(tmp_path, cfg)
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-gold-0000", max_retries=0)

    async def one(prompt: str, max_tokens: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await stream_to_end(client, prompt, max_tokens)

    def done(s: dict[str, Any]) -> bool:
        return learned(s["pools"]["default"]["tpot_limit"])

    async def go() -> dict[str, Any]:
        async with client, httpx.AsyncClient(timeout=30) as c:
            st: dict[str, Any] = {}
            for _ in range(4):
                await round_of_waves(one)
                st = await status_until(c, gw.url, done, timeout_s=5.0)
                if done(st):
                    break
            return st

    try:
        st = asyncio.run(go())
    finally:
        gw.stop()
        eng.stop()
    tl: dict[str, Any] = st["pools"]["default"]["tpot_limit"]
    return tl


def test_the_tpot_limit_learns_the_engines_decode_from_the_streams(tmp_path: Path) -> None:
    async def waves(one: Stream) -> None:
        for width in (1, 4, 16, 32):  # waves of growing concurrency: a spread of n
            await asyncio.gather(*(one("hi", 40, 0.0) for _ in range(max(8, width))))

    tl = _learn_tpot(  # at 10× speed, each sequence adds 0.1 ms to a step (1 ms of model
        # time, the profile's is 0.04 ms): from 8 to 32 in flight the TPOT grows from ~1.6 ms
        # to ~4 ms, well above a busy machine's noise (with the profile's cost, 0.1 ms of
        # growth, the fit found the TPOT flat beside parallel tests and stayed unknown)
        tmp_path,
        10.0,
        waves,
        lambda t: t["samples"] >= 20 and t["tpot_per_seq_s"] is not None,
        "--set",
        "per_decode_seq_s=0.001",
    )
    assert tl["samples"] >= 20, tl
    assert tl["target_tpot_s"] is None  # nothing in flight now: no tier's objective applies
    assert tl["out_of_reach"] is False  # so no objective is out of the fit's reach
    # what slows a step here: the batch, and each new request's prefill and arrival (two
    # prompt tokens, but a request's handling takes the engine's loop too): the fit learns
    # one or both, never a negative cost
    assert tl["tpot_per_seq_s"] is not None and tl["tpot_per_seq_s"] >= 0, repr(tl)
    assert tl["tpot_per_prefill_token_s"] is not None and tl["tpot_per_prefill_token_s"] >= 0
    assert tl["tpot_per_seq_s"] > 0 or tl["tpot_per_prefill_token_s"] > 0, repr(tl)
    assert 0 < tl["tpot_base_s"] < 0.5, tl


def test_the_tpot_limit_tells_long_prompts_prefill_from_the_batch(tmp_path: Path) -> None:
    """Short answers decode while long prompts are prefilled in the same steps: the fit
    charges the slowdown to the prefill (per prompt token), measured from the relayed
    streams' first tokens, not to the batch."""
    long_prompt = "lorem ipsum dolor sit amet " * 300  # ~1,500 tokens

    async def waves(one: Stream) -> None:
        # width short prompts decode 60 tokens; prompts long ones arrive meanwhile
        for width, prompts in ((4, 0), (16, 0), (4, 8), (16, 8), (8, 16)):
            short = [one("hi", 60, 0.0) for _ in range(width)]
            longs = [one(long_prompt, 2, 0.02 * (i + 1)) for i in range(prompts)]
            await asyncio.gather(*short, *longs)

    tl = _learn_tpot(  # at 3× speed a prefill chunk costs a few ms
        tmp_path,
        3.0,
        waves,
        lambda t: t["samples"] >= 20 and (t["tpot_per_prefill_token_s"] or 0.0) > 0.0,
    )
    assert tl["samples"] >= 20, tl
    assert tl["tpot_per_prefill_token_s"] > 0, repr(tl)
    assert tl["prefill_max_per_step"] > 50, repr(tl)  # long prompts counted while one decoded
    assert tl["tpot_per_seq_s"] >= 0 and tl["prefill_per_seq"] > 0, repr(tl)
