"""Requests no SDK sends, against a real gateway and engine on loopback (issue 32's
fuzzing): every answer is OpenAI's error shape, nothing hangs and nothing is charged.

* a content part whose ``text`` is not a string, JSON nested past the limit: 400 naming the
  field (they were uvicorn's plain-text 500 and a 500);
* a body that does not arrive within ``gateway.request_timeout_s``: 408, the connection
  closed, nothing reserved or counted (the body is read before admission);
* bytes that are not HTTP: the parser's 400, in OpenAI's shape too;
* a WebSocket handshake: answered as the plain GET it is (405), not uvicorn's plain-text 500.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from velvetrope.openai.request import MAX_JSON_DEPTH

from .conftest import gateway_config, metric, start_gateway, wait_idle

pytestmark = pytest.mark.integration

KEY = "sk-gold-0000"
GOLD = {"Authorization": f"Bearer {KEY}"}
BURST = 50_000.0
SLOW = {"tokens_per_minute": 0.6, "token_burst": BURST}
"""A bucket that refills so slowly (0.01 token/s) that any charge shows on its level."""
BODY_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def gw(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway whose gold tenant has a slow bucket and whose bodies must arrive in 0.5 s."""
    cfg = gateway_config([engine])
    cfg["policy"]["tenants"][0]["limits"] = SLOW
    cfg["gateway"]["request_timeout_s"] = BODY_TIMEOUT_S
    p = start_gateway(tmp_path_factory.mktemp("hostile"), cfg)
    yield p.url
    p.stop()


def _error(r: httpx.Response) -> dict[str, Any]:
    """The error object of an answer in OpenAI's shape (asserted)."""
    assert r.headers["content-type"] == "application/json"
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param"}
    return err


def test_a_text_part_whose_text_is_not_a_string_is_a_400_naming_it(gw: str) -> None:
    for text in (None, 5, ["a"], {"a": 1}):
        body = {
            "model": "velvetrope-sim",
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        }
        r = httpx.post(gw + "/v1/chat/completions", headers=GOLD, json=body)
        assert r.status_code == 400, r.text
        err = _error(r)
        assert err["param"] == "messages[0].content[0].text"
        assert err["type"] == "invalid_request_error"
        assert err["code"] == ("missing_required_parameter" if text is None else "invalid_type")
    assert wait_idle(gw)["in_flight"] == 0


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 5000])
def test_json_nested_past_the_limit_is_a_400(gw: str, depth: int) -> None:
    levels = depth - 1  # under a top-level member of the body (level 1)
    deep = "[" * levels + "]" * levels
    for stream in (b"false", b"true"):  # a stream's body is written again for the engine
        raw = b'{"model":"velvetrope-sim","prompt":"x","stream":%s,"x":%s}' % (
            stream,
            deep.encode(),
        )
        r = httpx.post(gw + "/v1/completions", headers=GOLD, content=raw)
        assert r.status_code == 400, r.text
        err = _error(r)
        assert err["code"] == "invalid_value"
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in err["message"]
        assert err["param"] == ("x" if depth < 1024 else None)


def _exchange(gw: str, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the gateway closes it (a hang fails
    the test after 10 s, far beyond any timeout under test)."""
    host, port = gw.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def _parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_costs_nothing(gw: str) -> None:
    served = {"model": "velvetrope-sim", "prompt": "x", "max_tokens": 2}
    assert httpx.post(gw + "/v1/completions", headers=GOLD, json=served).status_code == 200
    level_before = wait_idle(gw)["buckets"]["tenant:gold:tok"]
    assert level_before < BURST - 2  # the bucket is in use, and slow to refill
    requests_before = metric(gw, "velvetrope_requests_total")
    partial = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        b'{"model":"velvetrope-sim","messages":[{"role":"user",'
    )
    status, headers, body = _parse(_exchange(gw, partial))  # returns: the gateway closed it
    assert status == 408
    assert headers["connection"] == "close"
    err = orjson.loads(body)["error"]
    assert (err["code"], err["type"], err["param"]) == (
        "request_timeout",
        "invalid_request_error",
        None,
    )
    assert str(BODY_TIMEOUT_S) in err["message"]
    level_after = wait_idle(gw)["buckets"]["tenant:gold:tok"]
    assert level_before <= level_after < level_before + 1  # refilled a little, not charged
    assert metric(gw, "velvetrope_requests_total") == requests_before  # never admitted


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthoriz"],
    ids=["silent-connection", "half-a-head"],
)
def test_a_head_that_does_not_arrive_in_time_is_a_408(gw: str, sent: bytes) -> None:
    """A connection that stays silent, or stalls inside a request's head (before any
    request exists for the application), is answered 408 and closed all the same."""
    status, headers, body = _parse(_exchange(gw, sent))
    assert (status, headers["connection"]) == (408, "close")
    assert orjson.loads(body)["error"]["code"] == "request_timeout"


def test_keep_alive_requests_each_get_the_whole_timeout(gw: str) -> None:
    """The deadline runs from each request's first byte: requests on one connection spread
    over more than the timeout are all served."""
    served = {"model": "velvetrope-sim", "prompt": "x", "max_tokens": 2}
    with httpx.Client(base_url=gw, headers=GOLD) as c:
        for _ in range(3):
            assert c.post("/v1/completions", json=served).status_code == 200
            time.sleep(BODY_TIMEOUT_S * 0.6)
        assert c.post("/v1/completions", json=served).status_code == 200


def test_bytes_that_are_not_http_get_a_400_in_openais_shape(gw: str) -> None:
    for junk in (b"HELLO\r\n\r\n", b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n"):
        status, headers, body = _parse(_exchange(gw, junk))
        assert status == 400
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        err = orjson.loads(body)["error"]
        assert (err["code"], err["type"]) == ("invalid_http_request", "invalid_request_error")


def test_a_websocket_upgrade_is_answered_as_the_get_it_is(gw: str) -> None:
    upgrade = (
        b"GET /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    status, headers, body = _parse(_exchange(gw, upgrade))
    assert status == 405  # no WebSockets here (was uvicorn's plain-text 500)
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
