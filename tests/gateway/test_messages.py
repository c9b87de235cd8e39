"""Anthropic's Messages API through a real gateway in front of a real ``velvetrope engine``,
with the official ``anthropic`` SDK (``base_url`` the gateway, its ``x-api-key``):
``messages.create``, ``messages.stream`` and ``messages.count_tokens`` answer as the engine
does straight and are settled from the usage it reported; errors are in Anthropic's shape,
an overloaded gateway's 503 a 529."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from .conftest import (
    NOT_THE_ENGINES_COUNT,
    charged,
    gateway_config,
    metered_config,
    metric,
    start_engine,
    start_gateway,
    status_until,
)

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
GOLD = "sk-gold-0000"


@pytest.fixture(scope="module")
def gw(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = metered_config([engine], tokenizer=NOT_THE_ENGINES_COUNT)
    p = start_gateway(tmp_path_factory.mktemp("messages"), cfg)
    yield p.url
    p.stop()


def _sdk(base: str, key: str = GOLD) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


MSGS: Any = [{"role": "user", "content": "Tell me about the sea"}]


def test_messages_create_stream_and_count_tokens_are_settled_from_the_engines_usage(
    gw: str, engine: str
) -> None:
    before = charged(gw, "gold")
    settled = 0
    with _sdk(engine, "unused") as direct, _sdk(gw) as via:
        want = direct.messages.create(model=MODEL, max_tokens=12, messages=MSGS, system="Brief.")
        got = via.messages.create(model=MODEL, max_tokens=12, messages=MSGS, system="Brief.")
        assert got.content[0].type == "text" and got.content == want.content
        assert got.usage.input_tokens == want.usage.input_tokens
        assert got.usage.output_tokens == want.usage.output_tokens <= 12
        assert got.stop_reason in ("end_turn", "max_tokens")
        settled += got.usage.input_tokens + got.usage.output_tokens
        with via.messages.stream(model=MODEL, max_tokens=12, messages=MSGS) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == final.content[0].text  # type: ignore[union-attr]
        assert final.usage.output_tokens == want.usage.output_tokens
        settled += final.usage.input_tokens + final.usage.output_tokens
        counted = via.messages.count_tokens(model=MODEL, messages=MSGS, system="Brief.")
        assert counted.input_tokens == want.usage.input_tokens  # the engine's count
    assert charged(gw, "gold") - before == pytest.approx(settled, abs=0.5)


def test_bearer_works_too_and_errors_are_in_anthropics_shape(gw: str) -> None:
    r = httpx.post(
        gw + "/v1/messages",
        json={"model": MODEL, "max_tokens": 4, "messages": MSGS},
        headers={"Authorization": f"Bearer {GOLD}"},
    )
    assert r.status_code == 200 and r.json()["type"] == "message"
    with _sdk(gw, "sk-wrong") as bad, pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=4, messages=MSGS)
    assert e.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "missing or invalid API key"},
    }
    for payload, message in (
        ({"model": MODEL, "messages": MSGS}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 4, "messages": []}, "messages"),
        (
            {"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
            "role",
        ),
    ):
        r = httpx.post(gw + "/v1/messages", json=payload, headers={"x-api-key": GOLD})
        assert r.status_code == 400
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert message in body["error"]["message"]


def test_an_overloaded_gateway_answers_529_overloaded_error(tmp_path: Path) -> None:
    eng = start_engine(1.0)  # real time: a 150-token answer takes over a second
    cfg = gateway_config([eng.url], queue={"max_queued": 2})
    cfg["policy"]["pools"] = [{"name": "default", "max_in_flight": 1}]
    p = start_gateway(tmp_path, cfg)
    long: Any = {"model": MODEL, "prompt": "x", "max_tokens": 150, "ignore_eos": True}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers={"x-api-key": GOLD}) as c:
            first = asyncio.create_task(c.post(p.url + "/v1/completions", json=long))
            st = await status_until(c, p.url, lambda s: s["in_flight"] == 1)
            assert st["in_flight"] == 1, st  # the one slot is taken
            msg = {"model": MODEL, "max_tokens": 4, "messages": MSGS}
            rest = [asyncio.create_task(c.post(p.url + "/v1/messages", json=msg)) for _ in range(4)]
            return [await first, *[await t for t in rest]]

    try:
        rs = asyncio.run(run())
        assert sorted(r.status_code for r in rs) == [200, 200, 200, 529, 529]  # 2 queued
        for r in rs:
            if r.status_code == 529:
                assert r.json()["type"] == "error"
                assert r.json()["error"]["type"] == "overloaded_error"
        assert metric(p.url, "velvetrope_requests_total", reason="queue_full") == 2
    finally:
        p.stop()
        eng.stop()
