"""How long a tier's dispatched jobs take to their first token, and which queued job that
makes too late to dispatch.

A queued job of a tier with a TTFT objective waits at most that objective (its deadline,
:attr:`~velvetrope.core.policy.TierPolicy.wait_bound_s`); but a job dispatched a moment
before its deadline still needs its prefill, and whatever the engine starts first, before
its first token.  Dispatched that late it misses its objective anyway, and the engine's
work on it (its prefill, then every token it streams) is taken from requests that could
still meet theirs.

:class:`FirstTokenLead` measures the *lead*, the time from dispatch to first token, of
each such tier's streamed jobs dispatched within a sliding window (``window_s``: a lead
from another load is not this one's), and takes its ``quantile`` (a low one: ``0.1`` means
nine in ten of those jobs took longer).  Only leads that have ended count, and a lead
longer than the window is never seen: the estimate errs short, toward dispatching.  That
is deliberate.  Kept by first token instead, the leads of jobs that waited long in an
engine's queue would fill the window seconds after that queue had gone, expire every job
of the tier, and so stop the dispatches whose leads would show it had gone.  A tier whose
every job was expired has no lead one window later, and is dispatched again.

:meth:`FirstTokenLead.too_late` says that a queued job whose objective is nearer than that
lead is not to be dispatched: the controller expires it (503 ``expired``, as at its
deadline) and looks at the next.  With fewer than ``min_samples`` leads in the window
there is no lead, and nothing is too late before its deadline.  The top tier is measured
and judged like any other: its late jobs cost the jobs of its own tier behind them.

Pure bookkeeping on an injected time; the controller calls it for the gateway and the
simulator alike.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from velvetrope.core.job import Job

__all__ = ["FirstTokenLead"]


class _Leads:
    """One tier's leads, and the quantile of the last reading with the moment it lapses."""

    __slots__ = ("_key", "_lapses", "_value", "added", "samples")

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()  # (dispatched at, lead)
        self.added = 0  # samples ever appended: with the deque's length, names its state
        self._key: tuple[int, int] = (0, 0)
        self._lapses = 0.0  # the reading holds while the window starts at or before this
        self._value: float | None = None

    def quantile(self, q: float, since: float, min_samples: int) -> float | None:
        s = self.samples
        while s and s[0][0] + s[0][1] < since:  # first token before the window: so was
            s.popleft()  # its dispatch
        if len(s) < min_samples:
            return None
        key = (self.added, len(s))
        if key == self._key and since <= self._lapses:
            return self._value
        window = [(d, lead) for d, lead in s if d >= since]
        self._key = key
        self._lapses = min((d for d, _ in window), default=math.inf)
        n = len(window)
        if n < min_samples:
            self._value = None
        else:
            leads = sorted(lead for _, lead in window)
            self._value = leads[min(n - 1, int(q * n))]
        return self._value


class FirstTokenLead:
    """Each timed tier's recent leads (dispatch to first token) and the expiries they
    decided.

    ``ttft`` maps every tier to its TTFT objective (``None``: not measured, never too
    late).  ``quantile`` in ``[0, 1)`` picks the lead from the window's sorted leads (the
    ``⌊quantile·n⌋``-th, from 0); ``window_s`` is the window; ``min_samples`` the fewest
    leads that make one.
    """

    __slots__ = ("_leads", "_ttft", "expired", "min_samples", "quantile", "window_s")

    def __init__(
        self,
        ttft: Mapping[str, float | None],
        *,
        quantile: float,
        window_s: float,
        min_samples: int = 8,
    ) -> None:
        if not 0.0 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        self.quantile = quantile
        self.window_s = window_s
        self.min_samples = min_samples
        self._ttft: dict[str, float] = {}
        self._leads: dict[str, _Leads] = {}
        self.expired = 0
        """Queued jobs found too late to dispatch (:meth:`too_late`)."""
        self.retarget(ttft)

    def retarget(self, ttft: Mapping[str, float | None]) -> None:
        """Take reloaded objectives; the leads of tiers still timed are kept."""
        self._ttft = {t: v for t, v in ttft.items() if v is not None}
        self._leads = {t: self._leads.get(t) or _Leads() for t in self._ttft}

    def first_token(self, job: Job, now: float) -> None:
        """``job``, dispatched at ``job.dispatched_at``, streamed its first token at ``now``."""
        leads = self._leads.get(job.tier)
        if leads is not None and job.dispatched_at is not None:
            leads.samples.append((job.dispatched_at, now - job.dispatched_at))
            leads.added += 1

    def lead(self, tier: str, now: float) -> float | None:
        """``tier``'s lead at ``now``; ``None`` for an untimed tier or too few samples."""
        leads = self._leads.get(tier)
        if leads is None:
            return None
        return leads.quantile(self.quantile, now - self.window_s, self.min_samples)

    def too_late(self, job: Job, now: float) -> bool:
        """Whether queued ``job``, dispatched at ``now``, would reach its first token past
        its tier's objective (or its own earlier ``deadline``) by the tier's lead (counted
        in :attr:`expired`)."""
        ttft = self._ttft.get(job.tier)
        if ttft is None:
            return False
        lead = self.lead(job.tier, now)
        if lead is None:
            return False
        due = job.arrival + ttft
        if job.deadline is not None and job.deadline < due:
            due = job.deadline
        if now + lead <= due:
            return False
        self.expired += 1
        return True

    def status(self, now: float) -> dict[str, Any]:
        """Each timed tier's lead in seconds (``None``: too few samples) and the expiries."""
        return {
            "leads_s": {t: self.lead(t, now) for t in self._ttft},
            "expired": self.expired,
        }
