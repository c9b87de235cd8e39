"""Every admitted endpoint through a real gateway in front of real ``velvetrope engine``
processes, with the official ``openai`` SDK: embeddings (a string, a list, token ids, a
list of token-id arrays) settled from the engine's ``usage.prompt_tokens``; the output cap
that the reservation assumed sent to the engine when a request names none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .conftest import (
    NOT_THE_ENGINES_COUNT,
    admin_status,
    charged,
    gateway_config,
    metered_config,
    metric,
    start_gateway,
    wait_idle,
)

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
GOLD = "sk-gold-0000"
BRONZE = "sk-bronze-0000"
DEFAULT_MAX = 5
"""``gateway.default_max_tokens`` of the gateway under test."""


@pytest.fixture(scope="module")
def gw(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = metered_config([engine], tokenizer=NOT_THE_ENGINES_COUNT)
    cfg["gateway"]["default_max_tokens"] = DEFAULT_MAX
    p = start_gateway(tmp_path_factory.mktemp("endpoints"), cfg)
    yield p.url
    p.stop()


def _sdk(base: str, key: str = GOLD) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


EMBEDDING_INPUTS: list[Any] = [
    "the quick brown fox jumps over the lazy dog",
    ["first sentence to embed", "a second, somewhat longer sentence to embed", "third"],
    [101, 2023, 2003, 1037, 3231, 102],
    [[101, 2023, 102], [7, 8, 9, 10, 11, 12, 13]],
]
"""What ``embeddings.create`` may be given: a string, strings, token ids, token-id arrays."""


@pytest.mark.parametrize("encoding", ["base64", "float"])
def test_embeddings_through_the_sdk_answer_as_direct_and_settle_the_engines_prompt_tokens(
    gw: str, engine: str, encoding: str
) -> None:
    direct, via = _sdk(engine), _sdk(gw, BRONZE)
    before = charged(gw, "bronze")
    reported = 0
    fmt: Any = encoding
    with direct, via:
        for value in EMBEDDING_INPUTS:
            want = direct.embeddings.create(model=MODEL, input=value, encoding_format=fmt)
            got = via.embeddings.create(model=MODEL, input=value, encoding_format=fmt)
            n = 1 if isinstance(value, str) or isinstance(value[0], int) else len(value)
            assert len(got.data) == n
            assert [d.index for d in got.data] == list(range(n))
            assert [d.embedding for d in got.data] == [d.embedding for d in want.data]
            assert got.usage.prompt_tokens == want.usage.prompt_tokens > 0
            assert got.usage.total_tokens == got.usage.prompt_tokens
            reported += got.usage.prompt_tokens
    # the tenant is charged exactly what the engine reported: the input, no output
    assert charged(gw, "bronze") - before == pytest.approx(reported, abs=0.5)
    assert metric(gw, "velvetrope_requests_total", tier="batch", outcome="completed") >= 4


def test_embeddings_take_dimensions_and_are_deterministic(gw: str) -> None:
    with _sdk(gw) as via:
        a = via.embeddings.create(model=MODEL, input="same words", dimensions=8)
        b = via.embeddings.create(model=MODEL, input="same words", dimensions=8)
    assert len(a.data[0].embedding) == 8
    assert a.data[0].embedding == b.data[0].embedding
    assert abs(sum(x * x for x in a.data[0].embedding) - 1.0) < 1e-5  # a unit vector


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ({"model": MODEL}, "missing_required_parameter", "input"),
        ({"model": MODEL, "input": ""}, "invalid_value", "input"),
        ({"model": MODEL, "input": []}, "invalid_value", "input"),
        ({"model": MODEL, "input": ["ok", ""]}, "invalid_value", "input[1]"),
        ({"model": MODEL, "input": ["ok", 3]}, "invalid_type", "input[1]"),
        ({"model": MODEL, "input": [1, -2]}, "invalid_value", "input"),
        ({"model": MODEL, "input": [[1], [-2]]}, "invalid_type", "input[1]"),
        ({"model": MODEL, "input": {"text": "x"}}, "invalid_type", "input"),
        ({"input": "x"}, "missing_required_parameter", "model"),
        ({"model": MODEL, "input": "x", "encoding_format": 8}, "invalid_value", "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "invalid_value", "dimensions"),
    ],
)
def test_bad_embeddings_get_a_400_naming_the_field_and_count_nothing(
    gw: str, payload: dict[str, Any], code: str, param: str
) -> None:
    before = admin_status(gw)["buckets"].get("tenant:silver:tok")
    r = httpx.post(
        gw + "/v1/embeddings", json=payload, headers={"Authorization": "Bearer sk-silver-0000"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == (code, param, "invalid_request_error")
    assert wait_idle(gw)["buckets"].get("tenant:silver:tok") == before


def test_an_embedding_longer_than_the_model_gets_the_engines_400(gw: str) -> None:
    r = httpx.post(
        gw + "/v1/embeddings",
        json={"model": MODEL, "input": list(range(70_000))},
        headers={"Authorization": f"Bearer {GOLD}"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_get_on_embeddings_is_405(gw: str) -> None:
    r = httpx.get(gw + "/v1/embeddings", headers={"Authorization": f"Bearer {GOLD}"})
    assert r.status_code == 405


# -- the output cap ------------------------------------------------------------------------


def test_a_request_without_max_tokens_generates_no_more_than_was_reserved(gw: str) -> None:
    """With vLLM's ``ignore_eos`` the engine generates exactly its cap, which without one is
    the rest of the context; through the gateway it is ``default_max_tokens``, the output
    the reservation assumed, and the tenant is charged what the engine reported."""
    msgs: Any = [{"role": "user", "content": "tell me everything"}]
    eos: Any = {"ignore_eos": True}
    opts: Any = {"include_usage": True}
    before = charged(gw, "gold")
    settled = 0
    with _sdk(gw) as via:
        chat = via.chat.completions.create(model=MODEL, messages=msgs, extra_body=eos)
        assert chat.usage is not None
        assert chat.usage.completion_tokens == DEFAULT_MAX
        assert chat.choices[0].finish_reason == "length"
        settled += chat.usage.total_tokens
        done = via.completions.create(model=MODEL, prompt="once upon a time", extra_body=eos)
        assert done.usage is not None and done.usage.completion_tokens == DEFAULT_MAX
        settled += done.usage.total_tokens
        usage = None
        for ch in via.chat.completions.create(
            model=MODEL, messages=msgs, stream=True, stream_options=opts, extra_body=eos
        ):
            usage = ch.usage or usage
        assert usage is not None and usage.completion_tokens == DEFAULT_MAX
        settled += usage.total_tokens
        # n completions: each capped at the default, the reservation their sum
        two = via.chat.completions.create(model=MODEL, messages=msgs, n=2, extra_body=eos)
        assert two.usage is not None and two.usage.completion_tokens == 2 * DEFAULT_MAX
        settled += two.usage.total_tokens
    # a body that names the cap as null gets it set too
    r = httpx.post(
        gw + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": None, "ignore_eos": True},
        headers={"Authorization": f"Bearer {GOLD}"},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == DEFAULT_MAX
    settled += r.json()["usage"]["total_tokens"]
    assert charged(gw, "gold") - before == pytest.approx(settled, abs=0.5)


def test_the_clients_own_cap_is_kept(gw: str) -> None:
    msgs: Any = [{"role": "user", "content": "tell me everything"}]
    eos: Any = {"ignore_eos": True}
    with _sdk(gw) as via:
        a = via.chat.completions.create(model=MODEL, messages=msgs, max_tokens=9, extra_body=eos)
        b = via.chat.completions.create(
            model=MODEL, messages=msgs, max_completion_tokens=7, extra_body=eos
        )
    assert a.usage is not None and a.usage.completion_tokens == 9
    assert b.usage is not None and b.usage.completion_tokens == 7


def test_passthrough_mode_forwards_embeddings(engine: str, tmp_path: Path) -> None:
    cfg = gateway_config([engine])
    cfg["gateway"]["admission"] = False
    p = start_gateway(tmp_path, cfg)
    try:
        with _sdk(p.url) as c:
            e = c.embeddings.create(model=MODEL, input=["a", "b"])
        assert len(e.data) == 2 and e.usage.prompt_tokens > 0
    finally:
        p.stop()


# -- refusals at the door ------------------------------------------------------------------


def test_every_refusal_at_the_door_is_counted_and_an_unknown_path_is_a_404_with_a_code(
    engine: str, tmp_path: Path
) -> None:
    cfg = gateway_config([engine])
    cfg["gateway"]["max_body_bytes"] = 1024
    p = start_gateway(tmp_path, cfg)
    gold = {"Authorization": f"Bearer {GOLD}"}
    try:
        with httpx.Client(base_url=p.url) as h:
            for method in ("GET", "POST", "DELETE"):
                r = h.request(method, "/v1/nowhere", headers=gold)
                assert r.status_code == 404
                assert r.json()["error"]["code"] == "not_found"
            r = h.get("/v1/embeddings", headers=gold)
            assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
            assert r.headers["x-should-retry"] == "false"
            r = h.post("/metrics")
            assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
            r = h.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
            assert h.get("/v1/models").status_code == 401
            r = h.post("/v1/embeddings", json={"model": MODEL}, headers=gold)
            assert r.status_code == 400
            r = h.post("/v1/chat/completions", json={"model": MODEL, "x": "y" * 3000}, headers=gold)
            assert r.status_code == 413
        text = httpx.get(p.url + "/metrics").text
        assert metric(p.url, "velvetrope_refused_total", endpoint="other", status="404") == 3
        assert metric(p.url, "velvetrope_refused_total", status="405") == 2
        assert metric(p.url, "velvetrope_refused_total", endpoint="embeddings", status="405") == 1
        assert metric(p.url, "velvetrope_refused_total", endpoint="embeddings", status="401") == 1
        assert metric(p.url, "velvetrope_refused_total", endpoint="models", status="401") == 1
        assert (
            metric(
                p.url,
                "velvetrope_refused_total",
                endpoint="embeddings",
                status="400",
                code="missing_required_parameter",
            )
            == 1
        )
        assert metric(p.url, "velvetrope_refused_total", endpoint="chat", status="413") == 1
        assert metric(p.url, "velvetrope_refused_total") == 9
        assert "velvetrope_requests_total{" not in text  # none reached admission
    finally:
        p.stop()
