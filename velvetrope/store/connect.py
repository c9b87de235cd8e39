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
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import Sentinel

from velvetrope.errors import ConfigError

__all__ = ["SCHEMES", "FastPackConnection", "connect", "parse_nodes"]

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")


class _FastPack:
    """redis-py's ``pack_command`` in linear time.

    redis-py builds each command by re-joining a growing buffer once per argument; our
    scripts carry 10–30 arguments, and that packing was the largest single cost of a Redis
    call in the gateway's profile.  This builds the same RESP bytes from one list (a test
    compares both byte for byte); values other than ``bytes`` and ``str`` go through the
    client's own encoder, so its checks (no ``bool``, no ``None``) still apply.
    """

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str):
            if " " in first:
                args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        parts = [b"*%d\r\n" % len(args)]
        encode = self.encoder.encode
        for a in args:
            kind = type(a)
            b = a if kind is bytes else a.encode() if kind is str else encode(a)
            parts += (b"$%d\r\n" % len(b), b, b"\r\n")
        return [b"".join(parts)]


class FastPackConnection(_FastPack, Connection):
    """A TCP connection with linear-time command packing (and its address string, which
    redis-py formats on every read, made once)."""

    _host_error_text: str | None = None

    def _host_error(self) -> str:
        text = self._host_error_text
        if text is None:
            text = self._host_error_text = super()._host_error()
        return text


class _FastPackSSLConnection(_FastPack, SSLConnection):
    pass


class _FastPackUnixConnection(_FastPack, UnixDomainSocketConnection):
    pass


_FAST = {
    Connection: FastPackConnection,
    SSLConnection: _FastPackSSLConnection,
    UnixDomainSocketConnection: _FastPackUnixConnection,
}


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
    caller bounds its call with its own budget (:class:`~velvetrope.store.guard.GuardedState`),
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
        if pw is not None and url_password is None:
            kw["password"] = pw
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, **kw
        )
        pool.connection_class = _FAST.get(pool.connection_class, pool.connection_class)
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
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            parse_nodes(parts.netloc, 26379),
            sentinel_kwargs={"socket_timeout": timeout_s},
            password=pw,
            db=db,
            **common,
        )
        return sentinel.master_for(path[0])
    raise ConfigError(f"state.url: unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
