"""A response head checked in two scans, not two per header.

uvicorn's ``RequestResponseCycle.send`` checks each header of a response head against two
regular expressions (one search for the name, one for the value) before writing it.  A
gateway answer carries a dozen headers (OpenAI's six ``x-ratelimit-*``, velvetrope's own,
uvicorn's defaults), and those two dozen searches cost more than everything else that goes
into writing the head.  Each expression is a class of single bytes, so
:class:`OneScanCycle` checks the same bytes with one table lookup per byte
(``bytes.translate``, about three times faster than the expression's search): over the
names joined together and over the values joined by tabs.  The tables are built from
uvicorn's own expressions, byte by byte, and a joined string holds a forbidden byte
exactly when one of its parts does (the tab is a byte a value may hold).

Contract: the bytes written, the cycle's state (``keep_alive``, ``chunked_encoding``,
``expected_content_length``) and the errors are uvicorn's own.  A head that fails a check,
or is not made of ``(bytes, bytes)`` pairs, is handed to uvicorn's ``send``, which raises
what it always raises; so is every other message, and a head sent while writing is paused,
after a disconnect or with the access log on.  The head-writing code follows uvicorn
0.54's, the minor version ``pyproject.toml`` pins (``tests/gateway/test_head.py`` compares
both on every kind of head); should another uvicorn be installed anyway, :data:`ENABLED` is
false and :func:`one_scan` leaves uvicorn's cycle as it is.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

__all__ = ["ENABLED", "OneScanCycle", "one_scan"]

ENABLED = uvicorn.__version__.split(".")[:2] == ["0", "54"]
"""Whether this uvicorn is one whose head writing :class:`OneScanCycle` follows."""


def _table(pattern: re.Pattern[bytes]) -> bytes:
    """``bytes.translate`` table: a byte ``pattern`` matches becomes 0, any other 1."""
    return bytes(0 if pattern.fullmatch(bytes([b])) else 1 for b in range(256))


_SPECIAL = frozenset((b"content-length", b"transfer-encoding", b"connection"))
"""The (lower-case) header names that change how the response is framed."""
_NAME_TABLE = _table(HEADER_RE)
_VALUE_TABLE = _table(HEADER_VALUE_RE)


class _Sent:
    """What :meth:`OneScanCycle.send` returns for a head it wrote: done at once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_SENT = _Sent()


class OneScanCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, checking a response head in two scans (see the
    module)."""

    def send(self, message: Any) -> Awaitable[None]:  # type: ignore[override]
        if (
            message["type"] != "http.response.start"
            or self.response_started
            or self.disconnected
            or self.access_log
            or self.flow.write_paused
        ):
            return RequestResponseCycle.send(self, message)
        headers = self.default_headers + list(message.get("headers", []))
        try:
            names = b"".join([name for name, _ in headers])
            values = b"\t".join([value for _, value in headers])
            bad = b"\0" in names.translate(_NAME_TABLE) or b"\0" in values.translate(_VALUE_TABLE)
        except (TypeError, ValueError):  # not (bytes, bytes) pairs: uvicorn says what
            bad = True
        if bad:
            # the headers as read (they may have been an iterator)
            again = {**message, "headers": headers[len(self.default_headers) :]}
            return RequestResponseCycle.send(self, again)  # type: ignore[arg-type]
        # uvicorn's own, from here on
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        lower = names.islower()  # no upper-case letter in any name: none to lower
        for name, value in headers:
            if not lower:
                name = name.lower()
            if name not in _SPECIAL:  # one set lookup for the common case
                pass
            elif name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))
        return _SENT


def one_scan(cycle: RequestResponseCycle | None) -> None:
    """Make ``cycle`` (just created, its app not yet running) a :class:`OneScanCycle` when
    :data:`ENABLED`; anything else is left as it is."""
    if ENABLED and cycle is not None and cycle.__class__ is RequestResponseCycle:
        cycle.__class__ = OneScanCycle
