"""The gateway's replica choice in a prefix-routed pool, in process: the core's PrefixRouter
over the upstreams that may take a request (health, breakers, exclusions, saturation's room),
and the prefix identity computed only for such a pool."""

from __future__ import annotations

from velvetrope.clock import ManualClock
from velvetrope.config import parse_config
from velvetrope.core.prefix_routing import prefix_routers
from velvetrope.gateway.api.app import Gateway
from velvetrope.gateway.upstream.upstreams import UpstreamPools
from velvetrope.openai.prefix import prefix_hashes

from .conftest import gateway_config

URLS = ["http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"]
SYSTEM = {"role": "system", "content": "You answer questions about trains. " * 80}


def body(question: str) -> dict[str, object]:
    return {"model": "m", "messages": [SYSTEM, {"role": "user", "content": question}]}


def config(routing: str) -> dict[str, object]:
    cfg = gateway_config(URLS, pools=[{"name": "default", "routing": routing}])
    cfg["gateway"]["fleet"] = {"breaker_failures": 1, "breaker_open_s": 5.0}
    return cfg


def test_affinity_sticks_to_one_upstream_and_steps_around_a_broken_one() -> None:
    cfg = parse_config(config("prefix_affinity"))
    clock = ManualClock()
    ups = UpstreamPools(cfg, clock)
    router = prefix_routers(cfg.policy)["default"]
    hs = prefix_hashes(body("when is the next train?"), 128, 64)
    assert len(hs) == len(prefix_hashes(body("another?"), 128, 64)) > 3
    first = ups.pick("default", prefix=router, hashes=hs, block_tokens=128)
    assert first is not None
    for q in ("from A to B?", "is it late?", "which platform?"):
        again = prefix_hashes(body(q), 128, 64)
        assert ups.pick("default", prefix=router, hashes=again, block_tokens=128) is first
    assert (router.kept, router.missed) == (3, 1)
    ups.failed(first, "timeout")  # its breaker opens: the prefix goes elsewhere, counted once
    other = ups.pick("default", prefix=router, hashes=hs, block_tokens=128)
    assert other is not None and other is not first
    assert router.kept + router.overridden + router.missed == 5
    # excluded (could not be reached) and unhealthy upstreams are never chosen
    ex = ups.pick("default", [other.url], prefix=router, hashes=hs, block_tokens=128)
    assert ex is not None and ex.url not in (first.url, other.url)
    # with room for none, the choice falls back to every upstream that may take work
    none = ups.pick("default", (), lambda url: False, router, hs, 128)
    assert none is other


def test_hashed_routing_agrees_across_gateways_without_sharing_state() -> None:
    cfg = parse_config(config("prefix_hash"))
    a = UpstreamPools(cfg, ManualClock())
    b = UpstreamPools(cfg, ManualClock())
    ra, rb = prefix_routers(cfg.policy)["default"], prefix_routers(cfg.policy)["default"]
    picks = set()
    for i in range(12):
        hs = prefix_hashes(
            body(f"q{i}") | {"messages": [{"role": "system", "content": f"{i} " * 900}]}, 128, 64
        )
        ua = a.pick("default", prefix=ra, hashes=hs, block_tokens=128)
        ub = b.pick("default", prefix=rb, hashes=hs, block_tokens=128)
        assert ua is not None and ub is not None and ua.url == ub.url
        picks.add(ua.url)
    assert len(picks) >= 2


def test_the_prefix_identity_is_computed_only_for_a_prefix_routed_pool() -> None:
    plain = Gateway(parse_config(gateway_config(URLS)))
    assert plain.engines.prefix == {}
    assert plain.engines.prefix_hashes("default", body("x")) == ()
    routed = Gateway(parse_config(config("prefix_affinity")))
    got = routed.engines.prefix_hashes("default", body("x"))
    assert got == prefix_hashes(body("y"), 128, 64)  # the system prompt's blocks


def test_an_upstream_that_leaves_the_pool_is_forgotten_by_the_index() -> None:
    gw = Gateway(parse_config(config("prefix_affinity")))
    engines = gw.engines
    router = engines.prefix["default"]
    hs = engines.prefix_hashes("default", body("x"))
    up = engines.pick("default", (), hs)
    assert up is not None and router.index.depths(hs, {up.url: 0}) == {up.url: len(hs)}
    ups = engines.upstreams.pools["default"]
    engines.upstreams.pools["default"] = [u for u in ups if u is not up]  # as DNS drops it
    engines.follow()
    assert router.index.depths(hs, {up.url: 0}) == {} and len(router.index) == 0
