"""Each call to Redis within a time budget, the circuit breaker fed, and the failure policy's
verdict when Redis cannot be asked.

A call's budget is ``call_timeout_s`` plus a multiple of this process's own event-loop lag
(measured every 50 ms, a decaying peak), because under load a reply waits for the loop as
much as for Redis, and a budget that counts our own backlog as Redis's fault would trip the
breaker exactly when shared limits matter most.  Failures feed a
:class:`~velvetrope.store.breaker.CircuitBreaker`, so a dead Redis costs no timeout per
request once the breaker opened.  While Redis cannot be reached, ``on_store_error``
decides (:meth:`CallGuard.fall_back`): ``fail_open`` answers from a local share,
``fail_closed`` raises :class:`~velvetrope.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from time import monotonic, perf_counter  # compiled: a global, not an attribute per call
from typing import Any, Final, Literal

from redis.exceptions import RedisError

from velvetrope.errors import StoreUnavailable
from velvetrope.store.breaker import CircuitBreaker
from velvetrope.store.redis_store import RedisStore
from velvetrope.store.replies import refused

__all__ = ["FAILURES", "CallGuard", "OnStoreError"]

OnStoreError = Literal["fail_open", "fail_closed"]
FAILURES: Final = (RedisError, OSError, TimeoutError, ConnectionError)
"""What a call to Redis raises when it failed (redis-py's errors, the connection's, a
timeout)."""


class CallGuard:
    """Budgets, the breaker's feed and the fallback verdict for the calls to one Redis.

    ``on_failure`` hears of every failed call (Redis may have lost its data: the leases held
    here are to be asserted again); ``observe_call(op, seconds)`` of every call's latency."""

    def __init__(
        self,
        redis: RedisStore,
        breaker: CircuitBreaker,
        *,
        on_store_error: OnStoreError,
        call_timeout_s: float,
        expected_replicas: int | None,
        on_failure: Callable[[], None],
        observe_call: Callable[[str, float], None] | None = None,
    ) -> None:
        self.redis = redis
        self.breaker = breaker
        self.on_store_error = on_store_error
        self.call_timeout_s = call_timeout_s
        self.expected_replicas = expected_replicas
        self._on_failure = on_failure
        self._observe = observe_call or (lambda op, s: None)
        self.answered = False  # Redis answered once: its heartbeats, not a guess, give N
        self.fallbacks: Counter[str] = Counter()  # fallback decisions by operation
        self.loop_lag_s = 0.0  # decaying peak of the event loop's lag
        self.late = 0  # calls answered after the budget while Redis was answering
        self.refusals = 0  # calls Redis refused (error replies naming no passing state)
        self.late_cap_s = 1.0
        self._watch: list[tuple[float, asyncio.Future[Any]]] = []  # (deadline, call)
        self._watchdog: asyncio.Task[None] | None = None
        self._lag: asyncio.Task[None] | None = None

    @property
    def budget_s(self) -> float:
        """The time one call may take now: the configured budget plus 4x the loop lag."""
        return self.call_timeout_s + 4.0 * self.loop_lag_s

    @property
    def up(self) -> bool:
        """Whether Redis answered the last call (the breaker is closed)."""
        return self.breaker.closed

    def heard(self, ok: bool) -> None:
        """The outcome of calls made elsewhere (the outbox's rounds): feed the breaker."""
        if ok:
            self.breaker.success()
        else:
            self.failed()

    def failed(self) -> None:
        """A call failed: feed the breaker and tell ``on_failure``."""
        self.breaker.failure()
        self._on_failure()

    async def call(self, op: str, call: Any) -> Any:
        """Wait for one Redis call (an awaitable of its raw reply) within the budget;
        record its latency; feed the breaker (a call Redis refused, see
        :func:`~velvetrope.store.replies.refused`, counts as Redis answering).  A call still
        pending when the budget runs out while Redis demonstrably answers others is this
        process's backlog, not Redis's: it may wait up to ``late_cap_s`` more (counted in
        ``late``).  Raises
        :class:`StoreUnavailable` on any failure.

        A pipelined call is a plain future: the watchdog (one task, every few ms) fails it
        when its time is up, so a call costs no timer of its own."""
        t0 = perf_counter()
        try:
            if type(call) is asyncio.Future and self._watchdog is not None:
                if not call.done():
                    deadline = monotonic() + self.budget_s
                    self._watch.append((deadline, call))
                out = await call
            else:
                out = await self._wait_alone(call)
        except FAILURES as e:
            if refused(e):  # Redis answered: it refused this call, it is not away
                self.breaker.success()
                self.answered = True
                self.refusals += 1
            else:
                self.failed()
            self._observe(op, perf_counter() - t0)
            raise StoreUnavailable(f"shared state: {op} failed: {e!r}") from None
        self.breaker.success()
        self.answered = True
        self._observe(op, perf_counter() - t0)
        return out

    async def _wait_alone(self, call: Any) -> Any:
        """:meth:`call`'s wait for a call the watchdog does not watch (a task on a
        cluster, or before :meth:`start`)."""
        fut = asyncio.ensure_future(call)
        done, _ = await asyncio.wait((fut,), timeout=self.budget_s)
        if not done and self.redis.answering(self.budget_s):
            self.late += 1
            done, _ = await asyncio.wait((fut,), timeout=self.late_cap_s)
        if not done:
            fut.cancel()
            raise TimeoutError(f"no answer within {self.budget_s * 1000:.0f} ms")
        return fut.result()

    def fall_back(self, op: str) -> None:
        """Redis cannot be asked for ``op`` (``reserve``, ``lease``): count the decision in
        ``fallbacks``; raise :class:`StoreUnavailable` when the fallback is refused —
        ``fail_closed``, or Redis never answered and no ``expected_replicas`` says what
        share this replica may take."""
        if self.on_store_error == "fail_closed" or (
            not self.answered and self.expected_replicas is None
        ):
            self.fallbacks[f"{op}_refused"] += 1
            if self.on_store_error == "fail_open":
                raise StoreUnavailable(
                    f"shared state has not answered yet ({op}); fail_open needs "
                    "state.expected_replicas to share limits before Redis was ever seen"
                )
            raise StoreUnavailable(
                f"shared state is unavailable ({op}); on_store_error=fail_closed"
            )
        self.fallbacks[f"{op}_local"] += 1

    # -- background ------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog of pipelined calls and the event loop's lag watch."""
        loop = asyncio.get_running_loop()
        self._watchdog = loop.create_task(self._watch_calls())
        self._lag = loop.create_task(self._watch_lag())

    async def stop(self) -> None:
        """Stop what :meth:`start` started; calls are then waited for one by one."""
        tasks = [t for t in (self._lag, self._watchdog) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._watchdog = None
        self._lag = None

    async def _watch_calls(self, period_s: float = 0.005) -> None:
        """Fail watched calls whose time is up; give late ones (Redis answering others)
        ``late_cap_s`` more."""
        while True:
            await asyncio.sleep(period_s)
            watch = self._watch
            if not watch:
                continue
            now = monotonic()
            keep: list[tuple[float, asyncio.Future[Any]]] = []
            for deadline, fut in watch:
                if fut.done():
                    continue
                if now < deadline:
                    keep.append((deadline, fut))
                elif deadline > 0 and self.redis.answering(self.budget_s):
                    self.late += 1
                    keep.append((-(now + self.late_cap_s), fut))  # negative: already late
                elif deadline < 0 and now < -deadline:
                    keep.append((deadline, fut))
                else:
                    fut.set_exception(TimeoutError("no answer from Redis within the budget"))
            self._watch = keep

    async def _watch_lag(self, period_s: float = 0.05) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(period_s)
            lag = max(0.0, loop.time() - t - period_s)
            self.loop_lag_s = max(lag, self.loop_lag_s * 0.8)
