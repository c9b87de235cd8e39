"""The open-loop load generator against a real ``velvetrope engine`` (and a tiny rejecting
server for the error paths), all on loopback, each run bounded by its own deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from aiohttp import web

from velvetrope.demo.loadgen import FILLER_WORD, prompt_text, replay, replay_sync
from velvetrope.demo.replay_config import ClientPlan, ReplayConfig
from velvetrope.demo.replay_results import LiveCounters, ReplayOutcome, ReplayResult
from velvetrope.errors import PolicyError
from velvetrope.openai.tokenizer import get_tokenizer
from velvetrope.serving.launch import ServerProcess, free_port, start_engine
from velvetrope.sim.trace_request import TraceRequest


@pytest.fixture(scope="module")
def fast_engine() -> Iterator[ServerProcess]:
    """An engine 50x faster than real time."""
    with start_engine("--speed", "50") as p:
        yield p


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[ServerProcess]:
    """An engine in real time (long outputs take seconds)."""
    with start_engine("--speed", "1") as p:
        yield p


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_prompt_text_is_exact_under_cl100k_and_approx() -> None:
    with warnings.catch_warnings():
        # bpe-openai loads its vocabulary with importlib.resources.open_binary (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        bpe = get_tokenizer("cl100k_base")
    approx = get_tokenizer("approx")
    for n in (1, 2, 17, 1020, 4142):
        assert bpe.count(prompt_text(n)) == n
        assert approx.count(prompt_text(n)) == n
    with pytest.raises(PolicyError):
        prompt_text(0)


@pytest.mark.integration
def test_replays_with_exact_token_counts_on_schedule(fast_engine: ServerProcess) -> None:
    sizes = [(700, 31), (12, 1), (1500, 64), (40, 0), (300, 200)] * 4
    reqs = [
        TraceRequest(0.03 * i, p, o, tenant=f"t{i % 2}", tier="interactive" if i % 2 else "batch")
        for i, (p, o) in enumerate(sizes)
    ]
    live = LiveCounters()
    cfg = ReplayConfig((fast_engine.url,), {"t0": "k0", "t1": "k1"}, deadline_s=20)
    res = replay_sync(reqs, cfg, live)
    assert [r.outcome for r in res.results] == [ReplayOutcome.COMPLETED] * len(reqs)
    for req, r in zip(reqs, res.results, strict=True):
        expected = max(1, req.output_tokens)  # max_tokens=0 is not allowed; 1 is sent
        assert r.tokens == r.usage_tokens == r.max_tokens == expected
        assert r.status == 200 and r.error_code is None
        assert r.tenant == req.tenant and r.tier == req.tier
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.sent_s >= r.scheduled_s  # never before its arrival time
        assert r.queue_ms is None  # an engine, not the gateway
    assert live.completed == live.sent == live.accepted == live.total == len(reqs)
    assert live.open == 0 and live.finished == len(reqs)
    assert live.tokens == sum(r.tokens for r in res.results)


@pytest.mark.integration
def test_open_loop_and_deadline_cut_everything_open(slow_engine: ServerProcess) -> None:
    # Outputs of 3000 tokens take far longer than the 1.5 s deadline at real time, so
    # every request is still open when the next one is due: they are sent anyway, then cut.
    reqs = [TraceRequest(0.1 * i, 50, 3000) for i in range(10)] + [TraceRequest(5.0, 10, 5)]
    live = LiveCounters()
    res = replay_sync(reqs, ReplayConfig((slow_engine.url,), deadline_s=1.5), live)
    sent, late = res.results[:10], res.results[10]
    # open loop: each was sent on schedule although none had finished; the deadline cut them
    assert all(r.outcome is ReplayOutcome.TIMEOUT and r.status == 200 for r in sent)
    assert [r.sent_s >= r.scheduled_s for r in sent] == [True] * 10
    assert all(0 < r.tokens < 3000 for r in sent)
    assert (
        late.outcome is ReplayOutcome.TIMEOUT and late.error_code == "not_sent" and late.tokens == 0
    )
    assert live.sent == 10 and live.timeouts == 11 and live.open == 0
    # The cut connections abort the sequences in the engine (bounded wait).
    deadline = time.monotonic() + 5
    while _running(slow_engine.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(slow_engine.url) == 0


@pytest.mark.integration
def test_per_request_timeout(slow_engine: ServerProcess) -> None:
    reqs = [TraceRequest(0.0, 20, 4000), TraceRequest(0.0, 20, 2)]
    res = replay_sync(reqs, ReplayConfig((slow_engine.url,), deadline_s=10, request_timeout_s=0.5))
    assert res.duration_s < 2.0
    assert res.results[0].outcome is ReplayOutcome.TIMEOUT
    assert res.results[0].error_code == "client_timeout"
    assert res.results[1].outcome is ReplayOutcome.COMPLETED and res.results[1].tokens == 2


@pytest.mark.integration
def test_client_plans_answer_whole_or_hang_up(slow_engine: ServerProcess) -> None:
    reqs = [TraceRequest(0.0, 20, 3), TraceRequest(0.0, 20, 3000), TraceRequest(0.0, 20, 3000)]
    reqs.append(TraceRequest(0.0, 20, 4))
    plans = [
        ClientPlan(stream=False),
        ClientPlan(hang_up_after_tokens=5),
        ClientPlan(stream=False, hang_up_after_s=0.3),
        ClientPlan(hang_up_after_s=30.0),  # answered long before: never hangs up
    ]
    live = LiveCounters()
    res = replay_sync(reqs, ReplayConfig((slow_engine.url,), deadline_s=20), live, plans)
    whole, cut, left, waited = res.results
    assert whole.outcome is ReplayOutcome.COMPLETED and whole.tokens == whole.usage_tokens == 3
    assert cut.outcome is ReplayOutcome.HUNG_UP and cut.tokens == 5 and cut.status == 200
    assert left.outcome is ReplayOutcome.HUNG_UP and left.tokens == 0
    assert left.elapsed_s >= 0.3 and left.e2e_s is None  # left at its time, before the end
    assert waited.outcome is ReplayOutcome.COMPLETED and waited.tokens == 4
    assert live.hung_up == 2 and live.completed == 2 and live.finished == live.total == 4
    # both hang-ups closed their connections: the engine aborted their sequences
    deadline = time.monotonic() + 5
    while _running(slow_engine.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(slow_engine.url) == 0


@pytest.mark.integration
def test_idle_connections_are_not_reused_past_the_servers_keep_alive(
    fast_engine: ServerProcess,
) -> None:
    # The server stalls (SIGSTOP, as on a machine too busy to run it) past its 5 s keep-alive
    # while the client's connections sit idle; when it wakes, it closes them for idleness
    # before it reads what was sent on them.  A client that kept them past KEEPALIVE_S would
    # send the second batch on them and fail before any answer; this one opens new ones.
    reqs = [TraceRequest(0.0, 5, 1)] * 20 + [TraceRequest(6.0, 5, 1)] * 20
    pid = fast_engine.pid

    async def run() -> ReplayResult:
        loop = asyncio.get_running_loop()
        loop.call_later(3.0, os.kill, pid, signal.SIGSTOP)
        loop.call_later(6.5, os.kill, pid, signal.SIGCONT)
        try:
            return await replay(reqs, ReplayConfig((fast_engine.url,), deadline_s=30))
        finally:
            os.kill(pid, signal.SIGCONT)

    res = asyncio.run(run())
    assert res.by_outcome() == {ReplayOutcome.COMPLETED: 40}, [
        r.error_code for r in res.results if r.outcome is not ReplayOutcome.COMPLETED
    ]


async def _rejecting_server() -> tuple[web.AppRunner, list[str]]:
    """Two loopback URLs: the first rejects (429 for key-a, else 503), the second is a 404."""

    async def reject(request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "")
        code, status = ("rate_limited", 429) if key.endswith("a") else ("queue_full", 503)
        body = {"error": {"message": "no", "type": "x", "code": code, "param": None}}
        return web.json_response(body, status=status, headers={"Retry-After": "3"})

    app = web.Application()
    app.router.add_post("/v1/completions", reject)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/nowhere"]


@pytest.mark.integration
def test_rejections_round_robin_and_failures() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    reqs = [TraceRequest(0.01 * i, 10, 5, tenant="a" if i % 2 else "b") for i in range(6)]
    live = LiveCounters()

    async def run() -> tuple[list[str], ReplayResult]:
        runner, urls = await _rejecting_server()
        try:
            cfg = ReplayConfig((*urls, dead), {"a": "key-a", "b": "key-b"}, deadline_s=10)
            return urls, await replay(reqs, cfg, live)
        finally:
            await runner.cleanup()

    urls, res = asyncio.run(run())
    r = res.results
    assert [x.url for x in r] == [*urls, dead] * 2
    assert r[0].outcome is ReplayOutcome.REJECTED
    assert (r[0].status, r[0].error_code) == (503, "queue_full")
    assert r[3].outcome is ReplayOutcome.REJECTED
    assert (r[3].status, r[3].error_code) == (429, "rate_limited")
    assert r[0].retry_after_s == 3.0 and r[0].e2e_s is not None
    assert r[1].outcome is ReplayOutcome.ERROR and r[1].status == 404
    assert r[2].outcome is ReplayOutcome.FAILED and r[2].status == 0
    assert live.rejected == {"queue_full": 1, "rate_limited": 1}
    assert live.finished == 6 and live.open == 0


@asynccontextmanager
async def _completions_server(
    handler: Callable[[web.Request], Awaitable[web.Response]],
) -> AsyncIterator[str]:
    """An aiohttp server on loopback answering ``POST /v1/completions`` with ``handler``;
    yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.integration
