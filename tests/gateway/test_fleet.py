"""The gateway's fleet in process: breakers, capacity that follows the live engines, DNS
discovery, and the routing headers and body rewrite.  No server is started here (the
probes of discovered addresses find nothing listening); ``test_fleet_live.py`` has the
same behaviours against real engines."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from velvetrope.clock import ManualClock
from velvetrope.config import parse_config
from velvetrope.core import EngineReading, Job
from velvetrope.core.request_machine import RequestMachine
from velvetrope.errors import ConfigError
from velvetrope.gateway.api.admission_headers import route_headers
from velvetrope.gateway.api.app import Gateway
from velvetrope.gateway.api.parse import degrade_body, parse_request
from velvetrope.gateway.upstream.upstreams import UpstreamPools, resolve_host
from velvetrope.openai.tokenizer import ApproxTokenizer

from .conftest import gateway_config

A, B, C = "http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"


def fleet_config(engines: list[str], **policy: Any) -> dict[str, Any]:
    cfg = gateway_config(engines, **policy)
    cfg["gateway"]["fleet"] = {"breaker_failures": 3, "breaker_open_s": 5.0}
    return cfg


def test_the_breaker_takes_a_failing_engine_out_and_probes_it_back() -> None:
    clock = ManualClock()
    changes: list[int] = []
    ups = UpstreamPools(
        parse_config(fleet_config([A, B])), clock, on_change=lambda: changes.append(1)
    )
    ups.changed()
    a, b = ups.pools["default"]
    b.in_flight = 1  # so that a, when eligible, is the least loaded
    for _ in range(2):
        ups.failed(a, "answered 500")
    assert a.breaker_state == "closed" and ups.pick("default") is a
    ups.failed(a, "answered 500")  # the third in a row
    assert a.breaker_state == "open" and [u.url for u in ups.live("default")] == [B]
    assert all(ups.pick("default") is b for _ in range(4))
    clock.advance(5.0)
    ups.changed()  # the health loop notices the half-open breaker
    assert [u.url for u in ups.probing("default")] == [A]
    assert ups.pick("default") is a  # the probe
    assert ups.pick("default") is b  # only one probe at a time
    ups.succeeded(a)
    assert a.breaker_state == "closed" and ups.pick("default") is a
    assert len(changes) == 4  # initial, opened, half-open, closed


def test_a_probe_abandoned_by_its_client_opens_the_breaker_for_another_period() -> None:
    clock = ManualClock()
    ups = UpstreamPools(parse_config(fleet_config([A])), clock)
    (a,) = ups.pools["default"]
    for _ in range(3):
        ups.failed(a, "timeout")
    clock.advance(5.0)
    assert ups.pick("default") is a
    ups.abandoned(a, answered=False)  # no answer yet: inconclusive
    assert a.breaker_state == "open" and ups.pick("default") is None
    clock.advance(5.0)
    assert ups.pick("default") is a
    ups.abandoned(a, answered=True)  # it answered before the client left
    assert a.breaker_state == "closed"


def test_capacity_fleet_slots_and_saturation_follow_the_live_engines() -> None:
    clock = ManualClock()
    pools = [{"name": "default", "max_in_flight_per_engine": 4,
              "max_tokens_in_flight_per_engine": 1000}]  # fmt: skip
    gw = Gateway(parse_config(fleet_config([A, B, C], pools=pools)), clock)
    cap = gw.ctl.pool_capacity("default")
    machine = RequestMachine(gw.ctl)
    job = Job("j", "t", "gold", prompt_tokens=10, max_tokens=20)
    job.cost = 30
    rule = gw.ctl.saturation("default")
    assert rule is not None
    assert (cap.max_in_flight, cap.max_tokens, cap.engines) == (12, 3000, 3)
    a, b, _ = gw.upstreams.pools["default"]
    gw.upstreams.mark_failed(a, "connection refused")  # out at once
    slot = machine.slot(job)  # the lease a job asks for is sized from the pool now
    assert (cap.max_in_flight, slot.max_in_flight, slot.max_tokens, slot.tokens) == (8, 8, 2000, 30)
    for _ in range(3):
        gw.upstreams.failed(b, "answered 502")
    assert (cap.max_in_flight, cap.engines) == (4, 1)
    assert set(rule.status(clock.now())) == {C}
    clock.advance(5.0)
    gw.upstreams.changed()
    assert cap.max_in_flight == 4 + 1  # one probe slot for the half-open engine
    assert set(rule.status(clock.now())) == {B, C}
    st = gw.ctl.status()["pools"]["default"]
    assert (st["max_in_flight"], st["engines"]) == (5, 1)


def test_fixed_capacity_stays_fixed() -> None:
    gw = Gateway(parse_config(fleet_config([A, B])), ManualClock())
    gw.upstreams.mark_failed(gw.upstreams.pools["default"][0], "refused")
    assert gw.ctl.pool_capacity("default").max_in_flight == 32


def test_dns_upstreams_are_re_resolved() -> None:
    answers: list[list[str] | OSError] = [
        ["127.0.0.2", "127.0.0.3"],
        ["127.0.0.3", "::1"],
        OSError("temporary failure in name resolution"),
        [],
    ]
    asked: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    cfg = fleet_config([])
    cfg["upstreams"] = {
        "default": [
            {"url": "http://127.0.0.1:12"},
            {
                "url": "http://engines.ns.svc.cluster.local:8000",
                "discovery": "dns",
                "metrics_url": "http://engines.ns.svc.cluster.local:9090/metrics",
            },
        ]
    }
    ups = UpstreamPools(parse_config(cfg), ManualClock(), resolver=resolver)

    def urls() -> list[tuple[str, str | None, bool, str]]:
        return [(u.url, u.source, u.healthy, u.metrics_url) for u in ups.pools["default"]]

    errors: list[dict[str, str]] = []

    async def go() -> list[list[tuple[str, str | None, bool, str]]]:
        seen = []
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                await ups.refresh_dns(s)
                seen.append(urls())
                errors.append(dict(ups.dns_errors))
        return seen

    first, second, third, fourth = asyncio.run(go())
    src = "http://engines.ns.svc.cluster.local:8000"
    assert asked[0] == ("engines.ns.svc.cluster.local", 8000)
    static = ("http://127.0.0.1:12", None, True, "http://127.0.0.1:12/metrics")

    def found(ip: str, metrics_ip: str) -> tuple[str, str, bool, str]:
        # a new address joins after a probe (nothing listens here: it joins unhealthy)
        return (f"http://{ip}:8000", src, False, f"http://{metrics_ip}:9090/metrics")

    assert first == [static, found("127.0.0.2", "127.0.0.2"), found("127.0.0.3", "127.0.0.3")]
    assert second == [static, found("127.0.0.3", "127.0.0.3"), found("[::1]", "[::1]")]
    assert third == second and "temporary failure" in errors[2][src]  # kept on an error
    assert fourth == [static] and errors[3] == {}  # an empty answer empties it


def test_the_default_resolver_reads_the_system_resolver() -> None:
    assert "127.0.0.1" in asyncio.run(resolve_host("localhost", 80))


def test_route_headers_and_the_degraded_body() -> None:
    raw = orjson.dumps(
        {
            "model": "big",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 400,
            "n": 2,
        }
    )
    tok = ApproxTokenizer()
    parsed = parse_request(
        raw, "chat", max_tokens_limit=4096, count_text=tok.count, count_chat=tok.count_chat
    )
    job = Job("j", "t", "default", 5, 800, pool="default", model="big", n=2)
    job.route = "default"
    degrade_body(parsed, job)
    assert parsed.upstream_body() == raw  # not degraded: the client's bytes
    assert route_headers(job) == [
        (b"x-velvetrope-pool", b"default"),
        (b"x-velvetrope-route", b"default"),
    ]
    job.max_tokens, job.pool, job.model = 2 * 50, "spare", "small"
    job.degraded = ("max_tokens", "pool")
    degrade_body(parsed, job)
    body = orjson.loads(parsed.upstream_body())
    assert (body["max_completion_tokens"], body["model"]) == (50, "small")
    assert route_headers(job)[-1] == (
        b"x-velvetrope-degraded",
        b"max_tokens=50, pool=spare, model=small",
    )


@pytest.mark.parametrize(
    ("patch", "check"),
    [
        ({"routes": [{"model": "m", "pool": "default"}]}, "policy.routes"),
        ({"gateway": {"saturation": {"max_waiting": 7}}}, None),
    ],
)
def test_moved_config_keys(patch: dict[str, Any], check: str | None) -> None:
    cfg = {**fleet_config([A]), **patch}
    if check is not None:
        with pytest.raises(ConfigError, match=check):
            parse_config(cfg)
        return
    assert parse_config(cfg).policy.saturation.max_waiting == 7


def test_saturation_set_in_both_places_is_refused() -> None:
    cfg = fleet_config([A])
    cfg["gateway"]["saturation"] = {"max_waiting": 7}
    cfg["policy"]["saturation"] = {"max_waiting": 1}
    with pytest.raises(ConfigError, match=r"gateway\.saturation and policy\.saturation are both"):
        parse_config(cfg)
    del cfg["policy"]["saturation"]
    assert parse_config(cfg).policy.saturation.max_waiting == 7


@pytest.mark.parametrize(
    ("upstream", "says"),
    [
        ({"engine": "vllm-v2"}, "unknown engine 'vllm-v2': choose one of auto, none, vllm"),
        (
            {"engine": "tgi", "engine_metrics": {"running": "r", "waiting": "w"}},
            "give engine \\('tgi'\\) or engine_metrics, not both",
        ),
        ({"engine_metrics": {"running": "r"}}, "engine_metrics.waiting"),
        ({"engine_metrics": {"running": "r", "waiting": "queue depth"}}, "not a metric name"),
        (
            {"engine_metrics": {"running": "r", "waiting": "w", "kv_unit": "fraction"}},
            "kv_unit",
        ),
    ],
)
def test_an_upstreams_engine_is_checked(upstream: dict[str, Any], says: str) -> None:
    cfg = fleet_config([])
    cfg["upstreams"] = {"default": [{"url": A, **upstream}]}
    with pytest.raises(ConfigError, match=says):
        parse_config(cfg)


def test_an_upstreams_dialect_is_pinned_or_named() -> None:
    cfg = fleet_config([])
    cfg["upstreams"] = {
        "default": [
            {"url": A},
            {"url": B, "engine": "sglang"},
            {"url": C, "engine_metrics": {"running": 'r{m="x"}', "waiting": "w"}},
        ]
    }
    a, b, c = parse_config(cfg).upstreams["default"]
    assert a.dialect() is None  # auto: detected from the text
    pinned, custom = b.dialect(), c.dialect()
    assert pinned is not None and pinned.name == "sglang"
    assert custom is not None and (custom.name, str(custom.running[0])) == ("custom", 'r{m="x"}')


def test_the_replica_choice_prefers_engines_the_readings_give_room() -> None:
    clock = ManualClock()
    gw = Gateway(parse_config(fleet_config([A, B])), clock)
    rule = gw.ctl.saturation("default")
    assert rule is not None
    a, b = gw.upstreams.pools["default"]
    a.in_flight, b.in_flight = 0, 3  # a is the least loaded ...
    rule.observe(A, EngineReading(running=2, waiting=2, kv_usage=0.1), clock.now())
    rule.observe(B, None, clock.now())  # ... but queues; b is blind (no saturation for it)
    assert all(gw.engines.pick("default") is b for _ in range(3))
    rule.observe(A, EngineReading(running=1, waiting=0, kv_usage=0.1), clock.now())
    assert gw.engines.pick("default") is a  # room again: the least loaded
    b.healthy = False
    rule.observe(A, EngineReading(running=2, waiting=5, kv_usage=0.1), clock.now())
    assert gw.engines.pick("default") is a  # none with room: the least loaded of all


def test_the_replica_choice_takes_the_least_prefill_ahead_then_the_load() -> None:
    """Among engines with room: for a job of a tier with a TTFT objective, the fewest prompt
    tokens ahead of it (its band and above: the engines order by the forwarded tier), then
    the fewest requests; for a tier with none, the fewest requests."""
    clock = ManualClock()
    tiers = [
        {"name": "interactive", "slo": {"ttft_s": 1.0}},
        {"name": "standard", "slo": {"ttft_s": 5.0}},
        {"name": "batch", "slo": {"e2e_s": 120}},
    ]
    gw = Gateway(parse_config(fleet_config([A, B], tiers=tiers)), clock)
    rule = gw.ctl.saturation("default")
    assert rule is not None and rule.backlog is not None and rule.backlog.ordered
    a, b = gw.upstreams.pools["default"]
    for url in (A, B):
        rule.observe(url, EngineReading(running=0, waiting=0, kv_usage=0.1), clock.now())

    def job(tier: str, band: int, prompt: int) -> Job:
        j = Job(id=f"{tier}-{prompt}", tenant="t", tier=tier, prompt_tokens=prompt, max_tokens=8)
        j.band = band
        return j

    long_top, long_standard = job("interactive", 0, 7000), job("standard", 1, 9000)
    for j, up in ((long_top, a), (long_standard, b)):
        rule.started(j, clock.now())
        gw.engines.sent(j, up)
    a.in_flight, b.in_flight = 1, 3  # a holds fewer requests, but a long top-tier prompt
    top, standard, batch = job("interactive", 0, 10), job("standard", 1, 10), job("batch", 2, 10)
    assert gw.engines.pick("default", (), (), top) is b  # the standard prompt is behind it
    assert gw.engines.pick("default", (), (), standard) is a  # 7,000 ahead of it, not 9,000
    assert gw.engines.pick("default", (), (), batch) is a  # no TTFT objective: the load
    assert gw.engines.pick("default") is a  # no job said: the load
    rule.first_token(long_top, clock.now())  # prefilled: nothing is ahead on a any more
    assert gw.engines.pick("default", (), (), top) is a
