"""Time sources.

Nothing in :mod:`velvetrope.core` or :mod:`velvetrope.engine` reads the wall clock: they
are handed a :class:`Clock` (or a timestamp) by their driver.  The gateway uses
:class:`SystemClock`, the simulator and the tests a :class:`ManualClock`.

All times are float seconds on an arbitrary monotonic origin.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A monotonic time source, in seconds."""

    def now(self) -> float:
        """Return the current time; never smaller than any value returned before."""
        ...


class SystemClock:
    """The process's monotonic clock (:func:`time.monotonic`)."""

    __slots__ = ()

    now = staticmethod(time.monotonic)  # the C function itself: no Python frame per read


class ManualClock:
    """A clock that moves only when told to: for tests and virtual-time simulation."""

    __slots__ = ("_t",)

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        """Move forward by ``dt >= 0`` seconds and return the new time."""
        if dt < 0:
            raise ValueError(f"a clock cannot go backwards (dt={dt})")
        self._t += dt
        return self._t

    def set(self, t: float) -> None:
        """Jump to ``t``, which must not be earlier than the current time."""
        if t < self._t:
            raise ValueError(f"a clock cannot go backwards ({t} < {self._t})")
        self._t = float(t)
