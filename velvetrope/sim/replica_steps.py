"""Each replica's step ends in the simulator's event loop (:mod:`velvetrope.sim.runner`),
with fast-forward (:mod:`velvetrope.engine.fastforward`).

Replica ``k``'s next step end is the event environment's timer ``k``
(:attr:`~velvetrope.sim.env.Environment.timers`, ``inf``: no step running); what that step
end delivers is either the events its step returned or, for a decode run, the events of
the run's last step.

Fast-forward: a replica whose next steps are pure decode has its step end at the end of
the whole stretch.  Anything that touches it earlier (a dispatch to it, a client timeout of
one of its jobs) first applies the stretch up to the step in progress
(:meth:`ReplicaSteps.settle`) and moves its step end there (its timer: nothing stale is
left behind).  A scrape reads each run as it stands at the step in progress without
applying it (:meth:`ReplicaSteps.projected`: only its KV blocks change before its last
step) and lets it go on; the autoscaler's signal, which reads the batchers themselves,
applies every run up to the step in progress first (:meth:`ReplicaSteps.bring_up`).  A
step starting exactly at that moment counts as started when a step-by-step loop would have
handled that step end first (a lower replica number while handling a step end; always for
the other events: ``by`` is :data:`BY_ALL`).
"""

from __future__ import annotations

import math
from typing import Final

from velvetrope.engine import Batcher, EngineEvent
from velvetrope.engine.fastforward import DecodeRun, RunCounts
from velvetrope.sim.env import Environment

__all__ = ["BY_ALL", "ReplicaSteps"]

BY_ALL: Final = 1 << 30
"""The ``by`` of events that are not step ends: after every replica's (fast-forward)."""


class ReplicaSteps:
    """Every replica's step in progress: its end (the environment's timer), the events it
    delivers, and its decode run when fast-forward planned one (see the module
    docstring).  ``fresh`` counts, per replica, the jobs added since its step began
    (:attr:`~velvetrope.sim.scrape.EngineScrapes.fresh`): a replica with any steps at once."""

    def __init__(
        self, env: Environment, batchers: list[Batcher], fresh: list[int], fast_forward: bool
    ) -> None:
        self.step_end = env.timers
        """Replica ``k``'s next step end (never before now); ``inf``: none."""
        self.batchers = batchers
        self.fresh = fresh
        self.fast_forward = fast_forward
        self.pend: list[list[EngineEvent] | None] = [None] * len(batchers)
        """What each replica's step end delivers when it has no run in progress."""
        self.runs: list[DecodeRun | None] = [None] * len(batchers)
        """Each replica's decode run in progress."""
        self.counts = RunCounts()
        self.plans = [DecodeRun(b, self.counts) for b in batchers]
        """Each replica's run, planned again and again."""

    def add_replica(self) -> None:
        """Track one more replica (the next engine slot of ``batchers``), idle."""
        self.pend.append(None)
        self.runs.append(None)
        self.plans.append(DecodeRun(self.batchers[len(self.plans)], self.counts))
        self.step_end.append(math.inf)

    def settle(self, k: int, now: float, by: int) -> None:
        """Apply replica ``k``'s pending decode run up to its step in progress at ``now``
        (seen while handling the step end of replica ``by``, :data:`BY_ALL` for the other
        events) and move its step end there.  Called before anything reads or changes
        batcher ``k``."""
        run = self.runs[k]
        if run is None:
            return
        self.runs[k] = None
        j = run.started(now, inclusive=k < by)
        self.pend[k] = run.apply(j)
        if j < run.steps:
            self.step_end[k] = run.start(j)

    def bring_up(self, now: float) -> None:
        """Apply every pending decode run up to the step in progress at ``now`` (a scrape
        reads every engine); a run that goes on past ``now`` keeps its end."""
        for k, run in enumerate(self.runs):
            if run is not None:
                j = run.started(now, inclusive=True)
                if j < run.steps:
                    run.apply(j)
                else:
                    self.settle(k, now, BY_ALL)

    def projected(self, now: float) -> list[float | None]:
        """Each replica's KV usage with its pending decode run brought up to the step in
        progress at ``now``, the run left pending (``None``: no run, read the batcher); a
        run that ends by ``now`` is settled."""
        usage: list[float | None] = [None] * len(self.runs)
        for k, run in enumerate(self.runs):
            if run is not None:
                j = run.started(now, inclusive=True)
                if j < run.steps:
                    usage[k] = run.kv_usage(j)
                else:
                    self.settle(k, now, BY_ALL)
        return usage

    def begin(self, k: int, now: float) -> None:
        """Replica ``k``, idle until now, was given work: its first step starts at once."""
        self.pend[k] = None
        self.step_end[k] = now

    def ended(self, k: int) -> list[EngineEvent] | None:
        """The events replica ``k``'s step end delivers (a decode run ending is applied
        whole: its last step's)."""
        run = self.runs[k]
        if run is None:
            return self.pend[k]
        self.runs[k] = None
        return run.apply(run.steps)

    def next_step(self, k: int, t: float) -> bool:
        """Start replica ``k``'s next step at ``t``, its step end just handled: a decode run
        when one can be planned, else one step; ``False`` when batcher ``k`` has no work
        (the replica is idle, no step end pending)."""
        b = self.batchers[k]
        # A job added since the step began is most likely admitted now, when a plan would
        # find no run: step at once (stepping is as exact as a run, only slower).
        if self.fast_forward and not self.fresh[k]:
            run = self.plans[k]
            if run.plan(t):
                self.runs[k] = run
                self.pend[k] = None
                self.step_end[k] = run.end
                return True
        self.fresh[k] = 0
        if b.has_work:
            res = b.step(t)
            self.pend[k] = res.events
            self.step_end[k] = t + res.duration
            return True
        self.pend[k] = None
        return False
