"""Waiting streaming clients are told where they stand (opt-in), with the official SDK."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import admin_status, gateway_config, start_engine, start_gateway

pytestmark = pytest.mark.integration

LONG = {
    "model": "velvetrope-sim",
    "messages": [{"role": "user", "content": "a long answer please"}],
    "max_tokens": 400,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One slot, a real-time engine: a second request waits while the first streams."""
    eng = start_engine(1.0)
    cfg: dict[str, Any] = gateway_config([eng.url])
    cfg["policy"]["pools"] = [{"name": "default", "max_in_flight": 1}]
    cfg["policy"]["tiers"][0]["max_wait_s"] = 30
    cfg["policy"]["tiers"][2]["max_wait_s"] = 0.9  # batch: expires while waiting
    cfg["policy"]["tenants"][2]["queue_progress"] = True  # bronze opts in for all requests
    cfg["policy"]["tenants"].append({"name": "iron", "tier": "batch"})  # iron does not
    cfg["api_keys"].append({"tenant": "iron", "key": "sk-iron-0000"})
    cfg["gateway"]["progress_interval_s"] = 0.2
    cfg["gateway"]["saturation"] = {"enabled": False}
    try:
        with start_gateway(tmp_path_factory.mktemp("progress"), cfg) as g:
            yield g.url
    finally:
        eng.stop()


def occupy(gw: str) -> threading.Thread:
    """Hold the only slot with a long stream; returns once it is in flight."""
    started = threading.Event()

    def run() -> None:
        with httpx.stream(
            "POST",
            gw + "/v1/chat/completions",
            json=LONG,
            headers={"Authorization": "Bearer sk-gold-0000"},
            timeout=60,
        ) as r:
            for _ in r.iter_bytes():
                started.set()

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(20)
    return t


def test_a_waiting_stream_gets_comments_then_its_answer(gw: str) -> None:
    holder = occupy(gw)
    try:
        lines: list[str] = []
        with httpx.stream(
            "POST",
            gw + "/v1/chat/completions",
            json={**LONG, "max_tokens": 5},
            headers={"Authorization": "Bearer sk-gold-0000", "x-velvetrope-progress": "1"},
            timeout=60,
        ) as r:
            assert r.status_code == 200
            assert r.headers["x-velvetrope-progress"] == "1"
            lines = [x for x in r.iter_lines() if x]
        comments = [x for x in lines if x.startswith(": velvetrope queued")]
        assert comments and "ahead<=0" in comments[0]
        assert lines[-1] == "data: [DONE]"
        # and the official SDK, which ignores comments, gets an ordinary stream
        c = openai.OpenAI(base_url=gw + "/v1", api_key="sk-gold-0000", max_retries=0)
        stream = c.chat.completions.create(
            model="velvetrope-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            extra_headers={"x-velvetrope-progress": "1"},
            extra_body={"ignore_eos": True},
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert text
    finally:
        holder.join()


def test_a_rejection_after_comments_is_an_sse_error_with_the_same_code(gw: str) -> None:
    holder = occupy(gw)
    try:
        c = openai.OpenAI(base_url=gw + "/v1", api_key="sk-bronze-0000", max_retries=0)
        stream = c.chat.completions.create(
            model="velvetrope-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
        )
        with pytest.raises(openai.APIError) as ei:
            for _ in stream:
                pass
        assert ei.value.code == "expired"
        # without progress the same wait ends as a plain 503 with that code
        r = httpx.post(
            gw + "/v1/chat/completions",
            json={**LONG, "max_tokens": 5},
            headers={"Authorization": "Bearer sk-iron-0000"},
            timeout=60,
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "expired"
    finally:
        holder.join()
    st = admin_status(gw)
    assert st["queued"] == 0 and st["in_flight"] == 0
