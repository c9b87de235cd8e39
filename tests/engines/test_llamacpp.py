"""The gateway in front of llama.cpp's ``llama-server`` (see ``conftest.py``).

Every SDK call answers the same straight to the engine and through the gateway, and is
settled from the engine's own numbers; an engine error passes through byte for byte; a
client that hangs up, streaming or not, stops the engine's generation and is charged what
it cost; a choice the engine leaves out of its usage (``n=2``) is charged all the same; a
loop of streamed requests meets llama.cpp's habit of closing a connection after each
streamed response and gets no 503.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from velvetrope.engine.profile import load_profile
from velvetrope.serving.launch import ServerProcess

from .conftest import (
    CTX_PER_SLOT,
    GOLD,
    MODEL_NAME,
    SLOTS,
    admin_status,
    charged,
    engine_metric,
    wait_engine_idle,
    wait_idle,
)

pytestmark = pytest.mark.integration

SAME = {"cache_prompt": False}
"""Every prompt computed afresh: greedy decoding then gives the same tokens on both paths."""


def _clients(llama: ServerProcess, gateway: str) -> tuple[openai.OpenAI, openai.OpenAI]:
    direct = openai.OpenAI(base_url=llama.url + "/v1", api_key="unused", max_retries=0)
    via = openai.OpenAI(base_url=gateway + "/v1", api_key=GOLD, max_retries=0)
    return direct, via


def _calls(c: openai.OpenAI) -> list[tuple[list[str], tuple[int, int] | None]]:
    """Each SDK call once: its texts (per choice) and the usage it reported."""
    out: list[tuple[list[str], tuple[int, int] | None]] = []
    msgs: Any = [{"role": "user", "content": "Say hello to the sea"}]
    kw: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0.0}
    chat = c.chat.completions.create(messages=msgs, extra_body=SAME, **kw)
    assert chat.usage is not None
    out.append(([chat.choices[0].message.content or ""], _u(chat.usage)))
    done = c.completions.create(prompt="Once upon a time", extra_body=SAME, **kw)
    assert done.usage is not None
    out.append(([done.choices[0].text], _u(done.usage)))
    for include in (False, True):
        opts: Any = {"include_usage": True} if include else openai.omit
        text, usage = "", None
        for ch in c.chat.completions.create(
            messages=msgs, stream=True, stream_options=opts, extra_body=SAME, **kw
        ):
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
            if ch.usage is not None:
                usage = _u(ch.usage)
        out.append(([text], usage))
        text, usage = "", None
        for ct in c.completions.create(
            prompt="Once upon a time", stream=True, stream_options=opts, extra_body=SAME, **kw
        ):
            if ct.choices:
                text += ct.choices[0].text
            if ct.usage is not None:
                usage = _u(ct.usage)
        out.append(([text], usage))
    return out


def _u(usage: Any) -> tuple[int, int]:
    return int(usage.prompt_tokens), int(usage.completion_tokens)


def test_every_sdk_call_answers_the_same_direct_and_is_settled_from_the_engines_usage(
    llama: ServerProcess, gateway: str
) -> None:
    direct, via = _clients(llama, gateway)
    before = charged(gateway, "gold")
    with direct, via:
        straight = _calls(direct)
        through = _calls(via)
    assert through == straight
    assert all(t[0] for t, _ in through)  # every call generated text
    # llama.cpp puts its usage in a stream's last chunk even when not asked for it; the
    # gateway passes that chunk on (it carries a choice), so both paths show it
    # each call was charged the engine's numbers (the streams without usage: the same
    # prompt and length as the calls with it)
    chat_u, text_u = straight[0][1], straight[1][1]
    assert chat_u is not None and text_u is not None
    expected = 3 * sum(chat_u) + 3 * sum(text_u)
    assert charged(gateway, "gold") - before == pytest.approx(expected, abs=0.5)


def test_a_prompt_too_long_for_the_engine_gets_its_400_byte_for_byte(
    llama: ServerProcess, gateway: str
) -> None:
    body = orjson.dumps({"model": MODEL_NAME, "prompt": "hello " * 700, "max_tokens": 4})
    direct = httpx.post(llama.url + "/v1/completions", content=body, timeout=30)
    before = charged(gateway, "gold")
    via = httpx.post(
        gateway + "/v1/completions",
        content=body,
        headers={"authorization": f"Bearer {GOLD}", "content-type": "application/json"},
        timeout=30,
    )
    assert direct.status_code == 400, direct.text
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    assert charged(gateway, "gold") == pytest.approx(before, abs=0.5)  # no work done


def test_a_streaming_hang_up_stops_the_engines_generation(
    llama: ServerProcess, gateway: str
) -> None:
    wait_engine_idle(llama.url)
    decodes = engine_metric(llama.url, "n_decode_total")
    before = charged(gateway, "gold")
    got = 0
    with httpx.Client(timeout=30) as c:
        body = {"model": MODEL_NAME, "prompt": "Once", "max_tokens": 900, "stream": True}
        headers = {"authorization": f"Bearer {GOLD}"}
        with c.stream("POST", gateway + "/v1/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                got += line.startswith('data: {"choices"') and '"text":""' not in line
                if got == 3:
                    break  # leaving the block closes the connection: the client hangs up
    wait_engine_idle(llama.url)
    generated = engine_metric(llama.url, "n_decode_total") - decodes
    assert generated < 450, f"llama.cpp went on generating ({generated} decode steps)"
    # charged what it was streamed (at least the 3 tokens read, far from all 900)
    assert 3 < charged(gateway, "gold") - before < 450


def test_a_non_streaming_hang_up_stops_generation_and_is_charged_its_reservation(
    llama: ServerProcess, gateway: str
) -> None:
    wait_engine_idle(llama.url)
    decodes = engine_metric(llama.url, "n_decode_total")
    before = charged(gateway, "gold")
    body = {"model": MODEL_NAME, "prompt": "Once", "max_tokens": 900}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up: its connection closes
        httpx.post(
            gateway + "/v1/completions",
            json=body,
            headers={"authorization": f"Bearer {GOLD}"},
            timeout=httpx.Timeout(30, read=0.3),
        )
    wait_engine_idle(llama.url, every_s=2.0)
    generated = engine_metric(llama.url, "n_decode_total") - decodes
    assert generated < 600, f"llama.cpp went on generating ({generated} decode steps)"
    # the engine cannot say what it generated before the hang-up: the reservation is
    # charged (the prompt and max_tokens with this policy), never the prompt alone
    assert 900 < charged(gateway, "gold") - before < 900 + 5


def test_every_choice_of_n_2_is_charged(llama: ServerProcess, gateway: str) -> None:
    direct, via = _clients(llama, gateway)
    kw: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 6, "n": 2, "extra_body": SAME}
    with direct, via:
        engine = direct.completions.create(prompt="Once upon a time", **kw)
        before = charged(gateway, "gold")
        got = via.completions.create(prompt="Once upon a time", **kw)
        whole = charged(gateway, "gold") - before
        before = charged(gateway, "gold")
        texts = ["", ""]
        for ch in via.completions.create(
            prompt="Once upon a time", stream=True, stream_options={"include_usage": True}, **kw
        ):
            for choice in ch.choices:
                texts[choice.index] += choice.text
        streamed = charged(gateway, "gold") - before
    assert engine.usage is not None and got.usage is not None
    assert len(got.choices) == 2 and all(c.finish_reason == "length" for c in got.choices)
    assert got.usage.completion_tokens == engine.usage.completion_tokens  # passed through
    both = engine.usage.prompt_tokens + 2 * 6  # both choices charged
    assert whole == pytest.approx(both, abs=0.5)
    assert all(texts) and streamed == pytest.approx(both, abs=0.5)


def test_a_loop_of_streamed_requests_meets_closed_connections_and_gets_no_503(
    llama: ServerProcess, gateway: str
) -> None:
    body = orjson.dumps(
        {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2, "stream": True, **SAME}
    )
    headers = {"authorization": f"Bearer {GOLD}", "content-type": "application/json"}

    async def run() -> list[int]:
        statuses: list[int] = []
        async with httpx.AsyncClient(timeout=30) as c:

            async def worker() -> None:
                for _ in range(50):
                    async with c.stream(
                        "POST", gateway + "/v1/completions", content=body, headers=headers
                    ) as r:
                        await r.aread()
                        statuses.append(r.status_code)

            # twice the engine's slots: requests wait in the gateway's queue and go out the
            # moment a slot frees, on the connection the last answer just left in the pool
            await asyncio.gather(*(worker() for _ in range(2 * SLOTS)))
        return statuses

    before = admin_status(gateway)["upstreams"][0]["failures"]
    statuses = asyncio.run(run())
    assert statuses.count(200) == len(statuses) == 400, {s: statuses.count(s) for s in statuses}
    up = wait_idle(gateway)["upstreams"][0]
    assert up["healthy"] and up["breaker"] == "closed"
    assert up["failures"] == before  # a closed pooled connection is no failure of the engine


def test_calibrate_measures_llama_cpp_and_writes_a_profile(
    llama: ServerProcess, gateway: str, tmp_path: Path
) -> None:
    wait_idle(gateway)
    wait_engine_idle(llama.url)
    out = tmp_path / "llama.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "velvetrope",
            "calibrate",
            "--url",
            llama.url,
            "--quick",
            "--max-seconds",
            "120",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # it read the engine's context (1,024 tokens a slot) and slots from the engine itself
    assert f"context {CTX_PER_SLOT} tokens, {SLOTS} slots" in proc.stderr
    profile = load_profile(str(out))
    assert profile.max_num_seqs == SLOTS and profile.max_model_len == CTX_PER_SLOT
    assert profile.step_base_s > 0
