"""Cached input through real processes: ``velvetrope engine`` with prefix caching on reports
the prompt tokens it found cached (``usage.prompt_tokens_details.cached_tokens``, as vLLM
does), and ``velvetrope serve`` charges them to a budget at the budget's ``cached_input``
weight and counts them in the ledger's cached column, on ``memory://`` and on a real
``redis-server``.  The official ``openai`` client, streamed and whole answers; the
gateway's calendar is fixed by its wall-clock offset file."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from tests.support.polling import poll
from tests.support.prometheus import metric_sum
from tests.support.redis_server import RedisServer
from velvetrope.core.quota import LEDGER_CAP
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

from .conftest import admin_status, start_engine
from .test_quotas import ADMIN_H, Calendar, quota_config, usage_cli

pytestmark = pytest.mark.integration

BANK = "You are the support assistant of a bank. Answer in two sentences. " * 60  # ~4 KB
AIRLINE = "You are the booking assistant of an airline. Answer in one sentence. " * 60
QUESTIONS = ("What is my balance?", "Can I close my account?", "Where is my card?", "How?")
WEIGHTS = {"input": 1.0, "cached_input": 0.25, "output": 4.0}
PRICE = {"input": 2.0, "cached_input": 0.5, "output": 8.0}
LIMIT = 1_000_000
DAY = "2027-04-12"
DAY_KEY = f"quota:gold:day:{DAY}:tok"


@pytest.fixture(scope="module")
def caching_engine() -> Iterator[str]:
    """``velvetrope engine`` with automatic prefix caching on (50x real time)."""
    p = start_engine(50.0, "--tokenizer", "approx", "--set", "enable_prefix_caching=true")
    yield p.url
    p.stop()


def cached_config(engine: str, state: dict[str, Any]) -> dict[str, Any]:
    budgets = [{"tenant": "gold", "window": "day", "tokens": LIMIT, "weights": WEIGHTS}]
    return quota_config(engine, state, budgets=budgets, prices={"velvetrope-sim": PRICE})


def ask_all(gw: str, system: str) -> list[tuple[int, int, int]]:
    """The questions, sharing the ``system`` prompt, streamed and whole in turn: what the
    engine reported for each, ``(prompt, cached, output)``, read by the openai client."""
    client = openai.OpenAI(base_url=gw + "/v1", api_key="sk-gold-0000", max_retries=0)
    out = []
    for i, q in enumerate(QUESTIONS):
        messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        extra = {"ignore_eos": True}
        if i % 2:
            stream = client.chat.completions.create(
                model="velvetrope-sim", messages=messages, max_tokens=5 + i, stream=True,
                stream_options={"include_usage": True}, extra_body=extra,
            )  # fmt: skip
            usage = [c.usage for c in stream if c.usage is not None][-1]
        else:
            done = client.chat.completions.create(
                model="velvetrope-sim", messages=messages, max_tokens=5 + i, extra_body=extra
            )
            assert done.usage is not None
            usage = done.usage
        details = usage.prompt_tokens_details
        assert details is not None and details.cached_tokens is not None
        out.append((usage.prompt_tokens, details.cached_tokens, usage.completion_tokens))
    return out


def check_reported(reported: list[tuple[int, int, int]], system: str) -> None:
    """The first request found nothing cached; each later one the system prompt's full
    16-token blocks (the approximate tokenizer: 4 characters a token)."""
    shared = (len(system) // 4) // 16 * 16
    assert reported[0][1] == 0
    for prompt, cached, _ in reported[1:]:
        assert shared - 16 <= cached < prompt


def charged(reported: list[tuple[int, int, int]]) -> float:
    """What the budget is charged: uncached input, cached input and output at their weights."""
    w_in, w_cached, w_out = WEIGHTS["input"], WEIGHTS["cached_input"], WEIGHTS["output"]
    return sum((p - c) * w_in + c * w_cached + o * w_out for p, c, o in reported)


def check_ledger(gw: str, reported: list[tuple[int, int, int]]) -> None:
    """The day's ledger row equals what the engine reported, in JSON, CSV and the CLI."""
    days = {"from": DAY, "to": DAY}
    rows = httpx.get(gw + "/admin/usage", params={"tenant": "gold", **days}, headers=ADMIN_H)
    (row,) = rows.json()["rows"]
    prompt, cached, output = (sum(r[i] for r in reported) for i in range(3))
    assert (row["day"], row["requests"]) == (DAY, len(reported))
    assert (row["input_tokens"], row["cached_input_tokens"], row["output_tokens"]) == (
        prompt, cached, output,
    )  # fmt: skip
    cost = ((prompt - cached) * PRICE["input"] + cached * PRICE["cached_input"]) / 1e6
    assert row["cost_usd"] == pytest.approx(cost + output * PRICE["output"] / 1e6)
    as_csv = {"format": "csv", **days}
    csv_text = httpx.get(gw + "/admin/usage", params=as_csv, headers=ADMIN_H).text
    head, line = csv_text.splitlines()
    assert head == (
        "day,tenant,model,requests,input_tokens,cached_input_tokens,output_tokens,cost_usd"
    )
    assert line.split(",")[3:7] == [str(len(reported)), str(prompt), str(cached), str(output)]
    table = usage_cli("--url", gw, "--from", DAY, "--to", DAY).splitlines()
    assert table[0].split()[4:7] == ["input_tokens", "cached_input_tokens", "output_tokens"]
    assert table[1].split()[4:7] == [str(prompt), str(cached), str(output)]


