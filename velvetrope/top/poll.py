"""Reading the gateways for ``velvetrope top``: ``/admin/status`` and ``/metrics`` over HTTP.

:func:`poll` asks one gateway for both at once and returns a
:class:`~velvetrope.top.rows.Sample`; a :class:`Poller` asks every gateway at once.  A
gateway that cannot be read is a sample with ``status`` ``None`` and the reason in
``error`` (unreachable, timed out, an HTTP status such as 401 for a wrong admin token, a
status that is not a JSON object), never an exception: the frame shows it as down.
Metrics that cannot be read leave ``metrics`` ``None`` (no rates) and say why in
``error`` while the status is shown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson

from velvetrope.top.exposition import Metrics, parse_metrics
from velvetrope.top.rows import DENIED, Sample

__all__ = ["Poller", "normalize_url", "poll"]


def normalize_url(url: str) -> str:
    """``url`` with ``http://`` when it names no scheme, without a trailing slash."""
    url = url.strip().rstrip("/")
    return url if "://" in url else "http://" + url


async def _get(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> bytes | str:
    """The body of a 200 answer, or why there is none."""
    try:
        r = await client.get(url, headers=headers)
    except httpx.TimeoutException:
        return "timed out"
    except httpx.ConnectError:
        return "unreachable"
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        return str(e) or type(e).__name__
    if r.status_code == 401:
        return DENIED
    if r.status_code != 200:
        return f"HTTP {r.status_code}"
    return r.content


async def poll(
    client: httpx.AsyncClient,
    url: str,
    admin_token: str | None,
    clock: Callable[[], float] = time.monotonic,
) -> Sample:
    """One sample of the gateway at ``url`` (see the module docstring); ``at`` is
    ``clock()`` once both answers are in."""
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    raw_status, raw_metrics = await asyncio.gather(
        _get(client, url + "/admin/status", headers), _get(client, url + "/metrics", {})
    )
    at = clock()
    status: dict[str, Any] | None = None
    error: str | None = None
    if isinstance(raw_status, str):
        error = raw_status
    else:
        try:
            parsed = orjson.loads(raw_status)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            status = parsed
        else:
            error = "status is not a JSON object"
    metrics: Metrics | None = None
    if isinstance(raw_metrics, str):
        error = error or f"metrics: {raw_metrics}"
    else:
        try:
            metrics = parse_metrics(raw_metrics.decode("utf-8", "replace"))
        except ValueError:
            error = error or "metrics: not Prometheus text"
    return Sample(url, at, status, metrics, error)


class Poller:
    """Polls the gateways at ``urls`` through one HTTP client (``timeout_s`` per request),
    open while inside ``async with``."""

    def __init__(self, urls: Sequence[str], admin_token: str | None, timeout_s: float) -> None:
        self.urls = list(urls)
        self.admin_token = admin_token
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))

    async def __aenter__(self) -> Poller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def poll(self) -> list[Sample]:
        """One sample of each gateway, in the order of ``urls``, polled at once."""
        return list(
            await asyncio.gather(*(poll(self._client, u, self.admin_token) for u in self.urls))
        )
