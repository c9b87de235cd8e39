"""Engine saturation: hold dispatch while a pool's engines already queue work of their own.

A continuous-batching engine accepts everything it is sent and queues what it cannot run;
once it has a queue of its own, more dispatches only move the backlog to where the gateway
can no longer order, shed or cancel it.  :class:`EngineSaturation` is that brake for one
pool, as a :class:`~velvetrope.core.capacity.SaturationSignal` and a
:class:`~velvetrope.core.capacity.DispatchTracker` of its
:class:`~velvetrope.core.capacity.PoolCapacity`.  It does no I/O: whoever has readings
feeds them to :meth:`EngineSaturation.observe` with their timestamp (the gateway from each
engine's ``/metrics``, the simulator from its engine models), and says which engines are
live with :meth:`EngineSaturation.set_engines`.

Readings are each engine's requests running, requests waiting and KV-cache usage (0..1),
whatever its engine calls them (the gateway reads them in the engine's dialect,
:mod:`velvetrope.dialects`; vLLM's are ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``).

**The rule.**  Each live engine ``e`` has room

    ``room_e = capacity_e + max_waiting − (running_e + waiting_e + ours_e − ours_at_e)``

where ``running_e`` and ``waiting_e`` are from its last reading, ``ours_e`` is the number of
this pool's jobs sent to ``e`` and not yet ended, and ``ours_at_e`` was that number when the
reading was taken: the reading is corrected by what was sent to the engine and came back
since.  ``capacity_e`` (what the engine runs at once) is *learned*: a reading that shows the
engine queueing (``waiting > 0``) sets it to ``running``; after that, a reading that shows it
running all it was allowed with no queue and room in its KV cache raises it to
``running + 1``, a probe (the engine's capacity moves with the lengths it holds, and a
capacity learned under KV pressure must be able to grow back), so the engine's own queue is
held to ``max_waiting`` plus that one probe.  Until a reading has shown it queueing, the
capacity is a *slow-start* window: ``initial_capacity`` at first, doubled (to twice what it
runs) by each reading that shows it running all the window allowed with no queue and room in
its KV cache.  The pool allows a dispatch while ``Σ_e max(0, room_e) − pending ≥ 1``, where
``pending`` counts jobs dispatched from the pool and not yet sent to an engine.  Per engine:

* an engine never read yet is taken as idle (``running = waiting = 0``, corrected by what was
  sent to it): a cold start is held to the window from the first request, there is no
  learning period in which a burst reaches the engines unchecked;
* an engine at ``kv_usage ≥ max_kv_usage`` has no room (its KV cache is full);
* an engine's room is at most its *KV room*: ``(max_kv_usage − kv_usage) × running /
  kv_usage + max_waiting − waiting_e − (ours_e − ours_at_e)``, the requests its cache holds
  before ``max_kv_usage`` at what each running request holds on average, plus the queue
  allowed, less what was sent since the reading.  A capacity in requests is learned at the
  lengths the engine ran then; as its sequences grow (each decode step adds a token to
  every one), the same count fills more of the cache, and a room in requests alone would
  send a burst that a nearly full cache cannot start (and a top-tier prompt then waits for
  running decodes to end: vLLM admits a waiting prompt only when its blocks are free);
* a job of a lower band (not band 0) is held while every live engine's KV room, without
  the queue allowance and less what the pool dispatched and has not sent anywhere yet,
  is under ``1 +`` its share of the *top band's reserve*: the top-band
  jobs (a tier with a TTFT objective) expected within ``share`` of their TTFT objective at
  the rate they were dispatched over the headroom's window
  (:meth:`~velvetrope.core.headroom.TierHeadroom.top_reserve`).  A top-tier prompt that
  finds the cache full waits for running decodes to end, however the engine orders its
  queue (a vLLM engine admits a waiting prompt only when its first blocks are free, and
  displaces running sequences only when they run out of blocks themselves); the engines
  alone, overfilling their caches, preempt lower-priority sequences and so make that room,
  at the cost of the work they throw away.  The reserve keeps the room instead, sized by
  what the top tier measurably sends: a pool without top-tier traffic keeps none.  Only
  with the headroom rule (``limit: slo``);
* a job of a lower band is held, too, while every live engine's *prefill backlog* (the
  prompt tokens sent there and not yet answered with a first token) takes longer than
  ``share`` of the top band's TTFT objective at the rate the engine has been prefilling
  (:meth:`~velvetrope.core.prefill_backlog.PrefillBacklog.prefill_s`, Little's law over
  the gateway's own streams; :meth:`~velvetrope.core.headroom.TierHeadroom.top_budget_s`):
  an engine finishes the prefills it has begun before it admits a waiting prompt, however
  it orders its queue, so a lower-band prompt sent into such a backlog delays the next
  top-tier arrival and gains nothing over waiting in the gateway's queue, where it can
  still be ordered.  Only with top-tier traffic over the headroom's window, and only with
  the headroom rule;
* a reading older than ``stale_after_s`` is not used: the engine is *stale* and has
  unlimited room, so it is served without saturation (the pool's in-flight limit,
  :mod:`velvetrope.core.capacity`, still holds) until a reading arrives; a rule never holds
  a pool forever on a reading it no longer gets;
* an engine declared unreadable before any reading (:meth:`EngineSaturation.observe` with
  ``None``: no ``/metrics``, or none in a known dialect) is *blind*: unlimited room likewise;
* with no live engine at all the rule has nothing to say and allows it (capacity per engine
  × live engines decides).

:meth:`EngineSaturation.engine_room` is one engine's room, so that the replica choice can
prefer engines with room (:meth:`EngineSaturation.has_room`), and among those the one with
the least prefill ahead of the job (:meth:`EngineSaturation.prefill_ahead`, kept by the
rule's :attr:`~EngineSaturation.backlog` from the same events:
:mod:`velvetrope.core.prefill_backlog`); :meth:`EngineSaturation.state` says which of the
cases above holds (``on``, ``stale``, ``blind``).

**Accounting, per job.**  :meth:`~EngineSaturation.started` (every dispatch from the pool)
counts a job as pending; :meth:`~EngineSaturation.sent` moves it to the engine that took it
(again to another engine when the caller retries elsewhere); :meth:`~EngineSaturation.ended`
(its outcome, whatever it is: completed, failed, cancelled, no upstream reached) takes it
off wherever it is.  The controller calls ``started`` and ``ended`` exactly once per
dispatched job, so nothing the rule counts can leak, and :meth:`~EngineSaturation.allows_dispatch`
only reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from velvetrope.core.headroom import TierHeadroom
from velvetrope.core.job import Job
from velvetrope.core.policy import SaturationPolicy
from velvetrope.core.prefill_backlog import PrefillBacklog

__all__ = ["EngineReading", "EngineSaturation"]

_INF: Final = math.inf
_ABSENT: Final[Any] = object()


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One reading of an engine's gauges: requests running, requests waiting, KV usage 0..1."""

    running: float
    waiting: float
    kv_usage: float


