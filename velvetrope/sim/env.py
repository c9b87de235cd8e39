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

Priorities are integers, lower first; :func:`priority` packs an event class and a rank
within the class into one, so that, for example, every replica's step end at a time comes
before any arrival at that time, and step ends among themselves go by replica number.
"""

from __future__ import annotations

import heapq
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

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)
        self._heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(
        self, at: float, prio: int, callback: Callable[[Any], None], arg: Any = None
    ) -> None:
        """Run ``callback(arg)`` at time ``at`` (``>= now``) with priority ``prio``."""
        if not at >= self.now:  # also refuses nan
            raise PolicyError(f"cannot schedule at {at!r}, before now ({self.now!r})")
        self._seq += 1
        heapq.heappush(self._heap, (at, prio, self._seq, callback, arg))

    def peek(self) -> float:
        """The time of the next event (``inf`` when there is none)."""
        return self._heap[0][0] if self._heap else math.inf

    def run(self, until: float = math.inf) -> None:
        """Run events in order until none is left or the next is later than ``until``; then
        :attr:`now` is the last event's time (or ``until`` if it is finite and later)."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            at, _, _, callback, arg = pop(heap)
            self.now = at
            callback(arg)
        if math.isfinite(until) and until > self.now:
            self.now = until
