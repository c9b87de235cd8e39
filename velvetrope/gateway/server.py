"""Running the gateway under uvicorn (uvloop, httptools) with a graceful drain.

On the first SIGTERM or SIGINT the gateway stops admitting (new requests get 503
``draining``, ``/readyz`` fails), lets queued and in-flight work finish for up to
``gateway.drain_grace_s`` seconds, then exits.  A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from types import FrameType

import uvicorn

from velvetrope.config import GatewayConfig
from velvetrope.gateway.app import Gateway

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
        self._drain_task = asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        ok = await self.gateway.drained(self.gateway.settings.drain_grace_s)
        note = "drained" if ok else "grace period over with work still in flight"
        print(f"velvetrope: {note}; exiting", file=sys.stderr, flush=True)
        self.should_exit = True


def serve(config: GatewayConfig, *, log_level: str = "warning") -> None:
    """Serve ``config`` until drained after a signal."""
    gateway = Gateway(config)
    uv = uvicorn.Config(
        gateway,
        host=config.listen.host,
        port=config.listen.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(uv, gateway)
    print(
        f"velvetrope gateway listening on http://{config.listen.host}:{config.listen.port}",
        flush=True,
    )
    server.run()
