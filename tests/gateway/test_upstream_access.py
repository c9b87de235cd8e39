"""Upstreams as users configure them, through HTTP: a base URL with ``/v1``, an engine with
no ``/health``, an engine that wants an API key, an ``https://`` engine with a private CA.

Real processes on loopback: ``velvetrope engine`` (with ``--api-key``, ``--no-health``,
``--ssl-certfile``), ``velvetrope serve``, the official ``openai`` client and httpx.  The
certificates come from a throwaway CA made by ``trustme``.  Every wait is a deadline poll.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trustme
import yaml

from velvetrope.config_sections import Upstream
from velvetrope.errors import ConfigError
from velvetrope.gateway.upstream.upstream_access import access_for
from velvetrope.serving import launch
from velvetrope.serving.launch import ServerProcess, free_port, start

from .conftest import admin_status, gateway_config, start_gateway

pytestmark = pytest.mark.integration

ENGINE_KEY = "engine-secret-0001"
GOLD_KEY = "sk-gold-0000"
ENGINE = ("--speed", "50", "--tokenizer", "approx")


def _engine(
    *extra: str, scheme: str = "http", verify: ssl.SSLContext | bool = True
) -> ServerProcess:
    port = free_port()
    return start(
        ["engine", "--host", "127.0.0.1", "--port", str(port), *ENGINE, *extra],
        f"{scheme}://127.0.0.1:{port}",
        "/metrics",  # open on every engine here, with or without a key or /health
        verify=verify,
    )


def _chat_through(gw: str, stream: bool) -> int:
    """One chat completion through the gateway with the official client: its tokens."""
    client = openai.OpenAI(base_url=gw + "/v1", api_key=GOLD_KEY, max_retries=0)
    try:
        msgs: list[Any] = [{"role": "user", "content": "hello there"}]
        if not stream:
            r = client.chat.completions.create(model="velvetrope-sim", messages=msgs, max_tokens=8)
            assert r.usage is not None
            return r.usage.completion_tokens
        chunks = client.chat.completions.create(
            model="velvetrope-sim",
            messages=msgs,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in chunks if c.usage is not None]
        assert len(usage) == 1
        return usage[0].completion_tokens
    finally:
        client.close()


@pytest.fixture(scope="module")
def keyed_engine() -> Iterator[ServerProcess]:
    """An engine with no ``/health`` that wants an API key on ``/v1/``."""
    p = _engine("--api-key", ENGINE_KEY, "--no-health")
    yield p
    p.stop()


def test_v1_url_api_key_and_no_health(tmp_path: Path, keyed_engine: ServerProcess) -> None:
    eng = keyed_engine.url
    assert httpx.get(eng + "/health").status_code == 404
    refused = httpx.post(eng + "/v1/chat/completions", json={})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"

    cfg = gateway_config([])
    cfg["upstreams"] = {"default": [{"url": eng + "/v1/", "api_key_env": "VR_TEST_ENGINE_KEY"}]}
    gw = start_gateway_env(tmp_path, cfg, {"VR_TEST_ENGINE_KEY": ENGINE_KEY})
    try:
        assert _chat_through(gw.url, stream=False) >= 1
        assert _chat_through(gw.url, stream=True) >= 1
        models = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {GOLD_KEY}"})
        assert [m["id"] for m in models.json()["data"]] == ["velvetrope-sim"]
        (up,) = admin_status(gw.url)["upstreams"]
        assert up["url"] == eng  # the /v1 suffix dropped: the engine's root
        assert up["healthy"] and up["health_path"] == "/v1/models"
        assert up["engine"]["dialect"] == "vllm" and up["engine"]["saturation"] == "on"
        assert admin_status(gw.url)["in_flight"] == 0
        assert ENGINE_KEY not in str(admin_status(gw.url))
        assert ENGINE_KEY not in gw.stderr_text()  # nor in what it logged
    finally:
        gw.stop()


def test_explicit_health_path(tmp_path: Path, keyed_engine: ServerProcess) -> None:
    cfg = gateway_config([])
    up = {"url": keyed_engine.url, "api_key_env": "VR_K", "health_path": "/metrics"}
    cfg["upstreams"] = {"default": [up]}
    gw = start_gateway_env(tmp_path, cfg, {"VR_K": ENGINE_KEY})
    try:
        (u,) = admin_status(gw.url)["upstreams"]
        assert u["healthy"] and u["health_path"] == "/metrics"
        assert _chat_through(gw.url, stream=True) >= 1
    finally:
        gw.stop()


def test_an_unset_api_key_env_is_refused_before_listening(tmp_path: Path) -> None:
    cfg = gateway_config([])
    cfg["upstreams"] = {"default": [{"url": "http://127.0.0.1:9", "api_key_env": "VR_UNSET_X"}]}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "VR_UNSET_X"}
    for args in (["serve", "--config", str(path)], ["config", "check", str(path)]):
        run = subprocess.run(
            [sys.executable, "-m", "velvetrope", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert run.returncode == 2, run.stderr
        assert "VR_UNSET_X" in run.stderr and "not set" in run.stderr


# -- https ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_engine(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An engine serving HTTPS with a certificate for 127.0.0.1 from a private CA."""
    d = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1")
    chain, key = d / "chain.pem", d / "key.pem"
    chain.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    key.write_bytes(cert.private_key_pem.bytes())
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    p = _engine(
        "--ssl-certfile", str(chain), "--ssl-keyfile", str(key), scheme="https", verify=client_ctx
    )
    yield p
    p.stop()


