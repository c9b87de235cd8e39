"""One pipelined RESP connection to Redis: commands go out as they are issued, replies come
back in the same order and resolve their callers' futures as they arrive.

This is the transport of :class:`~velvetrope.store.pipeline.AutoPipeline` (what ioredis
does with one connection).  Compared with a redis-py pipeline per batch, it takes no pool
connection, no lock, no task and no coroutine per reply: a batch is one ``write``, and the
replies are parsed by hiredis in ``data_received`` and handed to their futures there.
Several batches may be in flight on the connection at once.

Contract:

* :meth:`Wire.send` writes already-packed commands, one :class:`Pending` per command, in
  order.  Each hears ``reply(r)`` with its reply, an error reply (``-ERR ...``) included,
  as the matching redis-py exception instance (``NoScriptError`` for ``NOSCRIPT``, ...), so
  that it decides; or ``fail(e)`` with redis-py's ``ConnectionError`` when the connection
  is lost first (or cannot be made).  The next :meth:`Wire.send` connects anew.
* Connecting (TCP, TLS, Unix socket, or the master a Sentinel names) authenticates and
  selects the database from the redis-py client's own settings, within ``connect_timeout``.
* :func:`pack` builds the RESP bytes of one command.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

__all__ = ["Pending", "Wire", "pack"]


_SENDABLE = (str, bytes, int, float)


def pack(*args: object) -> bytes:
    """The RESP encoding of the command ``args`` (``bytes``, ``str``, ``int``, ``float``;
    numbers as ``repr`` writes them).  hiredis packs in C, about 2.5x faster than Python."""
    try:
        packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # stub: 1-tuple
        return packed
    except TypeError:
        bad = next((a for a in args if isinstance(a, bool) or not isinstance(a, _SENDABLE)), None)
        raise TypeError(f"cannot send {type(bad).__name__} to Redis: {bad!r}") from None


class Pending(Protocol):
    """A command sent and not yet answered."""

    def reply(self, r: Any) -> None: ...

    def fail(self, e: Exception) -> None: ...


class _Waiter:
    """A :class:`Pending` as a future (for the handshake)."""

    __slots__ = ("fut",)

    def __init__(self) -> None:
        self.fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def reply(self, r: Any) -> None:
        if not self.fut.done():
            self.fut.set_result(r)

    def fail(self, e: Exception) -> None:
        if not self.fut.done():
            self.fut.set_exception(e)


class _Protocol(asyncio.Protocol):
    """Replies, in order, to the commands waiting for them."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )
        self.pending: deque[Pending] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        try:
            while True:
                r = reader.gets()
                if r is False:
                    return
                pending.popleft().reply(r)
        except (InvalidResponse, IndexError) as e:  # a reply nobody asked for, or garbage
            self._fail(RedisConnectionError(f"Redis protocol error: {e!r}"))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, err: Exception) -> None:
        self.lost = True
        pending = self.pending
        while pending:
            pending.popleft().fail(err)


class Wire:
    """A lazily (re)connected pipelined connection with the settings of redis-py ``client``
    (a ``redis.asyncio.Redis`` on a plain, TLS, Unix-socket or Sentinel pool)."""

    def __init__(self, client: Any, connect_timeout: float = 5.0) -> None:
        self.pool = client.connection_pool
        self.connect_timeout = (
            self.pool.connection_kwargs.get("socket_connect_timeout") or connect_timeout
        )
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._waiting: set[asyncio.Task[None]] = set()  # sends waiting for a connection

    def pending(self) -> list[Pending]:
        """Commands written and not yet answered."""
        p = self._proto
        return [] if p is None else list(p.pending)

    def send(self, payload: bytes, calls: Sequence[Pending]) -> None:
        """Write ``payload``, the packed commands of ``calls`` (in order)."""
        p = self._proto
        if p is not None and not p.lost and p.transport is not None:
            p.pending.extend(calls)
            p.transport.write(payload)
        else:
            task = asyncio.get_running_loop().create_task(self._send_when_connected(payload, calls))
            self._waiting.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._waiting.discard)

    async def _send_when_connected(self, payload: bytes, calls: Sequence[Pending]) -> None:
        try:
            p = await self._connect()
        except Exception as e:  # every caller hears why
            err = e if isinstance(e, RedisConnectionError) else RedisConnectionError(repr(e))
            for c in calls:
                c.fail(err)
            return
        if p.lost or p.transport is None:
            for c in calls:
                c.fail(RedisConnectionError("connection to Redis lost"))
            return
        p.pending.extend(calls)
        p.transport.write(payload)

    async def _connect(self) -> _Protocol:
        """The live protocol, connecting once for all callers that need it now."""
        p = self._proto
        if p is not None and not p.lost:
            return p
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
            # its callers may all be gone (cancelled) when it fails: nobody else hears it
            self._connecting.add_done_callback(_heard)
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        kw = self.pool.connection_kwargs
        conn_class = self.pool.connection_class
        try:
            async with asyncio.timeout(self.connect_timeout):
                if issubclass(conn_class, UnixDomainSocketConnection):
                    _, p = await loop.create_unix_connection(_Protocol, kw["path"])
                else:
                    host, port = await self._address(kw)
                    ctx: ssl.SSLContext | None = None
                    if issubclass(conn_class, SSLConnection):
                        ctx = conn_class(**kw).ssl_context.get()
                    _, p = await loop.create_connection(_Protocol, host, port, ssl=ctx)
                await self._handshake(p, kw)
        except TimeoutError:
            raise RedisConnectionError("connecting to Redis timed out") from None
        except OSError as e:
            raise RedisConnectionError(f"cannot connect to Redis: {e}") from None
        self._proto = p
        return p

    async def _address(self, kw: dict[str, Any]) -> tuple[str, int]:
        master = getattr(self.pool, "get_master_address", None)
        if master is not None:  # a Sentinel pool: ask the Sentinels for the master
            host, port = await master()
            return str(host), int(port)
        return str(kw.get("host", "localhost")), int(kw.get("port", 6379))

    @staticmethod
    async def _handshake(p: _Protocol, kw: dict[str, Any]) -> None:
        cmds: list[Sequence[object]] = []
        password, username = kw.get("password"), kw.get("username")
        if password:
            cmds.append(("AUTH", username, password) if username else ("AUTH", password))
        if kw.get("db"):
            cmds.append(("SELECT", int(kw["db"])))
        if not cmds:
            return
        waiters = [_Waiter() for _ in cmds]
        p.pending.extend(waiters)
        assert p.transport is not None
        p.transport.write(b"".join(pack(*c) for c in cmds))
        for c, w in zip(cmds, waiters, strict=True):
            r = await w.fut
            if isinstance(r, Exception):
                p.transport.close()
                raise RedisConnectionError(f"Redis refused {c[0]}: {r}")

    async def close(self) -> None:
        """Close the connection (pending calls fail)."""
        p = self._proto
        self._proto = None
        if p is not None and p.transport is not None:
            p.transport.close()
            await asyncio.sleep(0)


def _heard(t: asyncio.Future[_Protocol]) -> None:
    """Mark the connection attempt's failure as heard (see :meth:`Wire._connect`)."""
    if not t.cancelled():
        t.exception()
