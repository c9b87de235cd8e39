"""A small HTTP/1.1 client for the proxy's hot path: pooled keep-alive connections,
httptools parsing, true streaming, and immediate close on cancel.

Why not aiohttp or httpx: on this path the client's own per-request Python cost is most of
what the gateway adds (measured in ``bench/gateway_bench.py``); this client does only what
proxying to an OpenAI-compatible engine needs.  It speaks ``http://`` and ``https://``
(HTTP/1.1 over TLS, verified against the context given).

Contract:

* :meth:`HttpClient.post` returns a :class:`Response` once the status line and headers
  arrived.  Read it with :meth:`Response.read` or iterate :meth:`Response.chunks`; the
  body is de-chunked.  Always :meth:`Response.close` it (or use ``async with``): a fully
  read keep-alive response returns its connection to the pool, anything else closes it —
  which is how the upstream learns at once that a client went away.
* Errors: :class:`~velvetrope.errors.UpstreamUnreachable` when the connection cannot be
  made (nothing was sent), :class:`~velvetrope.errors.UpstreamTimeout` when connecting or
  waiting for the next bytes takes longer than the timeouts, and
  :class:`~velvetrope.errors.UpstreamError` when the connection breaks.
* A pooled connection the server closed is never what fails a request: a request on a
  reused idle connection that ends with no byte of an answer is sent again on a *new*
  connection (never on another pooled one, which may be just as stale: llama.cpp's server
  closes its connection after every streamed response while advertising keep-alive).  Only
  what happens on the new connection can fail the request, so a stale connection never
  counts against an engine's health or breaker.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools

from velvetrope.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable

__all__ = ["HttpClient", "Response"]


_Key = tuple[str, int, bool]
"""``(host, port, tls)``: connections are pooled per key."""


class _Conn(asyncio.Protocol):
    """One connection and the response currently arriving on it."""

    def __init__(self, key: _Key) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.chunks: deque[bytes] = deque()
        self.done = False
        self.keep_alive = False
        self.answered = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        # the loop the connection lives on, kept: asking for the running loop makes a
        # getpid() system call on CPython 3.11, once per wait
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.error = UpstreamError(f"bad HTTP from upstream: {e}")
            self._wake()
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.done and self.error is None:
            self.error = exc or ConnectionResetError("the upstream closed the connection")
        self._wake()
        # The parser holds this protocol's bound methods: a reference cycle, which only a
        # full collection would free (rare in the gateway: see Gateway.startup's gc
        # settings), so every closed connection would pile up until then.  Nothing more
        # can arrive: break it, and the connection goes by reference counting.
        del self.parser

    # -- httptools callbacks ---------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # -- helpers -----------------------------------------------------------------
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Wait for the next parser event or an error, at most ``timeout`` seconds."""
        loop = self.loop
        assert loop is not None  # set by connection_made, before any wait
        w = self.waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, w)
        try:
            await w
        finally:
            timer.cancel()
            self.waiter = None

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """The system's CA store with host name checks: an ``https://`` URL with no context."""
    return ssl.create_default_context()


