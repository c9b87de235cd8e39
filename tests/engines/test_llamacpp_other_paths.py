"""The paths the gateway does not meter, in front of llama.cpp's ``llama-server`` (which
serves ``/tokenize`` and ``/detokenize`` in its own shapes): refused with 404 by default,
and with ``gateway.other_paths: pass`` answered as the engine answers straight, each call
charged the fixed cost."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess

from .conftest import GOLD, charged, gateway_config

pytestmark = pytest.mark.integration

COST = 2
KEY = {"Authorization": f"Bearer {GOLD}"}


@pytest.fixture(scope="module")
def passing(llama: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = gateway_config(llama.url)
    cfg["gateway"].update(other_paths="pass", other_paths_cost_tokens=COST)
    gw = launch.start_gateway(cfg, tmp_path_factory.mktemp("passing"))
    yield gw.url
    gw.stop()


def test_llamas_tokenize_is_refused_by_default(llama: ServerProcess, gateway: str) -> None:
    assert httpx.post(llama.url + "/tokenize", json={"content": "hi"}).status_code == 200
    r = httpx.post(gateway + "/tokenize", json={"content": "hi"}, headers=KEY)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_llamas_tokenize_and_detokenize_pass_at_the_fixed_cost(
    llama: ServerProcess, passing: str
) -> None:
    body = {"content": "The quick brown fox jumps over the lazy dog"}
    want = httpx.post(llama.url + "/tokenize", json=body, timeout=30).json()
    assert want["tokens"]
    before = charged(passing, "gold")
    got = httpx.post(passing + "/tokenize", json=body, headers=KEY, timeout=30)
    assert got.status_code == 200 and got.json() == want
    back = httpx.post(
        passing + "/detokenize", json={"tokens": want["tokens"]}, headers=KEY, timeout=30
    )
    direct = httpx.post(llama.url + "/detokenize", json={"tokens": want["tokens"]}, timeout=30)
    assert back.status_code == 200 and back.json() == direct.json()
    assert charged(passing, "gold") - before == pytest.approx(2 * COST, abs=0.5)
