"""``velvetrope engine`` over loopback: the real command in a subprocess, real clients.

The official ``openai`` client checks the API shape; httpx and raw sockets check errors,
metrics and disconnects.  Engines run 100x faster than real time, except the ``slow`` one
(real time, with a deliberately slow prefill) used to catch requests mid-flight.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import openai
import orjson
import pytest

from tests.support.servers import EngineServer, run_engine
from velvetrope.engine.serve.metrics import LOAD_METRIC_NAMES
from velvetrope.openai.tokenizer import get_tokenizer

pytestmark = pytest.mark.integration

MODEL = "velvetrope-sim"
T = TypeVar("T")

VLLM_SAMPLE_NAMES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    *(
        f"vllm:{h}_{suffix}"
        for h in (
            "time_to_first_token_seconds",
            "e2e_request_latency_seconds",
            "request_queue_time_seconds",
        )
        for suffix in ("bucket", "sum", "count")
    ),
}


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast() -> Iterator[EngineServer]:
    """100x real time, 50 kB body limit."""
    with run_engine(speed=100, max_body_mb=0.05) as e:
        yield e


@pytest.fixture(scope="module")
def instant() -> Iterator[EngineServer]:
    with run_engine(instant=True, model="fast-upstream") as e:
        yield e


@pytest.fixture(scope="module")
def small() -> Iterator[EngineServer]:
    """A tiny KV cache (64 blocks = 1,024 tokens) and context, 10x real time (slow enough
    that requests sent together overlap on the engine even when the machine is busy)."""
    with run_engine(speed=10, set=["num_gpu_blocks=64", "max_model_len=1024"]) as e:
        yield e


@pytest.fixture(scope="module")
def slow() -> Iterator[EngineServer]:
    """Real time, prefill 2 ms/token: a 1,000-token prompt takes 2 s before its first token."""
    with run_engine(speed=1, set=["per_prefill_token_s=0.002"]) as e:
        yield e


@pytest.fixture
def client(fast: EngineServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fast.openai_base, api_key="x", max_retries=0) as c:
        yield c


def metrics(server: EngineServer) -> dict[str, float]:
    """Sample name -> value from /metrics (histogram buckets keep only +Inf)."""
    text = httpx.get(server.url + "/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name.endswith("_bucket") and 'le="+Inf"' not in name_labels:
            continue
        out[name] = float(value)
    return out


def wait_until(probe: Callable[[], T], ok: Callable[[T], bool], timeout_s: float = 10.0) -> T:
    """Poll ``probe`` until ``ok(value)`` (bounded); return the last value."""
    deadline = time.monotonic() + timeout_s
    value = probe()
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = probe()
    return value


def idle(m: dict[str, float]) -> bool:
    return m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0


def busy(m: dict[str, float]) -> bool:
    return m["vllm:num_requests_running"] >= 1 and m["vllm:kv_cache_usage_perc"] > 0


def words(n: int) -> str:
    return " hello" * n


def raw_request(server: EngineServer, path: str, body: bytes) -> socket.socket:
    """Send one POST on a raw socket (to disconnect at will); the caller closes it."""
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


# -- the OpenAI API, through the official client ------------------------------------------------


def test_models_and_health(fast: EngineServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.get(fast.url + "/health")
    assert (r.status_code, r.content) == (200, b"")


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=300
    )
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 8  # OpenAI's count for this chat on cl100k
    n = resp.usage.completion_tokens
    assert 1 <= n <= 300
    assert resp.usage.total_tokens == 8 + n
    content = choice.message.content or ""
    assert get_tokenizer("cl100k_base").count(content) == n  # one filler word per token
    ext = (resp.model_extra or {})["velvetrope"]
    assert set(ext) == {"model_queue_s", "model_ttft_s", "model_e2e_s"}
    assert 0 <= ext["model_queue_s"] <= ext["model_ttft_s"] < ext["model_e2e_s"] or n == 1


def test_chat_streaming_without_usage(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=7,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as stream:
        chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert all(len(c.choices) == 1 for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices[0].delta.content]
    assert len(pieces) == 7
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    with client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream with usage"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    pieces = [c.choices[0].delta.content for c in chunks[:-1] if c.choices[0].delta.content]
    assert last.usage.completion_tokens == len(pieces) >= 1
    assert last.usage.prompt_tokens == get_tokenizer("cl100k_base").count_chat(
        [{"role": "user", "content": "Stream with usage"}]
    )
    assert all(c.usage is None for c in chunks[:-1])
    ext = (last.model_extra or {})["velvetrope"]
    assert ext["model_e2e_s"] >= ext["model_ttft_s"] > 0


def test_completions_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400)
    assert full.object == "text_completion"
    assert full.usage is not None
    assert full.usage.prompt_tokens == 4
    with client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=400,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    text = "".join(c.choices[0].text for c in chunks[:-1])
    assert text == full.choices[0].text  # the same prompt gets the same answer
    assert usage_chunk.usage.completion_tokens == full.usage.completion_tokens == len(chunks) - 1
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason


def test_completions_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="a", extra_body={"ignore_eos": True})
    assert resp.usage is not None and resp.usage.completion_tokens == 16


def test_completions_accepts_token_ids(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5], max_tokens=3)
    assert resp.usage is not None and resp.usage.prompt_tokens == 5


@pytest.mark.parametrize("max_tokens", [1, 37, 300])
def test_ignore_eos_gives_exactly_max_tokens(client: openai.OpenAI, max_tokens: int) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
    )
    assert chat.usage is not None and chat.usage.completion_tokens == max_tokens
    assert chat.choices[0].finish_reason == "length"
    comp = client.completions.create(
        model=MODEL, prompt="x", max_tokens=max_tokens, extra_body={"ignore_eos": True}
    )
    assert comp.usage is not None and comp.usage.completion_tokens == max_tokens


def test_output_length_is_deterministic_per_prompt(client: openai.OpenAI) -> None:
    def length(prompt: str) -> int:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2000)
        assert r.usage is not None
        return r.usage.completion_tokens

    lengths = [length(f"question {i}") for i in range(12)]
    assert lengths == [length(f"question {i}") for i in range(12)]
    assert len(set(lengths)) > 4


def test_n_choices_share_the_prompt_and_sum_the_usage(
    fast: EngineServer, client: openai.OpenAI
) -> None:
    msgs: list[Any] = [{"role": "user", "content": "Hello"}]
    one = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300)
    before = metrics(fast)
    three = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content or "" for c in three.choices]
    assert texts[0] == one.choices[0].message.content  # choice 0 is the n=1 answer
    assert len(set(texts)) == 3  # every choice has its own draw
    assert three.usage is not None
    assert three.usage.prompt_tokens == 8  # the prompt is counted once
    tok = get_tokenizer("cl100k_base")
    assert three.usage.completion_tokens == sum(tok.count(t) for t in texts)
    after = wait_until(lambda: metrics(fast), idle)
    gen = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert gen == three.usage.completion_tokens  # n sequences decoded
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 3 * 8


@pytest.mark.parametrize("chat", [True, False])
def test_n_choices_stream_with_their_index(client: openai.OpenAI, chat: bool) -> None:
    extra = {"ignore_eos": True}
    opts: Any = {"include_usage": True}
    pieces: dict[int, int] = {}
    finish: dict[int, str | None] = {}
    if chat:
        msgs: list[Any] = [{"role": "user", "content": "Stream n"}]
        with client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=6, n=2, stream=True,
            stream_options=opts, extra_body=extra,
        ) as stream:  # fmt: skip
            chunks = list(stream)
        for ch in chunks[:-1]:
            (c,) = ch.choices
            pieces[c.index] = pieces.get(c.index, 0) + bool(c.delta.content)
            finish[c.index] = finish.get(c.index) or c.finish_reason
        assert chunks[-1].choices == []
        usage = chunks[-1].usage
    else:
        with client.completions.create(
            model=MODEL, prompt="Stream n", max_tokens=6, n=2, stream=True,
            stream_options=opts, extra_body=extra,
        ) as stream:  # fmt: skip
            comp = list(stream)
        for cc in comp[:-1]:
            (t,) = cc.choices
            pieces[t.index] = pieces.get(t.index, 0) + bool(t.text)
            finish[t.index] = finish.get(t.index) or t.finish_reason
        assert comp[-1].choices == []
        usage = comp[-1].usage
    assert pieces == {0: 6, 1: 6}
    assert finish == {0: "length", 1: "length"}
    assert usage is not None
    assert usage.completion_tokens == 12
    assert usage.total_tokens == usage.prompt_tokens + 12


def test_instant_mode_answers_at_once(instant: EngineServer) -> None:
    with openai.OpenAI(base_url=instant.openai_base, api_key="x", max_retries=0) as c:
        resp = c.chat.completions.create(
            model="fast-upstream",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=50,
            extra_body={"ignore_eos": True},
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 50
        assert (resp.model_extra or {})["velvetrope"] == {
            "model_queue_s": 0.0,
            "model_ttft_s": 0.0,
            "model_e2e_s": 0.0,
        }
        with c.completions.create(
            model="fast-upstream",
            prompt="hi",
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ) as stream:
            chunks = list(stream)
        two = c.completions.create(
            model="fast-upstream", prompt="hi", max_tokens=5, n=2, extra_body={"ignore_eos": True}
        )
    assert len(chunks) == 21 and chunks[-1].usage is not None
    assert [ch.index for ch in two.choices] == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens == 10
    m = metrics(instant)
    assert m["vllm:generation_tokens_total"] == 80
    assert idle(m)


# -- metrics ------------------------------------------------------------------------------------


def test_metric_names_are_vllms(fast: EngineServer, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL, prompt="metrics", max_tokens=5)
    text = httpx.get(fast.url + "/metrics").text
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name_labels = line.rsplit(" ", 1)[0]
        names.add(name_labels.split("{", 1)[0])
        assert f'model_name="{MODEL}"' in name_labels
    # vLLM's names, and our two load gauges (velvetrope_engine_*, not vLLM's) beside them
    assert names == VLLM_SAMPLE_NAMES | set(LOAD_METRIC_NAMES)
    assert "# TYPE vllm:num_preemptions_total counter" in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text


def test_metrics_count_tokens_and_requests(fast: EngineServer, client: openai.OpenAI) -> None:
    before = metrics(fast)
    resp = client.completions.create(model=MODEL, prompt="count me", max_tokens=30)
    assert resp.usage is not None
    after = metrics(fast)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 2
    gen = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert gen == resp.usage.completion_tokens
    for h in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        name = f"vllm:{h}_seconds_count"
        assert after[name] - before[name] == 1
    assert idle(after)


def test_preemption_under_a_tiny_kv_cache(small: EngineServer) -> None:
    # Six sequences of 100 + 400 tokens want 6 * 32 blocks of a 64-block cache.
    def one(i: int) -> int:
        with openai.OpenAI(base_url=small.openai_base, api_key="x", max_retries=0) as c:
            r = c.completions.create(
                model=MODEL,
                prompt=[i + 1] * 100,
                max_tokens=400,
                extra_body={"ignore_eos": True},
            )
            assert r.usage is not None
            return r.usage.completion_tokens

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(6))) == [400] * 6
    m = wait_until(lambda: metrics(small), idle)
    assert idle(m)
    assert m["vllm:num_preemptions_total"] > 0
    assert m["vllm:generation_tokens_total"] == 2400


# -- disconnects ----------------------------------------------------------------------------------


def test_disconnect_mid_stream_frees_the_sequence(slow: EngineServer) -> None:
    with (
        openai.OpenAI(base_url=slow.openai_base, api_key="x", max_retries=0) as c,
        c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "a very long answer please"}],
            max_tokens=5000,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as stream,
    ):
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 3:
                break
        before = metrics(slow)
        assert busy(before)
    m = wait_until(lambda: metrics(slow), idle)
    assert idle(m)
    assert m["vllm:num_requests_waiting"] == 0
    done = "vllm:e2e_request_latency_seconds_count"
    assert m[done] == before[done]  # aborted, never completed


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_before_the_first_token_frees_the_sequence(
    slow: EngineServer, stream: bool
) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": words(1000), "max_tokens": 10, "stream": stream})
    done = "vllm:e2e_request_latency_seconds_count"
    sock = raw_request(slow, "/v1/completions", body)
    try:
        before = wait_until(lambda: metrics(slow), busy)  # prefilling: 2 s at 2 ms/token
        assert busy(before)
    finally:
        sock.close()
    m = wait_until(lambda: metrics(slow), idle)
    assert idle(m)
    assert m[done] == before[done]  # aborted, never completed


# -- errors ---------------------------------------------------------------------------------------


def _post(server: EngineServer, path: str, content: bytes) -> httpx.Response:
    return httpx.post(
        server.url + path, content=content, headers={"content-type": "application/json"}
    )


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        (CHAT, b'{"model": "velvetrope-sim", "messages": [', 400, "invalid_json", None),
        (CHAT, b"[1, 2]", 400, "invalid_type", None),
        (CHAT, _json({"model": MODEL}), 400, "missing_required_parameter", "messages"),
        (CHAT, _json({"messages": MSGS}), 400, "missing_required_parameter", "model"),
        (CHAT, _json({"model": MODEL, "messages": "hi"}), 400, "invalid_type", "messages"),
        (CHAT, _json({"model": MODEL, "messages": []}), 400, "invalid_value", "messages"),
        (
            CHAT,
            _json({"model": MODEL, "messages": [{"content": "x"}]}),
            400,
            "missing_required_parameter",
            "messages[0].role",
        ),
        (
            CHAT,
            _json({"model": MODEL, "messages": [{"role": "user", "content": 3}]}),
            400,
            "invalid_type",
            "messages[0].content",
        ),
        (
            CHAT,
            _json({"model": MODEL, "messages": MSGS, "max_tokens": "5"}),
            400,
            "invalid_type",
            "max_tokens",
        ),
        (
            CHAT,
            _json({"model": MODEL, "messages": MSGS, "max_tokens": 0}),
            400,
            "invalid_value",
            "max_tokens",
        ),
        (
            CHAT,
            _json({"model": MODEL, "messages": MSGS, "stream": "yes"}),
            400,
            "invalid_type",
            "stream",
        ),
        (
            CHAT,
            _json({"model": MODEL, "messages": MSGS, "stream_options": {"include_usage": True}}),
            400,
            "invalid_value",
            "stream_options",
        ),
        (CHAT, _json({"model": MODEL, "messages": MSGS, "n": 0}), 400, "invalid_value", "n"),
        (CHAT, _json({"model": MODEL, "messages": MSGS, "n": 17}), 400, "invalid_value", "n"),
        (CHAT, _json({"model": MODEL, "messages": MSGS, "n": "2"}), 400, "invalid_type", "n"),
        (
            CHAT,
            _json({"model": MODEL, "messages": MSGS, "ignore_eos": 1}),
            400,
            "invalid_type",
            "ignore_eos",
        ),
        (CHAT, _json({"model": "gpt-4o", "messages": MSGS}), 404, "model_not_found", "model"),
        (COMP, _json({"model": MODEL}), 400, "missing_required_parameter", "prompt"),
        (COMP, _json({"model": MODEL, "prompt": 5}), 400, "invalid_type", "prompt"),
        (COMP, _json({"model": MODEL, "prompt": ["a", "b"]}), 400, "invalid_value", "prompt"),
        (
            COMP,
            _json({"model": MODEL, "prompt": "hi", "max_tokens": 9000}),
            400,
            "context_length_exceeded",
            "prompt",
        ),
        (
            COMP,
            _json({"model": MODEL, "prompt": words(9000), "max_tokens": 1}),
            413,
            "request_too_large",
            None,
        ),
        ("/v1/nope", _json({}), 404, "not_found", None),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    fast: EngineServer,
    path: str,
    body: bytes,
    status: int,
    code: str,
    param: str | None,
) -> None:
    r = _post(fast, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]


def test_wrong_method_is_405(fast: EngineServer) -> None:
    r = httpx.get(fast.url + COMP)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_prompt_too_long_for_the_model(small: EngineServer) -> None:
    with openai.OpenAI(base_url=small.openai_base, api_key="x", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": words(1100)}]
            )
        assert info.value.code == "context_length_exceeded"
        assert "1024" in info.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            c.chat.completions.create(model="other", messages=MSGS)  # type: ignore[arg-type]
        assert missing.value.code == "model_not_found"
        # Without max_tokens a chat may use whatever room the context has left.
        ok = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": words(1000)}],
            extra_body={"ignore_eos": True},
        )
        assert ok.usage is not None
        assert ok.usage.prompt_tokens + ok.usage.completion_tokens == 1024


# -- the process ----------------------------------------------------------------------------------


def test_readiness_line_and_clean_exit_on_sigterm_mid_stream() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "velvetrope", "engine", "--port", "0", "--speed", "1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no readiness line within 30 s"
        line = proc.stdout.readline().decode()
        assert line.startswith("velvetrope engine ready on http://127.0.0.1:")
        url = line.split()[4]
        assert f"pid={proc.pid}" in line
        with httpx.Client(base_url=url, timeout=10) as http:
            body = {
                "model": MODEL,
                "prompt": "long",
                "max_tokens": 5000,
                "stream": True,
                "ignore_eos": True,
            }
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: {")
                os.kill(proc.pid, signal.SIGTERM)
                tail = list(lines)
        assert any('"error"' in t for t in tail)  # the stream was ended, with a reason
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err.decode()
        assert out == b""  # the readiness line is the only output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_bad_profile_fails_fast_with_a_clear_message() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "velvetrope", "engine", "--port", "0", "--profile", "nope"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    assert b"unknown engine profile 'nope'" in r.stderr


def test_injected_faults_only_when_enabled(fast: EngineServer) -> None:
    """``velvetrope_fault`` is an ordinary unknown field for an engine run without
    ``--faults``; with it, the status asked for comes back in OpenAI's error shape, and a
    value that is not an HTTP error status is a 400."""
    req = {"model": "velvetrope-sim", "prompt": "hi", "max_tokens": 2, "velvetrope_fault": 500}
    assert httpx.post(fast.url + "/v1/completions", json=req).status_code == 200
    with run_engine(instant=True, faults=True) as e:
        for status, code in ((500, "internal_error"), (503, "injected_503")):
            r = httpx.post(e.url + "/v1/completions", json={**req, "velvetrope_fault": status})
            assert (r.status_code, r.json()["error"]["code"]) == (status, code)
        r = httpx.post(e.url + "/v1/completions", json={**req, "velvetrope_fault": 200})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "velvetrope_fault")
        r = httpx.post(
            e.url + "/v1/completions",
            json={k: v for k, v in req.items() if k != "velvetrope_fault"},
        )
        assert r.status_code == 200
