"""What the simulator's event loop (:class:`velvetrope.sim.runner.SimDriver`) takes and
gives: the per-request inputs prepared once, an autoscaled pool's parts, the trace it
returns, and the decision log's entry type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from velvetrope.core import Job
from velvetrope.engine.fastforward import RunCounts
from velvetrope.sim.replicas import ReplicaPool

__all__ = ["Autoscaling", "Inputs", "LogEntry", "Scaler", "Trace"]

LogEntry = tuple[float, str, str, str]
"""A decision-log entry (:data:`velvetrope.sim.result.LogEntry`, which is this type)."""


class Scaler(Protocol):
    """What drives an autoscaled pool: KEDA's model, or a script in the tests."""

    def next_at(self) -> float:
        """When it next acts (``inf``: never)."""
        ...

    def fire(self, now: float, current: int, ready: int) -> int:
        """Act at ``now`` with ``current`` replicas asked for, ``ready`` of them serving;
        returns the replica count it sets."""
        ...


@dataclass(slots=True)
class Autoscaling:
    """One autoscaled pool: its number, the scaler, the replicas, the signal and its scrape
    interval (``signal(now)`` is read at each scrape and handed to ``record``).

    In :class:`~velvetrope.sim.runner.SimDriver`, the pool it names is dynamic: its replicas
    come from a :class:`~velvetrope.sim.replicas.ReplicaPool`, the autoscaler's signal is
    scraped every ``scrape_interval_s``, and each change of the replica count starts
    replicas (taking work once their start-up is over) or drains them (no new work; gone
    once their batcher is empty).  The pool's in-flight limits (capacity per engine) and its
    saturation rule follow its ready replicas, the rule reads the draining ones too, and the
    decision log gains ``scale``, ``ready``, ``drain`` and ``gone`` entries.
    """

    pool: int
    scaler: Scaler
    replicas: ReplicaPool
    scrape_interval_s: float = 15.0
    signal: Callable[[float], float] | None = None
    record: Callable[[float, float], None] | None = None


@dataclass(slots=True)
class Inputs:
    """Per-request inputs, prepared once (aligned lists, in workload order).  ``outputs`` is
    updated in place when a degraded job's ``max_tokens`` cuts what its engine generates.
    ``templates`` are the requests' shared-prefix ids (the core's template, the engine's
    prefix id) and ``prefix_tokens`` the tokens of that prefix; ``blocks`` the requests'
    prefix block hashes and ``block_tokens`` their blocks' sizes (empty, 0: none)."""

    times: list[float]
    tenants: list[str]
    tiers: list[str]
    prompts: list[int]
    outputs: list[int]
    caps: list[int]
    preds: list[int | None]
    models: list[str | None]
    templates: list[str | None]
    pool_index: dict[str, int]
    max_len: int
    prefix_tokens: list[int]
    blocks: list[tuple[int, ...]]
    block_tokens: list[int]
    engine_priority: dict[tuple[str, str], int] = field(default_factory=dict)
    """``(pool, tier)`` → the ``priority`` the job is sent to its engine with
    (:class:`~velvetrope.core.engine_priority.EnginePriority`; absent: 0)."""
    kinds: list[str] = field(default_factory=list)
    """The requests' endpoint kinds (empty: all ``chat``); a prompt-only kind's job is sized
    by :func:`~velvetrope.core.kinds.size_prompt_only`, as the gateway sizes it."""


@dataclass(slots=True)
class Trace:
    """What :meth:`~velvetrope.sim.runner.SimDriver.run` returns besides the core's own state
    (``runs``: how its decode runs went, all zero without fast-forward)."""

    jobs: list[Job | None]
    decisions: list[LogEntry]
    samples_t: list[float]
    samples_q: list[int]
    samples_f: list[int]
    span_s: float
    runs: RunCounts