def _tls_gateway(tmp: Path, url: str, **tls: Any) -> ServerProcess:
    cfg = gateway_config([])
    cfg["upstreams"] = {"default": [{"url": url, **tls}]}
    return start_gateway(tmp, cfg, ready_path="/healthz")


def test_https_upstream_with_a_ca_bundle(
    tmp_path: Path, ca: trustme.CA, tls_engine: ServerProcess
) -> None:
    assert tls_engine.url.startswith("https://")
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    gw = _tls_gateway(tmp_path, tls_engine.url + "/v1", ca_bundle=str(bundle))
    try:
        wait_ready(gw.url)
        assert _chat_through(gw.url, stream=True) >= 1
        assert _chat_through(gw.url, stream=False) >= 1
        (up,) = admin_status(gw.url)["upstreams"]
        assert up["healthy"] and up["url"] == tls_engine.url
        assert up["engine"]["dialect"] == "vllm"  # /metrics read over TLS too
    finally:
        gw.stop()


def test_https_upstream_whose_certificate_is_not_trusted(
    tmp_path: Path, tls_engine: ServerProcess
) -> None:
    gw = _tls_gateway(tmp_path, tls_engine.url)
    try:
        (up,) = admin_status(gw.url)["upstreams"]
        assert not up["healthy"]
        assert "certificate" in str(up["last_error"])
        assert httpx.get(gw.url + "/readyz").status_code == 503
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {GOLD_KEY}"},
            json={"model": "velvetrope-sim", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "no_healthy_upstream"
    finally:
        gw.stop()
    # with verification off (a self-signed engine in a test cluster) it serves
    gw = _tls_gateway(tmp_path, tls_engine.url, tls_verify=False)
    try:
        wait_ready(gw.url)
        assert _chat_through(gw.url, stream=True) >= 1
    finally:
        gw.stop()


# -- helpers -------------------------------------------------------------------------------


def start_gateway_env(tmp: Path, cfg: dict[str, Any], env: dict[str, str]) -> ServerProcess:
    return launch.start_gateway(cfg, tmp, "/readyz", env=env)


def wait_ready(gw: str, timeout_s: float = 20.0) -> None:
    """Poll ``/readyz`` until 200 (a deadline poll; fails with the last answer)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = httpx.get(gw + "/readyz")
        if last.status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"/readyz never 200: {last and last.text}")


# -- the settings alone --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://e:8000", "http://e:8000"),
        ("http://e:8000/", "http://e:8000"),
        ("http://e:8000/v1", "http://e:8000"),
        ("https://e/engine-a/v1/", "https://e/engine-a"),
        ("http://e:8000/v1beta", "http://e:8000/v1beta"),
    ],
)
def test_the_url_is_the_engines_root(given: str, root: str) -> None:
    assert Upstream(url=given).url == root


def test_access_settings_and_their_errors(tmp_path: Path) -> None:
    a = access_for(Upstream(url="http://e:1", api_key_env="K"), environ={"K": " s3cret\n"})
    assert a.auth_line == b"Authorization: Bearer s3cret\r\n" and a.tls is None
    assert a.headers == {"Authorization": "Bearer s3cret"}
    assert a.health_paths == ("/health", "/v1/models")
    assert access_for(Upstream(url="http://e:1", health_path="/ping")).health_paths == ("/ping",)
    assert access_for(Upstream(url="https://e:1")).tls is not None
    off = access_for(Upstream(url="https://e:1", tls_verify=False)).tls
    assert off is not None and off.verify_mode == ssl.CERT_NONE and not off.check_hostname
    with pytest.raises(ConfigError, match="'K', which is not set"):
        access_for(Upstream(url="http://e:1", api_key_env="K"), environ={})
    with pytest.raises(ConfigError, match="cannot load ca_bundle"):
        access_for(Upstream(url="https://e:1", ca_bundle=str(tmp_path / "absent.pem")))
    with pytest.raises(ConfigError, match="not https"):
        access_for(Upstream(url="http://e:1", ca_bundle=str(tmp_path / "absent.pem")))
