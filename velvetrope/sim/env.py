"""The simulator's event environment: one clock, one heap of events (SimPy's shape).

SimPy's ``Environment`` keeps ``now`` and a heap of ``(time, priority, id, event)``; events at
the same time run by priority, then in the order they were scheduled.  This one does the
same with plain callbacks, which is what the simulator needs and all its hot loop can
afford:

* :meth:`Environment.schedule` ``(at, priority, callback, arg)``: ``callback(arg)`` will run
  at ``at`` (never before :attr:`now`);
* :meth:`Environment.run` pops events in ``(time, priority, sequence)`` order, sets
  :attr:`now` to the event's time and calls it, until the heap is empty or the next event is
  later than ``until``; a callback may schedule more events, at ``now`` or later;
* an event is cancelled by whoever scheduled it (it keeps a token and ignores a call whose
  token is stale): the heap never needs a search;
* :attr:`Environment.timers` are events outside the heap, one per index ``k``, each pending
  at ``timers[k]`` (``inf``: not pending) and run as ``on_timer(k)``: setting ``timers[k]``
  (never before :attr:`now`) moves timer ``k``, so a time that keeps changing leaves no
  stale event behind, and a timer costs no heap operation.  At one time, timers run before
  every heap event, lower index first; :meth:`~Environment.run` clears a timer before it
  runs it.

A hot loop that schedules by the ten thousand and knows its times are never before
:attr:`now` may skip :meth:`~Environment.schedule`'s call and check:
``heapq.heappush(env.heap, (at, prio, next(env.order), callback, arg))`` is the same event
(:attr:`Environment.heap` and :attr:`Environment.order` are public for that, and for nothing
else).

Priorities are integers, lower first; :func:`priority` packs an event class and a rank
within the class into one, so that, for example, a scrape at a time comes before any arrival
at that time.  Timers suit a few sources whose next time is moved often (a replica's step
end): :meth:`~Environment.run` takes the earliest of them by a scan, each event.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from velvetrope.errors import PolicyError

__all__ = ["Environment", "priority"]

_RANK_BITS = 40


def priority(event_class: int, rank: int = 0) -> int:
    """One integer ordering first by ``event_class`` then by ``rank`` (both ``>= 0``, rank
    below 2**40)."""
    if event_class < 0 or not 0 <= rank < 1 << _RANK_BITS:
        raise PolicyError(f"bad priority ({event_class}, {rank})")
    return (event_class << _RANK_BITS) | rank


def _unset(k: int) -> None:
    raise PolicyError(f"timer {k} is due but the environment has no on_timer")


class Environment:
    """One ``now``, one event heap and the timers (see the module docstring)."""

    __slots__ = ("heap", "now", "on_timer", "order", "timers")

    def __init__(
        self, start: float = 0.0, *, timers: int = 0, on_timer: Callable[[int], None] | None = None
    ) -> None:
        self.now = float(start)
        self.heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        """The pending events ``(at, prio, sequence, callback, arg)`` (a heapq heap)."""
        self.order = itertools.count(1)
        """The events' sequence numbers, in scheduling order."""
        self.timers = [math.inf] * timers
        """When each timer is due (``inf``: not pending); set directly, may be appended to."""
        self.on_timer = on_timer or _unset
        """What a due timer runs, with its index."""

    def __len__(self) -> int:
        return len(self.heap) + sum(1 for t in self.timers if t < math.inf)

    def schedule(
        self, at: float, prio: int, callback: Callable[[Any], None], arg: Any = None
    ) -> None:
        """Run ``callback(arg)`` at time ``at`` (``>= now``) with priority ``prio``."""
        if not at >= self.now:  # also refuses nan
            raise PolicyError(f"cannot schedule at {at!r}, before now ({self.now!r})")
        heapq.heappush(self.heap, (at, prio, next(self.order), callback, arg))

    def peek(self) -> float:
        """The time of the next event (``inf`` when there is none)."""
        return min([self.heap[0][0] if self.heap else math.inf, *self.timers])

    def run(self, until: float = math.inf) -> None:
        """Run events in order until none is left or the next is later than ``until``; then
        :attr:`now` is the last event's time (or ``until`` if it is finite and later)."""
        heap = self.heap
        timers = self.timers
        on_timer = self.on_timer
        pop = heapq.heappop
        inf = math.inf
        while True:
            t = min(timers) if timers else inf
            if heap and heap[0][0] < t:  # (a timer goes first at equal times)
                if heap[0][0] > until:
                    break
                at, _, _, callback, arg = pop(heap)
                self.now = at
                callback(arg)
            elif t <= until and t < inf:
                k = timers.index(t)
                timers[k] = inf
                self.now = t
                on_timer(k)
            else:
                break
        if math.isfinite(until) and until > self.now:
            self.now = until
