"""Time sources.

Nothing in :mod:`velvetrope.core` or :mod:`velvetrope.engine` reads the wall clock: they
are handed a :class:`Clock` (or a timestamp) by their driver.  The gateway uses
:class:`SystemClock`, the simulator and the tests a :class:`ManualClock`.

All times are float seconds on an arbitrary monotonic origin, except :class:`WallClock`'s:
epoch seconds, for what follows the calendar (budgets over days and months, the ledger's
days), which the gateway reads once per request and hands to the core.
"""

from __future__ import annotations

import os
import time
from typing import Protocol, runtime_checkable

__all__ = ["OFFSET_ENV", "Clock", "ManualClock", "SystemClock", "WallClock"]

OFFSET_ENV = "VELVETROPE_WALL_OFFSET_FILE"
"""The environment variable naming :class:`WallClock`'s offset file."""


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


class WallClock:
    """The calendar: epoch seconds (:func:`time.time`).  With ``offset_file`` (by default
    the file the environment variable ``VELVETROPE_WALL_OFFSET_FILE`` names, if set), plus
    the seconds that file holds, read again whenever its modification time or size changes: a
    test's or a drill's way to move a running gateway to the end of a day or a month.  A
    missing or unreadable file counts as 0."""

    __slots__ = ("_file", "_offset", "_stamp")

    def __init__(self, offset_file: str | None = None) -> None:
        self._file = offset_file if offset_file is not None else os.environ.get(OFFSET_ENV)
        self._stamp: tuple[int, int] | None = None
        self._offset = 0.0

    def now(self) -> float:
        """Epoch seconds, plus the offset file's seconds."""
        if self._file is None:
            return time.time()
        try:
            st = os.stat(self._file)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                with open(self._file) as f:
                    self._offset = float(f.read().strip() or 0.0)
                self._stamp = stamp
        except (OSError, ValueError):
            self._offset, self._stamp = 0.0, None
        return time.time() + self._offset