def _expire(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_exception(TimeoutError())


class Response:
    """An upstream response whose body may still be arriving."""

    __slots__ = ("_client", "_conn", "_finished", "headers", "read_timeout", "status")

    def __init__(self, client: HttpClient, conn: _Conn, read_timeout: float) -> None:
        self._client = client
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers
        self.read_timeout = read_timeout
        self._finished = False

    def header(self, name: bytes, default: bytes | None = None) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return default

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives (de-chunked)."""
        c = self._conn
        while True:
            while c.chunks:
                yield c.chunks.popleft()
            if c.done:
                self._finished = True
                return
            if c.error is not None:
                raise UpstreamError(f"upstream connection broke: {c.error!r}")
            try:
                await c.wait(self.read_timeout)
            except TimeoutError:
                raise UpstreamTimeout(
                    f"no bytes from upstream for {self.read_timeout:g}s"
                ) from None

    @property
    def at_end(self) -> bool:
        """Whether every piece of the body has been handed out (the response is complete).
        Once true, the response counts as read to its end, so leaving it (``async with``)
        returns its connection to the pool even if :meth:`chunks` was not run to its end."""
        c = self._conn
        if c.done and not c.chunks:
            self._finished = True
            return True
        return False

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([piece async for piece in self.chunks()])

    def close(self) -> None:
        """Return the connection to the pool if the body was fully read, else close it."""
        c = self._conn
        if self._finished and c.done and c.keep_alive and not c.closed:
            self._client._release(c)
        else:
            c.close()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class HttpClient:
    """A keep-alive connection pool per (host, port)."""

    def __init__(
        self, connect_timeout: float = 5.0, read_timeout: float = 600.0, max_idle: int = 256
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self._idle: dict[_Key, list[_Conn]] = {}
        self._targets: dict[str, tuple[str, int, str]] = {}
        self.stale_retries = 0
        """Requests sent again on a new connection because their pooled one was stale."""

    def _target(self, url: str) -> tuple[str, int, str]:
        t = self._targets.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or u.hostname is None:
                raise UpstreamError(f"only http:// and https:// upstreams, got {url!r}")
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            port = u.port or (443 if u.scheme == "https" else 80)
            t = self._targets[url] = (u.hostname, port, path)
        return t

    async def _connect(self, key: _Key, tls: ssl.SSLContext | None) -> _Conn:
        loop = asyncio.get_running_loop()
        host, port, _ = key
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: _Conn(key),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(f"connecting to {host}:{port} timed out") from None
        except ssl.SSLCertVerificationError as e:
            raise UpstreamUnreachable(
                f"upstream {host}:{port}: its TLS certificate was refused: {e.verify_message}"
            ) from None
        except OSError as e:
            raise UpstreamUnreachable(
                f"cannot connect to upstream {host}:{port}: {e.strerror or e}"
            ) from None
        return proto

    def _release(self, c: _Conn) -> None:
        idle = self._idle.setdefault(c.key, [])
        if len(idle) >= self.max_idle:
            c.close()
            return
        c._reset()
        c.reused = True
        idle.append(c)

    async def post(
        self,
        url: str,
        body: bytes,
        content_type: bytes = b"application/json",
        *,
        tls: ssl.SSLContext | None = None,
        auth: bytes = b"",
    ) -> Response:
        """Send ``body``; return once the response head arrived.  ``tls``: the context an
        ``https://`` URL's connection is wrapped in (``None``: the default verification);
        ``auth``: header lines to add, each ending in CRLF (the engine's API key)."""
        host, port, path = self._target(url)
        secure = url.startswith("https:")
        if secure and tls is None:
            tls = _default_tls()
        key = (host, port, secure)
        head = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + f"{host}:{port}".encode()
            + b"\r\nContent-Type: "
            + content_type
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nAccept: */*\r\n"
            + auth
            + b"\r\n"
        )
        c = self._pooled(key)
        fresh = c is None
        if c is None:
            c = await self._connect(key, tls)
        while True:
            assert c.transport is not None
            c.transport.write(head + body)
            try:
                while not c.head_done:
                    if c.error is not None:
                        break
                    await c.wait(self.read_timeout)
            except TimeoutError:
                c.close()
                raise UpstreamTimeout(f"no answer from {url} in {self.read_timeout:g}s") from None
            except BaseException:
                c.close()
                raise
            if c.head_done:
                return Response(self, c, self.read_timeout)
            c.close()
            if fresh or c.answered:
                raise UpstreamError(f"upstream {url} closed the connection: {c.error!r}")
            # A pooled connection the server had closed (it may close one after a response
            # while still advertising keep-alive, and its FIN can cross our request): not a
            # failure of the server.  Its siblings in the pool may be as stale, so the
            # request goes again on a new connection, never on another pooled one.
            self.stale_retries += 1
            c = await self._connect(key, tls)
            fresh = True

    def _pooled(self, key: _Key) -> _Conn | None:
        """The most recently returned idle connection to ``key`` that is not known closed."""
        idle = self._idle.get(key)
        while idle:
            cand = idle.pop()
            if not cand.closed:
                return cand
        return None

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()
