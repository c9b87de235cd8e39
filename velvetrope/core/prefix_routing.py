"""Prefix-aware replica choice: which engine of a pool takes a job, by the prompt's leading blocks.

A prompt's **prefix identity** is the chain of hashes of its leading blocks
(:func:`chain_hashes`): hash ``i`` digests every byte up to the end of block ``i``, so two
prompts share hash ``i`` exactly when they share their first ``i + 1`` blocks, as the
hashes of vLLM's automatic prefix caching do (the same chaining; coarser blocks).  The
gateway hashes the prompt's bytes (:mod:`velvetrope.openai.prefix`), the simulator is given
the hashes by its trace (Mooncake's ``hash_ids``): the rules below see only the hashes.

Two rules, each written once and called by the gateway
(:meth:`~velvetrope.gateway.upstream.upstreams.UpstreamPools.pick`) and by the simulator
(:meth:`~velvetrope.sim.scrape.EngineScrapes.route`) with the same inputs: the hashes, the
pool's engines in order with their names and their jobs in flight, and which of them may
take work.  Both are pure (:meth:`PrefixRouter.choose`); what was decided is then recorded
(:meth:`PrefixRouter.commit`), so a caller that must re-pick (an engine whose half-open
breaker already has its probe out) records only what it used.

**prefix_affinity** (cf. SGLang's ``cache_aware`` router, llm-d's approximate prefix
scorer).  A :class:`PrefixIndex` remembers, for each recently routed block hash, the
engines that computed it (at most ``index_ways``, most recent first), in a least-recently-
used map of at most ``index_blocks`` entries: approximate (an engine may have evicted what
the index still lists, another may hold what it forgot) and bounded in memory.  An engine's
*match* is the number of leading blocks of the job it holds, by the index.  Let ``lo`` be
the least load among the engines that may take work; an engine is *within the bound* unless
its load exceeds ``lo + balance_abs`` **and** ``balance_rel × lo`` (SGLang's
``balance_abs_threshold`` / ``balance_rel_threshold`` test, applied to the engine chosen).
The job goes to the engine within the bound with the longest match, the least loaded of
those, ties by rendezvous weight (below).  The least-loaded engine is always within the
bound, so with no match (or every matching engine loaded beyond the bound) the job goes to
a least-loaded engine.  Outcome: ``kept`` when the chosen engine has the longest match of
all the engines that may take work, ``overridden`` when a longer match was passed over for
load, ``miss`` when no engine matches (or the prompt is shorter than one block).

**prefix_hash** (rendezvous hashing, Thaler & Ravishankar 1998, with the bounded loads of
Mirrokni, Thorup & Zadimoghaddam 2018).  No index: the job's key is the hash of its first
``k = max(1, hash_tokens // block_tokens)`` blocks (all of them if it has fewer), each
engine's weight is a 64-bit mix of the key and the engine's name, and the job goes to the
heaviest engine whose load stays within ``ceil(load_factor × (total + 1) / engines)``
(``total``: the jobs in flight on the engines that may take work); there always is one.
Every gateway replica computes the same order from the same names, so replicas agree
without talking; only loads, which each replica counts itself, can move a job down the
order.  Outcome: ``kept`` (the first in the order), ``overridden`` (further down), ``miss``
(a prompt shorter than one block: least-loaded).

Engine names are what the caller uses as identity: the upstream's URL in the gateway, the
replica's name in the simulator (``"0"``, ``"1"``... unless given).  Cost: O(engines) plus
O(blocks × ways) dictionary operations per choice; nothing reads a clock.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from velvetrope.core.policy import PolicyConfig
from velvetrope.core.pool_policy import PrefixRoutingPolicy

__all__ = [
    "KEPT",
    "MISS",
    "OUTCOMES",
    "OVERRIDDEN",
    "Choice",
    "PrefixIndex",
    "PrefixRouter",
    "chain_hashes",
    "name_key",
    "prefix_routers",
    "rendezvous_weight",
]

KEPT = "kept"
"""The job went to the engine its prefix points to."""
OVERRIDDEN = "overridden"
"""The engine its prefix points to was passed over for load."""
MISS = "miss"
"""No engine matched the job's prefix (or it has none)."""
OUTCOMES = (KEPT, OVERRIDDEN, MISS)

_MASK = (1 << 64) - 1
_PERSON = b"velvetrope-pfx"


