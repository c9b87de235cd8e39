"""The engine's request load: the held count, its peak gauge and the journal.

Unit tests drive :class:`~velvetrope.engine.serve.journal.RequestLoad` with a manual clock;
one integration test runs ``velvetrope engine --journal`` and checks the journal against
the engine's own counters, then SIGKILLs it mid-request and reads what it left.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.servers import EngineServer, run_engine
from velvetrope.clock import ManualClock
from velvetrope.engine.serve.journal import RequestLoad

MODEL = "velvetrope-sim"


@dataclass
class Choice:
    """What the journal reads of a sequence."""

    finished: bool = False
    finished_wall: float | None = None
    first_token_wall: float | None = None
    tokens_delivered: int = 0
    pending_tokens: int = 0
    state: str = "aborted"


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def test_the_peak_is_the_most_held_at_once(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    load = RequestLoad(clock)
    for rid in ("a", "b"):
        load.begin(rid, None, clock.now(), 5, True)
    load.end("a", 5, [Choice(True, 100.0, 100.0, 3, 0, "finished")])
    load.begin("c", None, clock.now(), 5, True)
    assert (load.in_flight, load.peak) == (2, 2)
    load.begin("d", None, clock.now(), 5, True)
    assert (load.in_flight, load.peak) == (3, 3)
    for rid in ("b", "c", "d"):
        load.end(rid, 5, [Choice()])
    assert (load.in_flight, load.peak) == (0, 3)


def test_the_journal_records_when_and_what(tmp_path: Path) -> None:
    clock = ManualClock(10.0)
    path = tmp_path / "j.jsonl"
    load = RequestLoad(clock, str(path))
    load.begin("fin", "r-1", 9.5, 7, True)
    load.begin("cut", "r-2", 9.75, 4, False)
    load.begin("off", None, 9.875, 3, True)
    clock.advance(2.0)  # the handlers let go at 12.0; the finished one finished before
    two = [Choice(True, 11.0, 10.5, 5, 0, "finished"), Choice(True, 11.5, 10.25, 2, 0, "finished")]
    load.end("fin", 7, two)
    load.end("cut", 4, [Choice(False, None, 10.5, 6, 2, "aborted")])
    load.end("off", 3, [Choice(False, None, None, 0, 0, "closed")])
    got = lines(path)  # written through: readable before close
    load.close()
    assert got[:3] == [
        {"ev": "start", "id": "fin", "request_id": "r-1", "t": 9.5, "prompt": 7, "stream": True},
        {"ev": "start", "id": "cut", "request_id": "r-2", "t": 9.75, "prompt": 4, "stream": False},
        {"ev": "start", "id": "off", "request_id": None, "t": 9.875, "prompt": 3, "stream": True},
    ]
    fin, cut, off = got[3:]
    # finished: at its last choice's finish, both choices' prompts prefilled
    assert fin == {"ev": "end", "id": "fin", "t": 11.5, "state": "finished", "prefilled": 14,
                   "generated": 7, "taken": 7}  # fmt: skip
    # aborted: when let go; 2 of its 6 tokens were produced after its client had gone
    assert cut == {"ev": "end", "id": "cut", "t": 12.0, "state": "aborted", "prefilled": 4,
                   "generated": 6, "taken": 4}  # fmt: skip
    assert off == {"ev": "end", "id": "off", "t": 12.0, "state": "closed", "prefilled": 0,
                   "generated": 0, "taken": 0}  # fmt: skip


def _body(request_id: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"tell me about {request_id}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "request_id": request_id,
    }


def _gauges(e: EngineServer) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(e.url + "/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            out[head.split("{", 1)[0]] = float(value)
    return out


def _poll(pred: Any, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "not reached in time"
        time.sleep(0.02)


@pytest.mark.integration
def test_an_engine_journal_adds_up_to_its_counters_and_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "engine.jsonl"
    with run_engine(speed=5, journal=str(path)) as e:
        # three streams held at once (each 1,500 tokens: seconds at 5x), then one whole
        threads = [
            threading.Thread(
                target=httpx.post,
                args=(e.url + "/v1/chat/completions",),
                kwargs={"json": _body(f"s{i}", 1500, True), "timeout": 60},
            )
            for i in range(3)
        ]
        for t in threads:
            t.start()
        _poll(lambda: _gauges(e)["velvetrope_engine_requests_in_flight"] == 3)
        for t in threads:
            t.join()
        whole = httpx.post(e.url + "/v1/chat/completions", json=_body("w", 5, False), timeout=30)
        assert whole.status_code == 200
        # a client that hangs up mid-stream
        port = int(e.url.rsplit(":", 1)[1])
        raw = orjson.dumps(_body("cut", 2000, True))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
            ).encode()
            sock.sendall(head + raw)
            seen = b""
            while b"data:" not in seen:  # a token or more came: hang up mid-stream
                seen += sock.recv(4096)
        _poll(lambda: _gauges(e)["velvetrope_engine_requests_in_flight"] == 0)
        m = _gauges(e)
        assert m["velvetrope_engine_requests_peak"] == 3
        got = lines(path)
        starts = {x["request_id"]: x for x in got if x["ev"] == "start"}
        ends = {x["id"]: x for x in got if x["ev"] == "end"}
        assert set(starts) == {"s0", "s1", "s2", "w", "cut"}
        assert set(ends) == {x["id"] for x in starts.values()}
        cut = ends[starts["cut"]["id"]]
        assert cut["state"] == "aborted" and 0 < cut["taken"] <= cut["generated"] < 2000
        assert ends[starts["w"]["id"]]["generated"] == 5
        assert ends[starts["w"]["id"]]["id"] == whole.json()["id"]
        for x in starts.values():  # each ends after it starts, on the engine's clock
            assert ends[x["id"]]["t"] > x["t"]
        assert sum(x["prefilled"] + x["generated"] for x in ends.values()) == (
            m["vllm:prompt_tokens_total"] + m["vllm:generation_tokens_total"]
        )
        # SIGKILL mid-request: its start line is there, its end never comes
        failed: list[BaseException] = []

        def dying() -> None:
            try:
                httpx.post(
                    e.url + "/v1/chat/completions", json=_body("dies", 5000, False), timeout=30
                )
            except httpx.HTTPError as exc:
                failed.append(exc)

        t = threading.Thread(target=dying)
        t.start()
        _poll(lambda: b'"dies"' in path.read_bytes())
        e.process.proc.send_signal(signal.SIGKILL)
        e.process.proc.wait(10)
        t.join()
        assert len(failed) == 1  # the engine died under it
        after = lines(path)
        assert [x["ev"] for x in after if x.get("request_id") == "dies"] == ["start"]
        assert len(after) == len(got) + 1
