"""Redis clients from ``state.url``.

* ``redis://[:password@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path.sock``;
* ``redis+sentinel://host:port[,host:port...]/service_name[/db]``: the master that the
  Sentinels name for ``service_name``;
* ``redis+cluster://host:port[,host:port...]``: a Redis Cluster (or Valkey cluster), from
  any of its nodes.

The password comes from the environment variable named by ``state.password_env`` when the
URL carries none.  Every key velvetrope writes carries a hash tag, so each script touches
one slot and the same scripts run on a cluster.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from velvetrope.errors import ConfigError

__all__ = ["SCHEMES", "connect", "parse_nodes"]

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")


def parse_nodes(netloc: str, default_port: int) -> list[tuple[str, int]]:
    """``host:port,host:port`` (credentials stripped) as pairs; ConfigError if malformed."""
    hosts = netloc.rsplit("@", 1)[-1]
    out: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host:
            host, port = port, ""
        try:
            out.append((host, int(port) if port else default_port))
        except ValueError:
            raise ConfigError(f"state.url: bad port in {part!r}") from None
    if not out or not all(h for h, _ in out):
        raise ConfigError(f"state.url: no hosts in {netloc!r}")
    return out


def connect(url: str, *, password: str | None, timeout_s: float, max_connections: int = 64) -> Any:
    """A redis-py asyncio client (``Redis`` or ``RedisCluster``) for ``url``.

    ``timeout_s`` bounds connecting and the wait for a free connection (at most
    ``max_connections`` per process).  Reads carry no socket timeout of their own: every
    caller bounds its call with its own budget (:class:`~velvetrope.store.call_guard.CallGuard`),
    and a per-read timeout would cost a timer per reply of every pipeline.  A connection
    whose peer vanished is found by TCP keepalive."""
    parts = urlsplit(url)
    scheme = parts.scheme
    common: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": timeout_s,
        "socket_keepalive": True,
        "decode_responses": False,
    }
    url_password = unquote(parts.password) if parts.password else None
    pw = url_password or password
    if scheme in ("redis", "rediss", "unix"):
        kw = dict(common)
        if scheme == "unix":
            del kw["socket_keepalive"]  # a TCP option
        if pw is not None and url_password is None:
            kw["password"] = pw
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, **kw
        )
        return Redis(connection_pool=pool)
    if scheme == "redis+cluster":
        nodes = [ClusterNode(h, p) for h, p in parse_nodes(parts.netloc, 6379)]
        return RedisCluster(
            startup_nodes=nodes, password=pw, max_connections=max_connections, **common
        )
    if scheme == "redis+sentinel":
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ConfigError("state.url: a Sentinel URL names the service: .../service_name")
        db = int(path[1]) if len(path) > 1 else 0
        sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
            parse_nodes(parts.netloc, 26379),
            sentinel_kwargs={"socket_timeout": timeout_s},
            password=pw,
            db=db,
            **common,
        )
        return sentinel.master_for(path[0])
    raise ConfigError(f"state.url: unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