def chain_hashes(data: bytes, block_bytes: int, max_blocks: int) -> tuple[int, ...]:
    """The chained 64-bit hashes of the first ``min(len(data) // block_bytes, max_blocks)``
    full blocks of ``data`` (a trailing partial block has none).

    Hash ``i`` is the BLAKE2b digest of ``data[: (i + 1) * block_bytes]``, so it commits to
    every block before it; deterministic across processes and machines (no Python
    ``hash``).  Costs one pass over the hashed bytes.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    n = min(len(data) // block_bytes, max_blocks)
    if n <= 0:
        return ()
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    out: list[int] = []
    for i in range(n):
        h.update(data[i * block_bytes : (i + 1) * block_bytes])
        out.append(int.from_bytes(h.copy().digest(), "big"))
    return tuple(out)


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer to a well-spread 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def name_key(name: str) -> int:
    """An engine name's 64-bit key (BLAKE2b of its UTF-8 bytes)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def rendezvous_weight(key: int, engine_key: int) -> int:
    """The weight of the engine keyed ``engine_key`` for a job keyed ``key`` (higher wins)."""
    return _mix((key ^ _mix(engine_key)) & _MASK)


class Choice(NamedTuple):
    """A replica choice: ``at``, the position in the engines given (-1: none may take work), the
    ``matched`` leading blocks the index says that engine holds (0 under ``prefix_hash``),
    and the ``outcome`` (:data:`KEPT`, :data:`OVERRIDDEN`, :data:`MISS`)."""

    at: int
    matched: int
    outcome: str


