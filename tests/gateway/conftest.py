"""Real servers on loopback for the gateway tests: ``velvetrope engine`` and ``serve``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.prometheus import metric_sum
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess, free_port

__all__ = [
    "NOT_THE_ENGINES_COUNT",
    "Proc",
    "admin_status",
    "charged",
    "completion_body",
    "free_port",
    "metered_config",
    "metric",
    "start_engine",
    "start_gateway",
    "start_together",
    "status_until",
    "wait_idle",
]

ADMIN = "test-admin-token"


Proc = ServerProcess


def start_engine(speed: float = 50.0, *extra: str) -> ServerProcess:
    return launch.start_engine("--speed", str(speed), *extra)


def start_together(*starts: Callable[[], ServerProcess]) -> list[ServerProcess]:
    """The servers ``starts`` start, up to six at a time (their start-ups overlap; more at
    once would only queue for the same cores while each one's readiness deadline runs), in
    order.  If one fails to start, the others are stopped and its error raised."""
    with ThreadPoolExecutor(min(len(starts), 6)) as ex:
        futures = [ex.submit(start) for start in starts]
    if any(f.exception() is not None for f in futures):
        for f in futures:  # stop whatever did start, then say why one did not
            if f.exception() is None:
                f.result().stop()
        next(f for f in futures if f.exception() is not None).result()
    return [f.result() for f in futures]


def completion_body(
    max_tokens: int = 4, stream: bool = False, prompt: str = "hello world"
) -> dict[str, Any]:
    """A completion request for ``velvetrope engine``'s model of exactly ``max_tokens``
    output tokens (``ignore_eos``)."""
    return {
        "model": "velvetrope-sim",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def gateway_config(engines: list[str], **policy: Any) -> dict[str, Any]:
    """A config with tenants gold (interactive), silver (standard), bronze (batch)."""
    base: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "admin_token": ADMIN,
        "api_keys": [
            {"tenant": "gold", "key": "sk-gold-0000"},
            {"tenant": "silver", "key": "sk-silver-0000"},
            {"tenant": "bronze", "key": "sk-bronze-0000"},
        ],
        "policy": {
            "preset": "hybrid",
            "tiers": [{"name": "interactive"}, {"name": "standard"}, {"name": "batch"}],
            "tenants": [
                {"name": "gold", "tier": "interactive"},
                {"name": "silver", "tier": "standard", "allowed_tiers": ["interactive"]},
                {"name": "bronze", "tier": "batch"},
            ],
            "pools": [{"name": "default", "max_in_flight": 32}],
        },
        "upstreams": {"default": [{"url": u} for u in engines]},
        "gateway": {"drain_grace_s": 20},
    }
    for k, v in policy.items():
        base["policy"][k] = v
    return base


METERED_BURST = 1_000_000.0
"""The token burst of every tenant of :func:`metered_config`."""


NOT_THE_ENGINES_COUNT = "approx:1"
"""A gateway tokenizer that counts a character a token, where ``velvetrope engine`` counts
about four: a gateway that settles what the engine reported shows it (its own count would
be some four times larger)."""


def metered_config(engines: list[str], **gateway: Any) -> dict[str, Any]:
    """:func:`gateway_config` with every tenant's token bucket refilling so slowly (0.01
    token/s) that what was charged is read off its level (:func:`charged`), and these
    ``gateway`` settings."""
    cfg = gateway_config(engines)
    for t in cfg["policy"]["tenants"]:
        t["limits"] = {"tokens_per_minute": 0.6, "token_burst": METERED_BURST}
    cfg["gateway"].update(gateway)
    return cfg


def charged(gw: str, tenant: str) -> float:
    """Tokens charged to ``tenant`` of a :func:`metered_config` gateway so far, once idle."""
    level = wait_idle(gw)["buckets"].get(f"tenant:{tenant}:tok", METERED_BURST)
    return METERED_BURST - float(level)


def start_gateway(tmp: Path, config: dict[str, Any], ready_path: str = "/readyz") -> ServerProcess:
    return launch.start_gateway(config, tmp, ready_path)


@pytest.fixture(scope="session")
def engine() -> Iterator[str]:
    """A fast engine (50x real time) shared by the tests."""
    p = start_engine(50.0)
    yield p.url
    p.stop()


def admin_status(gw: str) -> dict[str, Any]:
    r = httpx.get(gw + "/admin/status", headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


async def status_until(
    c: httpx.AsyncClient,
    gw: str,
    ok: Callable[[dict[str, Any]], bool],
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    """Poll ``/admin/status`` until ``ok(status)`` (bounded); return the last status."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await c.get(gw + "/admin/status", headers={"Authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        st: dict[str, Any] = r.json()
        if ok(st) or time.monotonic() >= deadline:
            return st
        await asyncio.sleep(0.02)


async def stream_to_end(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> None:
    """Stream one completion of ``prompt`` (``max_tokens`` tokens, no early stop) from
    ``velvetrope engine``'s model through ``client`` and read it to its end."""
    stream = await client.completions.create(
        model="velvetrope-sim",
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for _ in stream:
        pass


def wait_idle(gw: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """Poll /admin/status until nothing is queued or in flight (bounded)."""
    deadline = time.monotonic() + timeout_s
    st = admin_status(gw)
    while time.monotonic() < deadline:
        st = admin_status(gw)
        if st["queued"] == 0 and st["in_flight"] == 0 and st["waiting_requests"] == 0:
            return st
        time.sleep(0.05)
    raise AssertionError(f"gateway not idle after {timeout_s}s: {st}")


def metric(gw: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return metric_sum(httpx.get(gw + "/metrics").text, name, **labels)
