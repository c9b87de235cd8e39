"""The outcome of one simulated run: what was run (:class:`RunInfo`) and what happened
(:class:`SimResult`).

A :class:`SimResult` holds plain data only (numpy arrays, tuples, dataclasses) and the
summaries computed from them (:mod:`velvetrope.sim.metrics`): it carries no wall-clock
time, so two runs with the same inputs give equal results.  Rendering it (the per-tier
table, the Markdown report and its plots) is :mod:`velvetrope.sim.report`'s, which imports
this module and never the other way round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from velvetrope.core.policy import SloPolicy
from velvetrope.engine.fastforward import RunCounts
from velvetrope.sim.capacity import Capacity
from velvetrope.sim.drive_inputs import LogEntry as _RunnerLogEntry
from velvetrope.sim.fleet import PoolStats
from velvetrope.sim.metrics import JobRecords, TierStats, summarize
from velvetrope.sim.scrape import EngineSamples

if TYPE_CHECKING:
    from velvetrope.sim.autoscale import AutoscaleTrace

__all__ = ["LogEntry", "RunInfo", "SimResult"]

LogEntry = _RunnerLogEntry
"""One entry of the decision log: ``(time, kind, job id, detail)``.

Kinds: ``arrive`` (detail ``admitted``, ``queued`` or ``rejected:<reason>``), ``dispatch``
(detail: the replica number) and ``end`` (detail ``<state>:<reason>``, one per job, at its
terminal time, rejections included); with an autoscaled pool also ``scale`` (detail
``<before>-><after>`` replicas asked for), ``ready``, ``drain`` and ``gone`` (detail: the
replica number), with an empty job id."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The parameters of a run, as the report's header shows them."""

    label: str
    requests: int
    policy: str
    profile: str
    replicas: dict[str, int]
    router: str
    lengths: str
    client_timeout_s: float | None
    load: float | None
    capacity: Capacity | None
    seed: int
    engine_scheduling: str = "fcfs"
    """The engines' waiting-queue policy (``fcfs``, or vLLM's ``priority``)."""

    def rows(self) -> list[tuple[str, str]]:
        """``(parameter, value)`` pairs, formatted deterministically (the engines'
        scheduling is named only when it is not the default ``fcfs``)."""
        fleet = ", ".join(f"{p}: {n} × {self.profile}" for p, n in self.replicas.items())
        if self.engine_scheduling != "fcfs":
            fleet += f", engines scheduling by {self.engine_scheduling}"
        rows = [
            ("workload", f"{self.label} ({self.requests:,} requests)"),
            ("policy", self.policy),
            ("fleet", f"{fleet}; router {self.router}"),
        ]
        if self.load is not None and self.capacity is not None:
            c = self.capacity
            rows.append(
                (
                    "offered load",
                    f"{self.load:g} × capacity = {self.load * c.rps:.2f} req/s "
                    f"(capacity {c.rps:.2f} req/s = {c.replicas} × {c.per_replica_rps:.2f}, "
                    "closed-loop saturation throughput of the engine model on this length mix)",
                )
            )
        else:
            rows.append(("offered load", "as recorded (no rescaling)"))
        rows += [
            ("output lengths known to the core", self.lengths),
            (
                "client timeout",
                "none" if self.client_timeout_s is None else f"{self.client_timeout_s:g} s",
            ),
            ("seed", str(self.seed)),
        ]
        return rows


@dataclass(frozen=True, eq=False)
class SimResult:
    """Everything one run produced.

    ``span_s`` is the virtual time from 0 to the last event; ``pools`` the engines' busy time,
    steps and preemptions; ``tiers`` the config's tiers, highest first; ``samples`` the queue
    depth and jobs in flight seen right after each arrival, as ``(t, queued, in_flight)``;
    ``decisions`` the decision log when it was recorded (see :data:`LogEntry`); ``engines``
    the replicas' running and waiting sequences at each scrape, when recorded;
    ``autoscale`` the autoscaled pool's replicas, scale events and GPU time, if one was;
    ``fast_forward`` how the engines' pure-decode stretches were advanced (all zero when
    every step was stepped).
    """

    info: RunInfo
    records: JobRecords
    span_s: float
    pools: list[PoolStats]
    tiers: tuple[str, ...]
    slos: dict[str, SloPolicy]
    samples: tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]
    decisions: tuple[LogEntry, ...] | None = None
    engines: EngineSamples | None = None
    autoscale: AutoscaleTrace | None = None
    fast_forward: RunCounts = field(default_factory=RunCounts)
    _summary: list[TierStats] = field(default_factory=list, repr=False)

    def summary(self) -> list[TierStats]:
        """The per-tier rows, then the ``all`` row (computed once)."""
        if not self._summary:
            self._summary.extend(summarize(self.records, self.slos, self.span_s, self.tiers))
        return self._summary

    def overall(self) -> TierStats:
        """The ``all`` row."""
        return self.summary()[-1]

    def busy_fraction(self) -> float:
        """GPU busy fraction over the whole fleet (replica-weighted mean over pools)."""
        total = sum(p.replicas for p in self.pools)
        if total == 0:
            return math.nan
        return sum(p.busy_fraction * p.replicas for p in self.pools) / total