def test_priorities_put_each_tiers_priority_in_the_body() -> None:
    tiers = ["interactive", "batch", "standard", "interactive", "batch", "standard"]
    # each request's prompt length names it in the bodies the server records
    reqs = [TraceRequest(0.01 * i, 10 + i, 5, tenant="a", tier=t) for i, t in enumerate(tiers)]
    prio = {"interactive": 0, "standard": 1, "batch": 2}
    bodies: list[dict[str, object]] = []

    async def record(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"error": {"code": "queue_full"}}, status=503)

    async def run(priorities: dict[str, int] | None) -> dict[int, object]:
        bodies.clear()
        async with _completions_server(record) as url:
            res = await replay(reqs, ReplayConfig((url,), deadline_s=10, priorities=priorities))
        assert res.by_outcome() == {ReplayOutcome.REJECTED: len(reqs)}
        return {len(str(b["prompt"])) // len(FILLER_WORD): b.get("priority") for b in bodies}

    sent = asyncio.run(run(prio))
    assert sent == {r.prompt_tokens: prio[str(r.tier)] for r in reqs}
    assert asyncio.run(run(None)) == {r.prompt_tokens: None for r in reqs}


@pytest.mark.integration
def test_tier_headers_go_with_each_tiers_requests_and_keep_the_key() -> None:
    tiers = ["interactive", "batch", "standard", "interactive"]
    reqs = [TraceRequest(0.01 * i, 10 + i, 5, tenant="a", tier=t) for i, t in enumerate(tiers)]
    classes = {
        "interactive": {"x-smg-priority": "interactive"},
        "batch": {"x-smg-priority": "bulk"},
    }
    seen: dict[int, tuple[str | None, str | None]] = {}

    async def record(request: web.Request) -> web.Response:
        body = await request.json()
        n = len(str(body["prompt"])) // len(FILLER_WORD)
        seen[n] = (request.headers.get("x-smg-priority"), request.headers.get("Authorization"))
        return web.json_response({"error": {"code": "queue_full"}}, status=503)

    async def run() -> None:
        headers = {**classes, "standard": {"Authorization": "Bearer forged"}}
        async with _completions_server(record) as url:
            await replay(reqs, ReplayConfig((url,), "sk-a", deadline_s=10, tier_headers=headers))

    asyncio.run(run())
    assert seen == {
        10: ("interactive", "Bearer sk-a"),
        11: ("bulk", "Bearer sk-a"),
        12: (None, "Bearer sk-a"),  # a tier's headers never replace the key
        13: ("interactive", "Bearer sk-a"),
    }


def test_bad_arguments() -> None:
    with pytest.raises(PolicyError):
        ReplayConfig(())
    with pytest.raises(PolicyError):
        ReplayConfig(("http://127.0.0.1:1",), deadline_s=0)
    cfg = ReplayConfig(("http://127.0.0.1:1",), {"a": "k"})
    with pytest.raises(PolicyError, match="no API key for tenant 'b'"):
        asyncio.run(replay([TraceRequest(0.0, 1, 1, tenant="b")], cfg))
    with pytest.raises(PolicyError, match="sorted"):
        asyncio.run(replay([TraceRequest(1.0, 1, 1), TraceRequest(0.0, 1, 1)], cfg))
    prio = ReplayConfig(("http://127.0.0.1:1",), priorities={"interactive": 0})
    with pytest.raises(PolicyError, match="no engine priority for tier 'batch'"):
        asyncio.run(replay([TraceRequest(0.0, 1, 1, tier="batch")], prio))
    with pytest.raises(PolicyError, match="2 client plans for 1 requests"):
        asyncio.run(replay([TraceRequest(0.0, 1, 1, tenant="a")], cfg, None, [ClientPlan()] * 2))
    with pytest.raises(PolicyError, match="streaming"):
        ClientPlan(stream=False, hang_up_after_tokens=3)
    with pytest.raises(PolicyError):
        ClientPlan(hang_up_after_tokens=0)
    with pytest.raises(PolicyError):
        ClientPlan(hang_up_after_s=0.0)


@pytest.mark.integration
def test_an_embedding_line_is_replayed_as_an_embeddings_call(fast_engine: ServerProcess) -> None:
    reqs = [
        TraceRequest(0.0, 200, 12, "t0"),
        TraceRequest(0.01, 300, 0, "t0", endpoint="embeddings"),
        TraceRequest(0.02, 50, 0, "t0", endpoint="embeddings"),
    ]
    res = replay_sync(reqs, ReplayConfig((fast_engine.url,), deadline_s=20))
    assert [r.outcome for r in res.results] == [ReplayOutcome.COMPLETED] * 3
    assert [r.tokens for r in res.results] == [12, 0, 0]  # an embedding generates nothing
    assert all(r.status == 200 and r.ttft_s is not None for r in res.results)
