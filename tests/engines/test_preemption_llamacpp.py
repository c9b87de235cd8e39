"""Making room before the first token in front of llama.cpp: a ``llama-server`` of one slot,
so a second request waits in its queue with no token; a gateway of two slots in
``limit: slo`` mode (:mod:`velvetrope.core.preemption`).

A long batch stream holds the slot; a short batch stream waits in llama.cpp's queue; an
interactive request waits in the gateway's.  Once it has waited half its TTFT the gateway
takes the waiting batch request back and closes its connection.  llama.cpp notices a closed
stream when it first writes to it, so it stops the request taken back after one token: its
``tokens_predicted_total`` grows by what the clients received and at most one more.  The
request is queued again and answered in full (with time left in its SLO), or answered 503
``preempted`` with ``Retry-After`` (with none); the tenant is charged exactly the usage
llama.cpp reported to it, nothing for the attempt taken back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import llama_engine
from tests.support.llama_engine import start_llama_server
from tests.support.streams import stream_completion, taken_back_round
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

from .conftest import ADMIN, BRONZE, BURST, GOLD, MODEL_NAME, charged, engine_metric

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def one_slot(tiny_model: Path) -> Iterator[ServerProcess]:
    """``llama-server`` with a single slot: a second request waits in its queue."""
    p = start_llama_server(tiny_model, slots=1, ctx_per_slot=2048)
    yield p
    p.stop()


def _gateway(engine: str, tmp: Path) -> ServerProcess:
    cfg = llama_engine.gateway_config(engine, ADMIN, (GOLD, BRONZE), BURST, 2)
    policy = cfg["policy"]
    policy["tiers"] = [
        {"name": "interactive", "slo": {"ttft_s": 0.4}},
        {"name": "batch", "slo": {"e2e_s": 600}},
    ]
    policy["queue"] = {"bands": "strict"}
    policy["pools"] = [{"name": "default", "limit": "slo", "max_in_flight": 2}]
    policy["saturation"] = {"enabled": False}
    tmp.mkdir()
    return launch.start_gateway(cfg, tmp)


async def _stream(client: openai.AsyncOpenAI, max_tokens: int, **kw: Any) -> Any:
    """One streamed completion's usage (the text must not be empty)."""
    text, usage = await stream_completion(client, MODEL_NAME, "Once upon a time", max_tokens, **kw)
    assert text and usage is not None
    return usage


def _round(engine: str, tmp: Path, **victim: Any) -> tuple[list[Any], float, float]:
    """The three requests on a fresh gateway: their outcomes, the tokens charged to the
    batch tenant and the tokens llama.cpp predicted meanwhile."""
    gw = _gateway(engine, tmp)
    predicted = engine_metric(engine, "tokens_predicted_total")

    def sdk(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)

    async def go() -> list[Any]:
        body = {"ignore_eos": True, "cache_prompt": False}
        async with httpx.AsyncClient(timeout=60) as c, sdk(BRONZE) as bronze, sdk(GOLD) as gold:
            return await taken_back_round(
                c,
                gw.url,
                _stream(bronze, 1500, extra_body=body),
                lambda: _stream(bronze, 8, extra_body=body, **victim),
                lambda: _stream(gold, 8, extra_body=body),
            )

    try:
        out = asyncio.run(go())
        return (
            out,
            charged(gw.url, "bronze"),
            engine_metric(engine, "tokens_predicted_total") - (predicted),
        )
    finally:
        gw.stop()


def test_llama_cpp_stops_a_request_taken_back_before_its_first_token(
    one_slot: ServerProcess, tmp_path: Path
) -> None:
    (running, waiting, top), bronze, predicted = _round(one_slot.url, tmp_path / "again")
    for r in (running, waiting, top):
        assert not isinstance(r, BaseException), r
    assert (running.completion_tokens, waiting.completion_tokens) == (1500, 8)
    assert 0 <= predicted - (1500 + 8 + top.completion_tokens) <= 1  # the attempt taken back
    # (the bucket refills 0.01 token/s meanwhile)
    assert bronze == pytest.approx(running.total_tokens + waiting.total_tokens, abs=0.5)
    (running, waiting, top), bronze, predicted = _round(
        one_slot.url, tmp_path / "refused", extra_headers={"x-slo-ttft-ms": "100"}
    )
    assert isinstance(waiting, openai.APIStatusError), waiting
    assert waiting.status_code == 503 and int(waiting.response.headers["retry-after"]) >= 1
    body = waiting.body
    assert isinstance(body, dict) and body["code"] == "preempted", body
    assert not isinstance(running, BaseException) and not isinstance(top, BaseException)
    assert 0 <= predicted - (running.completion_tokens + top.completion_tokens) <= 1
    assert bronze == pytest.approx(running.total_tokens, abs=0.5)  # refunded in full
