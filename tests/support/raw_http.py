"""Hand-written HTTP/1.1 servers in tests: reading one request off a stream."""

from __future__ import annotations

import asyncio

__all__ = ["read_request"]


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one request with a ``Content-Length`` body (head and body), discarding it."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
