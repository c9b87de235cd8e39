"""What a policy reload may change while the controller runs, and what it removes.

:meth:`~velvetrope.core.controller.AdmissionController.reconfigure` applies a new
:class:`~velvetrope.core.policy.PolicyConfig` between two events.  Applied at once:
tenants (added, removed, moved between tiers, their limits, weights and bounds), tiers
(added, removed, reordered, their weights, shares, bounds, waits, limits, SLOs, degrade
rules), pools (added; their fixed limits), routes, model limits and the global queue bound.
What the controller has learned is kept: queued and in-flight jobs, the output predictor,
each pool's drain rate and adaptive limit, fairness counters and band credits.

A setting whose state would have to be thrown away or rebuilt is refused instead, named by
:func:`restart_needed`: the estimator (the predictor's state is built for it), the
saturation rule's settings, the queue's structure (``bands``, ``fairness``, ``ordering``
and their parameters: the queued jobs' keys were computed with them), the drain meter's
smoothing, and a pool's switch of ``limit`` mode or a change of its adaptive or
``slo_limit`` settings (``engine_priority`` too, in ``slo`` mode).  A pool that disappears
from the policy keeps its jobs in flight; its queued jobs, and those of a removed tenant or
tier, are rejected with :attr:`~velvetrope.core.lifecycle.Reason.REMOVED_BY_RELOAD`
(:func:`orphaned`).
"""

from __future__ import annotations

from collections.abc import Collection

from velvetrope.core.job import Job
from velvetrope.core.policy import PolicyConfig

__all__ = ["orphaned", "restart_needed"]


def restart_needed(old: PolicyConfig, new: PolicyConfig) -> list[str]:
    """The settings that differ between ``old`` and ``new`` (both with their preset
    applied) and cannot change without a restart; empty when ``new`` can be applied."""
    out: list[str] = []
    if old.estimator != new.estimator:
        out.append("policy.estimator")
    if old.saturation != new.saturation:
        out.append("policy.saturation")
    structure = {"max_queued"}
    if old.queue.model_dump(exclude=structure) != new.queue.model_dump(exclude=structure):
        out.append("policy.queue (other than max_queued)")
    if (old.drain_ewma_alpha, old.drain_window_s) != (new.drain_ewma_alpha, new.drain_window_s):
        out.append("policy.drain_ewma_alpha / drain_window_s")
    before = {p.name: p for p in old.pools}
    for p in new.pools:
        was = before.get(p.name)
        if was is None:
            continue
        if was.limit_mode != p.limit_mode:
            out.append(f"pool {p.name!r}: a switch of limit ({was.limit_mode} -> {p.limit_mode})")
        elif was.limit_mode == "adaptive" and was.adaptive != p.adaptive:
            out.append(f"pool {p.name!r}: adaptive")
        elif was.limit_mode == "slo" and (
            was.slo_limit != p.slo_limit or was.engine_priority != p.engine_priority
        ):
            out.append(f"pool {p.name!r}: slo_limit / engine_priority")
    return out


def orphaned(
    queued: Collection[Job],
    old: PolicyConfig,
    new: PolicyConfig,
    gone_tenants: Collection[str] = (),
) -> list[Job]:
    """The queued jobs ``new`` leaves no place for: their pool or tier is gone, or their
    tenant was listed by ``old`` and is not by ``new``, or is in ``gone_tenants`` (e.g.
    its last API key was removed)."""
    pools = {p.name for p in new.pools}
    tiers = {t.name for t in new.tiers}
    removed = {t.name for t in old.tenants} - {t.name for t in new.tenants}
    removed.update(gone_tenants)
    return [
        job
        for job in queued
        if job.pool not in pools or job.tier not in tiers or job.tenant in removed
    ]