def engine_hits(engine: str) -> float:
    """The engine's ``vllm:prefix_cache_hits_total``: prompt tokens found cached."""
    return metric_sum(httpx.get(engine + "/metrics").text, "vllm:prefix_cache_hits_total")


def ledger_cached(gw: str) -> int:
    rows = httpx.get(gw + "/admin/usage", params={"from": DAY, "to": DAY}, headers=ADMIN_H)
    return sum(int(r["cached_input_tokens"]) for r in rows.json()["rows"])


def until(pred: Callable[[], bool], what: str) -> None:
    poll(pred, 20.0, what)


def test_cached_input_is_charged_at_its_weight_and_ledgered_on_memory(
    caching_engine: str, tmp_path: Path
) -> None:
    cal = Calendar(tmp_path / "offset")
    cal.set(f"{DAY}T10:00:00")
    proc = launch.start_gateway(
        cached_config(caching_engine, {"url": "memory://"}), tmp_path, env=cal.env
    )
    hits = engine_hits(caching_engine)
    try:
        reported = ask_all(proc.url, BANK)
        check_reported(reported, BANK)
        used = charged(reported)
        assert used < sum(p + 4 * o for p, _, o in reported)  # the cache made it cheaper
        until(lambda: admin_status(proc.url)["buckets"][DAY_KEY] == LIMIT - used, "settled")
        check_ledger(proc.url, reported)
        # a stream whose client does not ask for the usage: the gateway asks for it, reads
        # its cached count and drops it; the ledger's cached column is the engine's hits
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="sk-gold-0000", max_retries=0)
        messages: Any = [{"role": "system", "content": BANK}, {"role": "user", "content": "?"}]
        chunks = list(
            client.chat.completions.create(
                model="velvetrope-sim", messages=messages, max_tokens=3, stream=True
            )
        )
        assert all(c.usage is None for c in chunks)
        cached_before = sum(c for _, c, _ in reported)
        until(
            lambda: ledger_cached(proc.url) == engine_hits(caching_engine) - hits > cached_before,
            "the ledger's cached column equals the engine's prefix cache hits",
        )
    finally:
        proc.stop()


