"""Drive a sans-IO :class:`~velvetrope.engine.batcher.Batcher` in real time.

:class:`RealtimeEngine` owns one asyncio task that steps the batcher and plays each step on
an **absolute timeline**: model time ``m`` happens at wall time ``w0 + (m - m0) / speed``
(``speed`` K: K times faster than real time).  After computing a step ending at model time
``e`` the driver sleeps until ``e``'s wall time, then delivers the step's events to the
requests.  Scheduling against the timeline (never "sleep for the step's duration") means
timer jitter and the cost of delivering events do not accumulate:

* **behind** (the wall clock is already past the target): no sleep, the step is delivered
  at once and the next one computed, so the engine catches up; if the lag ever exceeds
  ``max_lag_s`` wall seconds the timeline is re-anchored so that the overdue step starts
  now (counted in :attr:`RealtimeEngine.resyncs`) instead of bursting through a long
  backlog;
* **idle** (no work): the driver waits for a submission, and the first one re-anchors the
  timeline at the current wall time (model time never goes backwards): idle time passes
  at ``speed`` and any lag is forgotten.

Arrivals are stamped in model time: ``m0 + (now - w0) * speed`` while the engine is busy,
but never later than the start of the next step (an arrival cannot be scheduled by a step
that, on the model's timeline, began before it).

Each request gets an :class:`~velvetrope.engine.serve.engine_request.EngineRequest`
(:mod:`velvetrope.engine.serve.engine_request`): a channel its HTTP handler awaits with
:meth:`~velvetrope.engine.serve.engine_request.EngineRequest.next_tokens`, plus the model's
own timeline for it (arrival, first scheduled, first token, finish, in model seconds) and
the wall times the driver observed, so that a client can compare what it measured with what
the model predicted.

Time and sleep are injectable (``clock``, ``sleep``) so that tests drive the engine with a
:class:`~velvetrope.clock.ManualClock` and a sleep that just advances it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from velvetrope.clock import Clock, SystemClock
from velvetrope.engine.batcher import Batcher, Finished, FirstToken, Preempted, StepResult, Tokens
from velvetrope.engine.serve.engine_request import (
    ABORTED,
    ACTIVE,
    CLOSED,
    FINISHED,
    EngineClosed,
    EngineRequest,
)

__all__ = ["RealtimeEngine", "SleepFn"]

log = logging.getLogger(__name__)

SleepFn = Callable[[float], Awaitable[None]]
"""``await sleep(seconds)``; ``asyncio.sleep`` in production, a clock-advancing fake in tests."""


class RealtimeEngine:
    """Steps ``batcher`` in real time at ``speed`` (see the module docstring).

    ``speed`` must be a positive finite number (K: K times faster than real time).
    ``clock`` defaults to :class:`~velvetrope.clock.SystemClock`, ``sleep`` to
    :func:`asyncio.sleep`.  ``priority`` must be the batcher's own ``priority`` mode (with
    FCFS, requests are admitted in submission order, which makes recording each one's
    first-scheduled time O(1) per request).  ``on_finish`` is called (synchronously, in
    the driver) with every request that completes, e.g. to record metrics.  ``max_lag_s``
    bounds how far behind the timeline the driver may fall before it re-anchors.

    Lifecycle: :meth:`start` in a running event loop, :meth:`submit` / :meth:`abort`
    requests, :meth:`stop` (idempotent; closes every live request with
    :class:`EngineClosed`).  All methods must be called from the loop's thread.
    """

    def __init__(
        self,
        batcher: Batcher,
        *,
        speed: float = 1.0,
        clock: Clock | None = None,
        sleep: SleepFn | None = None,
        priority: bool = False,
        on_finish: Callable[[EngineRequest], None] | None = None,
        max_lag_s: float = 1.0,
    ) -> None:
        if not (speed > 0 and speed != float("inf")):
            raise ValueError(f"speed must be a positive finite number, got {speed!r}")
        if not max_lag_s > 0:
            raise ValueError(f"max_lag_s must be positive, got {max_lag_s!r}")
        self._b = batcher
        self._k = float(speed)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._sleep: SleepFn = sleep if sleep is not None else asyncio.sleep
        self._on_finish = on_finish
        self._max_lag = float(max_lag_s)
        self._fcfs = not priority
        self._requests: dict[str, EngineRequest] = {}
        self._unscheduled: deque[EngineRequest] = deque()
        self._w0 = self._clock.now()
        self._m0 = 0.0
        self._m = 0.0  # model time at which the next step starts
        self._busy = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self.prompt_tokens_total = 0
        """Prompt tokens prefilled (counted when a request gets its first token)."""
        self.generation_tokens_total = 0
        """Output tokens produced (including those of requests later aborted)."""
        self.resyncs = 0
        """Times the timeline was re-anchored because the driver fell ``max_lag_s`` behind."""
        self.max_lag_seen_s = 0.0
        """Largest lag behind the timeline observed when a step was due (wall seconds)."""
        self.steps = 0
        """Steps that did work."""

    # -- inspection -----------------------------------------------------------------------

    @property
    def speed(self) -> float:
        """K: model seconds per wall second."""
        return self._k

    @property
    def batcher(self) -> Batcher:
        """The batcher being driven (read-only use, please)."""
        return self._b

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._task is not None and not self._closed

    @property
    def num_running(self) -> int:
        """Sequences in the batch (``vllm:num_requests_running``)."""
        return self._b.num_running

    @property
    def num_waiting(self) -> int:
        """Sequences waiting, including preempted ones (``vllm:num_requests_waiting``)."""
        return self._b.num_waiting

    @property
    def kv_usage(self) -> float:
        """KV-cache usage in [0, 1] (``vllm:kv_cache_usage_perc``)."""
        return self._b.kv_usage

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self._b.num_preemptions

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache (``vllm:prefix_cache_queries``)."""
        return self._b.prefix_cache_queries

    @property
    def prefix_cache_hits(self) -> int:
        """Prompt tokens found in the prefix cache (``vllm:prefix_cache_hits``)."""
        return self._b.prefix_cache_hits

    @property
    def spec_draft_tokens(self) -> int:
        """Speculative draft tokens proposed (``vllm:spec_decode_num_draft_tokens``)."""
        return self._b.spec_draft_tokens

    @property
    def spec_accepted_tokens(self) -> int:
        """Speculative draft tokens accepted (``vllm:spec_decode_num_accepted_tokens``)."""
        return self._b.spec_accepted_tokens

    @property
    def num_requests(self) -> int:
        """Live requests (submitted, neither finished nor aborted)."""
        return len(self._requests)

    def model_now(self) -> float:
        """The model time corresponding to the clock's current reading."""
        return self._m0 + (self._clock.now() - self._w0) * self._k

    def wall_of(self, model_time: float) -> float:
        """The wall time at which ``model_time`` happens on the current timeline."""
        return self._w0 + (model_time - self._m0) / self._k

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver task in the running loop (once)."""
        if self._task is not None:
            raise RuntimeError("RealtimeEngine.start() called twice")
        if self._closed:
            raise EngineClosed("the engine was stopped")
        self._wake = asyncio.Event()
        self._w0 = self._clock.now()
        self._m0 = self._m
        self._task = asyncio.create_task(self._run(), name="velvetrope-engine-driver")

    async def stop(self, reason: str = "the engine is shutting down") -> None:
        """Stop the driver and close every live request (their consumers get
        :class:`EngineClosed` carrying ``reason``).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                # Our own cancellation of the driver; re-raise only if *we* were cancelled.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        self._close_all(reason)

    def _close_all(self, reason: str) -> None:
        for r in list(self._requests.values()):
            self._b.abort(r.seq_id)
            r._state = CLOSED
            r._error = reason
            r._wake()
        self._requests.clear()
        self._unscheduled.clear()

    # -- commands -------------------------------------------------------------------------

    def submit(
        self,
        seq_id: str,
        prompt_tokens: int,
        output_tokens: int,
        *,
        priority: int = 0,
        arrived_at: float | None = None,
        block_ids: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> EngineRequest:
        """Add a sequence; returns its :class:`EngineRequest`.

        ``block_ids``/``block_tokens``: the prompt's leading blocks as chained hashes, which
        the batcher's prefix cache reuses (:meth:`~velvetrope.engine.batcher.Batcher.add`).

        ``arrived_at`` is the clock reading when the request reached the server (default:
        now); the time spent since (reading, parsing, tokenizing) counts as waiting, as in
        a real engine.  Its model arrival time is that moment on the timeline, but never
        later than the start of the next step nor earlier than the end of the last one.
        Raises :class:`~velvetrope.errors.PolicyError` if the batcher refuses it (too long
        for ``max_model_len``, counts below 1, ``seq_id`` already live) and
        :class:`EngineClosed` if the engine is not running.
        """
        if self._closed or self._task is None:
            raise EngineClosed("the engine is not running")
        k = self._k
        w = self._clock.now()
        aw = w if arrived_at is None or arrived_at > w else arrived_at
        if self._busy:
            ma = self._m0 + (aw - self._w0) * k
            arrival = ma if ma < self._m else self._m
            self._b.add(
                seq_id, prompt_tokens, output_tokens, arrival, priority,
                block_ids=block_ids, block_tokens=block_tokens,
            )  # fmt: skip
        else:
            # Idle: re-anchor the timeline at this moment (drops any lag); the next step
            # starts now, and the request arrived a little earlier.
            m_now = self._m0 + (w - self._w0) * k
            if m_now < self._m:
                m_now = self._m
            arrival = m_now - (w - aw) * k
            if arrival < self._m:
                arrival = self._m
            self._b.add(
                seq_id, prompt_tokens, output_tokens, arrival, priority,
                block_ids=block_ids, block_tokens=block_tokens,
            )  # fmt: skip
            self._w0, self._m0, self._m = w, m_now, m_now
            self._busy = True
            assert self._wake is not None
            self._wake.set()
        r = EngineRequest(seq_id, prompt_tokens, output_tokens, priority, arrival, aw)
        self._requests[seq_id] = r
        self._unscheduled.append(r)
        return r

    def abort(self, request: EngineRequest) -> bool:
        """Remove a live request at once, freeing its KV blocks; its consumer's
        :meth:`~EngineRequest.next_tokens` then returns what is left, then 0.

        Returns ``False`` if it had already finished, been aborted or closed.
        """
        if request._state != ACTIVE:
            return False
        self._b.abort(request.seq_id)
        self._requests.pop(request.seq_id, None)
        request._state = ABORTED
        request._wake()
        return True

    # -- the driver -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the driver must never die silently: fail every request
            log.exception("velvetrope engine driver crashed")
            self._closed = True
            self._close_all(f"the engine crashed: {exc!r}")

    async def _loop(self) -> None:
        b = self._b
        clock = self._clock
        sleep = self._sleep
        wake = self._wake
        assert wake is not None
        while not self._closed:
            if not b.has_work:
                self._busy = False
                wake.clear()
                await wake.wait()
                continue
            start = self._m
            res = b.step(start)
            if self._unscheduled:
                self._mark_scheduled(start, clock.now())
            if res.duration <= 0.0:
                await sleep(0)  # nothing ran (see Batcher.step); let the loop breathe
                continue
            self.steps += 1
            end = res.end
            self._m = end
            target = self._w0 + (end - self._m0) / self._k
            delay = target - clock.now()
            if delay <= 0:
                lag = -delay
                if lag > self.max_lag_seen_s:
                    self.max_lag_seen_s = lag
                if lag > self._max_lag:
                    # Too far behind: this step starts now, on a new timeline.
                    now = clock.now()
                    self._w0, self._m0 = now, start
                    target = now + res.duration / self._k
                    delay = target - now
                    self.resyncs += 1
            if delay > 0:
                while delay > 0:
                    await sleep(delay)
                    delay = target - clock.now()
            else:
                await sleep(0)  # never starve the handlers, even when catching up
            if self._closed:
                return
            self._deliver(res, clock.now())

    def _mark_scheduled(self, start: float, now: float) -> None:
        """Stamp requests that the step starting at ``start`` scheduled for the first time.

        FCFS admits in submission order, so only the head of the queue needs looking at;
        in priority mode every unscheduled request is checked.
        """
        b = self._b
        q = self._unscheduled
        if self._fcfs:
            while q:
                r = q[0]
                if r._state == ACTIVE:
                    st = b.seq_state(r.seq_id)
                    if st is not None and st.status == "waiting":
                        break
                    r.scheduled_model = start
                    r.scheduled_wall = now
                q.popleft()
            return
        keep: deque[EngineRequest] = deque()
        for r in q:
            if r._state != ACTIVE:
                continue
            st = b.seq_state(r.seq_id)
            if st is not None and st.status == "waiting":
                keep.append(r)
            else:
                r.scheduled_model = start
                r.scheduled_wall = now
        self._unscheduled = keep

    def _deliver(self, res: StepResult, now: float) -> None:
        """Hand a step's events to their requests.

        Requests that got their first token are woken first: the batcher lists newly
        admitted sequences last, and their consumers would otherwise write after every
        decoding stream's chunk, adding that whole fan-out to their TTFT.
        """
        requests = self._requests
        woken: list[EngineRequest] = []
        first: list[EngineRequest] = []
        for ev in res.events:
            r = requests.get(ev.seq_id)
            if r is None:  # aborted while the step was playing
                continue
            if isinstance(ev, Tokens):
                n = ev.n
                r._avail += n
                r.tokens_delivered += n
                self.generation_tokens_total += n
                woken.append(r)
            elif isinstance(ev, FirstToken):
                r.first_token_model = ev.t
                r.first_token_wall = now
                self.prompt_tokens_total += r.prompt_tokens
                first.append(r)
            elif isinstance(ev, Finished):
                r.cached_tokens = ev.cached_tokens
                r.finished_model = ev.t
                r.finished_wall = now
                r._state = FINISHED
                del requests[ev.seq_id]
                woken.append(r)
                if self._on_finish is not None:
                    self._on_finish(r)
            elif isinstance(ev, Preempted):
                r.preemptions += 1
        for r in first:
            r._wake()
        for r in woken:
            r._wake()
