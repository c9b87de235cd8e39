"""What the request machine (:mod:`velvetrope.core.request_machine`) asks its driver to
do: the effects of a request's events.

Each effect names the job it is for.  A driver (the gateway's
:class:`~velvetrope.gateway.driver.admission.Admission`, the simulator's
:class:`~velvetrope.sim.runner.SimDriver`) carries them out in the order given:

==================  ==============================================================
effect              the driver
==================  ==============================================================
:class:`Reserve`    asks the store to reserve ``claims`` (and the lease ``slot``,
                    if any, in the same trip); reports ``reserved``/``unreserved``
:class:`Acquire`    takes the dispatched job's lease; reports ``slot_granted``
                    or ``slot_failed``
:class:`Send`       hands the job to an engine (wakes its waiter); reports
                    ``sent``, ``first_token`` and its end
:class:`Cancel`     cancels the job at its engine (taken back before its first
                    token); ``refusal`` set: answer it, else it is queued again
:class:`Settle`     settles ``lines`` against ``claims`` in the store and gives
                    back the job's lease (``pool``), waking a lease waiter
:class:`Respond`    answers the job's client with ``refusal`` (no ticket)
==================  ==============================================================
"""

from __future__ import annotations

from typing import NamedTuple

from velvetrope.core.bucket import BucketSnapshot, Claim, SettleLine
from velvetrope.core.job import Job
from velvetrope.core.leases import Slot

__all__ = ["Acquire", "Cancel", "Effect", "Refusal", "Reserve", "Respond", "Send", "Settle"]


class Refusal(NamedTuple):
    """Why a request gets no answer from an engine: the HTTP ``status``, OpenAI's error
    ``code``, a ``message``, ``retry_after_s`` (``None`` when retrying cannot help) and the
    claimed buckets' ``snapshots`` (for ``x-ratelimit-*`` headers)."""

    status: int
    code: str
    message: str
    retry_after_s: float | None
    snapshots: tuple[BucketSnapshot, ...] = ()


class Reserve(NamedTuple):
    """Reserve ``claims`` for ``job``, and the lease ``slot`` in the same trip if given."""

    job: Job
    claims: tuple[Claim, ...]
    slot: Slot | None


class Acquire(NamedTuple):
    """Take the dispatched ``job``'s lease ``slot`` (waiting while every slot is leased)."""

    job: Job
    slot: Slot


class Send(NamedTuple):
    """``job`` is dispatched and has its lease: send it to an engine."""

    job: Job


class Cancel(NamedTuple):
    """Cancel ``job`` at its engine (taken back before its first token): ``refusal`` is its
    answer (503 ``preempted``; its settlement gives its lease back), or ``None`` when it is
    queued again: then its lease, if it has one, is given back now
    (:meth:`~velvetrope.store.base.Store.release`), for the job dispatched in its place."""

    job: Job
    refusal: Refusal | None


class Settle(NamedTuple):
    """Settle ``job``'s ``claims`` with ``lines`` and give back its lease (of ``job.pool``)."""

    job: Job
    claims: tuple[Claim, ...]
    lines: tuple[SettleLine, ...]


class Respond(NamedTuple):
    """Answer ``job``'s client with ``refusal``."""

    job: Job
    refusal: Refusal


Effect = Reserve | Acquire | Send | Cancel | Settle | Respond
