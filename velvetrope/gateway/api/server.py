"""Running the gateway under uvicorn (uvloop, httptools) with a graceful drain.

On the first SIGTERM or SIGINT the gateway stops admitting (new requests get 503
``draining``, ``/readyz`` fails), lets queued and in-flight work finish for up to
``gateway.drain_grace_s`` seconds, then exits; after SIGTERM (an orchestrator's stop) it
keeps answering for at least ``gateway.drain_notice_s`` even when nothing is left, so a
load balancer polling ``/readyz`` sees the 503 before the listener closes.  SIGINT (a
terminal's Ctrl-C) skips the notice.  A second signal exits at once.

``workers > 1`` runs that many gateway processes on one listening socket (the kernel
spreads connections).  They share limits and slots only through shared state, so more than
one worker needs a Redis ``state.url``: with ``memory://`` every worker would enforce every
limit on its own, and :func:`serve` refuses to start.  The parent forwards exit signals to
the workers (each drains) and restarts a worker that dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

import uvicorn

from velvetrope.config import ConfigSource, GatewayConfig
from velvetrope.errors import ConfigError
from velvetrope.gateway.api.app import Gateway
from velvetrope.gateway.upstream.upstream_access import check_access
from velvetrope.serving.coalesce import HeadHoldingHttpToolsProtocol

__all__ = ["DrainingServer", "serve"]


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the gateway before stopping."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self.gateway = gateway
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gateway.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        self.gateway.start_draining()
        print("velvetrope: draining (new requests get 503)", file=sys.stderr, flush=True)
        notice = self.gateway.settings.drain_notice_s if sig == signal.SIGTERM else 0.0
        self._drain_task = asyncio.get_event_loop().create_task(self._drain(notice))

    async def _drain(self, notice_s: float) -> None:
        """Wait for the drain (at most ``drain_grace_s``), and at least ``notice_s`` since
        the signal, answering all along; then exit."""
        loop = asyncio.get_running_loop()
        until = loop.time() + notice_s
        ok = await self.gateway.drained(self.gateway.settings.drain_grace_s)
        note = "drained" if ok else "grace period over with work still in flight"
        if loop.time() < until:
            print(f"velvetrope: {note}; answering until the notice ends", file=sys.stderr)
            await asyncio.sleep(until - loop.time())
        print(f"velvetrope: {note}; exiting", file=sys.stderr, flush=True)
        self.should_exit = True


def _uvicorn_config(config: GatewayConfig, gateway: Gateway, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        gateway,
        host=config.listen.host,
        port=config.listen.port,
        loop="uvloop",
        # httptools; a response head and body: one write; a request late in full: 408
        http=HeadHoldingHttpToolsProtocol.with_request_timeout(config.gateway.request_timeout_s),
        ws="none",  # no WebSockets: a handshake is served as the plain GET it is (405)
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


def _worker(
    data: dict[str, Any], sock: socket.socket, log_level: str, source: ConfigSource | None
) -> None:
    """One worker process: its own gateway on the shared socket (reloading ``source``)."""
    config = GatewayConfig.model_validate(data)
    gateway = Gateway(config, config_source=source)
    DrainingServer(_uvicorn_config(config, gateway, log_level), gateway).run(sockets=[sock])


def serve(
    config: GatewayConfig,
    *,
    log_level: str = "warning",
    workers: int = 1,
    source: ConfigSource | None = None,
) -> None:
    """Serve ``config`` until drained after a signal, in ``workers`` processes; ``source``
    is where it was read from, reloaded on SIGHUP (:mod:`velvetrope.gateway.ops.reload`).

    Raises :class:`~velvetrope.errors.ConfigError` for ``workers > 1`` without shared state,
    and for an upstream the gateway could not reach as configured (an ``api_key_env`` not
    set, an unreadable ``ca_bundle``).
    """
    check_access(config)  # a missing engine key or CA file: refused before listening
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if workers > 1 and not config.state.shared:
        raise ConfigError(
            f"--workers {workers} needs shared state: with state.url memory:// each worker "
            "would enforce every limit and max_in_flight on its own (the fleet would get "
            f"{workers}x them).  Set state.url to a Redis URL, or run one worker."
        )
    where = f"http://{config.listen.host}:{config.listen.port}"
    if workers == 1:
        gateway = Gateway(config, config_source=source)
        server = DrainingServer(_uvicorn_config(config, gateway, log_level), gateway)
        print(f"velvetrope gateway listening on {where}", flush=True)
        server.run()
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.listen.host, config.listen.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    _supervise(config, sock, workers, log_level, where, source)


def _supervise(
    config: GatewayConfig,
    sock: socket.socket,
    workers: int,
    log_level: str,
    where: str,
    source: ConfigSource | None,
) -> None:
    """Run ``workers`` processes; forward SIGTERM/SIGINT and SIGHUP; restart any that die
    (with the last configuration that a SIGHUP found valid)."""
    ctx = multiprocessing.get_context("spawn")
    data = config.model_dump(mode="json")
    procs: list[Any] = []
    stopping: list[int] = []

    def spawn() -> Any:
        p = ctx.Process(target=_worker, args=(data, sock, log_level, source), daemon=False)
        p.start()
        return p

    def on_hup(sig: int, frame: FrameType | None) -> None:
        nonlocal data
        if source is not None:
            with contextlib.suppress(ConfigError):
                data = source.load().model_dump(mode="json")  # each worker says why not
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGHUP)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        stopping.append(sig)
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    procs.extend(spawn() for _ in range(workers))
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hup)
    print(f"velvetrope gateway listening on {where} ({workers} workers)", flush=True)
    while True:
        time.sleep(0.2)
        if stopping:
            if not any(p.is_alive() for p in procs):
                break
            continue
        for i, p in enumerate(procs):
            if not p.is_alive():
                print(f"velvetrope: worker {p.pid} exited ({p.exitcode}); restarting", flush=True)
                procs[i] = spawn()
    for p in procs:
        p.join(5)
    sock.close()
