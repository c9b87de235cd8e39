"""``velvetrope top`` against a real gateway in front of a real engine.

One engine at real-time speed and one gateway (``memory://`` state, two slots, a dead
second upstream, tenant bronze limited to 6 requests a minute).  Eight long streamed
requests (one gold, seven bronze) leave the gateway in a state that holds still for tens
of seconds: 2 in flight, 5 queued, 1 rejected for bronze's rate.  Then ``top --once`` runs
as a subprocess, into a pipe and inside a pseudo-terminal of 80×24, and in the
pseudo-terminal interactively (keys: sort, filter, quit); each frame is checked against
``/admin/status`` read just before and just after it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.cells import cell_len

from tests.gateway.conftest import ADMIN, admin_status, gateway_config, status_until
from velvetrope.serving import launch
from velvetrope.serving.launch import free_port

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>78])")
BODY = {
    "model": "velvetrope-sim",
    "messages": [{"role": "user", "content": "tell me everything"}],
    "max_tokens": 4000,
    "ignore_eos": True,
    "stream": True,
}


def env(**extra: str) -> dict[str, str]:
    """This environment without a terminal size of its own, plus ``extra``."""
    out = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out.pop("VELVETROPE_ADMIN_TOKEN", None)
    return {**out, "TERM": "xterm", **extra}


def top(*args: str) -> list[str]:
    return [sys.executable, "-m", "velvetrope", "top", *args]


class Pty:
    """``velvetrope top`` in a pseudo-terminal of ``cols``×``rows``; what it wrote, as text
    without escape sequences."""

    def __init__(self, args: list[str], cols: int = 80, rows: int = 24) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env(), start_new_session=True
        )
        os.close(slave)
        self.fd = master
        self.raw = b""

    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace")).replace("\r", "")

    def read_until(self, marker: str, timeout_s: float = 20.0) -> str:
        """Read until ``marker`` shows in the text (or the end); the text."""
        deadline = time.monotonic() + timeout_s
        while marker not in self.text() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not chunk:
                    break
                self.raw += chunk
        return self.text()

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def finish(self, timeout_s: float = 20.0) -> int:
        """Read to the end; the exit status."""
        self.read_until("\0never\0", timeout_s)
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.fd)


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(gateway URL, live engine URL, dead upstream URL) with the servers running (the two
    started at once: the gateway is ready once it finds the engine healthy)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = gateway_config(
        [url, dead],
        pools=[{"name": "default", "max_in_flight": 2}],
        tenants=[
            {"name": "gold", "tier": "interactive", "limits": {"tokens_per_minute": 10**6}},
            {"name": "silver", "tier": "standard"},
            {"name": "bronze", "tier": "batch", "limits": {"requests_per_minute": 6}},
        ],
        saturation={"enabled": True, "scrape_interval_s": 0.25},
    )
    cfg["gateway"] = {"drain_grace_s": 1, "fleet": {"health_interval_s": 0.25}}
    with ThreadPoolExecutor(2) as pool:
        starts = [
            pool.submit(launch.start_engine, "--speed", "1", port=port),
            pool.submit(launch.start_gateway, cfg, tmp_path),
        ]
    try:
        engine, gw = (f.result() for f in starts)
        yield gw.url, engine.url, dead
    finally:
        for f in reversed(starts):
            if f.exception() is None:
                f.result().stop()


async def stream(c: httpx.AsyncClient, gw: str, key: str) -> None:
    """A long streamed completion, read until cancelled (or refused)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with c.stream("POST", gw + "/v1/chat/completions", json=BODY, headers=headers) as r:
        async for _ in r.aiter_bytes():
            pass


def steady(st: dict[str, Any], engine: str, dead: str) -> bool:
    """The state the test reads: all eight requests decided, the engine read since."""
    ups = {u["url"]: u for u in st["upstreams"]}
    load = st["engine_load"].get(engine) or {}
    return (
        st["in_flight"] == 2
        and st["queued"] == 5
        and load.get("running") == 2
        and load.get("waiting") == 0
        and ups[dead]["healthy"] is False
    )


def cells(lines: list[str], first: str, inside: bool = False) -> list[str]:
    """The cells (split on runs of two spaces or more) from ``first`` to the end of the one
    line that starts with it or, ``inside``, where it starts a cell (the table on the right
    of a side-by-side pair)."""
    (line,) = [ln for ln in lines if ln.startswith(first) or (inside and f"  {first}" in ln)]
    line = line[line.index(first) :]
    return [c.strip() for c in line.split("  ") if c.strip()]


