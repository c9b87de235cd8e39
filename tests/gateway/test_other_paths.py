"""The paths the gateway does not meter (``/tokenize``, ``/detokenize``, ``/v1/audio/*``,
any other ``/v1/`` path), through a real gateway in front of a real ``velvetrope engine``
with ``httpx``: refused with 404 ``not_found`` by default (``gateway.other_paths:
refuse``), passed through with request-count admission when the config says ``pass``
(API key, queue, a slot, a fixed cost from the tenant's bucket); and the engine's own
``/tokenize`` and ``/detokenize`` in vLLM's shapes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import (
    admin_status,
    charged,
    free_port,
    metered_config,
    metric,
    start_gateway,
    wait_idle,
)
from .test_reload import Running

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
DONE = "completed"
GOLD = {"Authorization": "Bearer sk-gold-0000"}
BRONZE = {"Authorization": "Bearer sk-bronze-0000"}
COST = 3
"""``gateway.other_paths_cost_tokens`` of the passing gateway."""


@pytest.fixture(scope="module")
def refusing(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    p = start_gateway(tmp_path_factory.mktemp("refusing"), metered_config([engine]))
    yield p.url
    p.stop()


@pytest.fixture(scope="module")
def passing(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = metered_config([engine], other_paths="pass", other_paths_cost_tokens=COST)
    cfg["gateway"]["max_body_bytes"] = 4096
    p = start_gateway(tmp_path_factory.mktemp("passing"), cfg)
    yield p.url
    p.stop()


def test_the_engine_tokenizes_in_vllms_shape_with_the_count_its_completions_charge(
    engine: str,
) -> None:
    prompt = "Tokenize these words, then count them once more for the gateway."
    t = httpx.post(engine + "/tokenize", json={"model": MODEL, "prompt": prompt}).json()
    assert set(t) == {"count", "max_model_len", "tokens", "token_strs"}
    assert t["count"] == len(t["tokens"]) > 1
    assert all(type(i) is int and 0 <= i < 2**31 for i in t["tokens"])
    c = httpx.post(
        engine + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
    ).json()
    assert c["usage"]["prompt_tokens"] == t["count"]
    models = httpx.get(engine + "/v1/models").json()
    assert t["max_model_len"] == models["data"][0]["max_model_len"]
    back = httpx.post(engine + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert back == {"prompt": prompt}
    chat = httpx.post(
        engine + "/tokenize", json={"messages": [{"role": "user", "content": prompt}]}
    ).json()
    assert chat["count"] == len(chat["tokens"]) > t["count"]  # the chat template's tokens


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/detokenize", {"tokens": [1, -1]}, 400, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ],
)
def test_the_engine_refuses_bad_tokenize_bodies_naming_the_field(
    engine: str, path: str, payload: dict[str, object], status: int, param: str
) -> None:
    r = httpx.post(engine + path, json=payload)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/audio/transcriptions"),
        ("GET", "/v1/files"),
    ],
)
def test_by_default_other_paths_get_a_404_with_a_code_naming_the_setting(
    refusing: str, method: str, path: str
) -> None:
    before = metric(refusing, "velvetrope_refused_total", endpoint="other", status="404")
    r = httpx.request(method, refusing + path, json={"model": MODEL, "prompt": "x"}, headers=GOLD)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "not_found"
    assert "gateway.other_paths: refuse" in err["message"]
    after = metric(refusing, "velvetrope_refused_total", endpoint="other", status="404")
    assert after == before + 1
    assert wait_idle(refusing)["buckets"].get("tenant:gold:tok") is None  # nothing reserved


def test_a_root_path_the_setting_does_not_decide_stays_a_plain_404(passing: str) -> None:
    r = httpx.post(passing + "/not-an-api", json={}, headers=GOLD)
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "no route /not-an-api",
        "type": "not_found_error",
        "code": "not_found",
        "param": None,
    }


def test_passed_through_tokenize_answers_as_the_engine_and_costs_the_fixed_cost(
    passing: str, engine: str
) -> None:
    body = {"model": MODEL, "prompt": "how many tokens is this prompt, engine?"}
    want = httpx.post(engine + "/tokenize", json=body).json()
    before = charged(passing, "bronze")
    done = metric(passing, "velvetrope_requests_total", endpoint="passthrough", outcome=DONE)
    settled = metric(passing, "velvetrope_tokens_settled_total", endpoint="passthrough")
    got = [httpx.post(passing + "/tokenize", json=body, headers=BRONZE) for _ in range(4)]
    assert [r.status_code for r in got] == [200] * 4
    assert all(r.json() == want for r in got)
    back = httpx.post(passing + "/detokenize", json={"tokens": want["tokens"]}, headers=BRONZE)
    assert back.json() == {"prompt": body["prompt"]}
    # five requests, each its fixed cost and nothing more: the bucket and the counters agree
    # (abs: the bucket refills 0.01 token/s meanwhile)
    assert charged(passing, "bronze") - before == pytest.approx(5 * COST, abs=0.5)
    after = metric(passing, "velvetrope_requests_total", endpoint="passthrough", outcome=DONE)
    assert after - done == 5
    tokens = metric(passing, "velvetrope_tokens_settled_total", endpoint="passthrough")
    assert tokens - settled == 5 * COST


def test_an_unknown_v1_path_passes_with_method_query_and_body_and_the_engines_answer(
    passing: str,
) -> None:
    before = charged(passing, "gold")
    files = {"file": ("a.wav", b"RIFF....WAVE", "audio/wav")}
    r = httpx.post(
        passing + "/v1/audio/transcriptions", files=files, data={"model": MODEL}, headers=GOLD
    )
    # the engine serves no audio: its own 404, relayed as it came, the call still admitted
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "Unknown path '/v1/audio/transcriptions'."
    q = httpx.get(passing + "/v1/files?limit=2", headers=GOLD)
    assert q.status_code == 404
    assert q.json()["error"]["code"] == "not_found"
    assert charged(passing, "gold") - before == pytest.approx(2 * COST, abs=0.5)


def test_passed_paths_need_a_key_and_a_body_within_the_limit_counted_at_the_door(
    passing: str,
) -> None:
    def refused(status: str) -> float:
        return metric(passing, "velvetrope_refused_total", endpoint="passthrough", status=status)

    r401, r413 = refused("401"), refused("413")
    r = httpx.post(passing + "/tokenize", json={"prompt": "x"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    big = httpx.post(passing + "/tokenize", json={"prompt": "x" * 5000}, headers=GOLD)
    assert big.status_code == 413
    assert (refused("401"), refused("413")) == (r401 + 1, r413 + 1)
    assert wait_idle(passing)["in_flight"] == 0


def test_a_passed_request_waits_in_its_tier_like_any_job_when_its_bucket_is_empty(
    engine: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cfg = metered_config([engine], other_paths="pass", other_paths_cost_tokens=COST)
    for t in cfg["policy"]["tenants"]:
        t["limits"] = {"tokens_per_minute": 0.6, "token_burst": 2 * COST}
    p = start_gateway(tmp_path_factory.mktemp("empty"), cfg)
    try:
        codes = [
            httpx.post(p.url + "/tokenize", json={"prompt": "x"}, headers=GOLD).status_code
            for _ in range(3)
        ]
        assert codes == [200, 200, 429]  # the third finds the bucket spent: refused, not passed
    finally:
        p.stop()


def test_the_setting_is_shown_and_a_reload_that_changes_it_is_refused_naming_it(
    engine: str, tmp_path: Path
) -> None:
    gw = Running(tmp_path, metered_config([engine]))
    try:
        assert admin_status(gw.url)["other_paths"] == "refuse"
        gw.write(lambda c: c["gateway"].update(other_paths="pass"))
        r = gw.reload()
        assert r.status_code == 409
        err = r.json()["error"]
        assert err["code"] == "needs_restart"
        assert err["message"] == "needs a restart to change: gateway.other_paths"
        # unchanged: still refused, still shown so
        assert httpx.post(gw.url + "/tokenize", json={}, headers=GOLD).status_code == 404
        assert admin_status(gw.url)["other_paths"] == "refuse"
    finally:
        gw.proc.stop()


def test_a_passed_request_takes_the_tier_its_header_asks_for_where_allowed(passing: str) -> None:
    def done(tier: str) -> float:
        return metric(
            passing, "velvetrope_requests_total", endpoint="passthrough", tier=tier, outcome=DONE
        )

    before = done("interactive"), done("standard")
    silver = {"Authorization": "Bearer sk-silver-0000"}
    asked = {**silver, "x-velvetrope-tier": "interactive"}  # silver may ask for interactive
    assert httpx.post(passing + "/tokenize", json={"prompt": "a"}, headers=asked).is_success
    assert httpx.post(passing + "/tokenize", json={"prompt": "a"}, headers=silver).is_success
    wait_idle(passing)
    assert (done("interactive"), done("standard")) == (before[0] + 1, before[1] + 1)


def test_a_pure_proxy_passes_them_without_admission(engine: str, tmp_path: Path) -> None:
    cfg = metered_config([engine], other_paths="pass", admission=False)
    p = start_gateway(tmp_path, cfg)
    try:
        r = httpx.post(p.url + "/tokenize", json={"prompt": "hello"}, headers=GOLD)
        assert r.status_code == 200 and r.json()["count"] >= 1
        assert metric(p.url, "velvetrope_requests_total") == 0  # nothing admitted
    finally:
        p.stop()


def test_an_upstream_that_cannot_be_reached_is_passed_over(engine: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = metered_config([dead, engine], other_paths="pass", other_paths_cost_tokens=COST)
    p = start_gateway(tmp_path, cfg, ready_path="/healthz")
    try:
        codes = [
            httpx.post(p.url + "/tokenize", json={"prompt": "x"}, headers=GOLD).status_code
            for _ in range(6)
        ]
        assert codes == [200] * 6
        assert charged(p.url, "gold") == pytest.approx(6 * COST, abs=0.5)
    finally:
        p.stop()
