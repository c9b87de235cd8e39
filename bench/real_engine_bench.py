"""The gateway in front of a real engine nobody here wrote: llama.cpp's ``llama-server``.

Builds ``llama-server`` first if it is not cached (``make llama-server``; minutes on two
cores), writes the tiny random-weight Llama GGUF of ``tests/support/llama_engine.py``,
starts the engine (4 slots, continuous batching, ``--metrics``) and ``velvetrope serve`` in
front of it on 127.0.0.1, and measures, in this one run:

* ``sdk_calls_ok``: official ``openai`` SDK calls (chat and completions, whole and
  streamed with and without usage, ``n=2``) that answer the same text and usage straight to
  the engine and through the gateway;
* ``usage_match``: tokens the gateway charged over the tokens the engine's usage reports
  for the same calls (1.00: settled exactly);
* ``saturation``: ``on`` when the gateway reads the engine's load from its ``/metrics``
  (the engine's dialect), else ``off`` (served without saturation, as the gateway says);
* ``top_tier_in_slo`` / ``direct_top_tier_in_slo``: interactive requests whose first token
  came within ``--slo`` seconds during ``--seconds`` of ``--factor`` times the engine's
  measured capacity with ``--share`` of it interactive, through the gateway and straight to
  the engine (same traffic, one after the other).

Details go to stderr; stdout gets one line::

    real_engine: engine=llamacpp sdk_calls_ok=N/N usage_match=1.00 saturation=on|off \
top_tier_in_slo=W/I direct_top_tier_in_slo=W/I

Every process is stopped by its PID at the end.  Run::

    .venv/bin/python bench/real_engine_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from tests.support.llama_engine import (
    MODEL_NAME,
    gateway_config,
    start_llama_server,
    write_tiny_llama,
)
from tests.support.overload import measure_capacity, overload
from velvetrope.serving.launch import start_gateway

__all__ = ["main"]

ADMIN = "bench-admin-token"
GOLD, BRONZE = "sk-gold-bench", "sk-bronze-bench"
BURST = 10_000_000.0
SLOTS = 4
SAME = {"cache_prompt": False}


def _status(gw: str) -> dict[str, Any]:
    r = httpx.get(gw + "/admin/status", headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def _charged(gw: str) -> float:
    deadline = time.monotonic() + 30
    st = _status(gw)
    while (st["in_flight"] or st["queued"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        st = _status(gw)
    return BURST - float(st["buckets"].get("tenant:gold:tok", BURST))


Answer = tuple[tuple[str, ...], tuple[int, int] | None]


def _sdk_calls(c: openai.OpenAI) -> list[Answer]:
    """Each kind of SDK call once: per call, its texts by choice and its usage."""
    msgs: Any = [{"role": "user", "content": "Say hello to the sea"}]
    out: list[Answer] = []
    for n in (1, 2):
        kw: dict[str, Any] = {
            "model": MODEL_NAME,
            "max_tokens": 8,
            "temperature": 0.0,
            "n": n,
            "extra_body": SAME,
        }
        chat = c.chat.completions.create(messages=msgs, **kw)
        out.append((tuple(ch.message.content or "" for ch in chat.choices), _u(chat.usage)))
        done = c.completions.create(prompt="Once upon a time", **kw)
        out.append((tuple(ch.text for ch in done.choices), _u(done.usage)))
        for include in (False, True):
            opts: Any = {"include_usage": True} if include else openai.omit
            texts, usage = [""] * n, None
            for ev in c.chat.completions.create(
                messages=msgs, stream=True, stream_options=opts, **kw
            ):
                for sc in ev.choices:
                    texts[sc.index] += sc.delta.content or ""
                usage = _u(ev.usage) or usage
            out.append((tuple(texts), usage))
            texts, usage = [""] * n, None
            for ct in c.completions.create(
                prompt="Once upon a time", stream=True, stream_options=opts, **kw
            ):
                for tc in ct.choices:
                    texts[tc.index] += tc.text
                usage = _u(ct.usage) or usage
            out.append((tuple(texts), usage))
    return out


def _u(usage: Any) -> tuple[int, int] | None:
    return None if usage is None else (int(usage.prompt_tokens), int(usage.completion_tokens))


def _expected_charge(answers: list[Answer]) -> int:
    """What the engine generated for the calls (every choice, ``max_tokens`` each: the model
    never ends early), with the prompt the engine counted."""
    total = 0
    for texts, usage in answers:
        prompt = usage[0] if usage is not None else 0
        total += prompt + 8 * len(texts)
    return total


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the summary line; 0 when every check held."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="overload duration")
    ap.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    ap.add_argument("--share", type=float, default=0.15, help="interactive share")
    ap.add_argument("--slo", type=float, default=2.0, help="first-token SLO (s)")
    ap.add_argument("--max-tokens", type=int, default=48, help="per overload request")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="real-engine-") as tmp:
        model = write_tiny_llama(Path(tmp) / "tiny-llama.gguf")
        engine = start_llama_server(model, slots=SLOTS)
        gw = None
        try:
            config = gateway_config(engine.url, ADMIN, (GOLD, BRONZE), BURST, SLOTS)
            gw = start_gateway(config, Path(tmp))
            direct = openai.OpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)
            via = openai.OpenAI(base_url=gw.url + "/v1", api_key=GOLD, max_retries=0)
            with direct, via:
                straight = _sdk_calls(direct)
                before = _charged(gw.url)
                through = _sdk_calls(via)
                charged = _charged(gw.url) - before
            # a stream without usage is compared with the same call with it
            prompts = {t: u for t, u in straight if u is not None}
            answers = [(t, u or prompts.get(t)) for t, u in straight]
            ok = sum(1 for a, b in zip(straight, through, strict=True) if a == b)
            usage_match = charged / _expected_charge(answers)
            say(f"sdk calls: {ok}/{len(straight)} the same; charged {charged:.0f} tokens")

            capacity = asyncio.run(
                measure_capacity(engine.url, GOLD, MODEL_NAME, args.max_tokens, 2 * SLOTS, 4.0)
            )
            say(f"engine capacity: {capacity:.1f} requests/s of {args.max_tokens} tokens")
            slo: dict[str, tuple[int, int]] = {}
            for name, url in (("direct", engine.url), ("gateway", gw.url)):
                res = asyncio.run(
                    overload(
                        url,
                        (GOLD, BRONZE),
                        MODEL_NAME,
                        rate=args.factor * capacity,
                        seconds=args.seconds,
                        share=args.share,
                        max_tokens=args.max_tokens,
                        grace_s=2 * args.seconds,
                    )
                )
                slo[name] = res.top_tier_in_slo(args.slo)
                codes = {s: res.status.count(s) for s in sorted(set(res.status))}
                say(f"{name}: statuses {codes}, interactive in SLO {slo[name]}")
            load = _status(gw.url)["engine_load"]
            saturation = any(v.get("running") is not None for v in load.values())
        finally:
            if gw is not None:
                gw.stop()
            engine.stop()
    (w, i), (dw, di) = slo["gateway"], slo["direct"]
    print(
        f"real_engine: engine=llamacpp sdk_calls_ok={ok}/{len(straight)} "
        f"usage_match={usage_match:.2f} saturation={'on' if saturation else 'off'} "
        f"top_tier_in_slo={w}/{i} direct_top_tier_in_slo={dw}/{di}"
    )
    return 0 if ok == len(straight) and abs(usage_match - 1) < 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
