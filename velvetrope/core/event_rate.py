"""The rate of events over a sliding window of an injected clock's time."""

from __future__ import annotations

from collections import deque

__all__ = ["EventRate"]


class EventRate:
    """Events per second over the last ``window_s`` seconds.

    :meth:`add` records an event at ``now``; :meth:`rate` counts those within ``window_s``
    of ``now`` over ``window_s`` (0 before any).  Times must not go backwards between calls
    (older events are dropped as the window moves)."""

    __slots__ = ("_at", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._at: deque[float] = deque()

    def add(self, now: float) -> None:
        """One event at ``now``."""
        self._at.append(now)

    def rate(self, now: float) -> float:
        """Events per second over the window ending at ``now``."""
        at = self._at
        cut = now - self.window_s
        while at and at[0] < cut:
            at.popleft()
        return len(at) / self.window_s
