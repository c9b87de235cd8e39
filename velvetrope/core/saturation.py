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

Readings are vLLM's gauges, per engine: ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (names as in vLLM's
"Production Metrics" documentation, docs.vllm.ai/en/stable/usage/metrics/).

**The rule.**  Each live engine ``e`` has room

    ``room_e = capacity_e + max_waiting − (running_e + waiting_e + ours_e − ours_at_e)``

where ``running_e`` and ``waiting_e`` are from its last reading, ``ours_e`` is the number of
this pool's jobs sent to ``e`` and not yet ended, and ``ours_at_e`` was that number when the
reading was taken: the reading is corrected by what was sent to the engine and came back
since.  ``capacity_e`` (what the engine runs at once) is learned: a reading that shows the
engine queueing (``waiting > 0``) sets it to ``running``; a reading that shows it running
all it was allowed with no queue and room in its KV cache raises it to ``running + 1``, a
probe (the engine's capacity moves with the lengths it holds, and a capacity learned
under KV pressure must be able to grow back), so the engine's own queue is held to
``max_waiting`` plus that one probe.  The pool admits a dispatch while
``Σ_e max(0, room_e) − pending ≥ 1``, where ``pending`` counts jobs dispatched from the
pool and not yet sent to an engine.  Per engine:

* an engine at ``kv_cache_usage_perc ≥ max_kv_usage`` has no room (its KV cache is full);
* a reading older than ``stale_after_s`` gives no room: a stale reading counts as
  saturated, never as idle;
* an engine never read, or never seen queueing and not queueing now, may have room: the
  pool is not held (a missing ``/metrics`` never stalls a pool);
* with no live engine at all the rule has nothing to say and admits (capacity per engine
  × live engines, :mod:`velvetrope.core.capacity`, decides).

**Accounting, per job.**  :meth:`~EngineSaturation.started` (every dispatch from the pool)
counts a job as pending; :meth:`~EngineSaturation.sent` moves it to the engine that took it
(again to another engine when the caller retries elsewhere); :meth:`~EngineSaturation.ended`
(its outcome, whatever it is: completed, failed, cancelled, no upstream reached) takes it
off wherever it is.  The controller calls ``started`` and ``ended`` exactly once per
dispatched job, so nothing the rule counts can leak, and :meth:`~EngineSaturation.admits`
only reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from velvetrope.core.job import Job
from velvetrope.core.policy import SaturationPolicy

__all__ = ["EngineReading", "EngineSaturation"]

_INF: Final = math.inf
_ABSENT: Final[Any] = object()


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One reading of an engine's gauges: requests running, requests waiting, KV usage 0..1."""

    running: float
    waiting: float
    kv_usage: float


class _Engine:
    __slots__ = ("at", "capacity", "ours", "ours_at", "reading")

    def __init__(self) -> None:
        self.reading: EngineReading | None = None
        self.at = -_INF
        self.ours = 0
        self.ours_at = 0
        self.capacity: float | None = None


class EngineSaturation:
    """The saturation rule of one pool; see the module docstring."""

    def __init__(
        self,
        pool: str,
        *,
        max_waiting: int = 2,
        max_kv_usage: float = 0.97,
        stale_after_s: float = 3.0,
    ) -> None:
        self.pool = pool
        self.max_waiting = max_waiting
        self.max_kv_usage = max_kv_usage
        self.stale_after_s = stale_after_s
        self.holds = 0
        """Times a dispatch was held (cumulative)."""
        self._engines: dict[str, _Engine] = {}
        self._live: list[_Engine] = []
        self._live_ids: list[str] = []
        self._where: dict[str, str | None] = {}
        self._pending = 0

    @classmethod
    def from_policy(cls, pool: str, policy: SaturationPolicy) -> EngineSaturation:
        """The rule for ``pool`` with ``policy``'s parameters."""
        return cls(
            pool,
            max_waiting=policy.max_waiting,
            max_kv_usage=policy.max_kv_usage,
            stale_after_s=policy.stale_s,
        )

    # -- inputs ------------------------------------------------------------------------

    def _engine(self, engine: str) -> _Engine:
        e = self._engines.get(engine)
        if e is None:
            e = self._engines[engine] = _Engine()
        return e

    def set_engines(self, engines: Iterable[str]) -> None:
        """The pool's live engines (healthy, breaker closed) are now ``engines``; the others
        count for nothing until they are live again (their readings and jobs are kept)."""
        ids = list(dict.fromkeys(engines))
        self._live_ids = ids
        self._live = [self._engine(i) for i in ids]

    def observe(self, engine: str, reading: EngineReading | None, now: float) -> None:
        """Take a reading of ``engine`` taken at ``now`` (``None``: it could not be read;
        the last reading is kept and grows stale)."""
        if reading is None:
            return
        e = self._engine(engine)
        e.reading = reading
        e.at = now
        e.ours_at = e.ours
        cap = e.capacity
        if reading.running > 0 and reading.waiting > 0:
            e.capacity = reading.running
        elif cap is not None and reading.running >= cap and reading.kv_usage < self.max_kv_usage:
            e.capacity = reading.running + 1  # running all it was given, no queue: probe one

    def started(self, job: Job, now: float) -> None:
        """``job`` was dispatched from the pool: pending until :meth:`sent` or its end."""
        self._where[job.id] = None
        self._pending += 1

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

    def ended(self, job: Job, now: float) -> None:
        """``job`` reached its terminal state: release it from wherever it was counted."""
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
        for e in engines:  # one loop, no call per engine: the dispatch path runs it
            r = e.reading
            if r is None:
                room = _INF
            elif now - e.at > stale or r.kv_usage >= max_kv:
                room = 0.0
            else:
                cap = e.capacity
                if cap is None and r.waiting <= max_waiting:
                    room = _INF
                else:
                    if cap is None:
                        cap = r.running
                    room = cap + max_waiting - (r.running + r.waiting + e.ours - e.ours_at)
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

    def admits(self, job: Job, in_flight: int, tokens_in_flight: int, now: float) -> bool:
        """True unless the pool's live engines are saturated (counts it in ``holds``)."""
        if self.room(now) >= 1.0:
            return True
        self.holds += 1
        return False

    # -- introspection -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Jobs dispatched from the pool and not yet sent to an engine."""
        return self._pending

    def ours(self, engine: str) -> int:
        """This pool's jobs sent to ``engine`` and not yet ended."""
        e = self._engines.get(engine)
        return 0 if e is None else e.ours

    def status(self, now: float) -> dict[str, dict[str, Any]]:
        """Per live engine: its last reading, the reading's age, the learned capacity, the
        corrected load (``projected``) and its room (``None``: unlimited)."""
        out: dict[str, dict[str, Any]] = {}
        rooms = self._rooms(self._live, now, False)
        for eid, e, room in zip(self._live_ids, self._live, rooms, strict=True):
            r = e.reading
            out[eid] = {
                "running": None if r is None else r.running,
                "waiting": None if r is None else r.waiting,
                "kv_usage": None if r is None else r.kv_usage,
                "age_s": None if r is None else now - e.at,
                "capacity": e.capacity,
                "ours": e.ours,
                "projected": None if r is None else r.running + r.waiting + e.ours - e.ours_at,
                "room": None if room == _INF else room,
            }
        return out
