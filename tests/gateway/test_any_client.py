"""Any OpenAI client, any engine framing: what the gateway does not read passes through;
streams framed with ``\\r\\n`` are relayed event by event and settled exactly; errors that
retrying cannot help say so; ``/v1/models`` answers for every pool.

Clients are the official ``openai`` package and httpx; engines are ``velvetrope engine`` and,
for framing the built-in engine does not use, :class:`ReplayUpstream`: a small HTTP/1.1
server on loopback that replays a stream recorded from ``velvetrope engine`` with its line
ends rewritten, and records the bodies it was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from velvetrope.openai.sse import split_events

from .conftest import Proc, gateway_config, metric, start_engine, start_gateway, wait_idle

pytestmark = pytest.mark.integration

KEY = "sk-gold-0000"
BURST = 100_000.0
SLOW = {"tokens_per_minute": 0.6, "token_burst": BURST}
"""A bucket that refills so slowly (0.01 token/s) that what was charged can be read off it."""
GOLD = {"Authorization": f"Bearer {KEY}"}

SDK_FIELDS: dict[str, Any] = {
    "verbosity": "low",
    "prompt_cache_key": "tenant-cache-1",
    "safety_identifier": "user-1234",
    "web_search_options": {"search_context_size": "low"},
}
"""Fields of the current SDK's ``chat.completions.create()`` that the gateway does not read."""

ENGINE_EXTRAS: dict[str, Any] = {
    "structured_outputs": {"choice": ["yes", "no"]},  # vLLM
    "regex": "[a-z]+",  # SGLang
    "ebnf": 'root ::= "a"',
    "separate_reasoning": True,
    "top_n_tokens": 2,  # TGI
    "tool_prompt": "use the tools",
    "cache_prompt": True,  # llama.cpp
    "n_probs": 3,
    "grammar": 'root ::= "a"',
    "json_schema": {"type": "string"},
    "id_slot": 0,
    "repeat_penalty": 1.1,
    "ignore_eos": True,
}
"""Engine extras as clients send them, through ``extra_body``."""


def _client(gw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw + "/v1", api_key=KEY, max_retries=0)


def _chat(c: openai.OpenAI, **kw: Any) -> Any:
    return c.chat.completions.create(
        model="velvetrope-sim",
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=4,
        **SDK_FIELDS,
        extra_body=ENGINE_EXTRAS,
        **kw,
    )


