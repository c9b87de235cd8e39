"""The endpoints beyond completions, and the output cap, in front of llama.cpp's
``llama-server`` (started with ``--embeddings``, mean pooling), with a gateway whose
``default_max_tokens`` is small: embeddings through the official ``openai`` SDK answer as
the engine does straight and are settled from its ``usage.prompt_tokens``; Responses are
settled from their ``usage``, and so are Anthropic Messages (the ``anthropic`` SDK); a
request that names no ``max_tokens`` never generates more than the gateway reserved
(llama.cpp's own default is to generate until the context is full)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.llama_engine import start_llama_server
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

from .conftest import CTX_PER_SLOT, GOLD, MODEL_NAME, SLOTS, charged, gateway_config

pytestmark = pytest.mark.integration

DEFAULT_MAX = 16
"""``gateway.default_max_tokens`` of the gateway under test."""


@pytest.fixture(scope="module")
def embedder(tiny_model: Path) -> Iterator[ServerProcess]:
    """``llama-server`` with ``--embeddings`` (which keeps its completion endpoints)."""
    p = start_llama_server(
        tiny_model,
        slots=SLOTS,
        ctx_per_slot=CTX_PER_SLOT,
        extra=("--embeddings", "--pooling", "mean"),
    )
    yield p
    p.stop()


@pytest.fixture(scope="module")
def capped(embedder: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``velvetrope serve`` in front of :func:`embedder` with ``default_max_tokens: 16``."""
    cfg = gateway_config(embedder.url)
    cfg["gateway"]["default_max_tokens"] = DEFAULT_MAX
    gw = launch.start_gateway(cfg, tmp_path_factory.mktemp("capped"))
    yield gw.url
    gw.stop()


def _sdk(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)


def test_embeddings_answer_as_direct_and_are_settled_from_the_engines_prompt_tokens(
    embedder: ServerProcess, capped: str
) -> None:
    inputs: list[Any] = [
        "the quick brown fox",
        ["first sentence", "a second, longer sentence to embed"],
        [1, 2, 3, 4, 5],
        [[1, 2, 3], [4, 5, 6, 7, 8, 9]],
    ]
    before = charged(capped, "gold")
    reported = 0
    with _sdk(embedder.url, "unused") as direct, _sdk(capped, GOLD) as via:
        for value in inputs:
            want = direct.embeddings.create(model=MODEL_NAME, input=value)
            got = via.embeddings.create(model=MODEL_NAME, input=value)
            assert len(got.data) == len(want.data) >= 1
            assert [d.embedding for d in got.data] == [d.embedding for d in want.data]
            assert got.usage.prompt_tokens == want.usage.prompt_tokens > 0
            reported += got.usage.prompt_tokens
    assert charged(capped, "gold") - before == pytest.approx(reported, abs=0.5)


def test_a_request_without_max_tokens_never_generates_more_than_was_reserved(
    capped: str,
) -> None:
    """``ignore_eos``: llama.cpp generates until its cap, which without one is the slot's
    whole context; through the gateway the cap is ``default_max_tokens``."""
    eos: Any = {"ignore_eos": True, "cache_prompt": False}
    msgs: Any = [{"role": "user", "content": "Tell me a long story"}]
    opts: Any = {"include_usage": True}
    before = charged(capped, "gold")
    settled = 0
    with _sdk(capped, GOLD) as via:
        chat = via.chat.completions.create(model=MODEL_NAME, messages=msgs, extra_body=eos)
        done = via.completions.create(model=MODEL_NAME, prompt="Once upon a time", extra_body=eos)
        usage = None
        for ch in via.completions.create(
            model=MODEL_NAME, prompt="Once", stream=True, stream_options=opts, extra_body=eos
        ):
            usage = ch.usage or usage
    for u in (chat.usage, done.usage, usage):
        assert u is not None
        assert u.completion_tokens == DEFAULT_MAX
        settled += u.prompt_tokens + u.completion_tokens
    assert chat.choices[0].finish_reason == "length"
    assert charged(capped, "gold") - before == pytest.approx(settled, abs=0.5)


def test_responses_through_the_sdk_are_capped_and_settled_from_the_engines_usage(
    capped: str,
) -> None:
    """``responses.create`` without ``max_output_tokens`` (llama.cpp's own default: the
    slot's whole context), streaming and not: the gateway sends ``max_output_tokens`` and
    settles the ``usage`` of the response (``input_tokens`` + ``output_tokens``)."""
    before = charged(capped, "gold")
    settled = 0
    with _sdk(capped, GOLD) as via:
        r = via.responses.create(model=MODEL_NAME, input="Tell me a long story")
        assert r.usage is not None and 0 < r.usage.output_tokens <= DEFAULT_MAX
        settled += r.usage.input_tokens + r.usage.output_tokens
        final = None
        deltas = 0
        for ev in via.responses.create(model=MODEL_NAME, input="Once upon a time", stream=True):
            deltas += ev.type == "response.output_text.delta"
            if ev.type == "response.completed":
                final = ev.response
    assert final is not None and final.usage is not None
    assert 0 < final.usage.output_tokens <= DEFAULT_MAX and deltas >= 1
    settled += final.usage.input_tokens + final.usage.output_tokens
    assert charged(capped, "gold") - before == pytest.approx(settled, abs=0.5)


def _prompt(usage: Any) -> int:
    """The prompt tokens of an Anthropic usage: ``input_tokens`` counts only those not read
    from the cache (llama.cpp's server as Anthropic's API: ``n_prompt - n_cached``), the
    cache reads (and writes) come apart; the gateway's buckets count them all."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return int(usage.input_tokens) + cached


def test_anthropic_messages_through_the_sdk_are_settled_from_the_engines_usage(
    embedder: ServerProcess, capped: str
) -> None:
    """The official ``anthropic`` SDK with ``base_url`` the gateway and its ``x-api-key``:
    ``messages.create``, ``messages.stream`` and ``messages.count_tokens`` (the engine's
    own count), each generation settled from llama.cpp's usage (the second reads the
    first's prompt from llama.cpp's cache: its ``cache_read_input_tokens`` are prompt
    tokens too)."""
    msgs: Any = [{"role": "user", "content": "Tell me about the sea"}]
    before = charged(capped, "gold")
    settled = 0
    with anthropic.Anthropic(base_url=capped, api_key=GOLD, max_retries=0, timeout=60) as via:
        m = via.messages.create(model=MODEL_NAME, max_tokens=8, messages=msgs)
        assert m.content and m.usage.output_tokens <= 8 and m.usage.input_tokens > 0
        settled += _prompt(m.usage) + m.usage.output_tokens
        with via.messages.stream(model=MODEL_NAME, max_tokens=8, messages=msgs) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text and 0 < final.usage.output_tokens <= 8
        settled += _prompt(final.usage) + final.usage.output_tokens
        counted = via.messages.count_tokens(model=MODEL_NAME, messages=msgs)
    with anthropic.Anthropic(base_url=embedder.url, api_key="unused", max_retries=0) as direct:
        assert (
            counted.input_tokens
            == direct.messages.count_tokens(model=MODEL_NAME, messages=msgs).input_tokens
        )
    assert charged(capped, "gold") - before == pytest.approx(settled, abs=0.5)
