"""``previous_response_id`` across two gateway replicas on one real ``redis-server``: a
response created through gateway A is followed up through gateway B, which finds the engine
that created it in Redis and routes there; ``GET``/``DELETE`` through B reach it too, for its
tenant only; the key expires (``state.response_ttl_s``) and a delete removes it.  Real
processes on loopback: two ``velvetrope engine``, two ``velvetrope serve``, the ``openai``
SDK."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.support.polling import poll
from tests.support.redis_server import RedisServer

from .conftest import start_gateway
from .test_responses import _home, _sdk, two
from .test_shared_state import second, shared_config

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
TTL_S = 120

__all__ = ["two"]  # the two engines (a fixture of test_responses)


def test_a_follow_up_through_another_replica_lands_on_the_creating_engine(
    tmp_path: Path, two: tuple[str, str], redis_url: str
) -> None:
    cfg = shared_config(two[0], redis_url, response_ttl_s=TTL_S)
    cfg["upstreams"] = {"default": [{"url": u} for u in two]}
    ns = cfg["state"]["namespace"]
    a = start_gateway(tmp_path, cfg)
    b = start_gateway(tmp_path, second(cfg))
    r = redis.Redis.from_url(redis_url)
    try:
        with _sdk(a.url) as via_a, _sdk(b.url) as via_b:
            firsts = [via_a.responses.create(model=MODEL, input=f"start {i}") for i in range(6)]
            homes = {f.id: _home(two, f.id) for f in firsts}
            assert set(homes.values()) == set(two)  # both engines created some
            for f in firsts:
                key = f"{ns}:resp:{f.id}"
                assert r.get(key) == f"gold\n{homes[f.id]}".encode()
                assert 0 < r.pttl(key) <= TTL_S * 1000
                follow = via_b.responses.create(
                    model=MODEL, input="and then?", previous_response_id=f.id
                )
                assert follow.previous_response_id == f.id
                assert _home(two, follow.id) == homes[f.id]
                assert via_b.responses.retrieve(f.id).id == f.id
            # another tenant does not see it through B either
            with _sdk(b.url, "sk-silver-0000") as other, pytest.raises(openai.NotFoundError):
                other.responses.retrieve(firsts[0].id)
            # deleted through B: gone from its engine and from Redis, so A forgets it too
            gone = firsts[1].id
            via_b.responses.delete(gone)
            # the gateway drops the key without awaiting it: it is gone soon after the answer
            poll(lambda: r.exists(f"{ns}:resp:{gone}") == 0, 10.0, "the home dropped from Redis")
            with pytest.raises(openai.NotFoundError):
                via_b.responses.retrieve(gone)
    finally:
        a.stop()
        b.stop()
        r.close()


def test_with_redis_away_a_replica_still_routes_its_own_follow_ups(
    tmp_path: Path, two: tuple[str, str], own_redis: RedisServer
) -> None:
    cfg = shared_config(two[0], own_redis.url, call_timeout_ms=200)
    cfg["upstreams"] = {"default": [{"url": u} for u in two]}
    a = start_gateway(tmp_path, cfg)
    b = start_gateway(tmp_path, second(cfg))
    try:
        own_redis.pause()  # Redis stops answering: every call runs out of its budget
        with _sdk(a.url) as via_a:
            firsts = [via_a.responses.create(model=MODEL, input=f"away {i}") for i in range(4)]
            for f in firsts:  # A remembers what it created, Redis or not
                follow = via_a.responses.create(
                    model=MODEL, input="still there?", previous_response_id=f.id
                )
                assert _home(two, follow.id) == _home(two, f.id)
        # B cannot know them: routed as any request; the engine that lacks one answers its
        # own 404, never the gateway a 5xx
        for f in firsts:
            r = httpx.post(
                b.url + "/v1/responses",
                json={"model": MODEL, "input": "x", "previous_response_id": f.id},
                headers={"Authorization": "Bearer sk-gold-0000"},
                timeout=30,
            )
            assert r.status_code in (200, 404), r.text
            if r.status_code == 404:
                assert f.id in r.json()["error"]["message"]
    finally:
        own_redis.resume()
        a.stop()
        b.stop()