@pytest.fixture(scope="module")
def gateways(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A gateway in the default mode and one in strict mode, before the same engine."""
    lax = start_gateway(tmp_path_factory.mktemp("lax"), gateway_config([engine]))
    cfg = gateway_config([engine])
    cfg["gateway"]["unknown_parameters"] = "refuse"
    strict = start_gateway(tmp_path_factory.mktemp("strict"), cfg)
    yield lax.url, strict.url
    lax.stop()
    strict.stop()


def test_sdk_fields_and_engine_extras_pass_to_the_engine(gateways: tuple[str, str]) -> None:
    lax, _ = gateways
    with _client(lax) as c:
        r = _chat(c)
        assert r.usage is not None and r.usage.completion_tokens == 4
        chunks = list(_chat(c, stream=True))
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 4
        assert all(ch.usage is None for ch in chunks)
        done = c.completions.create(
            model="velvetrope-sim",
            prompt="Once",
            max_tokens=3,
            extra_body={**ENGINE_EXTRAS, "some_future_field": [1, 2]},
        )
        assert done.usage is not None and done.usage.completion_tokens == 3
    wait_idle(lax)


def test_strict_mode_refuses_what_it_does_not_know(gateways: tuple[str, str]) -> None:
    _, strict = gateways
    with _client(strict) as c:
        with pytest.raises(openai.BadRequestError) as ei:
            _chat(c)
        assert ei.value.code == "unknown_parameter"
        assert ei.value.param in {**SDK_FIELDS, **ENGINE_EXTRAS}  # the first unknown key
        assert ei.value.response.headers["x-should-retry"] == "false"
        r = c.chat.completions.create(  # known keys only: served
            model="velvetrope-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body={"ignore_eos": True},
        )
        assert r.usage is not None and r.usage.completion_tokens == 2
    wait_idle(strict)


def test_fields_the_gateway_reads_are_still_checked(gateways: tuple[str, str]) -> None:
    lax, _ = gateways
    with _client(lax) as c:
        for extra, param in (
            ({"n": "2"}, "n"),
            ({"best_of": 0}, "best_of"),
            ({"logprobs": 3}, "logprobs"),
            ({"top_logprobs": -1}, "top_logprobs"),
            ({"max_completion_tokens": "9"}, "max_completion_tokens"),
            ({"stream_options": {"include_usage": "yes"}, "stream": True},
             "stream_options.include_usage"),
        ):  # fmt: skip
            with pytest.raises(openai.BadRequestError) as ei:
                c.chat.completions.create(
                    model="velvetrope-sim",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={**extra, "regex": "x"},
                )
            assert ei.value.param == param
            assert ei.value.response.headers["x-should-retry"] == "false"
    assert wait_idle(lax)["in_flight"] == 0


# -- an upstream that frames its stream with \r\n -------------------------------------------


class ReplayUpstream:
    """An OpenAI-compatible engine on loopback that answers every completion with ``events``
    (complete SSE events, already framed as the test wants), one write each.

    After the write of event ``hold_after`` it waits for :attr:`gate` (the test opens it
    once its client has that event), so a relay that buffers the stream never gets the rest.
    Every request body it is sent is kept in :attr:`bodies`."""

    def __init__(self, events: list[bytes], hold_after: int) -> None:
        self.events = events
        self.hold_after = hold_after
        self.gate = asyncio.Event()
        self.bodies: list[dict[str, Any]] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                if method == "POST":
                    self.bodies.append(orjson.loads(body))
                    await self._stream(writer)
                elif path == "/v1/models":
                    models = {"object": "list", "data": [{"id": "velvetrope-sim"}]}
                    writer.write(_response(200, orjson.dumps(models)))
                elif path == "/health":
                    writer.write(_response(200, b""))
                else:
                    writer.write(_response(404, b"{}"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the gateway closed the connection
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for i, ev in enumerate(self.events):
            if i == self.hold_after:
                # the event up to the \r that ends it, without the \n of a \r\n after it
                cut = len(ev) - 1 if ev.endswith(b"\r\n") else len(ev)
                writer.write(_chunk(ev[:cut]))
                await writer.drain()
                await self.gate.wait()
                if cut < len(ev):
                    writer.write(_chunk(ev[cut:]))
            else:
                writer.write(_chunk(ev))
            await writer.drain()
        writer.write(b"0\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def _record(engine: str, tokens: int) -> tuple[list[bytes], dict[str, int]]:
    """A chat stream as ``velvetrope engine`` sends it (with its usage chunk): its events
    and the usage it reports."""
    body = {
        "model": "velvetrope-sim",
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = httpx.post(engine + "/v1/chat/completions", json=body, timeout=30).content
    events, rest = split_events(raw)
    assert not rest.strip()
    usage = next(
        orjson.loads(e[6:])["usage"] for e in events if b'"usage":{' in e.replace(b" ", b"")
    )
    return events, usage


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"])
def test_a_stream_framed_with_cr_is_relayed_as_it_comes_and_settled_exactly(
    engine: str, tmp_path: Path, line_end: bytes
) -> None:
    events, usage = _record(engine, 25)
    assert usage["completion_tokens"] == 25
    framed = [e.replace(b"\n", line_end) for e in events]
    first = next(
        i for i, e in enumerate(events) if b'"content":"' in e and b'"content":""' not in e
    )

    async def run() -> tuple[int, float, list[Any], list[Any], list[dict[str, Any]]]:
        up = ReplayUpstream(framed, hold_after=first)
        await up.start()
        gw: Proc | None = None
        try:
            cfg = gateway_config([up.url])
            cfg["policy"]["tenants"][0]["limits"] = SLOW  # balances exact within a test
            gw = await asyncio.to_thread(start_gateway, tmp_path, cfg)
            c = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
            async with c:
                results = []
                for include_usage in (False, True):
                    up.gate.clear()
                    stream = await c.chat.completions.create(
                        model="velvetrope-sim",
                        messages=[{"role": "user", "content": "Tell me a story"}],
                        max_tokens=25,
                        stream=True,
                        stream_options={"include_usage": True} if include_usage else openai.omit,
                    )
                    chunks: list[Any] = []
                    it = stream.__aiter__()
                    while not any(ch.choices and ch.choices[0].delta.content for ch in chunks):
                        # the first token arrives while the upstream holds the rest
                        chunks.append(await asyncio.wait_for(it.__anext__(), 10))
                    before = len(chunks)
                    up.gate.set()
                    chunks += [ch async for ch in it]
                    results.append((before, chunks))
            st = await asyncio.to_thread(wait_idle, gw.url)
            charged = BURST - st["buckets"]["tenant:gold:tok"]
            settled = await asyncio.to_thread(
                metric, gw.url, "velvetrope_tokens_settled_total", tier="interactive"
            )
            assert settled == pytest.approx(charged, abs=1.0)
            (b0, plain), (_, with_usage) = results
            return b0, charged, plain, with_usage, up.bodies
        finally:
            if gw is not None:
                await asyncio.to_thread(gw.stop)
            await up.stop()

    held, settled, plain, with_usage, bodies = asyncio.run(run())
    assert held < len(plain)  # the first token came before the rest was sent
    for chunks in (plain, with_usage):
        text = [ch.choices[0].delta.content for ch in chunks if ch.choices]
        assert sum(1 for t in text if t) == 25
    assert all(ch.usage is None for ch in plain)  # did not ask: the usage chunk is dropped
    usages = [ch.usage for ch in with_usage if ch.usage is not None]
    assert [(u.prompt_tokens, u.completion_tokens) for u in usages] == [
        (usage["prompt_tokens"], 25)
    ]
    # the engine's own count, twice (the bucket refills 0.01 token/s meanwhile)
    assert settled == pytest.approx(2 * (usage["prompt_tokens"] + 25), abs=1.0)
    assert [b["stream_options"] for b in bodies] == [{"include_usage": True}] * 2


def test_what_the_gateway_does_not_read_reaches_the_engine_untouched(
    engine: str, tmp_path: Path
) -> None:
    events, _ = _record(engine, 3)

    async def run() -> list[dict[str, Any]]:
        up = ReplayUpstream(events, hold_after=-1)
        await up.start()
        gw: Proc | None = None
        try:
            gw = await asyncio.to_thread(start_gateway, tmp_path, gateway_config([up.url]))
            c = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
            async with c:
                stream = await c.chat.completions.create(
                    model="velvetrope-sim",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=3,
                    stream=True,
                    **SDK_FIELDS,
                    extra_body=ENGINE_EXTRAS,
                )
                async for _ in stream:
                    pass
            await asyncio.to_thread(wait_idle, gw.url)
            return up.bodies
        finally:
            if gw is not None:
                await asyncio.to_thread(gw.stop)
            await up.stop()

    (body,) = asyncio.run(run())
    for k, v in {**SDK_FIELDS, **ENGINE_EXTRAS}.items():
        assert body[k] == v


# -- /v1/models and x-should-retry ----------------------------------------------------------


def test_models_lists_every_pool_and_answers_by_id(engine: str, tmp_path: Path) -> None:
    small = start_engine(50.0, "--model", "small-sim")
    cfg = gateway_config([engine])
    cfg["policy"]["pools"] = [
        {"name": "default", "max_in_flight": 8},
        {"name": "small", "max_in_flight": 8},
        {"name": "spare", "max_in_flight": 8},
    ]
    cfg["upstreams"] = {
        "default": [{"url": engine}],
        "small": [{"url": small.url}],
        "spare": [{"url": engine}],  # the same model again: listed once
    }
    gw = start_gateway(tmp_path, cfg)
    try:
        with httpx.Client(base_url=gw.url, headers=GOLD) as h:
            r = h.get("/v1/models")
            assert r.status_code == 200
            ids = [m["id"] for m in r.json()["data"]]
            assert ids == ["velvetrope-sim", "small-sim"]
            one = h.get("/v1/models/small-sim")
            assert one.status_code == 200 and one.json()["id"] == "small-sim"
            missing = h.get("/v1/models/no-such-model")
            assert missing.status_code == 404
            err = missing.json()["error"]
            assert (err["code"], err["type"]) == ("model_not_found", "invalid_request_error")
            assert missing.headers["x-should-retry"] == "false"
            assert h.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code == 401
        with _client(gw.url) as c:
            assert [m.id for m in c.models.list()] == ["velvetrope-sim", "small-sim"]
            assert c.models.retrieve("velvetrope-sim").id == "velvetrope-sim"
            with pytest.raises(openai.NotFoundError):
                c.models.retrieve("no-such-model")
    finally:
        gw.stop()
        small.stop()


def test_errors_say_whether_a_retry_can_help(gateways: tuple[str, str]) -> None:
    lax, _ = gateways
    with httpx.Client(base_url=lax) as h:
        body = {"model": "velvetrope-sim", "prompt": "x", "max_tokens": 2}
        for r in (
            h.post("/v1/completions", json=body),  # no key: 401
            h.post("/v1/completions", json={**body, "max_tokens": "2"}, headers=GOLD),
            h.get("/v1/completions", headers=GOLD),  # 405
            h.get("/v1/nowhere", headers=GOLD),  # 404
            h.post(
                "/v1/completions",
                content=b'{"model":"m","prompt":"' + b"x" * 2_000_000 + b'"}',
                headers={**GOLD, "content-type": "application/json"},
            ),  # 413
        ):
            assert r.status_code in (400, 401, 404, 405, 413)
            assert r.headers["x-should-retry"] == "false", r.status_code
        ok = h.post("/v1/completions", json=body, headers=GOLD)
        assert ok.status_code == 200 and "x-should-retry" not in ok.headers
    wait_idle(lax)
