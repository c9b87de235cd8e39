"""A circuit breaker: after ``failures`` failed calls in a row, stop calling for ``reset_s``.

Sans-IO: time comes from the injected clock.  While open, :meth:`CircuitBreaker.allow`
says no at once, so a dead store costs no timeout per request.  After ``reset_s`` one probe
is let through (half-open); its success closes the breaker, its failure opens it again.
Any success reported (a heartbeat that reached the store, say) closes it too.
"""

from __future__ import annotations

from typing import Literal

from velvetrope.clock import Clock

__all__ = ["BreakerState", "CircuitBreaker"]

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Consecutive-failure breaker with a single half-open probe."""

    __slots__ = ("_clock", "_fails", "_opened_at", "_probing", "failures", "opened", "reset_s")

    def __init__(self, clock: Clock, *, failures: int = 3, reset_s: float = 0.5) -> None:
        self._clock = clock
        self.failures = failures
        self.reset_s = reset_s
        self._fails = 0
        self._opened_at: float | None = None
        self._probing = False
        self.opened = 0  # times the breaker opened

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self._probing or self._clock.now() >= self._opened_at + self.reset_s:
            return "half_open"
        return "open"

    @property
    def closed(self) -> bool:
        return self._opened_at is None

    def allow(self) -> bool:
        """May a call go to the store now?  In half-open state, only one probe at a time."""
        if self._opened_at is None:
            return True
        if self._probing or self._clock.now() < self._opened_at + self.reset_s:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        """A call reached the store: close."""
        self._fails = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        """A call failed: open after ``failures`` in a row, or when the probe failed."""
        self._fails += 1
        if self._probing or (self._opened_at is None and self._fails >= self.failures):
            if self._opened_at is None:
                self.opened += 1
            self._opened_at = self._clock.now()
            self._probing = False
