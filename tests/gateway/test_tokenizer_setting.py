"""``gateway.tokenizer`` alone decides how prompts are counted on the request path."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from velvetrope.openai.tokenizer import get_tokenizer

from .conftest import gateway_config, start_gateway

pytestmark = pytest.mark.integration

GOLD = {"Authorization": "Bearer sk-gold-0000"}
CJK = "你好世界。" * 80  # 400 characters: ~100 tokens by the approximation, 480 exactly
ASCII = "hello world, " * 30  # 390 characters: ~98 tokens either way


def completion(prompt: str) -> dict[str, object]:
    return {"model": "velvetrope-sim", "prompt": prompt, "max_tokens": 1, "ignore_eos": True}


@pytest.mark.parametrize("tokenizer", ["cl100k_base", "approx"])
def test_the_tokenizer_setting_alone_prices_the_prompt(
    engine: str, tmp_path: Path, tokenizer: str
) -> None:
    exact = get_tokenizer("cl100k_base").count(CJK)
    approx = get_tokenizer("approx").count(CJK)
    burst = 300  # between the two counts of the CJK prompt
    assert approx + 1 < burst < exact
    cfg = gateway_config([engine])
    cfg["gateway"]["tokenizer"] = tokenizer
    cfg["policy"]["tenants"][0]["limits"] = {"tokens_per_minute": 0.6, "token_burst": burst}
    cfg["policy"]["estimator"] = {"reserve": "max_tokens"}
    gw = start_gateway(tmp_path, cfg)
    try:
        r = httpx.post(gw.url + "/v1/completions", json=completion(CJK), headers=GOLD)
        if tokenizer == "cl100k_base":  # counted exactly: more than the bucket ever holds
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "request_too_large"
            ok = httpx.post(gw.url + "/v1/completions", json=completion(ASCII), headers=GOLD)
            assert ok.status_code == 200, ok.text  # the bucket itself admits ~100 tokens
        else:  # the approximation undercounts CJK text by 4x: it fits
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
