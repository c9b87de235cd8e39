"""Serving :class:`~velvetrope.engine.serve.app.EngineApp` with uvicorn (uvloop, httptools).

:func:`run_engine` is what ``velvetrope engine`` runs: it builds an
:class:`~velvetrope.engine.serve.engine_config.EngineConfig` from names or objects and
blocks until SIGINT or SIGTERM; :func:`serve_engine` serves a config in the running loop.
On a signal the engine is stopped first (open streams end with an error event), then
uvicorn exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Generator
from typing import Literal

import uvicorn

from velvetrope.engine.outputs import OutputPolicy
from velvetrope.engine.profile import EngineProfile, load_profile
from velvetrope.engine.serve.app import EngineApp
from velvetrope.engine.serve.engine_config import DEFAULT_MAX_BODY_BYTES, EngineConfig
from velvetrope.errors import ConfigError
from velvetrope.openai.tokenizer import Tokenizer, get_tokenizer

__all__ = ["run_engine", "serve_engine"]


class _Server(uvicorn.Server):
    """uvicorn, with SIGINT/SIGTERM meaning "shut down and exit 0" and the engine stopped
    before uvicorn waits for open streams to finish."""

    def __init__(self, config: uvicorn.Config, app: EngineApp) -> None:
        super().__init__(config)
        self._app = app

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGINT, signal.SIGTERM)
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._app.shutdown()
        await super().shutdown(sockets)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigError(f"engine: cannot listen on {host}:{port}: {reason}") from None
    return sock


async def serve_engine(
    config: EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
    tls: tuple[str, str] | None = None,
) -> None:
    """Serve ``config`` on ``host:port`` in the running loop until SIGINT/SIGTERM.

    ``port=0`` picks a free port.  ``tls`` is ``(certfile, keyfile)`` (PEM) to serve
    HTTPS.  ``on_ready`` is called once with the base URL (``http://host:port`` or
    ``https://...``) when the socket accepts connections.  Raises
    :class:`~velvetrope.errors.ConfigError` if the address cannot be bound or the
    certificate cannot be loaded.
    """
    sock = _bind(host, port)
    app = EngineApp(config)
    uv_config = uvicorn.Config(
        app,
        http="httptools",
        interface="asgi3",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    if tls is not None:
        try:
            uv_config.load()  # the certificate is read here: a bad file is a ConfigError
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ConfigError(f"engine: cannot load the TLS certificate or key: {exc}") from None
    server = _Server(uv_config, app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started and on_ready is not None:
            bound_host, bound_port = sock.getsockname()[:2]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            scheme = "https" if tls is not None else "http"
            on_ready(f"{scheme}://{shown}:{bound_port}")
        await task
    finally:
        sock.close()


def run_engine(
    host: str = "127.0.0.1",
    port: int = 8001,
    profile: EngineProfile | str = "llama3-8b-h100",
    speed: float = 1.0,
    model_name: str = "velvetrope-sim",
    tokenizer: Tokenizer | str = "cl100k_base",
    outputs: OutputPolicy | None = None,
    *,
    scheduling: Literal["fcfs", "priority"] = "fcfs",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    faults: bool = False,
    metrics_dialect: str = "vllm",
    journal: str | None = None,
    api_key: str | None = None,
    health_route: bool = True,
    tls: tuple[str, str] | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Run an engine server in this process (blocking, on uvloop) until SIGINT/SIGTERM.

    ``profile`` and ``tokenizer`` may be given as names (:func:`load_profile`,
    :func:`get_tokenizer`); ``speed=math.inf`` is instant mode; ``journal`` is a file to
    append each request's start and end to (:mod:`velvetrope.engine.serve.journal`);
    ``api_key``, ``health_route``:
    :class:`~velvetrope.engine.serve.engine_config.EngineConfig`'s; ``tls``: ``(certfile,
    keyfile)`` to serve HTTPS.
    Returns normally after a signal; raises :class:`~velvetrope.errors.ConfigError` /
    :class:`~velvetrope.errors.PolicyError` for a bad configuration before listening.
    """
    config = EngineConfig(
        profile=load_profile(profile) if isinstance(profile, str) else profile,
        speed=speed,
        model_name=model_name,
        tokenizer=get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer,
        outputs=outputs if outputs is not None else OutputPolicy(),
        scheduling=scheduling,
        max_body_bytes=max_body_bytes,
        faults=faults,
        metrics_dialect=metrics_dialect,
        journal=journal,
        api_key=api_key,
        health_route=health_route,
    )
    coro = serve_engine(config, host, port, on_ready=on_ready, log_level=log_level, tls=tls)
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it; fall back to asyncio's loop
        asyncio.run(coro)
        return
    if sys.platform == "win32":  # pragma: no cover - uvloop does not exist there
        asyncio.run(coro)
    else:
        uvloop.run(coro)
