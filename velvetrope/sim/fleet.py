"""A modelled fleet: N engine replicas per pool, each a real :class:`~velvetrope.engine.Batcher`,
behind a router.

Replicas are numbered ``0 .. total - 1``, pool by pool in the order the pools are given; a
pool's replicas are a contiguous range.  Routers (:data:`ROUTERS`):

``round_robin``
    each pool cycles through its replicas, one dispatch each.
``prefix_oracle``
    the pool's prefix-affinity rule (:mod:`velvetrope.core.prefix_routing`, with the pool's
    ``prefix`` settings) told by an oracle how many leading blocks of each job every replica's
    prefix cache holds right now, instead of by the rule's approximate index: what perfect
    knowledge of the engines' caches would buy (a yardstick; no gateway can route so).
``least_loaded``
    the replica of the pool with the fewest outstanding jobs (dispatched to it and not yet
    finished, aborted or failed); ties go to the lowest-numbered replica.  This is the
    gateway's rule, :func:`velvetrope.core.routing.least_loaded`, with ties from the first
    replica (the gateway rotates where ties start).  With a saturation rule the loop routes
    through :meth:`velvetrope.sim.scrape.EngineScrapes.route`, which prefers the replicas the
    rule gives room, as the gateway does.

Whatever the router, a pool whose policy says ``routing: prefix_affinity`` or ``prefix_hash``
routes by the jobs' prefix hashes (:attr:`Fleet.prefix`, the core's
:class:`~velvetrope.core.prefix_routing.PrefixRouter`, called by
:meth:`velvetrope.sim.scrape.EngineScrapes.route`), naming replica ``k`` ``names[k]``
(``str(k)`` unless given: the gateway names its engines by URL, and the rendezvous order
follows the names).

The fleet also keeps the busy-time accounting the report needs: a replica is *busy* from the
moment work is added to an idle replica until its batcher runs out of work.  The event loop
(:mod:`velvetrope.sim.runner`) owns the timing; it reads and updates the public lists here
directly, since they sit on its hot path.

Replicas can be added while a run goes on (:meth:`Fleet.add`, an autoscaled pool): a new
replica gets the next number and takes work only once :meth:`Fleet.enable` d (its start-up
over); :meth:`Fleet.disable` takes a replica out of routing (draining).  The routers choose
among a pool's enabled replicas in number order, so a fixed fleet routes as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from velvetrope.core.policy import PolicyConfig
from velvetrope.core.prefix_routing import PrefixRouter, prefix_routers
from velvetrope.core.routing import least_loaded
from velvetrope.engine import Batcher, EngineProfile
from velvetrope.engine.prefix_cache import expand_blocks
from velvetrope.errors import PolicyError

__all__ = ["ROUTERS", "SCHEDULING", "Fleet", "PoolStats", "pool_replicas"]

ROUTERS = ("least_loaded", "round_robin", "prefix_oracle")
SCHEDULING = ("fcfs", "priority")
"""The engines' waiting-queue policy (vLLM's ``--scheduling-policy``): ``fcfs``, or
``priority`` (by each request's ``priority``, lower first; see
:mod:`velvetrope.core.engine_priority` for what the gateway sends)."""


def pool_replicas(pools: Sequence[str], replicas: int | Mapping[str, int]) -> dict[str, int]:
    """Replica count per pool: ``replicas`` for every pool, or a mapping naming each pool.

    Every count must be ``>= 1``; a mapping must name exactly the given pools.
    """
    if isinstance(replicas, Mapping):
        unknown = sorted(set(replicas) - set(pools))
        missing = [p for p in pools if p not in replicas]
        if unknown or missing:
            raise PolicyError(
                f"replicas must name every pool exactly ({', '.join(pools)}); "
                f"unknown: {unknown}, missing: {missing}"
            )
        counts = {p: replicas[p] for p in pools}
    else:
        counts = dict.fromkeys(pools, replicas)
    for p, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PolicyError(f"pool {p!r} needs an integer number of replicas >= 1, got {n!r}")
    return counts


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One pool's engines over a run.

    ``busy_fraction`` is the mean over its replicas of busy time / ``span_s`` (the share of
    wall-clock time a GPU had a batch to run); ``steps`` and ``preemptions`` are summed.
    ``replicas`` counts every replica the pool had (those added while the run went on too).
    ``prefix_queries`` / ``prefix_hits``: prompt tokens looked up in, and found in, the
    replicas' prefix caches (vLLM's ``vllm:prefix_cache_queries`` / ``_hits``; 0 without
    prefix caching); :attr:`prefix_hit_rate` is their ratio.
    """

    pool: str
    replicas: int
    busy_fraction: float
    steps: int
    preemptions: int
    prefix_queries: int = field(default=0, repr=False)  # (the pinned goldens print the rest)
    prefix_hits: int = field(default=0, repr=False)
    taken_back: int = field(default=0, repr=False)
    """Jobs the gateway took back from the pool's engines before their first token
    (:mod:`velvetrope.core.preemption`)."""

    @property
    def prefix_hit_rate(self) -> float:
        """Prefix-cache hits over queries, in tokens (0.0 with no query)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


class Fleet:
    """Engine replicas grouped by pool, with a router and busy-time accounting."""

    __slots__ = (
        "_next",
        "_priority",
        "_token_events",
        "active",
        "batchers",
        "busy_s",
        "busy_since",
        "load",
        "members",
        "names",
        "pool_names",
        "pool_of",
        "prefix",
        "profile",
        "ranges",
        "router",
    )

    def __init__(
        self,
        profile: EngineProfile,
        replicas: Mapping[str, int],
        router: str = "least_loaded",
        *,
        token_events: bool = False,
        policy: PolicyConfig | None = None,
        names: Sequence[str] | None = None,
        scheduling: str = "fcfs",
    ) -> None:
        if router not in ROUTERS:
            raise PolicyError(f"unknown router {router!r}; known: {', '.join(ROUTERS)}")
        if scheduling not in SCHEDULING:
            raise PolicyError(f"unknown engine scheduling {scheduling!r}; known: fcfs, priority")
        self._priority = scheduling == "priority"
        self.profile = profile
        self.router = router
        self.pool_names = list(replicas)
        self.ranges: list[tuple[int, int]] = []
        lo = 0
        for p in self.pool_names:
            self.ranges.append((lo, lo + replicas[p]))
            lo += replicas[p]
        self.batchers = [
            Batcher(profile, token_events=token_events, priority=self._priority) for _ in range(lo)
        ]
        self.load = [0] * lo
        """Outstanding jobs per replica (maintained by the event loop)."""
        self.active = [False] * lo
        """Whether a replica has a step scheduled (maintained by the event loop)."""
        self.busy_since = [0.0] * lo
        self.busy_s = [0.0] * lo
        self._token_events = token_events
        self.pool_of = [j for j, (a, b) in enumerate(self.ranges) for _ in range(a, b)]
        self.members: list[list[int]] = [list(range(a, b)) for a, b in self.ranges]
        """Per pool, the replicas that take work, in number order."""
        self._next = [0] * len(self.ranges)
        if names is not None and len(names) != lo:
            raise PolicyError(f"{len(names)} engine names for {lo} replicas")
        self.names = list(names) if names is not None else [str(k) for k in range(lo)]
        """Replica ``k``'s name, what prefix-aware routing keys it by."""
        self.prefix: list[PrefixRouter | None] = [None] * len(self.ranges)
        """Per pool, its prefix-aware router (``None``: the fleet's router)."""
        if policy is not None:
            by_pool = {p.name: p for p in policy.pools}
            routers = prefix_routers(policy)
            for j, name in enumerate(self.pool_names):
                if router == "prefix_oracle":
                    self.prefix[j] = PrefixRouter(
                        "prefix_affinity", by_pool[name].prefix, self._cached_depths
                    )
                else:
                    self.prefix[j] = routers.get(name)

    def _cached_depths(
        self, hashes: Sequence[int], block_tokens: int, engines: Mapping[str, int]
    ) -> dict[str, int]:
        """The oracle: per replica named in ``engines``, the leading blocks of ``hashes``
        its prefix cache holds now (engines without prefix caching hold none)."""
        out: dict[str, int] = {}
        bs = self.profile.block_size
        if block_tokens < bs or block_tokens % bs:
            return out
        sub = block_tokens // bs
        expanded = expand_blocks(hashes, block_tokens, bs, len(hashes) * sub)
        index = {n: k for k, n in enumerate(self.names)}
        for name in engines:
            pc = self.batchers[index[name]].prefix_caching
            if pc is not None:
                d = len(pc.lookup(expanded)) // sub
                if d:
                    out[name] = d
        return out

    def __len__(self) -> int:
        return len(self.batchers)

    def add(self, pool: int) -> int:
        """A new replica in pool number ``pool`` (not taking work until enabled)."""
        k = len(self.batchers)
        self.batchers.append(
            Batcher(self.profile, token_events=self._token_events, priority=self._priority)
        )
        self.load.append(0)
        self.active.append(False)
        self.busy_since.append(0.0)
        self.busy_s.append(0.0)
        self.pool_of.append(pool)
        self.names.append(str(k))
        return k

    def enable(self, k: int) -> None:
        """Replica ``k`` takes work."""
        m = self.members[self.pool_of[k]]
        if k not in m:
            m.append(k)
            m.sort()

    def disable(self, k: int) -> None:
        """Replica ``k`` takes no more work (what it has goes on)."""
        m = self.members[self.pool_of[k]]
        if k in m:
            m.remove(k)

    def route(self, pool: int) -> int:
        """The replica that takes the next job of pool number ``pool`` (which must have an
        enabled replica)."""
        m = self.members[pool]
        if self.router == "round_robin":
            i = self._next[pool] % len(m)
            self._next[pool] = i + 1
            return m[i]
        return m[least_loaded(list(map(self.load.__getitem__, m)))]

    def busy_until(self, k: int, now: float) -> float:
        """Replica ``k``'s busy seconds up to ``now``."""
        return self.busy_s[k] + (now - self.busy_since[k] if self.active[k] else 0.0)

    def start_busy(self, k: int, now: float) -> None:
        """Replica ``k`` goes from idle to busy at ``now``."""
        self.active[k] = True
        self.busy_since[k] = now

    def stop_busy(self, k: int, now: float) -> None:
        """Replica ``k`` ran out of work at ``now``."""
        self.active[k] = False
        self.busy_s[k] += now - self.busy_since[k]

    def stats(self, span_s: float, taken_back: dict[str, int] | None = None) -> list[PoolStats]:
        """Per-pool statistics over ``[0, span_s]`` (open busy periods count up to ``span_s``);
        ``taken_back``: the gateway's preemptions per pool."""
        out = []
        for j, name in enumerate(self.pool_names):
            ks = [k for k, p in enumerate(self.pool_of) if p == j]
            busy = 0.0
            for k in ks:
                busy += self.busy_until(k, span_s) / span_s if span_s > 0 else 0.0
            out.append(
                PoolStats(
                    pool=name,
                    replicas=len(ks),
                    busy_fraction=busy / len(ks),
                    steps=sum(self.batchers[k].num_steps for k in ks),
                    preemptions=sum(self.batchers[k].num_preemptions for k in ks),
                    prefix_queries=sum(self.batchers[k].prefix_cache_queries for k in ks),
                    prefix_hits=sum(self.batchers[k].prefix_cache_hits for k in ks),
                    taken_back=(taken_back or {}).get(name, 0),
                )
            )
        return out