class PrefixIndex:
    """Which engines recently computed which blocks: a bounded, approximate map.

    ``block hash -> engine names`` (at most ``ways``, most recent first), least recently
    recorded entries evicted past ``capacity`` entries.  Memory: O(capacity × ways).
    """

    __slots__ = ("_map", "capacity", "ways")

    def __init__(self, capacity: int, ways: int) -> None:
        if capacity < 1 or ways < 1:
            raise ValueError(f"capacity and ways must be >= 1, got {capacity}, {ways}")
        self.capacity = capacity
        self.ways = ways
        self._map: OrderedDict[int, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def depths(self, hashes: Sequence[int], engines: Mapping[str, int]) -> dict[str, int]:
        """For each engine named in ``engines`` that holds at least the first block: how many
        leading blocks of ``hashes`` it holds (a run from the first, by the index)."""
        out: dict[str, int] = {}
        alive: set[str] | None = None
        m = self._map
        for i, h in enumerate(hashes):
            got = m.get(h)
            if got is None:
                break
            cur = {e for e in got if e in engines} if alive is None else alive.intersection(got)
            if not cur:
                break
            for e in cur:
                out[e] = i + 1
            alive = cur
        return out

    def record(self, hashes: Sequence[int], engine: str) -> None:
        """``engine`` computed (and now caches) every block of ``hashes``."""
        m = self._map
        ways = self.ways
        for h in hashes:
            got = m.get(h)
            if got is None:
                m[h] = [engine]
                if len(m) > self.capacity:
                    m.popitem(last=False)
                continue
            if got[0] != engine:
                if engine in got:
                    got.remove(engine)
                got.insert(0, engine)
                if len(got) > ways:
                    got.pop()
            m.move_to_end(h)

    def forget(self, engine: str) -> None:
        """Drop ``engine`` from every entry (it left the pool).  O(capacity)."""
        m = self._map
        for h in [h for h, got in m.items() if engine in got]:
            got = m[h]
            got.remove(engine)
            if not got:
                del m[h]


Depths = Callable[[Sequence[int], int, Mapping[str, int]], dict[str, int]]
"""``(hashes, block_tokens, engines by name) -> leading blocks held per engine``: what the
affinity rule asks its index (:meth:`PrefixIndex.depths`; the simulator's oracle reads the engines'
caches instead)."""


class PrefixRouter:
    """One pool's prefix-aware replica choice (``mode``: ``prefix_affinity`` or
    ``prefix_hash``); see the module docstring.

    ``depths`` replaces the index's lookup (an oracle that reads the engines' caches);
    then nothing is recorded in the index.  Counters (cumulative, updated by
    :meth:`commit`): :attr:`kept`, :attr:`overridden`, :attr:`missed`, and, under
    ``prefix_affinity``, :attr:`matched_blocks` / :attr:`hashed_blocks` (the expected hit
    rate is their ratio).
    """

    __slots__ = (
        "_depths",
        "_keys",
        "_learns",
        "hashed_blocks",
        "index",
        "kept",
        "matched_blocks",
        "missed",
        "mode",
        "overridden",
        "settings",
    )

    def __init__(
        self, mode: str, settings: PrefixRoutingPolicy, depths: Depths | None = None
    ) -> None:
        if mode not in ("prefix_affinity", "prefix_hash"):
            raise ValueError(f"unknown prefix routing mode {mode!r}")
        self.mode = mode
        self.settings = settings
        self.index = PrefixIndex(settings.index_blocks, settings.index_ways)
        index = self.index
        self._depths: Depths = (
            depths if depths is not None else (lambda hs, _bt, engines: index.depths(hs, engines))
        )
        self._learns = depths is None
        self._keys: dict[str, int] = {}
        self.kept = 0
        self.overridden = 0
        self.missed = 0
        self.matched_blocks = 0
        self.hashed_blocks = 0

    def _key(self, name: str) -> int:
        k = self._keys.get(name)
        if k is None:
            if len(self._keys) > 4096:  # names come and go (DNS): keep the map bounded
                self._keys.clear()
            k = self._keys[name] = name_key(name)
        return k

    def job_key(self, hashes: Sequence[int], block_tokens: int) -> int:
        """The job's rendezvous key: the hash of its first ``hash_tokens`` worth of blocks
        (at least one; all it has if fewer).  ``hashes`` must not be empty."""
        k = max(1, self.settings.hash_tokens // max(1, block_tokens))
        return hashes[min(len(hashes), k) - 1] & _MASK

    def choose(
        self,
        hashes: Sequence[int],
        block_tokens: int,
        names: Sequence[str],
        loads: Sequence[int],
        eligible: Callable[[int], bool] | None = None,
    ) -> Choice:
        """The engine for a job whose leading blocks (of ``block_tokens`` tokens each) hash
        to ``hashes``, among ``names`` with ``loads`` jobs in flight, of which
        ``eligible(i)`` (default: all) may take work.  Pure: see :meth:`commit`."""
        cands = [i for i in range(len(names)) if eligible is None or eligible(i)]
        if not cands:
            return Choice(-1, 0, MISS)
        hs = hashes[: self.settings.max_blocks]
        if not hs:
            best = cands[0]
            for i in cands:
                if loads[i] < loads[best]:
                    best = i
            return Choice(best, 0, MISS)
        key = self.job_key(hs, block_tokens)
        if self.mode == "prefix_hash":
            return self._hashed(key, names, loads, cands)
        return self._affinity(hs, block_tokens, key, names, loads, cands)

    def _hashed(
        self, key: int, names: Sequence[str], loads: Sequence[int], cands: list[int]
    ) -> Choice:
        total = 0
        for i in cands:
            total += loads[i]
        bound = math.ceil(self.settings.load_factor * (total + 1) / len(cands))
        order = sorted(cands, key=lambda i: rendezvous_weight(key, self._key(names[i])))
        order.reverse()
        for rank, i in enumerate(order):
            if loads[i] + 1 <= bound:
                return Choice(i, 0, KEPT if rank == 0 else OVERRIDDEN)
        best = min(cands, key=lambda i: loads[i])  # unreachable with load_factor > 1
        return Choice(best, 0, OVERRIDDEN)

    def _affinity(
        self,
        hs: Sequence[int],
        block_tokens: int,
        key: int,
        names: Sequence[str],
        loads: Sequence[int],
        cands: list[int],
    ) -> Choice:
        s = self.settings
        lo = loads[cands[0]]
        for i in cands:
            if loads[i] < lo:
                lo = loads[i]
        depth = self._depths(hs, block_tokens, {names[i]: i for i in cands})
        top = max(depth.values()) if depth else 0
        best = -1
        best_rank = (0, 0, 0)
        for i in cands:
            load = loads[i]
            within = not (load - lo > s.balance_abs and load > s.balance_rel * lo)
            d = depth.get(names[i], 0) if within else -1
            rank = (d, -load, rendezvous_weight(key, self._key(names[i])))
            if best < 0 or rank > best_rank:
                best, best_rank = i, rank
        got = max(0, best_rank[0])
        if top == 0:
            return Choice(best, 0, MISS)
        return Choice(best, got, KEPT if got == top else OVERRIDDEN)

    def commit(self, choice: Choice, hashes: Sequence[int], name: str) -> None:
        """The job of ``choice`` was sent to the engine ``name``: count the outcome and,
        under ``prefix_affinity``, record that the engine now holds its leading blocks."""
        if choice.outcome == KEPT:
            self.kept += 1
        elif choice.outcome == OVERRIDDEN:
            self.overridden += 1
        else:
            self.missed += 1
        if self.mode == "prefix_affinity":
            hs = hashes[: self.settings.max_blocks]
            self.hashed_blocks += len(hs)
            self.matched_blocks += choice.matched
            if self._learns:
                self.index.record(hs, name)

    @property
    def expected_hit_rate(self) -> float | None:
        """Matched over hashed blocks so far (``None``: none hashed, or ``prefix_hash``)."""
        return self.matched_blocks / self.hashed_blocks if self.hashed_blocks else None


def prefix_routers(
    config: PolicyConfig, depths: Callable[[str], Depths | None] | None = None
) -> dict[str, PrefixRouter]:
    """A :class:`PrefixRouter` per pool of ``config`` whose ``routing`` is prefix-aware
    (pools routed ``least_loaded`` have none).  ``depths(pool)``, when given, supplies the
    lookup that replaces each router's index (``None``: the index)."""
    out: dict[str, PrefixRouter] = {}
    for p in config.pools:
        if p.routing != "least_loaded":
            out[p.name] = PrefixRouter(
                p.routing, p.prefix, depths(p.name) if depths is not None else None
            )
    return out
