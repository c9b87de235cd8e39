"""Which engine created each Responses API response, for ``previous_response_id`` and
``GET``/``DELETE /v1/responses/{id}`` (engines keep a response's state in their own memory).

:class:`ResponseHomes` maps a response id to the upstream that created it and the tenant it
was created for.  In every process it keeps the ``limit`` newest ids (100,000; the oldest
forgotten first).  With Redis state (``state.url``) it also writes each id to Redis, as the
key ``{namespace}:resp:{id}`` whose value is ``tenant`` and ``url`` on two lines, expiring
after ``state.response_ttl_s`` (24 h by default): a follow-up that reaches another gateway
replica finds the engine there and is routed to it.  Redis is asked only for an id this
process does not know (the answer is then kept locally); the write does not hold up the
answer (it is sent at once, not awaited); a Redis that cannot answer within the state's call
budget, or that the store's breaker holds to be away (then it is not asked), makes the id
unknown (the request is routed as any other, and an engine that does not hold the response
answers its own 404), never an error of the gateway; a response created meanwhile is
remembered by its own replica only.

Contract: :meth:`ResponseHomes.find` answers the url recorded for ``(id, tenant)`` or
``None``: never another tenant's response.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from velvetrope.config_sections import StateSettings

__all__ = ["ResponseHomes", "SharedHomes", "response_homes"]

log = logging.getLogger("velvetrope.gateway")


class SharedHomes:
    """The Redis side of :class:`ResponseHomes`: ``client`` a redis-py asyncio client,
    keys under ``namespace``, values kept ``ttl_s``, each call bounded by ``budget_s`` and
    made only while ``up()`` (the store's breaker is closed: a Redis known to be away costs
    no wait)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        ttl_s: float,
        budget_s: float,
        up: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.up = up
        self.ns = namespace
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.budget_s = budget_s
        self.failures = 0
        """Calls that failed or ran out of budget (logged at debug level)."""
        self._pending: set[asyncio.Task[Any]] = set()

    def key(self, response_id: str) -> str:
        return f"{self.ns}:resp:{response_id}"

    def _spawn(self, call: Callable[[], Any]) -> None:
        if not self.up():
            self.failures += 1
            return
        task = asyncio.ensure_future(self._bounded(call()))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _bounded(self, call: Any) -> Any:
        try:
            return await asyncio.wait_for(call, self.budget_s)
        except Exception as e:  # Redis away or slow: the id is unknown, never an error
            self.failures += 1
            log.debug("velvetrope: response homes over Redis: %r", e)
            return None

    def put(self, response_id: str, url: str, tenant: str) -> None:
        """Write the id's home (not awaited)."""
        key, value = self.key(response_id), f"{tenant}\n{url}"
        self._spawn(lambda: self.client.set(key, value, px=self.ttl_ms))

    def drop(self, response_id: str) -> None:
        """Forget the id (not awaited)."""
        key = self.key(response_id)
        self._spawn(lambda: self.client.delete(key))

    async def get(self, response_id: str) -> tuple[str, str] | None:
        """``(url, tenant)`` of the id, or ``None`` (unknown, or Redis did not answer)."""
        if not self.up():
            self.failures += 1
            return None
        raw = await self._bounded(self.client.get(self.key(response_id)))
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        tenant, sep, url = text.partition("\n")
        return (url, tenant) if sep and url else None

    async def settle(self) -> None:
        """Wait for the writes sent so far (tests; shutdown)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class ResponseHomes:
    """Response id → (the upstream that created it, its tenant): the ``limit`` newest in
    this process, and every one of the last ``state.response_ttl_s`` in Redis when
    ``shared`` is given (see the module docstring)."""

    def __init__(self, limit: int = 100_000, shared: SharedHomes | None = None) -> None:
        self.limit = limit
        self.shared = shared
        self._homes: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def _keep(self, response_id: str, url: str, tenant: str) -> None:
        homes = self._homes
        homes[response_id] = (url, tenant)
        homes.move_to_end(response_id)
        if len(homes) > self.limit:
            homes.popitem(last=False)

    def record(self, response_id: str | None, url: str, tenant: str) -> None:
        """``response_id`` (if any) was created by ``url`` for ``tenant``."""
        if not response_id:
            return
        self._keep(response_id, url, tenant)
        if self.shared is not None:
            self.shared.put(response_id, url, tenant)

    def home(self, response_id: object, tenant: str) -> str | None:
        """What this process knows: the upstream that created ``response_id`` for
        ``tenant``; ``None`` if unknown here (forgotten, never seen, or another tenant's)."""
        if not isinstance(response_id, str):
            return None
        got = self._homes.get(response_id)
        return got[0] if got is not None and got[1] == tenant else None

    async def find(self, response_id: object, tenant: str) -> str | None:
        """:meth:`home`, else (with Redis state) what Redis knows, kept here from then on."""
        if not isinstance(response_id, str) or not response_id:
            return None
        if response_id in self._homes or self.shared is None:
            return self.home(response_id, tenant)
        got = await self.shared.get(response_id)
        if got is None:
            return None
        self._keep(response_id, *got)
        return got[0] if got[1] == tenant else None

    def forget(self, response_id: str) -> None:
        self._homes.pop(response_id, None)
        if self.shared is not None:
            self.shared.drop(response_id)


def response_homes(store: Any, state: StateSettings) -> ResponseHomes:
    """The gateway's map: shared over ``store``'s Redis client when the store is shared (a
    :class:`~velvetrope.store.guard.GuardedStore`), else this process's alone."""
    redis = getattr(store, "redis", None)
    if not getattr(store, "shared", False) or redis is None:
        return ResponseHomes()
    budget = state.call_timeout_ms / 1000.0
    up = (lambda: bool(store.up)) if hasattr(store, "up") else (lambda: True)
    shared = SharedHomes(redis.client, redis.ns, state.response_ttl_s, budget, up)
    return ResponseHomes(shared=shared)
