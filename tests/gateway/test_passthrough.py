"""Admission off (``gateway.admission: false``): a plain proxy in front of a real velvetrope
engine.  The engine's answers reach the client as the engine sent them, streamed or not,
errors included; nothing is queued, limited or counted."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from .conftest import Proc, gateway_config, start_gateway

pytestmark = pytest.mark.integration

AUTH = {"Authorization": "Bearer sk-gold-0000"}


@pytest.fixture(scope="module")
def gw(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = gateway_config([engine])
    config["gateway"]["admission"] = False
    p: Proc = start_gateway(tmp_path_factory.mktemp("gw"), config)
    yield p.url
    p.stop()


def _same_but_ids(a: bytes, b: bytes) -> None:
    """Equal, but for what each answer gets anew: its id, its creation time and the
    engine's own timings (``velvetrope.model_*_s``)."""

    def norm(x: bytes) -> bytes:
        return re.sub(rb'"(id|created|model_[a-z0-9]+_s)":("[^"]*"|[-+.\deE]+)', b"", x)

    assert norm(a) == norm(b)


@pytest.mark.parametrize("usage", [False, True])
def test_a_stream_arrives_as_the_engine_sent_it(gw: str, engine: str, usage: bool) -> None:
    """The events of a stream, byte for byte: with the client's own ``stream_options`` or
    without any (the plain proxy asks the engine for nothing more)."""
    body: dict[str, object] = {
        "model": "velvetrope-sim",
        "messages": [{"role": "user", "content": "Count to ten"}],
        "max_tokens": 9,
        "stream": True,
        "ignore_eos": True,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.Client(timeout=30) as c:
        direct = c.post(engine + "/v1/chat/completions", json=body)
        via = c.post(gw + "/v1/chat/completions", json=body, headers=AUTH)
    assert via.status_code == 200
    assert via.headers["content-type"].startswith("text/event-stream")
    assert "x-ratelimit-remaining-tokens" not in via.headers  # nothing was limited
    _same_but_ids(via.content, direct.content)
    assert via.content.endswith(b"data: [DONE]\n\n")
    assert (b'"usage":{' in via.content) is usage


def test_the_openai_client_streams_through(gw: str) -> None:
    with openai.OpenAI(base_url=gw + "/v1", api_key="sk-gold-0000", max_retries=0) as c:
        stream = c.completions.create(
            model="velvetrope-sim",
            prompt="Once upon a time",
            max_tokens=6,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
    assert len("".join(ch.choices[0].text for ch in chunks if ch.choices).split()) == 6
    assert all(ch.usage is None for ch in chunks)


def test_an_answer_arrives_as_the_engine_sent_it(gw: str, engine: str) -> None:
    body = {"model": "velvetrope-sim", "prompt": "abc", "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(timeout=30) as c:
        direct = c.post(engine + "/v1/completions", json=body)
        via = c.post(gw + "/v1/completions", json=body, headers=AUTH)
    assert via.status_code == 200
    assert via.headers["content-type"] == direct.headers["content-type"]
    _same_but_ids(via.content, direct.content)


def test_an_engine_error_arrives_as_the_engine_sent_it(gw: str, engine: str) -> None:
    """A request the engine refuses (a prompt longer than its context): its status and
    body, unchanged."""
    body = {"model": "velvetrope-sim", "prompt": "word " * 40000, "max_tokens": 4}
    with httpx.Client(timeout=30) as c:
        direct = c.post(engine + "/v1/completions", json=body)
        via = c.post(gw + "/v1/completions", json=body, headers=AUTH)
    assert 400 <= direct.status_code < 500
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