def _kv_holds(r: EngineReading, max_kv: float) -> float:
    """How many more requests ``r``'s engine has KV cache for before ``max_kv``, at what each
    of its running requests holds on average (``inf``: a reading with nothing running or an
    empty cache does not measure it)."""
    if r.running <= 0 or r.kv_usage <= 0.0:
        return _INF
    return (max_kv - r.kv_usage) * r.running / r.kv_usage


class _Engine:
    __slots__ = ("at", "blind", "capacity", "learned", "ours", "ours_at", "reading")

    def __init__(self, window: float) -> None:
        self.reading: EngineReading | None = None
        self.at = -_INF
        self.ours = 0
        self.ours_at = 0
        self.capacity = window
        """The learned capacity, or the slow-start window until ``learned``."""
        self.learned = False
        self.blind = False


class EngineSaturation:
    """The saturation rule of one pool; see the module docstring."""

    def __init__(
        self,
        pool: str,
        *,
        max_waiting: int = 2,
        max_kv_usage: float = 0.97,
        stale_after_s: float = 3.0,
        initial_capacity: int = 1,
    ) -> None:
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_kv_usage = max_kv_usage
        self.stale_after_s = stale_after_s
        self.initial_capacity = float(max(1, initial_capacity))
        self.holds = 0
        """Times a dispatch was held (cumulative)."""
        self.reserve_holds = 0
        """Of :attr:`holds`, lower-band dispatches held for the top band's KV reserve."""
        self.prefill_holds = 0
        """Of :attr:`holds`, lower-band dispatches held while every engine's prefill backlog
        takes longer than the top band's budget."""
        self._engines: dict[str, _Engine] = {}
        self._live: list[_Engine] = []
        self._live_ids: list[str] = []
        self._where: dict[str, str | None] = {}
        self._pending = 0
        self.headroom: TierHeadroom | None = None
        """Lets jobs with a TTFT objective past the brake (:mod:`velvetrope.core.headroom`)."""
        self.backlog: PrefillBacklog | None = None
        """Each engine's prompt tokens not prefilled yet, for the replica choice
        (:mod:`velvetrope.core.prefill_backlog`)."""

    @classmethod
    def from_policy(cls, pool: str, policy: SaturationPolicy) -> EngineSaturation:
        """The rule for ``pool`` with ``policy``'s parameters."""
        return cls(
            pool,
            max_waiting=policy.max_waiting,
            max_kv_usage=policy.max_kv_usage,
            stale_after_s=policy.stale_s,
            initial_capacity=policy.initial_capacity,
        )

    # -- inputs ------------------------------------------------------------------------

    def _engine(self, engine: str) -> _Engine:
        e = self._engines.get(engine)
        if e is None:
            e = self._engines[engine] = _Engine(self.initial_capacity)
        return e

    def set_engines(self, engines: Iterable[str]) -> None:
        """The pool's live engines (healthy, breaker closed) are now ``engines``; the others
        count for nothing until they are live again (their readings and jobs are kept)."""
        ids = list(dict.fromkeys(engines))
        self._live_ids = ids
        self._live = [self._engine(i) for i in ids]

    def observe(self, engine: str, reading: EngineReading | None, now: float) -> None:
        """Take a reading of ``engine`` taken at ``now``.  ``None``: the engine could not be
        read (or not understood); an engine never read is then *blind* (no saturation for
        it) at once, an engine read before keeps its last reading until it is stale."""
        e = self._engine(engine)
        if reading is None:
            if e.reading is None:
                e.blind = True
            return
        e.blind = False
        e.reading = reading
        e.at = now
        e.ours_at = e.ours
        running = reading.running
        if running > 0 and reading.waiting > 0:
            e.capacity = running
            e.learned = True
        elif running >= e.capacity and reading.kv_usage < self.max_kv_usage:
            # running all it was given, no queue: probe one more, or (slow start) double
            e.capacity = running + 1 if e.learned else 2 * running

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from the pool: pending until :meth:`sent` or its end."""
        self._where[job.id] = None
        self._pending += 1
        if self.headroom is not None:
            self.headroom.started(job, now)
        if self.backlog is not None:
            self.backlog.started(job)

    def first_token(self, job: Job, now: float) -> None:
        """``job`` produced its first token (the headroom rule measures starts; its prompt
        leaves the prefill backlog)."""
        if self.headroom is not None:
            self.headroom.first_token(job, now)
        if self.backlog is not None:
            self.backlog.prefilled(job.id, now)

    def sent(self, job_id: str, engine: str) -> None:
        """Job ``job_id`` was handed to ``engine`` (again, to another, on a retry).  Ignored
        for a job the rule does not hold (ended already, or started before it was attached)."""
        where = self._where
        if job_id not in where:
            return
        prev = where[job_id]
        if prev is None:
            self._pending -= 1
        else:
            self._engines[prev].ours -= 1
        self._engine(engine).ours += 1
        where[job_id] = engine
        if self.backlog is not None:
            self.backlog.sent(job_id, engine)

    def ended(self, job: Job, now: float) -> None:
        """``job`` reached its terminal state: release it from wherever it was counted."""
        if self.headroom is not None:
            self.headroom.ended(job, now)
        if self.backlog is not None:
            self.backlog.ended(job.id)
        prev = self._where.pop(job.id, _ABSENT)
        if prev is _ABSENT:
            return
        if prev is None:
            self._pending -= 1
        else:
            self._engines[prev].ours -= 1

    # -- the rule ----------------------------------------------------------------------

    def _rooms(self, engines: list[_Engine], now: float, stop: bool) -> list[float]:
        """The room of each of ``engines`` (``inf``: unlimited), up to the first unlimited
        one when ``stop``."""
        out: list[float] = []
        stale, max_kv, max_waiting = self.stale_after_s, self.max_kv_usage, self.max_waiting
        for e in engines:  # one loop, no method call per engine: the dispatch path runs it
            r = e.reading
            if e.blind:
                room = _INF
            elif r is None:  # never read yet: idle but for what we sent
                room = e.capacity + max_waiting - e.ours
            elif now - e.at > stale:
                room = _INF
            elif r.kv_usage >= max_kv:
                room = 0.0
            else:
                sent = e.ours - e.ours_at
                room = e.capacity + max_waiting - (r.running + r.waiting + sent)
                kv_room = _kv_holds(r, max_kv) + (max_waiting - r.waiting - sent)
                if kv_room < room:
                    room = kv_room
            out.append(room)
            if stop and room == _INF:
                break
        return out

    def room(self, now: float) -> float:
        """Dispatches the pool's engines can take now (``inf``: not limited by readings)."""
        if not self._live:
            return _INF
        total = 0.0
        for r in self._rooms(self._live, now, True):
            if r == _INF:
                return _INF
            if r > 0:
                total += r
        return total - self._pending

    def warming(self, now: float) -> bool:
        """Whether some live engine with current readings is still in slow start (no
        reading has shown it queueing, so its capacity is not learned yet)."""
        stale = self.stale_after_s
        for e in self._live:
            if not (e.learned or e.blind or (e.reading is not None and now - e.at > stale)):
                return True
        return False

    def _waiting(self, now: float) -> float:
        """Requests waiting in the live engines by their current readings (an engine with
        no current reading counts none)."""
        stale = self.stale_after_s
        total = 0.0
        for e in self._live:
            r = e.reading
            if r is not None and not e.blind and now - e.at <= stale:
                total += r.waiting
        return total

    def _kept_for_top(self, reserve: float, now: float) -> bool:
        """Whether every live engine's KV cache, by its current reading and counting what
        was sent there since and what the pool dispatched and has not sent anywhere yet,
        has room for fewer than ``reserve`` / engines + 1 requests at what a running request
        holds on average: the room the top band's arrivals need (module docstring).  False
        without a reserve, or while some engine has no current reading that measures it."""
        live = self._live
        if reserve <= 0.0 or not live:
            return False
        need = reserve / len(live) + 1.0 + self._pending
        max_kv, stale = self.max_kv_usage, self.stale_after_s
        for e in live:
            r = e.reading
            if e.blind or r is None or now - e.at > stale:
                return False
            if _kv_holds(r, max_kv) - (e.ours - e.ours_at) >= need:
                return False
        return True

    def _prefill_behind(self, budget_s: float, now: float) -> bool:
        """Whether every live engine's prefill backlog takes at least ``budget_s`` at its
        measured prefill rate (:meth:`~velvetrope.core.prefill_backlog.PrefillBacklog.prefill_s`):
        a prompt sent to any of them now is prefilled after the top band's budget.  False
        with no budget (``inf``), no backlog kept, or no live engine."""
        backlog = self.backlog
        if budget_s == _INF or backlog is None or not self._live_ids:
            return False
        return all(backlog.prefill_s(eid, now) >= budget_s for eid in self._live_ids)

    def _kv_free(self, now: float) -> bool:
        """Whether some live engine has room in its KV cache by its last reading, counting
        the requests sent to it since and those the pool dispatched and has not sent
        anywhere yet at what each running request holds on average (or no reading to go
        by): the start-time headroom sends nothing to engines that cannot start it (a burst
        dispatched at one instant is pending until each job is sent: uncounted, it would all
        pass on one reading)."""
        max_kv, stale, pending = self.max_kv_usage, self.stale_after_s, self._pending
        for e in self._live:
            r = e.reading
            if e.blind or r is None or now - e.at > stale:
                return True
            if r.kv_usage < max_kv and _kv_holds(r, max_kv) > e.ours - e.ours_at + pending:
                return True
        return not self._live

    def slack(self, now: float, share: float) -> bool:
        """Whether the engines plainly have room for more: every live engine has a current
        reading showing no request waiting and KV-cache usage under ``share`` ×
        ``max_kv_usage``.  False with no live engine, or one blind or stale (unknown is not
        room)."""
        if not self._live:
            return False
        stale, kv = self.stale_after_s, share * self.max_kv_usage
        for e in self._live:
            r = e.reading
            if e.blind or r is None or now - e.at > stale or r.waiting > 0 or r.kv_usage >= kv:
                return False
        return True

    def allows_dispatch(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """True unless the pool's live engines are saturated and ``job`` gets no headroom
        (:mod:`velvetrope.core.headroom`); a hold counts in ``holds``.

        Headroom is a top-band job ahead of lower-band requests the engines queue, whatever
        their KV caches hold (an engine that orders its queue by the tier gives the KV it
        frees to that job before them: held in the gateway, the job would wait for them
        too), or a job the engines start within its TTFT while some engine's KV cache has
        room.  A lower-band job is held, whatever the room, while no engine's KV cache keeps
        the top band's reserve (module docstring; counted in ``reserve_holds`` too), or
        while every engine's prefill backlog outlasts the top band's budget (counted in
        ``prefill_holds`` too)."""
        h = self.headroom
        if job.band > 0 and h is not None:
            if self._kept_for_top(h.top_reserve(now), now):
                self.reserve_holds += 1
                self.holds += 1
                return False
            if self._prefill_behind(h.top_budget_s(now), now):
                self.prefill_holds += 1
                self.holds += 1
                return False
        if self.room(now) >= 1.0:
            return True
        if h is not None:
            if job.band == 0 and h.ordered and h.overtakes(job, self._waiting(now), now):
                return True
            if self._kv_free(now) and h.allows_dispatch(job, now):
                return True
        self.holds += 1
        return False

    # -- introspection -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Jobs dispatched from the pool and not yet sent to an engine."""
        return self._pending

    def engine_room(self, engine: str, now: float) -> float:
        """Dispatches ``engine`` can take now by its readings (``inf``: unlimited; the
        pool's pending dispatches are not subtracted)."""
        return self._rooms([self._engine(engine)], now, False)[0]

    def has_room(self, engine: str, now: float) -> bool:
        """Whether ``engine`` can take one more dispatch by its readings."""
        return self.engine_room(engine, now) >= 1.0

    def prefill_ahead(self, engine: str, job: Job) -> int:
        """The prompt tokens ``engine`` prefills before ``job``'s first token
        (:meth:`PrefillBacklog.ahead`; 0 without a backlog)."""
        return 0 if self.backlog is None else self.backlog.ahead(engine, job)

    def state(self, engine: str, now: float) -> str:
        """``blind`` (declared unreadable before any reading), ``stale`` (its last reading is
        older than ``stale_after_s``) or ``on`` (its readings, or before the first one its
        slow-start window, limit it)."""
        e = self._engine(engine)
        if e.blind:
            return "blind"
        if e.reading is not None and now - e.at > self.stale_after_s:
            return "stale"
        return "on"

    def ours(self, engine: str) -> int:
        """This pool's jobs sent to ``engine`` and not yet ended."""
        e = self._engines.get(engine)
        return 0 if e is None else e.ours

    def status(self, now: float) -> dict[str, dict[str, Any]]:
        """Per live engine: its state (:meth:`state`), last reading, the reading's age, the
        capacity and whether it was learned (else: the slow-start window), the corrected
        load (``projected``) and its room (``None``: unlimited)."""
        out: dict[str, dict[str, Any]] = {}
        rooms = self._rooms(self._live, now, False)
        for eid, e, room in zip(self._live_ids, self._live, rooms, strict=True):
            r = e.reading
            out[eid] = {
                "state": self.state(eid, now),
                "running": None if r is None else r.running,
                "waiting": None if r is None else r.waiting,
                "kv_usage": None if r is None else r.kv_usage,
                "age_s": None if r is None else now - e.at,
                "capacity": e.capacity,
                "capacity_learned": e.learned,
                "ours": e.ours,
                "projected": None if r is None else r.running + r.waiting + e.ours - e.ours_at,
                "room": None if room == _INF else room,
                "prefill_backlog_tokens": (
                    None if self.backlog is None else self.backlog.tokens(eid)
                ),
                "prefill_backlog_s": (
                    None if self.backlog is None else self.backlog.prefill_s(eid, now)
                ),
            }
        return out
