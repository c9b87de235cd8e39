"""``velvetrope engine`` with prefix caching: real prompts are hashed into the engine's blocks,
so requests that share a system prompt hit its cache through HTTP, and its vLLM metrics say
so (a real process, the official openai client)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import typer

from tests.support.prometheus import metric_sum
from velvetrope.engine import load_profile
from velvetrope.engine.serve.cli import parse_overrides
from velvetrope.serving.launch import start_engine

SYSTEM = "You are the support assistant of a bank. Answer in two sentences. " * 60  # ~4 KB


def prefix_counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    return (
        metric_sum(text, "vllm:prefix_cache_queries_total"),
        metric_sum(text, "vllm:prefix_cache_hits_total"),
    )


@pytest.mark.integration
def test_requests_sharing_a_system_prompt_hit_the_engines_prefix_cache() -> None:
    eng = start_engine(
        "--speed", "50", "--tokenizer", "approx", "--set", "enable_prefix_caching=true"
    )
    try:
        client = openai.OpenAI(base_url=eng.url + "/v1", api_key="none", max_retries=0)

        def ask(system: str, question: str) -> int:
            r = client.chat.completions.create(
                model="velvetrope-sim",
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                max_tokens=2,
            )
            assert r.usage is not None
            return r.usage.prompt_tokens

        prompt = ask(SYSTEM, "What is my balance?")
        queries, hits = prefix_counters(eng.url)
        assert queries == prompt and hits == 0  # the first one finds nothing cached
        for q in ("Can I close my account?", "Where is my card?", "How do I pay?"):
            ask(SYSTEM, q)
        queries, hits = prefix_counters(eng.url)
        # each later request finds the system prompt's full 16-token blocks (about 1,000
        # tokens of ~1,020) computed by the first
        shared = (len(SYSTEM) // 4) // 16 * 16
        assert hits >= 3 * (shared - 16)
        assert hits <= 3 * prompt
        # a different system prompt shares nothing (but the role's first bytes)
        other = "You are a poet. Write in rhyme. " * 120
        ask(other, "What is my balance?")
        assert prefix_counters(eng.url)[1] == hits
    finally:
        eng.stop()


@pytest.mark.integration
def test_usage_reports_the_cached_tokens_as_vllm_does_streamed_and_whole() -> None:
    """``usage.prompt_tokens_details.cached_tokens``: what the prefix cache held for each
    request, summing to the engine's own hit counter; none without prefix caching."""
    eng = start_engine(
        "--speed", "50", "--tokenizer", "approx", "--set", "enable_prefix_caching=true"
    )
    plain = start_engine("--speed", "50", "--tokenizer", "approx")
    try:
        client = openai.OpenAI(base_url=eng.url + "/v1", api_key="none", max_retries=0)
        messages: Any = [{"role": "system", "content": SYSTEM}]
        cached = []
        for i, q in enumerate(("What is my balance?", "Where is my card?", "How?")):
            ask: Any = [*messages, {"role": "user", "content": q}]
            if i == 2:  # streamed: the final usage chunk carries it
                chunks = client.chat.completions.create(
                    model="velvetrope-sim", messages=ask, max_tokens=3, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                usage = [c.usage for c in chunks if c.usage is not None][-1]
            else:
                done = client.chat.completions.create(
                    model="velvetrope-sim", messages=ask, max_tokens=3
                )
                assert done.usage is not None
                usage = done.usage
            assert usage.prompt_tokens_details is not None
            cached.append(usage.prompt_tokens_details.cached_tokens)
        shared = (len(SYSTEM) // 4) // 16 * 16
        assert cached[0] == 0 and all(c is not None and c >= shared - 16 for c in cached[1:])
        assert sum(c or 0 for c in cached) == prefix_counters(eng.url)[1]
        on_completions = []
        for q in ("Q: balance?", "Q: card?"):  # /v1/completions: the same details
            c = client.completions.create(model="velvetrope-sim", prompt=SYSTEM + q, max_tokens=2)
            assert c.usage is not None and c.usage.prompt_tokens_details is not None
            on_completions.append(c.usage.prompt_tokens_details.cached_tokens or 0)
        assert on_completions[1] >= shared - 16 and on_completions[1] > on_completions[0]
        body = {"model": "velvetrope-sim", "messages": ask, "max_tokens": 2}
        u = httpx.post(plain.url + "/v1/chat/completions", json=body).json()["usage"]
        assert "prompt_tokens_details" not in u  # no prefix caching: no details, as vLLM's
    finally:
        eng.stop()
        plain.stop()


def test_set_takes_booleans() -> None:
    prof = load_profile("llama3-8b-h100")
    on = parse_overrides(prof, ["enable_prefix_caching=true"])
    assert on.enable_prefix_caching is True
    assert parse_overrides(on, ["enable_prefix_caching=off"]).enable_prefix_caching is False
    with pytest.raises(typer.BadParameter, match="enable_prefix_caching"):
        parse_overrides(prof, ["enable_prefix_caching=maybe"])
