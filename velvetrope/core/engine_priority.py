"""The priority a job is sent to its engine with, for engines that schedule by priority.

vLLM's ``--scheduling-policy priority`` orders its waiting queue by the request body's
``priority`` field, lower first (ties by arrival), and preempts the running sequence with
the largest ``(priority, arrival)`` when it runs out of KV cache.  A pool with
``engine_priority`` (on by default) forwards each job's tier band as that field: the
tier's index in ``policy.tiers`` (0 = the top tier, so the top tier is served first); how
each engine is sent it, and what an engine that refuses it teaches the gateway, is
:mod:`velvetrope.gateway.upstream.priority_forwarding`'s.  Off, nothing is forwarded.  A client's
own ``priority`` never reaches the engine (the gateway strips it: priority comes only from
the tenant's configuration).

One rule for the gateway (which writes the field into the upstream body) and the simulator
(which hands it to the engine model's batcher): :class:`EnginePriority`.
"""

from __future__ import annotations

from velvetrope.core.policy import PolicyConfig

__all__ = ["EnginePriority"]


class EnginePriority:
    """``of(pool, tier)``: the ``priority`` to forward for a job of ``tier`` dispatched to
    ``pool``, or ``None`` when that pool does not forward one (or the tier is unknown)."""

    __slots__ = ("_table",)

    def __init__(self, config: PolicyConfig) -> None:
        self._table: dict[tuple[str, str], int] = {
            (p.name, t.name): i
            for p in config.pools
            if p.engine_priority
            for i, t in enumerate(config.tiers)
        }

    @property
    def enabled(self) -> bool:
        """Whether any pool forwards a priority."""
        return bool(self._table)

    def of(self, pool: str, tier: str) -> int | None:
        return self._table.get((pool, tier))

    def table(self) -> dict[tuple[str, str], int]:
        """Every ``(pool, tier)`` that forwards a priority, and the priority."""
        return dict(self._table)
