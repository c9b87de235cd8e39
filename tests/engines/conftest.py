"""A real engine nobody here wrote, for the tests of this folder: llama.cpp's ``llama-server``
(:mod:`tests.support.llama_engine`; built by :mod:`harness.llama_build` on a machine that
has none) serving a tiny random-weight Llama that the session writes, and a
``velvetrope serve`` in front of it.

The gateway has two tenants: ``gold`` (interactive) and ``bronze`` (batch), each with a
token bucket that refills so slowly (0.01 token/s) that what was charged is read off its
level (:func:`charged`).  Its pool runs as many requests at once as the engine has slots.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import ADMIN, admin_status, wait_idle
from tests.support import llama_engine
from tests.support.llama_engine import MODEL_NAME, start_llama_server, write_tiny_llama
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

__all__ = [
    "ADMIN",
    "BRONZE",
    "BURST",
    "CTX_PER_SLOT",
    "GOLD",
    "MODEL_NAME",
    "SLOTS",
    "admin_status",
    "charged",
    "engine_metric",
    "gateway_config",
    "wait_engine_idle",
    "wait_idle",
]

BURST = 1_000_000.0
SLOTS = 4
CTX_PER_SLOT = 1024
GOLD = "sk-gold-0000"
BRONZE = "sk-bronze-0000"


def gateway_config(engine: str) -> dict[str, Any]:
    """``velvetrope serve``'s config in front of ``engine`` (see the module docstring)."""
    cfg = llama_engine.gateway_config(engine, ADMIN, (GOLD, BRONZE), BURST, SLOTS)
    cfg["gateway"] = {"drain_grace_s": 5}
    # llama.cpp notices that a non-streaming client left only after a second in which no
    # result of any request arrived; a scrape every second (the default) can keep that
    # second from ever passing
    cfg["policy"]["saturation"] = {"scrape_interval_s": 5.0}
    # a request whose answer never came is charged its reservation: max_tokens here
    cfg["policy"]["estimator"] = {"reserve": "max_tokens"}
    return cfg


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight Llama GGUF, written once per session."""
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def llama(tiny_model: Path) -> Iterator[ServerProcess]:
    """``llama-server`` with 4 slots of 1,024 tokens, continuous batching, ``--metrics``."""
    p = start_llama_server(tiny_model, slots=SLOTS, ctx_per_slot=CTX_PER_SLOT)
    yield p
    p.stop()


@pytest.fixture(scope="session")
def gateway(llama: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``velvetrope serve`` in front of :func:`llama`."""
    gw = launch.start_gateway(gateway_config(llama.url), tmp_path_factory.mktemp("gw"))
    yield gw.url
    gw.stop()


def charged(gw: str, tenant: str) -> float:
    """Tokens charged to ``tenant`` so far (its bucket's burst less its level), once idle;
    a bucket not used yet is not listed."""
    return BURST - float(wait_idle(gw)["buckets"].get(f"tenant:{tenant}:tok", BURST))


def engine_metric(engine: str, name: str) -> float:
    """llama.cpp's ``llamacpp:NAME`` from its ``/metrics``."""
    for line in httpx.get(engine + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"llamacpp:{name} is not in {engine}/metrics")


def wait_engine_idle(engine: str, timeout_s: float = 30.0, every_s: float = 0.01) -> float:
    """Poll the engine every ``every_s`` until no request is processing (bounded); return the
    seconds it took.  (Each poll wakes llama.cpp's request threads: see ``gateway_config``.)"""
    t0 = time.monotonic()
    while engine_metric(engine, "requests_processing") > 0:
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"llama-server still processing after {timeout_s}s")
        time.sleep(every_s)
    return time.monotonic() - t0
