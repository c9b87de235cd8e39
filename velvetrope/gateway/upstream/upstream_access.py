"""How the gateway reaches one upstream: TLS, the engine's API key, the liveness path.

An :class:`UpstreamAccess` is built once per configured upstream (:func:`access_for`) and
used by every call the gateway makes to that engine: the proxied requests
(:class:`~velvetrope.gateway.upstream.httpclient.HttpClient`), the health checks, the saturation
scrapes and ``/v1/models``.

* ``https://`` upstreams are verified against ``ca_bundle`` (a PEM file) or, without one,
  the system's CA store; ``tls_verify: false`` turns verification off (a self-signed
  engine in a test cluster).
* ``api_key_env`` names the environment variable holding the engine's key (vLLM
  ``--api-key``, llama.cpp ``--api-key``, a hosted endpoint): it is sent as
  ``Authorization: Bearer KEY`` to the engine, never logged and never shown in
  ``/admin/status``.  A variable that is not set is a configuration error at start, not a
  401 on every request.
* The liveness check asks ``health_path``, or ``/health`` and, when the engine answers that
  with 404 (an engine with no such route), ``/v1/models`` from then on.

Errors are :class:`~velvetrope.errors.ConfigError` naming the upstream and the setting.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from velvetrope.config import GatewayConfig
from velvetrope.config_sections import Upstream
from velvetrope.errors import ConfigError

__all__ = ["UpstreamAccess", "access_for", "check_access"]

HEALTH_FALLBACK = "/v1/models"
"""Asked when an engine answers ``/health`` with 404: every OpenAI-compatible server has it."""


@dataclass(frozen=True, slots=True)
class UpstreamAccess:
    """What every call to one upstream carries."""

    tls: ssl.SSLContext | None = None
    """For ``https://``: the context connections are wrapped in; ``None`` for ``http://``."""
    auth_line: bytes = b""
    """``Authorization: Bearer KEY\\r\\n`` (raw header line), or empty."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The same header for aiohttp's calls (health, metrics, models)."""
    health_paths: tuple[str, ...] = ("/health", HEALTH_FALLBACK)
    """The configured path alone, or ``/health`` then its fallback."""

    @property
    def aiohttp_ssl(self) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl=`` argument: the context, or ``True`` (its default checks)."""
        return self.tls if self.tls is not None else True


def _tls(u: Upstream, where: str) -> ssl.SSLContext | None:
    if not u.url.startswith("https://"):
        if u.ca_bundle is not None:
            raise ConfigError(f"{where}: ca_bundle is set but the url is not https://")
        return None
    try:
        ctx = ssl.create_default_context(cafile=u.ca_bundle)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{where}: cannot load ca_bundle {u.ca_bundle!r}: {e}") from None
    if not u.tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def access_for(
    u: Upstream, where: str = "upstream", environ: Mapping[str, str] | None = None
) -> UpstreamAccess:
    """The access settings of ``u`` (``where`` names it in errors; ``environ`` defaults to
    this process's environment).  Raises ConfigError for an unreadable ``ca_bundle`` or an
    ``api_key_env`` that is not set."""
    env = os.environ if environ is None else environ
    auth_line = b""
    headers: dict[str, str] = {}
    if u.api_key_env is not None:
        key = env.get(u.api_key_env, "").strip()
        if not key:
            raise ConfigError(
                f"{where}: api_key_env names {u.api_key_env!r}, which is not set in the "
                "environment (the engine would answer every request 401)"
            )
        if any(c in key for c in "\r\n"):
            raise ConfigError(f"{where}: the key in {u.api_key_env!r} spans lines")
        try:
            auth_line = b"Authorization: Bearer " + key.encode("latin-1") + b"\r\n"
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: the key in {u.api_key_env!r} is not latin-1") from None
        headers["Authorization"] = f"Bearer {key}"
    paths = (u.health_path,) if u.health_path is not None else ("/health", HEALTH_FALLBACK)
    return UpstreamAccess(_tls(u, where), auth_line, headers, paths)


def check_access(config: GatewayConfig, environ: Mapping[str, str] | None = None) -> None:
    """Build every upstream's access settings once (``config check`` and start-up): the
    first problem is raised as ConfigError."""
    for pool, ups in config.upstreams.items():
        for i, u in enumerate(ups):
            access_for(u, f"upstreams.{pool}[{i}] ({u.url})", environ)
