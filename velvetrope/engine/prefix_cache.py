"""Automatic prefix caching: a KV block pool whose full blocks are shared by content.

This is vLLM's automatic prefix caching, modelled without tokens.  A full block of a prompt
is identified by a **hash chain**: block ``i``'s hash digests its parent's hash and the
block's content, so two prompts share block ``i`` exactly when they share every token up
to the end of that block.  The model knows a prompt's content only as "the first
``prefix_tokens`` tokens of prefix ``prefix_id``" (a system prompt per application, a
template), so the content of block ``i`` of that prefix is ``(prefix_id, i)`` and
:func:`block_hashes` builds the chain from it; the rest of a prompt is private.

:class:`PrefixCachingAllocator` is the block pool:

* every block has a **reference count**: the number of block tables holding it;
* a block whose count drops to 0 goes to the back of the **free queue** but keeps its hash:
  it is *cached* and can be taken back by a later :meth:`~PrefixCachingAllocator.acquire`
  (a hit) until it is evicted;
* :meth:`~PrefixCachingAllocator.allocate` takes blocks from the **front** of the free queue
  (least recently freed first, LRU) and **evicts** their hashes;
* :meth:`~PrefixCachingAllocator.free` releases a table's blocks in reverse order (a
  sequence's tail goes to the queue first, so it is evicted before its shared head, as in
  vLLM).

Contract (the invariants the tests attack): a block is in the free queue if and only if its
reference count is 0, so a block held by any table is never handed out, evicted or freed
twice; ``num_free`` counts free-queue blocks (cached or not), so ``usage`` is vLLM's
``kv_cache_usage_perc`` (cached-but-unreferenced blocks count as free); the hash map holds
exactly the registered blocks that have not been evicted.

Cost: O(1) per block moved (a dict used as an ordered set); hashing is memoised per prefix.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from velvetrope.engine.kvcache import BlockPool

__all__ = ["PrefixCachingAllocator", "block_hashes", "expand_blocks"]

_ROOT = 0x5EED
_CHAINS: dict[str, list[int]] = {}
_MAX_CHAINS = 4096


def _digest(parent: int, prefix_id: str, index: int) -> int:
    h = hashlib.blake2b(f"{parent:x}|{prefix_id}|{index}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def block_hashes(prefix_id: str, n: int) -> tuple[int, ...]:
    """The hash chain of the first ``n`` full blocks of prefix ``prefix_id``.

    ``block_hashes(p, n)`` is a prefix of ``block_hashes(p, m)`` for ``n <= m``, and two
    different ids give different chains (64-bit digests; a collision is as unlikely as in
    vLLM).  Deterministic across processes (no Python ``hash``).
    """
    if n <= 0:
        return ()
    chain = _CHAINS.get(prefix_id)
    if chain is None:
        if len(_CHAINS) >= _MAX_CHAINS:
            _CHAINS.clear()
        chain = _CHAINS[prefix_id] = []
    parent = chain[-1] if chain else _ROOT
    while len(chain) < n:
        parent = _digest(parent, prefix_id, len(chain))
        chain.append(parent)
    return tuple(chain[:n])


def expand_blocks(
    ids: Sequence[int], block_tokens: int, engine_block: int, limit: int
) -> tuple[int, ...]:
    """The engine-block hash chain of a prompt given as hashes of coarser blocks.

    ``ids[i]`` identifies the prompt's tokens up to the end of its block ``i`` of
    ``block_tokens`` tokens (chained, like Mooncake's ``hash_ids`` or the gateway's prefix
    hashes), so sub-block ``j`` of it (``engine_block`` tokens) is identified by
    ``(ids[i], j)``, mapped to the negative integer ``-(ids[i] * sub + j) - 1`` (``sub =
    block_tokens // engine_block``), which never equals a :func:`block_hashes` digest (those
    are non-negative).  At most ``limit`` hashes (the prompt's full engine blocks).  Raises
    ``ValueError`` unless ``engine_block`` divides ``block_tokens``.
    """
    if engine_block < 1 or block_tokens < engine_block or block_tokens % engine_block:
        raise ValueError(
            f"the engine's block size {engine_block} must divide the trace's block size "
            f"{block_tokens}"
        )
    sub = block_tokens // engine_block
    n = min(len(ids) * sub, limit)
    out: list[int] = []
    for k in range(n):
        out.append(-((ids[k // sub] & 0xFFFFFFFFFFFFFFFF) * sub + k % sub) - 1)
    return tuple(out)


class PrefixCachingAllocator(BlockPool):
    """A KV block pool with reference counts, a hash map of cached blocks and LRU eviction.

    Same interface as :class:`~velvetrope.engine.kvcache.BlockAllocator` (``allocate``,
    ``free``, ``num_free``, ``num_used``, ``usage``, ``free_ids``) plus :meth:`lookup`,
    :meth:`acquire`, :meth:`register` for sharing; see the module docstring.
    """

    __slots__ = ("_by_hash", "_free", "_hash", "_ref", "evictions")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.evictions = 0
        """Cached blocks whose hash was dropped to reuse the block (cumulative)."""

    @property
    def num_cached(self) -> int:
        """Blocks that carry a hash (held or free), i.e. reusable by a lookup."""
        return len(self._by_hash)

    def refcount(self, block: int) -> int:
        """How many tables hold ``block``."""
        return self._ref[block]

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest run of ``hashes`` (from the first) that is cached."""
        out: list[int] = []
        by_hash = self._by_hash
        for h in hashes:
            b = by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def reclaimable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (acquiring them uses free blocks)."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    def acquire(self, blocks: Sequence[int], table: list[int]) -> None:
        """Append cached ``blocks`` to ``table``, taking a reference on each (a hit)."""
        ref, free = self._ref, self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
            table.append(b)
        self.num_free = len(free)

    def allocate(self, n: int, table: list[int]) -> None:
        """Move ``n`` blocks from the front of the free queue to the end of ``table``.

        Evicts the hash of every cached block it takes.  Raises ``ValueError`` (and changes
        nothing) if ``n`` is negative or more than :attr:`num_free`.
        """
        free = self._free
        if n < 0 or n > len(free):
            raise ValueError(f"cannot allocate {n} KV blocks: {len(free)} free")
        ref, hashes = self._ref, self._hash
        for _ in range(n):
            b, _unused = free.popitem(last=False)
            h = hashes[b]
            if h is not None:
                del self._by_hash[h]
                hashes[b] = None
                self.evictions += 1
            ref[b] = 1
            table.append(b)
        self.num_free = len(free)

    def free(self, table: list[int]) -> None:
        """Drop ``table``'s references (tail first) and clear it; blocks at 0 become free."""
        ref, free = self._ref, self._free
        for b in reversed(table):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                free[b] = None
        table.clear()
        self.num_free = len(free)

    def release_tail(self, table: list[int], keep: int) -> None:
        """Drop the references of ``table[keep:]`` and truncate ``table`` to ``keep``."""
        tail = table[keep:]
        del table[keep:]
        self.free(tail)

    def register(self, block: int, block_hash: int) -> bool:
        """Record that held ``block`` now holds the full content hashed ``block_hash``.

        Returns ``False`` (and changes nothing) if that content is already cached in
        another block or ``block`` already has a hash: the first copy wins, as in vLLM.
        """
        if self._hash[block] is not None or block_hash in self._by_hash:
            return False
        self._hash[block] = block_hash
        self._by_hash[block_hash] = block
        return True

    def free_ids(self) -> frozenset[int]:
        """A snapshot of the free-queue block ids (for invariant checks; O(num_blocks))."""
        return frozenset(self._free)
