"""Starting velvetrope servers as subprocesses on loopback (demo, benchmarks, tests).

:func:`start` runs ``python -m velvetrope ARGS`` (or another program given as ``program``),
waits until a readiness URL answers 200 (bounded; on failure the error shows the process's
stderr) and returns a :class:`ServerProcess` that stops it by its own PID.
:func:`vm_rss_mb` and :func:`open_fds` read a process's resident memory and open file
descriptors from ``/proc`` (Linux), for the benchmarks and harnesses that watch a server.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

__all__ = [
    "ServerProcess",
    "free_port",
    "open_fds",
    "start",
    "start_engine",
    "start_gateway",
    "vm_rss_mb",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vm_rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` in MiB, from ``/proc/<pid>/status`` (``VmRSS``).

    Raises OSError when the process is gone, RuntimeError when the file has no VmRSS."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` holds open (``/proc/<pid>/fd``); OSError
    when the process is gone or not ours."""
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class ServerProcess:
    """A server subprocess, its base URL and its stderr log file."""

    proc: subprocess.Popen[bytes]
    url: str
    log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGINT, then SIGKILL after ``timeout_s``; close the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    args: list[str],
    url: str,
    ready_path: str,
    timeout_s: float = 60.0,
    *,
    program: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> ServerProcess:
    """Start ``PROGRAM ARGS`` and wait until ``url + ready_path`` answers 200 (an
    ``https://`` URL's certificate checked against ``verify``: a context, or httpx's
    default).

    ``program`` is ``python -m velvetrope`` (this interpreter) unless given: e.g. the
    ``velvetrope`` console script, or ``python -c CODE``.  ``env`` is added to this
    process's environment.  Raises RuntimeError (with the process's stderr) if it exits or
    is not ready within ``timeout_s``; the process is stopped then.
    """
    log = tempfile.TemporaryFile()  # noqa: SIM115 (owned by ServerProcess, closed in stop)
    argv = [*(program or (sys.executable, "-m", "velvetrope")), *args]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    sp = ServerProcess(proc, url, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = sp.stderr_text()
            sp.stop()
            raise RuntimeError(f"{' '.join(argv)} exited ({proc.returncode}): {err}")
        try:
            if httpx.get(url + ready_path, timeout=1.0, verify=verify).status_code == 200:
                return sp
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    err = sp.stderr_text()
    sp.stop()
    raise RuntimeError(f"{' '.join(argv)} not ready after {timeout_s}s: {err}")


def start_engine(
    *extra: str, port: int | None = None, env: Mapping[str, str] | None = None
) -> ServerProcess:
    """``velvetrope engine`` on loopback with ``extra`` options (``--speed``, ...); ``env``
    is added to its environment."""
    port = port or free_port()
    return start(
        ["engine", "--host", "127.0.0.1", "--port", str(port), *extra],
        f"http://127.0.0.1:{port}",
        "/health",
        env=env,
    )


def start_gateway(
    config: dict[str, Any],
    directory: Path,
    ready_path: str = "/readyz",
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """``velvetrope serve`` with ``config`` (a dict; ``listen.port`` chosen if absent);
    ``env`` is added to its environment."""
    listen = config.setdefault("listen", {})
    listen.setdefault("host", "127.0.0.1")
    if not listen.get("port"):
        listen["port"] = free_port()
    path = directory / f"gateway-{listen['port']}.yaml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{listen['port']}"
    return start(["serve", "--config", str(path)], url, ready_path, env=env)