def test_responses_and_messages_report_their_cached_input_in_their_own_shapes(
    caching_engine: str, tmp_path: Path
) -> None:
    """The Responses API (``input_tokens_details.cached_tokens``, openai's client) and
    Anthropic's Messages (``cache_read_input_tokens``, anthropic's SDK), whole and streamed:
    settled and ledgered as a chat's."""
    cal = Calendar(tmp_path / "offset")
    cal.set(f"{DAY}T10:00:00")
    proc = launch.start_gateway(
        cached_config(caching_engine, {"url": "memory://"}), tmp_path, env=cal.env
    )
    shop = "You are the clerk of a hardware shop. Name one tool per answer. " * 60
    club = "You are the secretary of a chess club. Answer with one move. " * 60
    reported: list[tuple[int, int, int]] = []
    try:
        oa = openai.OpenAI(base_url=proc.url + "/v1", api_key="sk-gold-0000", max_retries=0)
        for i, q in enumerate(QUESTIONS):
            if i % 2:  # the last event carries the response (completed, or incomplete)
                stream = oa.responses.create(
                    model="velvetrope-sim", instructions=shop, input=q, max_output_tokens=4,
                    stream=True,
                )  # fmt: skip
                response = [e for e in stream if hasattr(e, "response")][-1].response
            else:
                response = oa.responses.create(
                    model="velvetrope-sim", instructions=shop, input=q, max_output_tokens=4
                )
            u = response.usage
            assert u is not None
            reported.append((u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens))
        check_reported(reported, shop)
        on_messages: list[tuple[int, int, int]] = []
        with anthropic.Anthropic(base_url=proc.url, api_key="sk-gold-0000", max_retries=0) as an:
            for i, q in enumerate(QUESTIONS):
                ask: Any = [{"role": "user", "content": q}]
                if i % 2:
                    with an.messages.stream(
                        model="velvetrope-sim", system=club, messages=ask, max_tokens=4
                    ) as events:
                        message = events.get_final_message()
                    mu = message.usage
                else:
                    mu = an.messages.create(
                        model="velvetrope-sim", system=club, messages=ask, max_tokens=4
                    ).usage
                read = mu.cache_read_input_tokens or 0
                prompt = mu.input_tokens + read + (mu.cache_creation_input_tokens or 0)
                on_messages.append((prompt, read, mu.output_tokens))
        check_reported(on_messages, club)
        reported += on_messages
        used = charged(reported)
        until(lambda: admin_status(proc.url)["buckets"][DAY_KEY] == LIMIT - used, "settled")
        check_ledger(proc.url, reported)
    finally:
        proc.stop()


def test_cached_input_over_redis_settles_the_same_and_old_ledger_days_read_none_cached(
    caching_engine: str, tmp_path: Path
) -> None:
    server = RedisServer()
    server.start()
    cal = Calendar(tmp_path / "offset")
    cal.set(f"{DAY}T10:00:00")
    ns = f"t{uuid.uuid4().hex[:8]}"
    state = {"url": server.url, "namespace": ns, "call_timeout_ms": 1000}
    r_ = redis.Redis.from_url(server.url)
    procs: list[ServerProcess] = []
    try:
        # a day counted before the ledger had a cached counter: three counters, no fourth
        old = f"{ns}:{{t:gold}}:b:ledger|2027-04-11|gold|velvetrope-sim|"
        for metric, n in (("requests", 2), ("input", 300), ("output", 40)):
            r_.hset(old + metric, mapping={"l": LEDGER_CAP - n})
        cfg = cached_config(caching_engine, state)
        other = {**cfg, "listen": {"host": "127.0.0.1", "port": 0}}
        procs += [launch.start_gateway(c, tmp_path, env=cal.env) for c in (cfg, other)]
        reported = ask_all(procs[0].url, AIRLINE)  # not cached by the test before
        check_reported(reported, AIRLINE)
        used = charged(reported)

        def level(key: str) -> float:
            raw = r_.hget(f"{ns}:{{t:gold}}:b:{key}", "l")
            return float(raw) if raw is not None else float("nan")

        until(lambda: level(DAY_KEY) == LIMIT - used, "settled in Redis")
        base = f"ledger|{DAY}|gold|velvetrope-sim|"
        assert LEDGER_CAP - level(base + "cached") == sum(c for _, c, _ in reported)
        assert LEDGER_CAP - level(base + "input") == sum(p for p, _, _ in reported)
        until(lambda: usage_days(procs[1].url) == ["2027-04-11", DAY], "both days read")
        rows = httpx.get(procs[1].url + "/admin/usage", headers=ADMIN_H).json()["rows"]
        assert [(r["requests"], r["input_tokens"], r["cached_input_tokens"]) for r in rows] == [
            (2, 300, 0),
            (len(reported), sum(p for p, _, _ in reported), sum(c for _, c, _ in reported)),
        ]
        check_ledger(procs[1].url, reported)  # the other replica reads the same ledger
    finally:
        for p in procs:
            p.stop()
        r_.close()
        server.stop()


def usage_days(gw: str) -> list[str]:
    rows = httpx.get(gw + "/admin/usage", headers=ADMIN_H).json()["rows"]
    return [r["day"] for r in rows]
