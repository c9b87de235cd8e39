"""A short overload of llama.cpp: three times what it completes a second, 15% of it from
the interactive tier.  Straight to the engine every request waits its turn in llama.cpp's
queue; through the gateway the interactive requests go first, so their first tokens come
within the SLO.  Both runs happen here, one after the other, against the same engine."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.overload import measure_capacity, overload
from velvetrope.serving.launch import ServerProcess

from .conftest import BRONZE, GOLD, MODEL_NAME, SLOTS, wait_engine_idle, wait_idle

pytestmark = pytest.mark.integration

SLO_S = 2.0
MAX_TOKENS = 48


def test_under_overload_the_top_tier_gets_its_first_token_within_its_slo(
    llama: ServerProcess, gateway: str
) -> None:
    wait_idle(gateway)
    wait_engine_idle(llama.url)
    capacity = asyncio.run(
        measure_capacity(llama.url, GOLD, MODEL_NAME, MAX_TOKENS, 2 * SLOTS, seconds=3.0)
    )
    assert capacity > 0
    runs = {}
    for name, url in (("direct", llama.url), ("gateway", gateway)):
        wait_engine_idle(llama.url)
        runs[name] = asyncio.run(
            overload(
                url,
                (GOLD, BRONZE),
                MODEL_NAME,
                rate=3 * capacity,
                seconds=6.0,
                share=0.15,
                max_tokens=MAX_TOKENS,
                grace_s=10.0,
            )
        )
    via, of = runs["gateway"].top_tier_in_slo(SLO_S)
    direct, of_direct = runs["direct"].top_tier_in_slo(SLO_S)
    assert of == of_direct >= 8
    assert via > direct, f"through the gateway {via}/{of}, direct {direct}/{of}"
    assert via >= 0.75 * of, f"through the gateway only {via}/{of} within {SLO_S} s"
    wait_idle(gateway)
