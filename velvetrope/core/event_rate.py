"""Rates over a sliding window of an injected clock's time: of events (:class:`EventRate`) and
of an amount carried by events (:class:`AmountRate`)."""

from __future__ import annotations

from collections import deque

__all__ = ["AmountRate", "EventRate"]


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


class AmountRate:
    """An amount per second (tokens, say) over the last ``window_s`` seconds.

    :meth:`add` records ``amount`` at ``now``; :meth:`rate` sums what was recorded within
    ``window_s`` of ``now`` over the window, or, before a whole window has passed since the
    first record, over the time since it (at least a twentieth of the window): a rate
    measured from the first seconds is not diluted by the part of the window before them.
    0 before any record.  Times must not go backwards between calls."""

    __slots__ = ("_at", "_first", "_sum", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._at: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._first: float | None = None

    def add(self, now: float, amount: float) -> None:
        """``amount`` recorded at ``now``."""
        if self._first is None:
            self._first = now
        self._at.append((now, amount))
        self._sum += amount

    def rate(self, now: float) -> float:
        """The amount per second over the window ending at ``now`` (class docstring)."""
        first = self._first
        if first is None:
            return 0.0
        at = self._at
        cut = now - self.window_s
        while at and at[0][0] < cut:
            self._sum -= at.popleft()[1]
        if not at:
            self._sum = 0.0  # no float residue once the window is empty
            return 0.0
        span = min(self.window_s, max(now - first, self.window_s / 20.0))
        return self._sum / span