def check_frame(text: str, before: dict[str, Any], gw: str, engine: str, dead: str) -> None:
    """The figures of ``text`` are ``before``'s (the status taken just before it)."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    pool = before["pools"]["default"]
    row = cells(lines, "default")
    assert (row[1], row[3].split()[-1]) == (str(pool["queued"]), "2/2"), row
    for band, b in pool["bands"].items():
        assert cells(lines, band)[1] == str(b["queued"])
    for tenant in ("gold", "bronze"):
        assert cells(lines, tenant)[1] == str(before["tenants_queued"].get(tenant, 0))
    up = {u["url"]: u for u in before["upstreams"]}
    live = cells(lines, engine.removeprefix("http://"))
    load = before["engine_load"][engine]
    assert live[2:7] == ["ok", up[engine]["breaker"], str(up[engine]["in_flight"]), "2", "0"]
    assert live[5:7] == [f"{load['running']:.0f}", f"{load['waiting']:.0f}"]
    assert cells(lines, dead.removeprefix("http://"))[2:4] == ["down", up[dead]["breaker"]]
    assert cells(lines, "rejected rate_limited", inside=True)[-1] == "1"
    host = gw.removeprefix("http://")
    shown = cells(lines, host)[:4]
    assert shown == [host, "up", str(before["queued"]), str(before["in_flight"])]


def pty_once(gw: str) -> tuple[int, str]:
    """``top --once`` in a pseudo-terminal of 80×24: its exit status and text."""
    p = Pty(top("--url", gw, "--admin-token", ADMIN, "--once", "--interval", "0.3"))
    code = p.finish()
    return code, p.text()


def pty_keys(gw: str) -> tuple[int, str]:
    """``top`` in a pseudo-terminal, sorted, filtered on "bro", quit: its exit status and
    the frame drawn once the filter was kept."""
    p = Pty(top("--url", gw, "--admin-token", ADMIN, "--interval", "0.5"))
    p.read_until("sort:queued▼")
    p.send("s")
    p.read_until("sort:bucket▼")
    p.send("/bro")
    p.read_until("filter: bro_")
    p.send("\r")
    text = p.read_until("[bro]")
    p.send("q")
    code = p.finish()
    end = text.index("[bro]")
    return code, text[text.rindex("filter: bro_", 0, end) : end]


def test_top_shows_what_admin_status_reports(busy: tuple[str, str, str]) -> None:
    gw, engine, dead = busy
    down = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> tuple[
        dict[str, Any], dict[str, Any], list[tuple[int, str, str]], tuple[tuple[int, str], ...]
    ]:
        async with httpx.AsyncClient(timeout=60) as c:
            await status_until(c, gw, lambda st: not st["upstreams"][1]["healthy"])
            tasks = [asyncio.create_task(stream(c, gw, "sk-gold-0000"))]
            tasks += [asyncio.create_task(stream(c, gw, "sk-bronze-0000")) for _ in range(7)]
            try:
                st = await status_until(c, gw, lambda st: steady(st, engine, dead))
                assert steady(st, engine, dead), st
                before = admin_status(gw)
                runs = [
                    top("--url", gw, "--url", down, "--once", "--interval", "0.3"),
                    top("--url", gw, "--admin-token", "wrong", "--once", "--interval", "0"),
                ]
                procs = [
                    await asyncio.create_subprocess_exec(
                        *args,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        env=env(VELVETROPE_ADMIN_TOKEN=ADMIN),
                    )
                    for args in runs
                ]
                in_pty = await asyncio.gather(
                    asyncio.to_thread(pty_once, gw), asyncio.to_thread(pty_keys, gw)
                )
                outs = [await p.communicate() for p in procs]
                after = admin_status(gw)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        done = [
            (p.returncode or 0, o.decode(), e.decode())
            for p, (o, e) in zip(procs, outs, strict=True)
        ]
        return before, after, done, in_pty

    before, after, piped, in_pty = asyncio.run(scenario())
    (code, out, err), (code401, out401, err401) = piped
    (code_once, once), (code_keys, filtered) = in_pty
    for key in ("in_flight", "queued", "tenants_queued", "pools"):
        if key != "pools":
            assert before[key] == after[key], key
    assert before["pools"]["default"]["bands"] == after["pools"]["default"]["bands"]

    # into a pipe: 80 columns, every row; the dead gateway makes the exit status 1
    assert (code, err) == (1, ""), err
    lines = out.splitlines()
    assert max(cell_len(ln) for ln in lines) <= 80
    check_frame(out, before, gw, engine, dead)
    assert cells(lines, down.removeprefix("http://"))[1:] == ["down", "unreachable"]
    lo, hi = before["buckets"]["tenant:bronze:req"], after["buckets"]["tenant:bronze:req"]
    shown = float(cells(lines, "bronze")[4])
    assert lo - 0.05 <= shown <= hi + 0.05, (lo, shown, hi)

    # a wrong admin token: the gateway is alive (401, not "down"), with the reason; the
    # status could not be read, so the exit status is still 1
    assert code401 == 1, err401
    assert "HTTP 401: admin token missing or wrong" in out401
    row = cells(out401.splitlines(), gw.removeprefix("http://"))
    assert row[1] == "401" and "down" not in row, row
    assert "up 1/1" in out401.splitlines()[0]
    assert "Traceback" not in err + err401

    # in a terminal of 80×24: within it, the same figures
    assert code_once == 0, once
    lines = [ln for ln in once.splitlines() if ln.strip()]
    assert len(lines) <= 24
    assert max(cell_len(ln.rstrip()) for ln in lines) <= 80
    check_frame(once, before, gw, engine, dead)

    # keys: s sorted by bucket, / filtered on "bro" (gold gone, bronze kept), q quit
    assert code_keys == 0, filtered
    assert "bronze" in filtered
    assert "gold" not in filtered
