"""The gateway's budgets and usage ledger (:mod:`velvetrope.core.quota`), at the edge.

:class:`Quotas` is what :class:`~velvetrope.gateway.driver.admission.Admission` asks, on the one
reservation path and the one settlement:

* :meth:`Quotas.claims`: a job's budget and ledger claims, added to its rate-bucket claims
  before the store reserves them all or none;
* :meth:`Quotas.answer`: the store's answer with each calendar budget's reset time (its
  window's end) in place of the bucket's wait: a spent budget's 429 ``quota_exceeded``
  says when it resets (``Retry-After``, ``x-ratelimit-reset-quota``);
* :meth:`Quotas.downgrade`: for a denial by a spent budget with ``on_exceeded:
  downgrade``, what the job gets instead of the refusal (the admission downgrades it and
  reserves again without that budget's claim);
* :meth:`Quotas.settle`: the settle lines of an ended job with each budget charged its
  weighted or priced use and each ledger counter its counts.

:meth:`Quotas.headers` are the budget headers of a response: ``x-ratelimit-limit-quota``,
``x-ratelimit-remaining-quota`` and ``x-ratelimit-reset-quota`` of the budget with the
smallest share left, and ``x-velvetrope-quota-warning`` past the soft threshold (a
downgraded job says so in ``x-velvetrope-degraded``: ``quota, tier=…``).  Metrics:
``velvetrope_quota_warnings_total``, ``velvetrope_quota_refusals_total`` and
``velvetrope_quota_downgrades_total`` (by window and whether enforced: in shadow mode, a job
that ran on a spent budget that would have refused or downgraded it, which its
``x-velvetrope-shadow-quota`` header says).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry

from velvetrope.clock import WallClock
from velvetrope.core.bucket import BucketSnapshot, Claim, Denial, Grant, SettleLine
from velvetrope.core.job import Job
from velvetrope.core.quota import Downgrade, QuotaBook
from velvetrope.core.quota_config import QuotaSettings
from velvetrope.gateway.api.admission_headers import duration
from velvetrope.gateway.ops.counters import LoopCounter

__all__ = ["Quotas"]

Header = tuple[bytes, bytes]
_LIMIT: Final = b"x-ratelimit-limit-quota"
_REMAINING: Final = b"x-ratelimit-remaining-quota"
_RESET: Final = b"x-ratelimit-reset-quota"
_WARNING: Final = b"x-velvetrope-quota-warning"
_SHADOW: Final = b"x-velvetrope-shadow-quota"


class Quotas:
    """Budgets and the ledger for one gateway process (see the module docstring)."""

    def __init__(self, settings: QuotaSettings, clock: WallClock | None = None) -> None:
        self.book = QuotaBook(settings)
        self.clock = clock or WallClock()
        self.warnings = LoopCounter(
            "velvetrope_quota_warnings",
            "Admitted requests that found a budget used past quotas.soft_threshold, by window.",
            ["window"],
        )
        self.refusals = LoopCounter(
            "velvetrope_quota_refusals",
            "Requests refused for a spent budget (enforced=false: shadow mode, let through), "
            "by window.",
            ["window", "enforced"],
        )
        self.downgrades = LoopCounter(
            "velvetrope_quota_downgrades",
            "Requests over a spent budget with on_exceeded: downgrade, downgraded instead of "
            "refused (enforced=false: shadow mode, would have been), by window and new tier.",
            ["window", "tier", "enforced"],
        )

    def register(self, registry: CollectorRegistry) -> None:
        """Expose the counters in ``registry`` (the gateway's)."""
        registry.register(self.warnings)
        registry.register(self.refusals)
        registry.register(self.downgrades)

    @property
    def settings(self) -> QuotaSettings:
        return self.book.settings

    def reconfigure(self, settings: QuotaSettings) -> None:
        """A reload: see :meth:`~velvetrope.core.quota.QuotaBook.reconfigure`."""
        self.book.reconfigure(settings)

    def claims(
        self, job: Job, claims: tuple[Claim, ...], skip: Sequence[str] = ()
    ) -> tuple[Claim, ...]:
        """``claims`` (the job's rate buckets, sized) and its budgets' (but the spent ones
        keyed in ``skip``, which downgraded it) and ledger's."""
        book = self.book
        if not book.active:
            return claims
        output = max(0, job.cost - job.prompt_tokens)
        now = self.clock.now()
        return claims + book.claims(job.tenant, job.model, job.prompt_tokens, output, now, skip)

    def downgrade(self, res: Grant | Denial) -> Downgrade | None:
        """For the store's denial ``res`` (after :meth:`answer`) by a budget that
        downgrades, its :class:`~velvetrope.core.quota.Downgrade` (counted); else ``None``."""
        if not isinstance(res, Denial) or not self.book.active:
            return None
        d = self.book.exceeded(res)
        if d is not None:
            self.downgrades.labels(d.window, d.tier or "", "true").inc()
        return d

    def answer(self, job: Job, claims: Sequence[Claim], res: Grant | Denial) -> Grant | Denial:
        """The store's ``res`` to ``job``'s ``claims`` with calendar budgets' reset times: a
        denial by one (not one whose claim exceeds the whole budget) waits until its
        window ends; counts warnings and refusals (in shadow mode: a budget with less
        left than the job would have reserved)."""
        book = self.book
        if not book.active:
            return res
        now = self.clock.now()
        snaps = book.snapshots(res.snapshots, now)
        if isinstance(res, Denial):
            reset = book.reset_s(res.key, now)
            too_big = any(c.key == res.key and c.amount > c.capacity for c in claims)
            if reset is None or too_big:
                return res._replace(snapshots=snaps)
            if book.downgrade_for(res.key) is None:
                self.refusals.labels(self.book.window(res.key), "true").inc()
            return Denial(reset, res.key, snaps)
        soft = self.settings.soft_threshold
        for s in snaps:
            if s.owner == "quota" and s.remaining <= s.limit * (1.0 - soft):
                self.warnings.labels(self.book.window(s.key)).inc()
                if self._shadow_refused(job, s):
                    d = book.downgrade_for(s.key)
                    if d is None:
                        self.refusals.labels(self.book.window(s.key), "false").inc()
                    else:
                        self.downgrades.labels(d.window, d.tier or "", "false").inc()
        return res._replace(snapshots=snaps)

    def _shadow_refused(self, job: Job, s: BucketSnapshot) -> bool:
        """Whether, in shadow mode, budget ``s`` (after ``job``'s reservation of 0) would
        have refused ``job``."""
        if self.settings.enforce:
            return False
        output = max(0, job.cost - job.prompt_tokens)
        return self.book.need(s.key, job.model, job.prompt_tokens, output) > s.remaining

    def settle(
        self, job: Job, claims: Sequence[Claim], lines: Sequence[SettleLine]
    ) -> tuple[SettleLine, ...]:
        """The settle lines of ``job`` (the controller's ``lines`` for ``claims``) with its
        budgets and ledger counters set from its usage."""
        if len(lines) != len(claims) or not any(c.owner in ("quota", "ledger") for c in claims):
            return tuple(lines)
        return self.book.settle(job.model, claims, lines, job.usage)

    def burn(self, levels: Iterable[tuple[str, tuple[float, float]]]) -> list[dict[str, Any]]:
        """``/admin/status``'s ``budgets``: each budget of the current window in the store's
        ``levels``, used of its limit (:meth:`~velvetrope.core.quota.QuotaBook.burn`)."""
        return [b._asdict() for b in self.book.burn(levels, self.clock.now())]

    def headers(self, snaps: tuple[BucketSnapshot, ...], job: Job | None = None) -> list[Header]:
        """The budget headers of a response from the claimed buckets' ``snaps`` (with the
        admitted ``job``: whether shadow mode let it through a spent budget)."""
        least: BucketSnapshot | None = None
        for s in snaps:
            if s.owner == "quota" and (
                least is None or s.remaining / s.limit < least.remaining / least.limit
            ):
                least = s
        if least is None:
            return []
        left = max(0.0, least.remaining)
        out = [
            (_LIMIT, f"{least.limit:g}".encode()),
            (_REMAINING, f"{left:g}".encode()),
            (_RESET, duration(least.reset_s) if math.isfinite(least.reset_s) else b"never"),
        ]
        used = 1.0 - least.remaining / least.limit
        if used >= self.settings.soft_threshold:
            out.append((_WARNING, f"{used:.0%} of {least.key} used".encode()))
        if job is not None:
            for s in snaps:
                if s.owner == "quota" and self._shadow_refused(job, s):
                    d = self.book.downgrade_for(s.key)
                    said = f"downgraded; {d.describe()}" if d else "rejected; quota_exceeded"
                    out.append((_SHADOW, said.encode()))
                    break
        return out
