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
  token is stale): the heap never needs a search.

A hot loop that schedules by the ten thousand and knows its times are never before
:attr:`now` may skip :meth:`~Environment.schedule`'s call and check:
``heapq.heappush(env.heap, (at, prio, next(env.order), callback, arg))`` is the same event
(:attr:`Environment.heap` and :attr:`Environment.order` are public for that, and for nothing
else).

Priorities are integers, lower first; :func:`priority` packs an event class and a rank
within the class into one, so that, for example, every replica's step end at a time comes
before any arrival at that time, and step ends among themselves go by replica number.
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


class Environment:
    """One ``now`` and one event heap (see the module docstring)."""

    __slots__ = ("heap", "now", "order")

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)
        self.heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        """The pending events ``(at, prio, sequence, callback, arg)`` (a heapq heap)."""
        self.order = itertools.count(1)
        """The events' sequence numbers, in scheduling order."""

    def __len__(self) -> int:
        return len(self.heap)

    def schedule(
        self, at: float, prio: int, callback: Callable[[Any], None], arg: Any = None
    ) -> None:
        """Run ``callback(arg)`` at time ``at`` (``>= now``) with priority ``prio``."""
        if not at >= self.now:  # also refuses nan
            raise PolicyError(f"cannot schedule at {at!r}, before now ({self.now!r})")
        heapq.heappush(self.heap, (at, prio, next(self.order), callback, arg))

    def peek(self) -> float:
        """The time of the next event (``inf`` when there is none)."""
        return self.heap[0][0] if self.heap else math.inf

    def run(self, until: float = math.inf) -> None:
        """Run events in order until none is left or the next is later than ``until``; then
        :attr:`now` is the last event's time (or ``until`` if it is finite and later)."""
        heap = self.heap
        pop = heapq.heappop
        if until == math.inf:  # (the same loop, without a comparison per event)
            while heap:
                at, _, _, callback, arg = pop(heap)
                self.now = at
                callback(arg)
            return
        while heap and heap[0][0] <= until:
            at, _, _, callback, arg = pop(heap)
            self.now = at
            callback(arg)
        if math.isfinite(until) and until > self.now:
            self.now = until
