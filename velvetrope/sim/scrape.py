"""The simulator's side of the fleet rules: capacity per engine and engine readings.

What the gateway learns from its engines over HTTP, the simulator reads from its engine
models, and hands to the same core objects:

* each pool's :class:`~velvetrope.core.capacity.PoolCapacity` is told its number of
  replicas (:meth:`~velvetrope.core.capacity.PoolCapacity.set_engines`), so limits given
  per engine become that × replicas, exactly as the gateway's live engines do;
* every ``policy.saturation.scrape_interval_s`` of virtual time, :meth:`EngineScrapes.fire`
  reads each replica's batcher (``num_running``, ``num_waiting``, ``kv_usage``: what a vLLM
  server's gauges report) into its pool's
  :class:`~velvetrope.core.saturation.EngineSaturation`, and the loop then dispatches what
  the fresh readings allow, as the gateway does after each scrape round;
* :meth:`EngineScrapes.route` picks the replica, preferring those the rule gives room (the
  gateway's replica choice); :meth:`EngineScrapes.sent` tells the rule which replica took a
  job (the gateway's ``sent``); the rule hears of each job's start and end from the
  controller itself.

A reading is what vLLM's gauges say: the state after the engine's last scheduling step.
A sequence added since that step has not been scheduled yet and is not counted as waiting
(vLLM updates ``vllm:num_requests_waiting`` from each step's scheduler statistics, so a
request handed to it between steps shows up only once a step has tried to schedule it);
the loop counts those adds in :attr:`EngineScrapes.fresh` and zeroes a replica's count when
it starts a step.  Readings are never stale here (a modelled engine always answers).  With
``record=True`` each scrape also records every replica's running and waiting sequences
(:class:`EngineSamples`), with or without the saturation rule: what an operator's Prometheus
would have scraped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from velvetrope.core import AdmissionController, EngineReading, EngineSaturation, Job
from velvetrope.core.routing import least_loaded
from velvetrope.sim.fleet import Fleet

__all__ = ["EngineSamples", "EngineScrapes"]


@dataclass(frozen=True, slots=True, eq=False)
class EngineSamples:
    """Per scrape (rows) and replica (columns): sequences running and waiting in the engine."""

    t: NDArray[np.float64]
    running: NDArray[np.int64]
    waiting: NDArray[np.int64]


class EngineScrapes:
    """Capacity per engine, the saturation rules' readings, and optional samples."""

    __slots__ = (
        "_ctl",
        "_fleet",
        "_ids",
        "_pool_rule",
        "_rule_of",
        "_rules",
        "_running",
        "_t",
        "_waiting",
        "fresh",
        "interval_s",
        "next_at",
        "record",
    )

    def __init__(self, ctl: AdmissionController, fleet: Fleet, *, record: bool = False) -> None:
        self._fleet = fleet
        self._ids = [str(k) for k in range(len(fleet))]
        self._rule_of: list[EngineSaturation | None] = [None] * len(fleet)
        self._ctl = ctl
        self._rules: list[tuple[EngineSaturation, list[int]]] = []
        self._pool_rule: list[EngineSaturation | None] = []
        for name, (lo, hi) in zip(fleet.pool_names, fleet.ranges, strict=True):
            ctl.pool_capacity(name).set_engines(hi - lo)
            rule = ctl.saturation(name)
            self._pool_rule.append(rule)
            if rule is not None:
                rule.set_engines(self._ids[lo:hi])
                self._rules.append((rule, list(range(lo, hi))))
                for k in range(lo, hi):
                    self._rule_of[k] = rule
        self.interval_s = ctl.config.saturation.scrape_interval_s
        self.record = record
        self.next_at = self.interval_s if (self._rules or record) else math.inf
        """Virtual time of the next scrape (``inf``: nothing to scrape)."""
        self.fresh = [0] * len(fleet)
        """Sequences added to each replica since its last step started (kept by the loop)."""
        self._t: list[float] = []
        self._running: list[list[int]] = []
        self._waiting: list[list[int]] = []

    def add(self, k: int) -> None:
        """Replica ``k`` was just added to the fleet (an autoscaled pool; not live yet)."""
        self._ids.append(str(k))
        self._rule_of.append(self._pool_rule[self._fleet.pool_of[k]])
        self.fresh.append(0)

    def set_live(self, pool: int, live: list[int], present: list[int]) -> None:
        """Pool number ``pool`` now has the replicas ``live`` taking work (capacity per
        engine × those) and ``present`` answering scrapes (the live ones and the draining)."""
        name = self._fleet.pool_names[pool]
        self._ctl.pool_capacity(name).set_engines(len(live))
        rule = self._pool_rule[pool]
        if rule is not None:
            rule.set_engines(self._ids[k] for k in live)
            for i, (r, _) in enumerate(self._rules):
                if r is rule:
                    self._rules[i] = (rule, list(present))

    def route(
        self,
        pool: int,
        now: float,
        hashes: Sequence[int] = (),
        block_tokens: int = 0,
        job: Job | None = None,
    ) -> int:
        """The replica that takes the next job of pool number ``pool`` (which must have an
        enabled replica), ``job``: the fleet's router, except that with
        ``least_loaded`` and a saturation rule the replicas *the rule gives room*
        (:meth:`~velvetrope.core.saturation.EngineSaturation.has_room`) are preferred and,
        among them, the one with the least prefill ahead of the job
        (:meth:`~velvetrope.core.saturation.EngineSaturation.prefill_ahead`), then the
        least-loaded, as the gateway's
        :meth:`~velvetrope.gateway.upstream.engines.Engines.pick` does; none with room: the
        same choice among all.  A pool with a prefix-aware router
        (:attr:`~velvetrope.sim.fleet.Fleet.prefix`) gives it the job's prefix ``hashes``
        (of ``block_tokens`` tokens a block) and the replicas' names and loads, those with
        room first as above, and records the choice
        (:meth:`~velvetrope.core.prefix_routing.PrefixRouter.commit`): the gateway's
        :meth:`~velvetrope.gateway.upstream.upstreams.UpstreamPools.pick` does the same."""
        fleet = self._fleet
        rule = self._pool_rule[pool]
        m = fleet.members[pool]
        prefix = fleet.prefix[pool]
        if prefix is not None and len(m) > 1:
            names = [fleet.names[k] for k in m]
            loads = [fleet.load[k] for k in m]
            choice = None
            if rule is not None:
                ids = self._ids
                choice = prefix.choose(
                    hashes, block_tokens, names, loads, lambda j: rule.has_room(ids[m[j]], now)
                )
            if choice is None or choice.at < 0:
                choice = prefix.choose(hashes, block_tokens, names, loads)
            prefix.commit(choice, hashes, names[choice.at])
            return m[choice.at]
        if rule is None or len(m) == 1 or fleet.router != "least_loaded":
            return fleet.route(pool)
        ids = self._ids
        loads = [fleet.load[k] for k in m]
        ahead = None if job is None else [rule.prefill_ahead(ids[k], job) for k in m]
        i = least_loaded(loads, 0, lambda j: rule.has_room(ids[m[j]], now), ahead)
        return m[i if i >= 0 else least_loaded(loads, 0, None, ahead)]

    def sent(self, job: Job, k: int) -> None:
        """``job`` was added to replica ``k``'s engine."""
        rule = self._rule_of[k]
        if rule is not None:
            rule.sent(job.id, self._ids[k])

    def fire(self, now: float, kv_usage: Sequence[float | None] | None = None) -> None:
        """Read every replica at ``now`` and schedule the next scrape.  ``kv_usage[k]``,
        when given and not ``None``, is replica ``k``'s KV usage as of ``now`` (its batcher
        lags behind by a pending decode run: nothing else of it has changed)."""
        batchers = self._fleet.batchers
        fresh = self.fresh
        waiting = [max(0, b.num_waiting - f) for b, f in zip(batchers, fresh, strict=True)]
        for rule, present in self._rules:
            for k in present:
                b = batchers[k]
                kv = kv_usage[k] if kv_usage is not None else None
                rule.observe(
                    self._ids[k],
                    EngineReading(b.num_running, waiting[k], b.kv_usage if kv is None else kv),
                    now,
                )
        if self.record:
            self._t.append(now)
            self._running.append([b.num_running for b in batchers])
            self._waiting.append(waiting)
        self.next_at = now + self.interval_s

    def samples(self) -> EngineSamples | None:
        """What was recorded (``None`` without ``record``)."""
        if not self.record:
            return None
        n = len(self._fleet)  # rows taken before replicas were added are padded with 0

        def grid(rows: list[list[int]]) -> NDArray[np.int64]:
            out = np.zeros((len(rows), n), dtype=np.int64)
            for i, row in enumerate(rows):
                out[i, : len(row)] = row
            return out

        return EngineSamples(
            t=np.asarray(self._t, dtype=np.float64),
            running=grid(self._running),
            waiting=grid(self._waiting),
        )
