"""An asyncio event loop on a virtual clock, for tests of code timed by ``loop.call_later``.

:class:`VirtualTimeLoop` is a selector event loop whose :meth:`~VirtualTimeLoop.time`
returns a clock that no wall time moves.  When the loop has nothing ready to run and
would wait for its next timer, the clock jumps to that timer at once instead; sockets are
still polled (without blocking) on every turn.  Every ``call_later``, ``asyncio.sleep``,
``wait_for`` or ``asyncio.timeout`` of the code under test then fires at exactly its
virtual instant, whatever the machine's load: a timing test asserts exact bounds and takes
no wall time.  A loop with nothing ready, no timer and no socket to wait on would wait
forever: it raises :class:`VirtualDeadlock` instead.

:func:`run` runs a coroutine on a fresh virtual loop; :func:`elapse` lets virtual time pass
(every timer due in it fires) and refuses to run on a loop with a real clock, so it can
never become a fixed sleep.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualDeadlock", "VirtualTimeLoop", "elapse", "run"]

T = TypeVar("T")


class VirtualDeadlock(RuntimeError):
    """Every task waits, and no timer or socket will ever wake one."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; where the loop would block for ``timeout`` seconds, moves its
    clock forward by that much instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:
            raise VirtualDeadlock("every task waits and no timer is scheduled")
        self._loop.advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock moves only from timer to timer (see the module)."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the loop does it when it would wait for a timer)."""
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._now += seconds


async def elapse(seconds: float) -> None:
    """Let ``seconds`` of virtual time pass on the running :class:`VirtualTimeLoop`; every
    timer due meanwhile fires.  No wall time passes."""
    if not isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
        raise TypeError("elapse() runs on a VirtualTimeLoop only (it would be a real sleep)")
    await asyncio.sleep(seconds)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh :class:`VirtualTimeLoop` (as :func:`asyncio.run` would)."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
