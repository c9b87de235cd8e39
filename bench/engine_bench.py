"""Timing fidelity of ``velvetrope engine`` under 256 concurrent streams at speed 1.

Starts a real engine subprocess (profile ``llama3-8b-h100``, ``--speed 1``) on 127.0.0.1,
then runs a closed loop of ``--streams`` concurrent streaming ``/v1/completions`` clients
(aiohttp; it costs about a ninth of httpx's CPU per streamed chunk here) until
``--requests`` requests completed or ``--max-seconds`` passed.  Prompts are filler text with
lognormal lengths (median 1,000 tokens, like the Azure conversation trace); output lengths
are the engine's default draw (median 129).

For every request the client measures TTFT (request sent -> first token chunk) and e2e
(request sent -> last token chunk) and reads the model's own predictions from the final
usage chunk (``velvetrope.model_ttft_s`` / ``model_e2e_s``, wall seconds).  The drift of a
request is ``|measured - modelled| / modelled``; the report is its median over requests.

Details go to stderr; stdout gets exactly one line::

    engine: streams=256 tokens_per_s=<N> ttft_drift=<D1> e2e_drift=<D2>

Targets: ``ttft_drift <= 0.10``, ``e2e_drift <= 0.05``.  Run::

    .venv/bin/python bench/engine_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass

import aiohttp
import orjson

from velvetrope.engine.serve.bodies import FILLER_WORDS
from velvetrope.serving.launch import start_engine

__all__ = ["Sample", "main", "run_load"]

MODEL = "velvetrope-sim"


@dataclass(frozen=True, slots=True)
class Sample:
    """One completed request: measured and modelled times (wall seconds)."""

    ttft: float
    e2e: float
    model_ttft: float
    model_e2e: float
    tokens: int


def _prompt(rng: random.Random, index: int) -> str:
    n = min(4000, max(16, round(rng.lognormvariate(math.log(1000), 0.8))))
    words = [FILLER_WORDS[rng.randrange(len(FILLER_WORDS))] for _ in range(n - 2)]
    return f"request {index}:" + "".join(words)


async def _one(session: aiohttp.ClientSession, url: str, prompt: str) -> Sample | None:
    body = orjson.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 2000,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    t0 = time.perf_counter()
    first = last = 0.0
    usage: dict[str, object] | None = None
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            print(f"engine_bench: HTTP {r.status}: {await r.text()}", file=sys.stderr)
            return None
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"choices":[]' in line:
                usage = orjson.loads(line[6:])
                continue
            now = time.perf_counter()
            if not first:
                first = now
            last = now
    if usage is None or not first:
        return None
    ext = usage["velvetrope"]
    tokens = usage["usage"]
    assert isinstance(ext, dict) and isinstance(tokens, dict)
    return Sample(
        first - t0,
        last - t0,
        float(ext["model_ttft_s"]),
        float(ext["model_e2e_s"]),
        int(tokens["completion_tokens"]),
    )


async def run_load(
    base_url: str, streams: int, requests: int, max_seconds: float, seed: int = 0
) -> tuple[list[Sample], float]:
    """Closed loop of ``streams`` clients; returns the samples and the elapsed seconds."""
    url = base_url + "/v1/completions"
    rng = random.Random(seed)
    prompts = [_prompt(rng, i) for i in range(requests)]
    samples: list[Sample] = []
    issued = 0
    deadline = time.perf_counter() + max_seconds
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal issued
            while issued < requests and time.perf_counter() < deadline:
                i = issued
                issued += 1
                s = await _one(session, url, prompts[i])
                if s is not None:
                    samples.append(s)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - t0
    return samples, elapsed


def _drift(measured: list[float], modelled: list[float]) -> float:
    return statistics.median(
        abs(m - p) / p for m, p in zip(measured, modelled, strict=True) if p > 0
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the summary line; 0 on success, 1 if nothing completed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--requests", type=int, default=768, help="total requests (bounded)")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="time bound")
    ap.add_argument("--profile", default="llama3-8b-h100")
    ap.add_argument("--speed", type=float, default=1.0)
    args = ap.parse_args(argv)

    server = start_engine("--profile", args.profile, "--speed", str(args.speed))
    try:
        samples, elapsed = asyncio.run(
            run_load(server.url, args.streams, args.requests, args.max_seconds)
        )
    finally:
        server.stop()
    if not samples:
        print("engine_bench: no request completed", file=sys.stderr)
        return 1
    tokens = sum(s.tokens for s in samples)
    ttft = _drift([s.ttft for s in samples], [s.model_ttft for s in samples])
    e2e = _drift([s.e2e for s in samples], [s.model_e2e for s in samples])
    med = statistics.median
    print(
        f"engine_bench: {len(samples)} requests in {elapsed:.1f}s; median TTFT measured "
        f"{med(s.ttft for s in samples):.3f}s vs modelled "
        f"{med(s.model_ttft for s in samples):.3f}s; median e2e measured "
        f"{med(s.e2e for s in samples):.3f}s vs modelled {med(s.model_e2e for s in samples):.3f}s",
        file=sys.stderr,
    )
    print(
        f"engine: streams={args.streams} tokens_per_s={tokens / elapsed:.0f} "
        f"ttft_drift={ttft:.3f} e2e_drift={e2e:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
