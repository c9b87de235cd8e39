"""Making room before the first token through real processes: ``velvetrope serve`` in front
of one ``velvetrope engine`` (one seat, a journal of what it did) on loopback, with the
official ``openai`` client.

A batch stream runs on the engine's only seat; a second batch stream is dispatched and
waits in the engine without a token; an interactive request then waits in the gateway's
queue (two slots, both taken).  Once it has waited half its TTFT (0.4 s) the gateway takes
the waiting batch request back:

* it is cancelled at the engine (the journal shows it aborted, nothing generated);
* with time left in its own SLO it is queued again and answered in full later, a 200 whose
  tokens are all there; with none left (its ``x-slo-ttft-ms``) it is a 503 ``preempted``
  with ``Retry-After``: never a 200 with an empty body;
* the tenant is settled for exactly what the engine reported: the tokens settled per tier
  equal the usage the clients received.

Tests wait on ``/admin/status``, never a fixed time.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.streams import stream_completion, taken_back_round

from .conftest import (
    admin_status,
    gateway_config,
    metric,
    start_engine,
    start_gateway,
)

pytestmark = pytest.mark.integration

TIERS = [
    {"name": "interactive", "slo": {"ttft_s": 0.4}},
    {"name": "standard", "slo": {"ttft_s": 10.0}},
    {"name": "batch", "slo": {"e2e_s": 600}},
]

SLOW = {"tokens_per_minute": 0.6, "token_burst": 1_000_000}


async def _stream(client: openai.AsyncOpenAI, max_tokens: int, **kw: Any) -> tuple[str, Any]:
    """One streamed completion: its text and its usage."""
    return await stream_completion(client, "velvetrope-sim", "hello there", max_tokens, **kw)


def _journal(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _round(tmp: Path, engine: str, tag: str, **victim: Any) -> tuple[list[Any], float, float]:
    """On a fresh gateway (no lateness learned yet) in front of ``engine``: the running
    stream, the victim (``request_id`` ``tag``), the interactive request; their outcomes and
    the tokens settled for the batch and interactive tiers."""
    cfg = gateway_config(
        [engine],
        tiers=TIERS,
        queue={"bands": "strict"},
        tenants=[  # token buckets, so that every settlement is counted by tier
            {"name": "gold", "tier": "interactive", "limits": SLOW},
            {"name": "bronze", "tier": "batch", "limits": SLOW},
        ],
        pools=[{"name": "default", "limit": "slo", "max_in_flight": 2}],
        saturation={"enabled": False},
    )
    tmp.mkdir()
    gw = start_gateway(tmp, cfg)

    def sdk(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)

    async def go() -> list[Any]:
        bronze, gold = sdk("sk-bronze-0000"), sdk("sk-gold-0000")
        body = {"ignore_eos": True}
        async with httpx.AsyncClient(timeout=60) as c, bronze, gold:
            return await taken_back_round(
                c,
                gw.url,
                _stream(bronze, 600, extra_body=body),
                lambda: _stream(bronze, 5, extra_body={**body, "request_id": tag}, **victim),
                lambda: _stream(gold, 5, extra_body=body),
            )

    try:
        out = asyncio.run(go())
        settled = [
            metric(gw.url, "velvetrope_tokens_settled_total", tier=t)
            for t in ("batch", "interactive")
        ]
        assert metric(gw.url, "velvetrope_preemptions_total", pool="default") == 1
    finally:
        gw.stop()
    return out, settled[0], settled[1]


def test_a_batch_request_waiting_in_the_engine_is_taken_back_for_an_interactive_one(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "engine.jsonl"
    eng = start_engine(1.0, "--set", "max_num_seqs=1", "--journal", str(journal))
    try:
        # time left in its SLO: queued again, answered in full
        (running, waiting, top), batch, interactive = _round(tmp_path / "a", eng.url, "again")
        for r in (running, waiting, top):
            assert not isinstance(r, BaseException), r
        text, usage = waiting
        assert usage.completion_tokens == 5 and text, waiting
        assert top[1].completion_tokens == 5 and running[1].completion_tokens == 600
        # settled exactly what the engine reported: the attempt taken back, nothing
        assert batch == running[1].total_tokens + usage.total_tokens
        assert interactive == top[1].total_tokens
        # no time left (its own TTFT bound passed): 503 preempted, refunded
        (running, waiting, top), batch, _ = _round(
            tmp_path / "b", eng.url, "refused", extra_headers={"x-slo-ttft-ms": "100"}
        )
        assert isinstance(waiting, openai.APIStatusError), waiting
        assert waiting.status_code == 503, waiting
        err = waiting.body
        assert isinstance(err, dict) and err["code"] == "preempted", err
        assert int(waiting.response.headers["retry-after"]) >= 1
        assert not isinstance(running, BaseException), running
        assert not isinstance(top, BaseException), top
        assert batch == running[1].total_tokens  # the request taken back: nothing
    finally:
        eng.stop()
    lines = _journal(journal)
    rid = {e["id"]: e["request_id"] for e in lines if e["ev"] == "start"}
    ends = {(rid[e["id"]], e["state"], e["generated"]) for e in lines if e["ev"] == "end"}
    # the engine stopped each taken-back attempt before it generated anything
    assert ("again", "aborted", 0) in ends and ("again", "finished", 5) in ends, ends
    assert ("refused", "aborted", 0) in ends, ends
    assert not any(r == "refused" and s == "finished" for r, s, _ in ends), ends


def test_with_shared_state_the_job_taken_back_gives_its_lease_to_the_top_tier(
    tmp_path: Path, redis_url: str
) -> None:
    """The same round with the slots counted in Redis (two leases fleet-wide): the batch
    request taken back gives its lease back as it is queued again, so the interactive
    request is sent to the engine at once (it waits there for the seat, as the engines'
    own order has it), not after the long stream ends and frees a lease; the request
    taken back takes a lease again when it is dispatched, and every request is answered
    in full."""
    journal = tmp_path / "engine.jsonl"
    eng = start_engine(1.0, "--set", "max_num_seqs=1", "--journal", str(journal))
    cfg = gateway_config(
        [eng.url],
        tiers=TIERS,
        queue={"bands": "strict"},
        tenants=[
            {"name": "gold", "tier": "interactive"},
            {"name": "bronze", "tier": "batch"},
        ],
        pools=[{"name": "default", "limit": "slo", "max_in_flight": 2}],
        saturation={"enabled": False},
    )
    namespace = f"p{uuid.uuid4().hex[:8]}"
    cfg["state"] = {"url": redis_url, "namespace": namespace, "call_timeout_ms": 1000}
    gw = start_gateway(tmp_path, cfg)

    def sdk(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)

    async def go() -> list[Any]:
        bronze, gold = sdk("sk-bronze-0000"), sdk("sk-gold-0000")
        async with httpx.AsyncClient(timeout=60) as c, bronze, gold:
            return await taken_back_round(
                c,
                gw.url,
                _stream(bronze, 600, extra_body={"ignore_eos": True, "request_id": "long"}),
                lambda: _stream(bronze, 5, extra_body={"ignore_eos": True, "request_id": "victim"}),
                lambda: _stream(gold, 5, extra_body={"ignore_eos": True, "request_id": "top"}),
            )

    try:
        running, waiting, top = asyncio.run(go())
        for r in (running, waiting, top):
            assert not isinstance(r, BaseException), r
        assert running[1].completion_tokens == 600
        assert waiting[1].completion_tokens == 5 and top[1].completion_tokens == 5
        assert admin_status(gw.url)["state"]["fallbacks"] == {}
    finally:
        gw.stop()
        eng.stop()
    lines = _journal(journal)
    rid = {e["id"]: e["request_id"] for e in lines if e["ev"] == "start"}
    order = [(e["ev"], rid[e["id"]]) for e in lines if e["ev"] in ("start", "end")]
    # the interactive request reached the engine while the long stream still ran
    assert order.index(("start", "top")) < order.index(("end", "long")), order
