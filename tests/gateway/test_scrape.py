"""The gateway scrapes its engines' ``/metrics`` (vLLM's names) for the core's saturation rule.

The rule itself is tested deterministically in ``tests/core/test_saturation.py``; here the
parser, and the wiring in the real gateway against real engines, with exact counters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from velvetrope.core import EngineReading
from velvetrope.gateway.scrape import parse_vllm_metrics

from .conftest import gateway_config, start_engine, start_gateway, status_until, wait_idle

GOLD = {"Authorization": "Bearer sk-gold-0000"}


def test_parse_vllm_metrics_sums_label_sets() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="a"} 3.0',
            'vllm:num_requests_waiting{model_name="b"} 2.0',
            'vllm:num_requests_running{model_name="a"} 7.0',
            'vllm:kv_cache_usage_perc{model_name="a"} 0.5',
            'vllm:kv_cache_usage_perc{model_name="b"} 0.25',
            "vllm:num_preemptions_total 4.0",
            "process_cpu_seconds_total 1.5",
        ]
    )
    assert parse_vllm_metrics(text) == EngineReading(running=7.0, waiting=5.0, kv_usage=0.5)
    assert parse_vllm_metrics("process_cpu_seconds_total 1.5\n") is None  # not an engine's
    assert parse_vllm_metrics("vllm:num_requests_waiting oops\n") is None


def test_a_sample_timestamp_is_not_its_value() -> None:
    text = "\n".join(
        [
            "vllm:num_requests_waiting 3 1700000000000",
            'vllm:num_requests_running{model_name="a"} 7 1700000000000',
            "vllm:kv_cache_usage_perc 0.5 1700000000000",
        ]
    )
    assert parse_vllm_metrics(text) == EngineReading(running=7.0, waiting=3.0, kv_usage=0.5)


def test_escaped_label_values_are_read_whole() -> None:
    # a quote, a backslash, a newline, a brace and a space-and-number inside label values
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="say \\"hi\\" 9"} 2',
            'vllm:num_requests_waiting{model_name="C:\\\\models\\n} 8"} 4',
            'vllm:num_requests_running{model_name="a,b=\\"c\\""} 1',
            "vllm:kv_cache_usage_perc 0.25",
        ]
    )
    assert parse_vllm_metrics(text) == EngineReading(running=1.0, waiting=6.0, kv_usage=0.25)


def test_nan_and_infinite_samples_are_skipped() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="a"} NaN',
            'vllm:num_requests_waiting{model_name="b"} 2',
            'vllm:num_requests_running{model_name="a"} +Inf',
            'vllm:num_requests_running{model_name="b"} 5',
            'vllm:kv_cache_usage_perc{model_name="a"} 0.5',
            'vllm:kv_cache_usage_perc{model_name="b"} NaN',
        ]
    )
    assert parse_vllm_metrics(text) == EngineReading(running=5.0, waiting=2.0, kv_usage=0.5)
    assert (
        parse_vllm_metrics("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -Inf\n") is None
    )


def test_only_the_gauges_lines_are_read() -> None:
    good = "vllm:num_requests_waiting 3\n  vllm:num_requests_running\t1\n"  # blanks allowed
    reading = EngineReading(running=1.0, waiting=3.0, kv_usage=0.0)
    assert parse_vllm_metrics(good) == reading
    # another exporter's line that is not the format does not blind the gateway ...
    assert parse_vllm_metrics(good + 'other_metric{label="unclosed} 1\n') == reading
    # ... a longer name that starts like a gauge's is another metric ...
    assert parse_vllm_metrics(good + "vllm:num_requests_waiting_by_reason 40\n") == reading
    # ... and a gauge's line that is not the format makes the text unreadable
    assert parse_vllm_metrics(good + 'vllm:kv_cache_usage_perc{model_name="a} 0.5\n') is None


@pytest.mark.integration
def test_the_gateway_scrapes_and_holds_in_its_own_queue(tmp_path: Path) -> None:
    """Eight requests fill an engine that runs two; once the gateway has scraped it
    queueing, four more wait in the gateway until the engine has room."""
    eng = start_engine(1.0, "--set", "max_num_seqs=2")
    cfg = gateway_config([eng.url])
    cfg["policy"]["saturation"] = {"enabled": True, "max_waiting": 0, "scrape_interval_s": 0.1}
    gw = start_gateway(tmp_path, cfg)
    body: dict[str, Any] = {
        "model": "velvetrope-sim",
        "prompt": "hello",
        "max_tokens": 60,
        "ignore_eos": True,
    }

    def seen_queueing(st: dict[str, Any]) -> bool:
        return any((e["waiting"] or 0) > 0 for e in st["engine_load"].values())

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            url = gw.url + "/v1/completions"
            first = [asyncio.create_task(c.post(url, json=body, headers=GOLD)) for _ in range(8)]
            st = await status_until(c, gw.url, seen_queueing)
            assert seen_queueing(st), st
            late = [asyncio.create_task(c.post(url, json=body, headers=GOLD)) for _ in range(4)]
            st = await status_until(c, gw.url, lambda s: s["queued"] == 4)
            assert st["queued"] == 4, st  # all four held by the gateway, none sent on
            return [*(await asyncio.gather(*first)), *(await asyncio.gather(*late))]

    try:
        rs = asyncio.run(go())
        assert [r.status_code for r in rs] == [200] * 12
        st = wait_idle(gw.url)
        assert st["dispatch_held_by_saturation"] >= 4
        m = httpx.get(eng.url + "/metrics").text
        assert "vllm:generation_tokens_total" in m
        gen = next(
            float(line.rsplit(" ", 1)[1])
            for line in m.splitlines()
            if line.startswith("vllm:generation_tokens_total")
        )
        assert gen == 12 * 60  # every request ran, in the engine, to the token
    finally:
        gw.stop()
        eng.stop()
