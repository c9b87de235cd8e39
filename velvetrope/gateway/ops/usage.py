"""``GET /admin/usage``: the usage ledger (:mod:`velvetrope.core.quota`), as JSON or CSV.

Query: ``from`` and ``to`` (days, ``YYYY-MM-DD``, inclusive; either may be left out),
``tenant`` (one tenant) and ``format`` (``json``, the default, or ``csv``; an ``Accept:
text/csv`` header asks for CSV too).  Authenticated as ``/admin/status`` is: the admin
token as a bearer token.

The counters are read where the settlements wrote them: the memory store's buckets, or
Redis (every ledger key of this namespace, found by ``SCAN``; a Redis that cannot be read
answers 503 ``state_unavailable``).  Every replica sharing the Redis reads the same rows.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

import orjson

from velvetrope.core.quota import LEDGER_PREFIX, LedgerRow, ledger_rows
from velvetrope.gateway.driver.quotas import Quotas
from velvetrope.openai.errors import error_body
from velvetrope.serving.asgi import Scope, Send, header, respond
from velvetrope.store.base import Store
from velvetrope.store.memory import MemoryStore

__all__ = ["CSV_COLUMNS", "answer_usage", "ledger_levels", "rows_csv"]

CSV_COLUMNS = (
    "day",
    "tenant",
    "model",
    "requests",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_usd",
)
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MARK = ":b:" + LEDGER_PREFIX


async def ledger_levels(store: Store) -> list[tuple[str, float]]:
    """Every ledger counter's ``(key, level)`` in ``store``.  Raises what the Redis client
    raises when Redis cannot be read."""
    if isinstance(store, MemoryStore):
        levels = store.buckets.levels(store.clock.now())
        return [(k, lvl) for k, (lvl, _) in levels.items() if k.startswith(LEDGER_PREFIX)]
    redis = getattr(store, "redis", None)
    if redis is None:
        return []
    client = redis.client
    keys: list[Any] = [k async for k in client.scan_iter(match=f"{redis.ns}:*{_MARK}*", count=1000)]
    out: list[tuple[str, float]] = []
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.hget(k, "l")
        for k, level in zip(chunk, await pipe.execute(), strict=True):
            if level is None:  # expired between the scan and the read
                continue
            name = k.decode() if isinstance(k, bytes) else str(k)
            out.append((name[name.index(_MARK) + 3 :], float(level)))
    return out


def rows_csv(rows: Sequence[LedgerRow]) -> str:
    """``rows`` as CSV with a header line (:data:`CSV_COLUMNS`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow([r.day, r.tenant, r.model or "", r.requests, r.input_tokens,
                    r.cached_input_tokens, r.output_tokens, f"{r.cost_usd:.6f}"])  # fmt: skip
    return buf.getvalue()


async def _error(send: Send, status: int, message: str, code: str) -> None:
    await respond(send, status, error_body(status, message, code, None))


async def answer_usage(store: Store, quotas: Quotas, scope: Scope, send: Send, admin: bool) -> None:
    """Answer ``GET /admin/usage`` (``admin``: the request carried the admin token)."""
    if not admin:
        await _error(send, 401, "the admin token is missing or wrong", "invalid_api_key")
        return
    q = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    first, last, tenant = q.get("from"), q.get("to"), q.get("tenant")
    for name, day in (("from", first), ("to", last)):
        if day is not None and not _DAY.match(day):
            await _error(send, 400, f"{name} must be a day, YYYY-MM-DD", "invalid_request")
            return
    accept = header(scope, b"accept") or b""
    fmt = q.get("format") or ("csv" if b"text/csv" in accept else "json")
    if fmt not in ("json", "csv"):
        await _error(send, 400, "format must be json or csv", "invalid_request")
        return
    try:
        levels = await ledger_levels(store)
    except Exception as e:  # the Redis client's errors: connection, timeout, reply
        await _error(send, 503, f"the ledger cannot be read: {e}", "state_unavailable")
        return
    settings = quotas.settings
    rows = ledger_rows(levels, settings, first, last, tenant)
    if fmt == "csv":
        await respond(send, 200, rows_csv(rows).encode(), [(b"content-type", b"text/csv")])
        return
    body = {
        "time_zone": settings.time_zone,
        "ledger": settings.ledger,
        "from": first,
        "to": last,
        "tenant": tenant,
        "rows": [r._asdict() for r in rows],
    }
    await respond(send, 200, orjson.dumps(body))
