"""The Responses API through a real gateway in front of two ``velvetrope engine``
processes, with the official ``openai`` SDK: ``responses.create`` streaming and not,
settled from the usage the engine reported; ``previous_response_id`` lands on the engine
that created the response; ``GET``/``DELETE /v1/responses/{id}`` reach it too, for its own
tenant only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import (
    NOT_THE_ENGINES_COUNT,
    charged,
    metered_config,
    start_engine,
    start_gateway,
    start_together,
)

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
GOLD = "sk-gold-0000"
SILVER = "sk-silver-0000"
DEFAULT_MAX = 6


@pytest.fixture(scope="module")
def two() -> Iterator[tuple[str, str]]:
    a, b = start_together(start_engine, start_engine)
    yield a.url, b.url
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def gw(two: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = metered_config(list(two), tokenizer=NOT_THE_ENGINES_COUNT)
    cfg["gateway"]["default_max_tokens"] = DEFAULT_MAX
    p = start_gateway(tmp_path_factory.mktemp("responses"), cfg)
    yield p.url
    p.stop()


def _sdk(base: str, key: str = GOLD) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


def _home(two: tuple[str, str], rid: str) -> str:
    """The engine that holds response ``rid`` (asked directly)."""
    held = [e for e in two if httpx.get(f"{e}/v1/responses/{rid}").status_code == 200]
    assert len(held) == 1, held
    return held[0]


def test_responses_create_streaming_and_not_is_settled_from_the_engines_usage(gw: str) -> None:
    before = charged(gw, "gold")
    settled = 0
    eos: Any = {"ignore_eos": True}
    with _sdk(gw) as c:
        r = c.responses.create(
            model=MODEL,
            input="Tell me about the sea",
            instructions="Be brief.",
            max_output_tokens=9,
        )
        assert r.status == "incomplete" and r.usage is not None  # cut at max_output_tokens
        assert r.output_text and r.usage.output_tokens <= 9
        settled += r.usage.input_tokens + r.usage.output_tokens
        items: Any = [{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}]
        r = c.responses.create(model=MODEL, input=items, extra_body=eos)  # no cap: the default
        assert r.usage is not None and r.usage.output_tokens == DEFAULT_MAX
        settled += r.usage.total_tokens
        kinds: list[str] = []
        text = ""
        final = None
        for ev in c.responses.create(model=MODEL, input="Stream it", stream=True, extra_body=eos):
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.incomplete"
    assert final is not None and final.usage is not None
    assert final.output_text == text and final.usage.output_tokens == DEFAULT_MAX
    settled += final.usage.total_tokens
    assert charged(gw, "gold") - before == pytest.approx(settled, abs=0.5)


def test_previous_response_id_lands_on_the_engine_that_created_it(
    gw: str, two: tuple[str, str]
) -> None:
    with _sdk(gw) as c:
        firsts = [c.responses.create(model=MODEL, input=f"start {i}") for i in range(6)]
        homes = {r.id: _home(two, r.id) for r in firsts}
        assert set(homes.values()) == set(two)  # both engines created some
        for r in firsts:
            for stream in (False, True):
                if stream:
                    events = c.responses.create(
                        model=MODEL, input="and then?", previous_response_id=r.id, stream=True
                    )
                    created = [e for e in events if e.type == "response.created"]
                    follow = created[0].response
                else:
                    follow = c.responses.create(
                        model=MODEL, input="and then?", previous_response_id=r.id
                    )
                assert follow.previous_response_id == r.id
                assert _home(two, follow.id) == homes[r.id]


def test_get_and_delete_a_response_reach_its_engine_for_its_tenant_only(gw: str) -> None:
    with _sdk(gw) as c, _sdk(gw, SILVER) as other:
        r = c.responses.create(model=MODEL, input="keep this")
        assert c.responses.retrieve(r.id).id == r.id
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.create(model=MODEL, input="x", previous_response_id=r.id)
        c.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
    post = httpx.post(gw + "/v1/responses/resp_x", headers={"Authorization": f"Bearer {GOLD}"})
    assert post.status_code == 405


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ({"model": MODEL}, "missing_required_parameter", "input"),
        ({"model": MODEL, "input": 3}, "invalid_type", "input"),
        ({"model": MODEL, "input": ["x"]}, "invalid_type", "input[0]"),
        (
            {"model": MODEL, "input": "x", "max_output_tokens": 0},
            "invalid_value",
            "max_output_tokens",
        ),
        ({"model": MODEL, "input": "x", "instructions": 1}, "invalid_type", "instructions"),
        ({"model": MODEL, "input": "x", "tools": {}}, "invalid_type", "tools"),
    ],
)
def test_bad_responses_requests_get_a_400_naming_the_field(
    gw: str, payload: dict[str, Any], code: str, param: str
) -> None:
    r = httpx.post(gw + "/v1/responses", json=payload, headers={"Authorization": f"Bearer {GOLD}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)
