"""The asyncio side of admission: waiting in the queue without blocking anything else.

:class:`Admission` owns the :class:`~velvetrope.core.controller.AdmissionController` for the
gateway.  A queued request awaits a future that is resolved when the controller dispatches
it (after any event that frees capacity) or when its deadline expires (a single timer
armed at the controller's next deadline).  A client that disconnects while queued cancels
its job at once.  Every exit path ends the job in the controller exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

from velvetrope.core import (
    AdmissionController,
    Admitted,
    Denial,
    Grant,
    Job,
    Outcome,
    Queued,
    Reason,
    Rejected,
    Usage,
)
from velvetrope.core.request import JobState
from velvetrope.errors import LifecycleError

__all__ = ["Admission", "Waited"]

Waited = Admitted | Rejected | Outcome | Literal["disconnected"]


class Admission:
    """Bridges the sans-IO controller and the event loop."""

    def __init__(self, ctl: AdmissionController) -> None:
        self.ctl = ctl
        self._waiters: dict[str, asyncio.Future[Outcome | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _tick(self) -> None:
        """Expire what is due and wake the expired jobs' waiters (expiries happen only in
        the controller's ``dispatchable`` and ``tick``, and ``tick`` returns them all)."""
        for o in self.ctl.tick():
            fut = self._waiters.pop(o.job.id, None)
            if fut is not None and not fut.done():
                fut.set_result(o)

    def pump(self) -> None:
        """Dispatch whatever the controller allows now, waking the waiters (with nothing
        queued there is nothing to dispatch or expire)."""
        if not self.ctl.queued:
            return
        for job in self.ctl.dispatchable():
            fut = self._waiters.pop(job.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        self._tick()
        self._arm()

    def _arm(self) -> None:
        nd = self.ctl.next_deadline()
        if nd is None or (self._timer_at is not None and self._timer_at <= nd):
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, nd - self.ctl.clock.now())
        self._timer_at = nd
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self._tick()
        self.pump()

    def arrive(
        self,
        job: Job,
        disconnected: asyncio.Future[None],
        reservation: Grant | Denial | None = None,
    ) -> Waited | None:
        """Arrive (with the bucket store's ``reservation``): what :meth:`admit` returns when
        it is decided at once, or ``None`` when the job was queued (then :meth:`wait`)."""
        d = self.ctl.arrive(job, reservation)
        if isinstance(d, Rejected):
            return d
        if isinstance(d, Admitted):
            if disconnected.done():
                self._abandon(job)
                return "disconnected"
            return d
        assert isinstance(d, Queued)
        return None

    async def admit(
        self,
        job: Job,
        disconnected: asyncio.Future[None],
        reservation: Grant | Denial | None = None,
        progress: Callable[[], Awaitable[None]] | None = None,
        every_s: float = 2.0,
    ) -> Waited:
        """Arrive (with the bucket store's ``reservation``) and, if queued, wait for
        dispatch, expiry or the client's disconnect.

        Returns ``Admitted`` (the job is DISPATCHED: start it and later end it with
        :meth:`complete`, :meth:`fail` or :meth:`cancel`), ``Rejected``, the ``Outcome``
        of an expiry, or ``"disconnected"``: the client left before the job was started
        upstream (it was cancelled, whether still queued or dispatched in the same tick).
        While queued, ``progress`` (if given) is awaited every ``every_s`` seconds.
        """
        res = self.arrive(job, disconnected, reservation)
        if res is not None:
            return res
        return await self.wait(job, disconnected, progress, every_s)

    async def wait(
        self,
        job: Job,
        disconnected: asyncio.Future[None],
        progress: Callable[[], Awaitable[None]] | None = None,
        every_s: float = 2.0,
    ) -> Waited:
        """Wait for a job :meth:`arrive` queued: what :meth:`admit` returns."""
        fut: asyncio.Future[Outcome | None] = disconnected.get_loop().create_future()
        self._waiters[job.id] = fut
        self.pump()
        timeout = every_s if progress is not None else None
        while not fut.done() and not disconnected.done():
            try:
                done, _ = await asyncio.wait(
                    (fut, disconnected), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done and progress is not None:
                    await progress()
            except asyncio.CancelledError:
                self._abandon(job)
                raise
        if fut.done() and not disconnected.done():
            res = fut.result()
            return Admitted(job) if res is None else res
        self._abandon(job)  # gone, even if dispatched in the same tick: never proxied
        return "disconnected"

    def _abandon(self, job: Job) -> None:
        """The waiter went away: cancel a still-queued job (or end a dispatched one)."""
        self._waiters.pop(job.id, None)
        if job.state is JobState.QUEUED:
            self.ctl.cancel(job.id)
            self.pump()
        elif job.state is JobState.DISPATCHED:
            self.cancel(job.id, Usage(0, 0))

    def first_token(self, job_id: str) -> None:
        """Record the first token (ignored if the job already ended)."""
        try:
            self.ctl.first_token(job_id)
        except LifecycleError:  # not contextlib.suppress: a context manager per call costs
            return

    def complete(self, job_id: str, usage: Usage) -> Outcome:
        out = self.ctl.complete(job_id, usage)
        self.pump()
        return out

    def fail(self, job_id: str, reason: Reason, usage: Usage | None = None) -> Outcome:
        out = self.ctl.fail(job_id, reason, usage)
        self.pump()
        return out

    def cancel(self, job_id: str, usage: Usage | None = None) -> Outcome:
        out = self.ctl.cancel(job_id, usage)
        self.pump()
        return out

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
