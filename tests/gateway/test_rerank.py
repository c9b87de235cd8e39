"""Rerank and score through a real gateway in front of a real ``velvetrope engine``:
prompt-only work, each (query, document) pair a prefill, answered as the engine does
straight and settled from the usage it reported."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import NOT_THE_ENGINES_COUNT, charged, metered_config, start_gateway

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
GOLD = {"Authorization": "Bearer sk-gold-0000"}
DOCS = ["the sea is blue", "a recipe for bread", "waves break on the shore"]


@pytest.fixture(scope="module")
def gw(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = metered_config([engine], tokenizer=NOT_THE_ENGINES_COUNT)
    p = start_gateway(tmp_path_factory.mktemp("rerank"), cfg)
    yield p.url
    p.stop()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/rerank", {"model": MODEL, "query": "the ocean", "documents": DOCS}),
        ("/rerank", {"model": MODEL, "query": "the ocean", "documents": DOCS, "top_n": 2}),
        ("/v1/rerank", {"model": MODEL, "query": "q", "documents": [{"text": d} for d in DOCS]}),
        ("/v1/score", {"model": MODEL, "text_1": "the ocean", "text_2": DOCS}),
        ("/v1/score", {"model": MODEL, "text_1": DOCS, "text_2": DOCS}),
    ],
)
def test_rerank_and_score_answer_as_direct_and_settle_the_engines_usage(
    gw: str, engine: str, path: str, body: dict[str, Any]
) -> None:
    before = charged(gw, "gold")
    want = httpx.post(engine + path, json=body)
    got = httpx.post(gw + path, json=body, headers=GOLD)
    assert want.status_code == got.status_code == 200, got.text
    w, g = want.json(), got.json()
    assert g.get("results") == w.get("results") and g.get("data") == w.get("data")
    assert g["usage"] == w["usage"] and g["usage"]["prompt_tokens"] > 0
    if "results" in g:
        scores = [r["relevance_score"] for r in g["results"]]
        assert scores == sorted(scores, reverse=True)
        assert len(scores) == body.get("top_n", len(DOCS))
    else:
        assert [d["index"] for d in g["data"]] == list(range(len(DOCS)))
    assert charged(gw, "gold") - before == pytest.approx(g["usage"]["prompt_tokens"], abs=0.5)


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        ("/v1/rerank", {"model": MODEL, "documents": DOCS}, "missing_required_parameter", "query"),
        (
            "/v1/rerank",
            {"model": MODEL, "query": "q", "documents": []},
            "invalid_value",
            "documents",
        ),
        (
            "/rerank",
            {"model": MODEL, "query": "q", "documents": [1]},
            "invalid_type",
            "documents[0]",
        ),
        (
            "/v1/rerank",
            {"model": MODEL, "query": "q", "documents": DOCS, "top_n": 0},
            "invalid_value",
            "top_n",
        ),
        (
            "/v1/score",
            {"model": MODEL, "text_1": ["a", "b"], "text_2": DOCS},
            "invalid_value",
            "text_2",
        ),
        ("/v1/score", {"model": MODEL, "text_2": DOCS}, "missing_required_parameter", "text_1"),
    ],
)
def test_bad_rerank_and_score_requests_get_a_400_naming_the_field(
    gw: str, path: str, body: dict[str, Any], code: str, param: str
) -> None:
    r = httpx.post(gw + path, json=body, headers=GOLD)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)
