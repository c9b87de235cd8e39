"""How each upstream is sent the tier as its engine's ``priority``, and what a refusal
teaches the gateway (:mod:`velvetrope.gateway.upstream.priority_forwarding`), on the real core."""

from __future__ import annotations

from typing import Any

from velvetrope.clock import ManualClock
from velvetrope.config import GatewayConfig
from velvetrope.core import AdmissionController
from velvetrope.gateway.upstream.priority_forwarding import REPROBE_S, PriorityForwarding
from velvetrope.gateway.upstream.upstreams import UpstreamPools, UpstreamState

VLLM_FCFS = b'{"error":{"message":"Got priority 2 but Priority scheduling is not enabled."}}'
SGLANG_OFF = b'{"object":"error","message":"Using priority is disabled for this server."}'


def _config(*upstreams: dict[str, Any], engine_priority: bool = True) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "policy": {
                "tiers": [
                    {"name": "interactive", "slo": {"ttft_s": 1.0}},
                    {"name": "batch", "slo": {"e2e_s": 120}},
                ],
                "tenants": [{"name": "a", "tier": "interactive"}],
                "pools": [{"name": "default", "engine_priority": engine_priority}],
                "saturation": {"enabled": True},
            },
            "upstreams": {"default": list(upstreams)},
        }
    )


def _setup(
    *upstreams: dict[str, Any], engine_priority: bool = True
) -> tuple[PriorityForwarding, AdmissionController, ManualClock, list[UpstreamState]]:
    cfg = _config(*upstreams, engine_priority=engine_priority)
    clock = ManualClock()
    ctl = AdmissionController(cfg.policy, clock)
    ups = UpstreamPools(cfg, clock).pools["default"]
    spoken: dict[str, str] = {}
    fwd = PriorityForwarding(cfg, ctl, clock, spoken.get)
    return fwd, ctl, clock, ups


def _ordered(ctl: AdmissionController) -> bool:
    """Whether the headroom rule counts on the engines' order; the prefill backlog the
    replica choice reads always agrees."""
    rule = ctl.saturation("default")
    assert rule is not None and rule.headroom is not None and rule.backlog is not None
    assert rule.backlog.ordered == rule.headroom.ordered
    return rule.headroom.ordered


def test_each_dialect_reads_the_tier_its_own_way() -> None:
    fwd, _, _, ups = _setup(
        {"url": "http://127.0.0.1:1"},
        {"url": "http://127.0.0.1:2", "engine": "sglang"},
        {"url": "http://127.0.0.1:3", "engine": "llamacpp"},
        {"url": "http://127.0.0.1:4", "engine": "sglang", "priority": "low_first"},
    )
    vllm, sglang, llama, pinned = ups
    assert fwd.band("default", "batch") == 1
    assert fwd.band("default", "interactive") == 0
    assert [fwd.wire(vllm, 1), fwd.wire(sglang, 1), fwd.wire(llama, 1)] == [1, -1, None]
    assert fwd.wire(pinned, 1) == 1  # the operator's reading wins over the dialect's
    assert [fwd.state(u, 0.0) for u in ups] == ["low_first", "high_first", "off", "low_first"]


def test_a_pool_without_engine_priority_forwards_nothing() -> None:
    fwd, ctl, _, _ = _setup({"url": "http://127.0.0.1:1"}, engine_priority=False)
    assert fwd.band("default", "batch") is None
    assert not _ordered(ctl)


def test_a_refusal_is_learned_once_and_the_pool_stops_counting_on_the_order() -> None:
    fwd, ctl, clock, (up,) = _setup({"url": "http://127.0.0.1:1"})
    assert _ordered(ctl)
    sent = fwd.wire(up, 2)
    assert sent == 2
    assert fwd.learn(up, sent, 400, VLLM_FCFS)  # send it again, without the field
    assert not _ordered(ctl)
    assert fwd.state(up, clock.now()) == "refused"
    assert fwd.wire(up, 2) is None  # the next requests go without it: no second refusal
    clock.advance(REPROBE_S)
    assert fwd.wire(up, 2) == 2  # tried again: the engine may have been restarted
    assert not fwd.learn(up, 2, 200, None)  # it takes it now
    assert fwd.state(up, clock.now()) == "low_first"
    assert _ordered(ctl)


def test_only_a_refusal_of_the_field_counts() -> None:
    fwd, ctl, _, (up,) = _setup({"url": "http://127.0.0.1:1"})
    other = b'{"error":{"message":"This model\'s maximum context length is 4096 tokens."}}'
    assert not fwd.learn(up, 1, 400, other)  # the client's mistake: passed on, not retried
    assert not fwd.learn(up, 0, 400, VLLM_FCFS)  # 0 is never refused (nothing to strip)
    assert not fwd.learn(up, 1, 500, VLLM_FCFS)  # a failure, not a refusal
    assert fwd.learn(up, 1, 503, SGLANG_OFF)  # SGLang aborts it with 503
    assert not _ordered(ctl)


def test_an_engine_without_the_field_makes_its_pool_unordered() -> None:
    fwd, ctl, _, (vllm, llama) = _setup(
        {"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2", "engine": "llamacpp"}
    )
    assert fwd.wire(vllm, 1) == 1
    assert _ordered(ctl)
    assert fwd.wire(llama, 1) is None
    assert not _ordered(ctl)  # one engine of the pool does not order its queue by tier
