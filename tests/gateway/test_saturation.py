"""Dispatch is held while the engines report a queue of their own (vLLM's metrics).

The rule is tested in-process and deterministically: the admission core on a ManualClock
with :class:`EngineSaturation` as its signal, fed scripted scrape readings, and the
gateway's bookkeeping (``sent``, an upstream's ``in_flight``) played by the test.  One
integration test checks the wiring in the real gateway with exact counters.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from velvetrope.clock import ManualClock
from velvetrope.config import parse_config
from velvetrope.core import AdmissionController, Admitted, Job, Queued, Usage
from velvetrope.gateway.saturation import EngineLoad, EngineSaturation, parse_vllm_metrics
from velvetrope.gateway.upstreams import UpstreamPools, UpstreamState

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
    load = parse_vllm_metrics(text)
    assert load.waiting == 5.0
    assert load.running == 7.0
    assert load.kv_usage == 0.5
    assert load.scraped


def scrape(running: int, waiting: int, kv: float = 0.1) -> EngineLoad:
    """What an engine's /metrics would say."""
    return parse_vllm_metrics(
        f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
        f"vllm:kv_cache_usage_perc {kv}\n"
    )


class Gateway:
    """The core on a ManualClock with the saturation signal, and the gateway's bookkeeping
    around it played by hand (one engine; 32 slots, so only the signal holds dispatch)."""

    def __init__(self, max_waiting: int = 0) -> None:
        config = parse_config(gateway_config(["http://engine.invalid"]), "<test>")
        self.clock = ManualClock()
        self.ctl = AdmissionController(config.policy, self.clock)
        self.pools = UpstreamPools(config)
        self.sig = EngineSaturation(self.pools, "default", max_waiting=max_waiting)
        self.ctl.pool_capacity("default").signals.append(self.sig)
        self.up: UpstreamState = self.pools.pools["default"][0]
        self.n = 0

    def _sent(self, job: Job) -> None:  # what the gateway does once a job is dispatched
        self.sig.sent()
        self.up.in_flight += 1

    def arrive(self) -> Job:
        self.n += 1
        job = Job(f"j{self.n}", "gold", "interactive", prompt_tokens=5, max_tokens=10)
        decision = self.ctl.arrive(job)
        if isinstance(decision, Admitted):
            self._sent(job)
        else:
            assert isinstance(decision, Queued)
        return job

    def complete(self, job: Job) -> None:
        self.up.in_flight -= 1
        self.ctl.first_token(job.id)
        self.ctl.complete(job.id, Usage(5, 10))

    def pump(self) -> list[str]:
        """Dispatch what the core now allows (after a scrape or a completion)."""
        out = self.ctl.dispatchable()
        for job in out:
            self._sent(job)
        return [j.id for j in out]


def test_without_a_scrape_nothing_is_held() -> None:
    gw = Gateway()
    for _ in range(6):
        gw.arrive()
    assert (gw.ctl.in_flight, gw.ctl.queued, gw.sig.held, gw.sig.pending) == (6, 0, 0, 0)


def test_an_engine_seen_queueing_holds_dispatch_until_it_has_room() -> None:
    gw = Gateway()
    first = [gw.arrive() for _ in range(4)]  # no reading yet: all dispatched
    gw.sig.observe(gw.up, scrape(running=2, waiting=2))  # it runs 2 and queues our other 2
    assert gw.sig.capacity == {gw.up.url: 2.0}
    late = [gw.arrive(), gw.arrive()]  # the first is held, the second queues behind it
    assert gw.ctl.queued == 2 and gw.sig.held == 1  # held in the gateway, not the engine
    # two come back: by the scrape corrected for them the engine holds 2, all it can run
    gw.complete(first[0])
    gw.complete(first[1])
    assert gw.pump() == [] and gw.sig.held == 2
    gw.sig.observe(gw.up, scrape(running=2, waiting=0))  # a fresh scrape says the same
    assert gw.pump() == [] and gw.sig.held == 3
    gw.complete(first[2])  # one more back: room for exactly one
    assert gw.pump() == [late[0].id]
    assert gw.ctl.queued == 1 and gw.sig.held == 4 and gw.sig.pending == 0
    gw.clock.advance(1.0)
    gw.sig.observe(gw.up, scrape(running=2, waiting=0))  # the dispatched one arrived
    gw.complete(first[3])
    assert gw.pump() == [late[1].id] and gw.ctl.queued == 0


@pytest.mark.parametrize("max_waiting", [0, 2])
def test_max_waiting_is_the_slack_per_engine(max_waiting: int) -> None:
    gw = Gateway(max_waiting)
    for _ in range(3):
        gw.arrive()
    gw.sig.observe(gw.up, scrape(running=2, waiting=1))
    assert gw.sig.capacity == {gw.up.url: 2.0}
    held = [isinstance(gw.ctl.arrive(Job(f"x{i}", "gold", "interactive", 5, 10)), Queued)
            for i in range(3)]  # fmt: skip
    # cap = 2 runnable + max_waiting; the engine holds 3, plus those on their way to it
    assert held == {0: [True, True, True], 2: [False, True, True]}[max_waiting]


def test_a_full_kv_cache_holds_and_an_unreadable_engine_never_does() -> None:
    gw = Gateway(max_waiting=4)
    gw.arrive()
    gw.arrive()
    gw.sig.observe(gw.up, scrape(running=2, waiting=0, kv=0.99))
    gw.arrive()
    assert gw.ctl.queued == 1  # KV full: it runs nothing more, whatever max_waiting says
    gw.sig.observe(gw.up, EngineLoad())  # /metrics could not be read
    assert len(gw.pump()) == 1
    for _ in range(5):
        gw.arrive()
    assert gw.ctl.queued == 0


@pytest.mark.integration
def test_the_gateway_scrapes_and_holds_in_its_own_queue(tmp_path: Path) -> None:
    """Eight requests fill an engine that runs two; once the gateway has scraped it
    queueing, four more wait in the gateway until the engine has room."""
    eng = start_engine(1.0, "--set", "max_num_seqs=2")
    cfg = gateway_config([eng.url])
    cfg["gateway"]["saturation"] = {"enabled": True, "max_waiting": 0, "scrape_interval_s": 0.1}
    gw = start_gateway(tmp_path, cfg)
    body: dict[str, Any] = {
        "model": "velvetrope-sim",
        "prompt": "hello",
        "max_tokens": 60,
        "ignore_eos": True,
    }

    def seen_queueing(st: dict[str, Any]) -> bool:
        return any(e["waiting"] > 0 for e in st["engine_load"].values())

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
